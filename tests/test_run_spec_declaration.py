"""The run spec is one declaration: RunSpec (hwbench/spec.py), whose fields that keep an option as given
are generated from the option's definition (hwbench/kept_options.py, from `kept=` in hwbench/options.py).
The result's spec section (hwbench.result.model.Spec) is made from its fields, each optional because a
result's spec may be partial, with its type and range; gradient accumulation is computed in one place that
both read; the point key (hwbench.point.PointKey) is a selection of the spec's fields (FROM_SPEC) with their
types."""

from __future__ import annotations

import dataclasses
import types
import typing
from operator import attrgetter

import pytest

from hwbench.catalog import load_catalog
from hwbench.fields import validation_problem
from hwbench.options import KEPT, LAUNCH_SPEC, RUN_OPTIONS, RunOptions
from hwbench.point import FROM_RUN, FROM_SPEC, PointKey
from hwbench.result.model import Parallel, RunResult, Spec, SpecLaunch
from hwbench.spec import LaunchSpec, OptimizerSpec, ParallelDims, RunSpec, build_run_spec

# What the result's spec holds beyond RunSpec: a sweep's record of a point whose options were refused.
RESULT_ONLY = {"run_args"}
# Sections the result keeps as a plain mapping (the optimizer's keys are the workload's).
AS_MAPPING = {"optimizer"}
# Run options the RunSpec holds under another name or in one of its parts, or that are used before it:
# option -> where the spec holds it (None: nowhere). Every other option is a RunSpec field of its own name,
# an OptimizerSpec field of its own name (OPTIMIZER_OPTIONS: the spec's optimizer holds it), or a
# ParallelDims field of its own name (PARALLEL_OPTIONS: the spec's parallel holds it).
OPTIMIZER_OPTIONS = {field.name for field in dataclasses.fields(OptimizerSpec)} & RUN_OPTIONS.keys()
PARALLEL_OPTIONS = {field.name for field in dataclasses.fields(ParallelDims)} & RUN_OPTIONS.keys()
LAUNCH_OPTIONS = {name for name, part in KEPT.items() if part == LAUNCH_SPEC}
ELSEWHERE = {
    "zero": "zero_stage", "out": "out_dir", "telemetry_interval": "telemetry_interval_s",
    "device_memory": "device_memory_bytes", "timeout": "launch.timeout_s",
    "preflight": None,  # the harness checks the machine before the run (hwbench.harness.run)
} | {name: f"optimizer.{name}" for name in OPTIMIZER_OPTIONS} | {name: f"parallel.{name}" for name in PARALLEL_OPTIONS
                                                                 } | {name: f"launch.{name}" for name in LAUNCH_OPTIONS}


def _base_type(annotation):
    """int, str, bool, float or a class, from `Positive | None`, `Annotated[...]` and the like."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
            kinds = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            assert len(kinds) == 1, annotation
            annotation = kinds[0]
        else:
            return annotation


def _pairs(dataclass, section):
    """{field: (RunSpec's base type, the result section's base type)} of each field either declares."""
    own = typing.get_type_hints(dataclass)
    held = {name: field.annotation for name, field in section.model_fields.items()}
    return {name: (_base_type(own[name]) if name in own else None, _base_type(held[name]) if name in held else None)
            for name in {*own, *held}}


@pytest.mark.parametrize("dataclass, section, nested", [
    (RunSpec, Spec, {"parallel": (ParallelDims, Parallel), "launch": (LaunchSpec, SpecLaunch)}),
    (ParallelDims, Parallel, {}),
    (LaunchSpec, SpecLaunch, {}),
])
def test_the_results_spec_section_holds_runspecs_fields_with_their_types(dataclass, section, nested):
    pairs = _pairs(dataclass, section)
    apart = (RESULT_ONLY | AS_MAPPING) & set(pairs)
    differ = {name: pair for name, pair in pairs.items() if name not in apart | set(nested) and pair[0] != pair[1]}
    assert not differ, f"{dataclass.__name__} and the result's {section.__name__} differ (theirs, result's): {differ}"
    assert {name: pairs[name] for name in nested} == nested
    assert all(pairs[name][0] is None for name in apart & RESULT_ONLY)


@pytest.mark.parametrize("spec, problem", [
    ({"micro_batch_size": 0}, "spec.micro_batch_size: must be >= 1, not 0"),  # RunSpec's Positive
    ({"warmup": -1}, "spec.warmup: must be >= 0, not -1"),  # Count
    ({"telemetry_interval_s": -0.5}, "spec.telemetry_interval_s: must be >= 0.0, not -0.5"),  # Rate
    ({"recompute": "yes"}, "spec.recompute: must be true/false, not text"),  # bool, strictly
    ({"parallel": {"tp": 0}}, "spec.parallel.tp: must be >= 1, not 0"),  # ParallelDims'
    ({"launch": {"master_port": "29500"}}, "spec.launch.master_port: must be an integer, not text"),  # LaunchSpec's
    ({"engine": None}, "spec.engine: must be text, not null"),  # its absence means native; null is damage
])
def test_the_results_spec_takes_each_fields_type_and_range_from_runspec(spec, problem):
    assert validation_problem(RunResult, {"run_id": "r", "status": "ok", "spec": spec}) == problem


def test_a_field_missing_from_an_older_results_spec_reads_as_what_its_absence_meant():
    spec = Spec.model_validate({})
    assert (spec.engine, spec.zero_stage, spec.fsdp, spec.fused_qkv, spec.cross_entropy) == (
        "native", 0, False, False, "standard")
    assert (spec.parallel.world_size, spec.launch.nnodes, spec.launch.node_rank) == (1, 1, 0)
    assert (spec.settings, spec.async_save, spec.launch.master_addr, spec.launch.max_restarts) == (
        "published", False, "127.0.0.1", 0)  # what RunSpec's defaults say such a run ran with
    assert spec.model is spec.parallel.source is spec.launch.master_port is None
    assert spec.dump() == {}  # and nothing is written that was not read


def test_a_spec_written_to_a_result_reads_back_as_the_same_runspec():
    spec = build_run_spec(RunOptions(model="tiny", nproc_per_node=2, target_ppl=5.0, save="/tmp/never-written",
                                     settings="fast", device_memory="16GiB"), load_catalog(), check_paths=False)
    assert Spec.model_validate(spec.to_dict()).run_spec() == spec


@pytest.mark.parametrize("options", [{"model": "small", "nproc_per_node": 2, "micro_batch_size": 2},
                                     {"model": "tiny", "nproc_per_node": 3}, {"model": "tiny"}])
def test_the_results_spec_accumulates_as_the_run_did(options):
    spec = build_run_spec(RunOptions(**options), load_catalog(), check_paths=False)
    held = Spec.model_validate(spec.to_dict())
    assert held.gradient_accumulation_steps == spec.gradient_accumulation_steps
    assert spec.gradient_accumulation_steps * spec.micro_batch_size * spec.parallel.dp == spec.global_batch_size


def test_a_partial_spec_has_no_accumulation():
    assert Spec.model_validate({"run_args": ["--model", "tiny"]}).gradient_accumulation_steps is None


def test_every_run_option_is_a_runspec_field_or_listed_where_it_goes():
    fields = {field.name for field in dataclasses.fields(RunSpec)}
    dropped = sorted(name for name in RUN_OPTIONS if name not in fields | ELSEWHERE.keys())
    assert not dropped, f"run options the RunSpec would drop: {dropped}; add a RunSpec field or list where it goes"
    assert not ELSEWHERE.keys() & fields  # a field of the option's own name holds it, not the place listed
    spec = build_run_spec(RunOptions(model="tiny"), load_catalog(), check_paths=False)
    for path in filter(None, ELSEWHERE.values()):
        attrgetter(path)(spec)  # each place is the RunSpec's


def test_an_option_kept_as_given_arrives_in_the_run_spec():
    given = dict(device="cpu", steps=3, warmup=1, data="synthetic", split="1,1,0", eval_iters=2, telemetry=False,
                 threads_per_rank=2, save="/tmp/never-written", save_interval=2, async_save=True,
                 load="/tmp/never-read", fsdp=True, nproc_per_node=2)
    spec = build_run_spec(RunOptions(**given), load_catalog(), check_paths=False)
    assert {name: getattr(spec, name) for name in given if name not in ELSEWHERE} == {
        name: value for name, value in given.items() if name not in ELSEWHERE}


def test_the_kept_fields_are_what_the_options_definitions_generate():
    """hwbench/kept_options.py is written by `python -m hwbench.options --kept-options`: an option kept
    in the spec is declared once, in hwbench/options.py, and its field follows."""
    from pathlib import Path

    from hwbench.options import kept_options_module

    module = Path(__file__).resolve().parent.parent / "hwbench" / "kept_options.py"
    assert module.read_text() == kept_options_module(), (
        "run: python -m hwbench.options --kept-options > hwbench/kept_options.py")


@pytest.mark.parametrize("name, field", [
    ("steps", "steps: Positive"),  # the option's range: minimum 1
    ("warmup", "warmup: Count"),  # minimum 0
    ("seq_length", "seq_length: Positive"),  # no default of its own: the workload's
    ("save", "save: str | None = None"),  # no default at all: None until given
    ("cross_entropy", 'cross_entropy: str = "standard"'),  # a result older than the option ran with its default
    ("lr_warmup_init", "lr_warmup_init: float = 0.0"),
    ("master_port", "master_port: Positive | None = None"),  # a rule of build_run_spec may set it
])
def test_a_kept_field_takes_its_type_range_and_absence_from_the_option(name, field):
    from hwbench.options import kept_options_module

    assert f"\n    {field}\n" in kept_options_module()


@pytest.mark.parametrize("minimum, above, kind", [(1, False, "Positive"), (0, False, "Count"), (0, True, "Positive"),
                                                  (2, False, None), (None, False, None), (1, True, None)])
def test_an_integer_options_range_is_a_spec_type_or_refused_by_the_generator(minimum, above, kind):
    from hwbench.arguments import Option
    from hwbench.options import _kept_type

    option = Option(help="", name="example", type=int, minimum=minimum, above_minimum=above)
    if kind is None:
        with pytest.raises(ValueError, match="--example is kept in the spec"):
            _kept_type(option)
    else:
        assert _kept_type(option) == kind


def test_every_kept_option_is_a_field_of_the_part_that_keeps_it():
    from hwbench.options import OPTIMIZER_SPEC, RUN_SPEC

    parts = {RUN_SPEC: RunSpec, OPTIMIZER_SPEC: OptimizerSpec, LAUNCH_SPEC: LaunchSpec}
    assert {name: part for name, part in KEPT.items()
            if name not in {field.name for field in dataclasses.fields(parts[part])}} == {}
    spec = build_run_spec(RunOptions(model="tiny"), load_catalog(), check_paths=False)
    held = {RUN_SPEC: spec, OPTIMIZER_SPEC: spec.optimizer, LAUNCH_SPEC: spec.launch}
    defaults = {name: RUN_OPTIONS[name].default for name in KEPT if RUN_OPTIONS[name].default is not None}
    assert {name: getattr(held[KEPT[name]], name) for name in defaults} == defaults  # not given: the option's


def test_every_optimizer_field_is_a_run_option():
    """So build_run_spec's one copy fills the optimizer: a new optimizer option is its definition
    (``kept=OPTIMIZER_SPEC``), nothing more."""
    assert OPTIMIZER_OPTIONS == {field.name for field in dataclasses.fields(OptimizerSpec)}


def test_every_parallel_dimension_is_the_run_option_of_its_name_with_its_default():
    """tp, pp, dp and ep are each one option (hwbench.options) held in the spec's parallel under its
    name; a dimension whose option has a fixed default (--ep 1) takes it from the option, not a second
    literal. ``source`` says where tp and pp came from: no option."""
    dimensions = {field.name: field.default for field in dataclasses.fields(ParallelDims) if field.name != "source"}
    assert PARALLEL_OPTIONS == dimensions.keys() and "ep" in PARALLEL_OPTIONS
    fixed = {name: RUN_OPTIONS[name].default for name in PARALLEL_OPTIONS if RUN_OPTIONS[name].default is not None}
    assert fixed and fixed == {name: dimensions[name] for name in fixed}
    spec = build_run_spec(RunOptions(model="tiny"), load_catalog(), check_paths=False)
    assert {name: getattr(spec.parallel, name) for name in fixed} == fixed


def test_an_optimizer_option_given_arrives_in_the_specs_optimizer():
    given = dict(lr=5e-4, min_lr=5e-5, lr_warmup_iters=3, lr_warmup_init=1e-5, lr_decay_iters=50,
                 lr_decay_style="linear", adam_beta1=0.8, adam_beta2=0.95, adam_eps=1e-5, weight_decay=0.2,
                 clip_grad=0.5)
    assert given.keys() | {"lr_warmup_fraction"} == OPTIMIZER_OPTIONS  # every one, the fraction below
    optimizer = build_run_spec(RunOptions(model="tiny", **given), load_catalog(), check_paths=False).optimizer
    assert {name: getattr(optimizer, name) for name in given} == given and optimizer.lr_warmup_fraction is None
    fraction = build_run_spec(RunOptions(model="tiny", lr_warmup_fraction=0.1, lr_decay_iters=50), load_catalog(),
                              check_paths=False).optimizer
    assert (fraction.lr_warmup_fraction, fraction.lr_warmup_iters) == (0.1, 5)  # Megatron's: of the decay iters


def test_runspec_fields_are_its_dataclass_fields():
    # the check above reads RunSpec's annotations: every one of them is a field
    assert set(typing.get_type_hints(RunSpec)) == {field.name for field in dataclasses.fields(RunSpec)}


def _spec_type(path: str):
    """RunSpec's type of ``path`` ("parallel.tp": ParallelDims's tp)."""
    owner = RunSpec
    *sections, name = path.split(".")
    for section in sections:
        owner = typing.get_type_hints(owner)[section]
    return _base_type(typing.get_type_hints(owner)[name])


def test_the_point_key_is_a_projection_of_the_spec_with_its_types():
    key_types = {name: _base_type(hint) for name, hint in typing.get_type_hints(PointKey).items()}
    assert set(PointKey.fields()) == {*FROM_SPEC, *FROM_RUN}
    differ = {name: (_spec_type(path), key_types[name]) for name, path in FROM_SPEC.items()
              if _spec_type(path) != key_types[name]}
    assert not differ, f"the spec's type and PointKey's differ: {differ}"


def test_a_results_point_key_holds_the_specs_values():
    spec = build_run_spec(RunOptions(model="tiny", nproc_per_node=2, pp=2, micro_batch_size=2, seq_length=64,
                                     cross_entropy="chunked"), load_catalog(), check_paths=False)  # pp: a schedule kept
    key = RunResult(run_id="r", status="ok", spec=spec.to_dict(), device={"backend": "cpu"}).point_key
    assert key is not None
    assert {name: getattr(key, name) for name in FROM_SPEC} == {
        name: attrgetter(path)(spec) for name, path in FROM_SPEC.items()}
    assert (key.backend, key.stand_in) == ("cpu", None)
