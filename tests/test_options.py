"""The run-option table (hwbench.options) and the command line as a user meets it:
Megatron's names, defaults that adapt to data parallelism, one vocabulary across
commands, and commands that start without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hwbench.catalog import load_catalog
from hwbench.cli import command_parser, main
from hwbench.commands.run import parse_run_spec
from hwbench.errors import UsageError
from hwbench.options import RUN_OPTIONS, RunOptions
from hwbench.spec import build_run_spec


def test_a_megatron_launch_lines_flags_can_be_pasted():
    spec = parse_run_spec(["--model", "tiny", "--nproc-per-node", "2", "--tensor-model-parallel-size", "2",
                           "--pipeline-model-parallel-size", "1", "--train-iters", "3", "--fp16",
                           "--recompute-activations", "--lr", "2e-4", "--min-lr", "1e-5", "--seed", "7",
                           "--eval-interval", "2", "--eval-iters", "1", "--split", "98,2,0",
                           "--data-path", "synthetic", "--vocab-file", "gpt2-vocab.json", "--merge-file",
                           "gpt2-merges.txt"], check_paths=False)
    assert (spec.parallel.tp, spec.parallel.pp, spec.parallel.dp) == (2, 1, 1)
    assert spec.steps == 3 and spec.precision == "fp16" and spec.recompute is True and spec.seed == 7
    assert spec.optimizer.lr == 2e-4 and spec.optimizer.min_lr == 1e-5
    assert (spec.eval_interval, spec.eval_iters, spec.split, spec.data) == (2, 1, "98,2,0", "synthetic")
    assert (
        parse_run_spec(["--model", "tiny", "--bf16", "--checkpoint-activations"], check_paths=False).precision == "bf16"
    )


@pytest.mark.parametrize(
    "flag,advice",
    [
        ("--sequence-parallel", "not supported"),
        ("--num-layers", "--model"),
        ("--use-flash-attn", "SDPA"),
        ("--deepspeed", "--engine deepspeed"),
    ],
)
def test_a_megatron_flag_hwbench_does_not_take_is_named_with_what_to_use(capsys, flag, advice):
    assert main(["run", "--model", "tiny", flag] + (["24"] if flag == "--num-layers" else [])) == 2
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and flag in line and advice in line


@pytest.mark.parametrize(
    "options,expected",
    [
        ({"model": "small", "nproc_per_node": 2}, (8, 16)),  # neither given: micro 8, global 8 x 2
        ({"model": "small", "nproc_per_node": 2, "dp": 2, "fsdp": True}, (8, 16)),
        ({"model": "small", "nproc_per_node": 2, "engine": "deepspeed", "zero": 2}, (8, 16)),
        ({"model": "tiny", "nproc_per_node": 2}, (4, 8)),  # the workload's 8 already fits 4 x 2: unchanged
        ({"model": "tiny", "nproc_per_node": 3}, (4, 12)),  # rounded up to a multiple of 4 x 3
        ({"model": "small", "nproc_per_node": 2, "micro_batch_size": 2}, (2, 8)),  # micro given: global follows
        ({"model": "small", "nproc_per_node": 2, "global_batch_size": 12}, (6, 12)),  # global given: micro follows
        ({"model": "1.3b", "nproc_per_node": 8}, (8, 32)),  # the published setting is kept
    ],
)
def test_batch_sizes_adapt_to_data_parallelism_when_not_given(options, expected):
    spec = build_run_spec(RunOptions(**options), load_catalog(), check_paths=False)
    assert (spec.micro_batch_size, spec.global_batch_size) == expected


def test_a_batch_combination_the_user_gave_is_still_refused():
    with pytest.raises(UsageError, match="--global-batch-size 10 is not a multiple of --micro-batch-size 4"):
        build_run_spec(
            RunOptions(model="tiny", micro_batch_size=4, global_batch_size=10), load_catalog(), check_paths=False
        )


def test_model_names_match_in_any_case():
    assert build_run_spec(RunOptions(model="1.3B"), load_catalog(), check_paths=False).model == "1.3b"
    assert build_run_spec(RunOptions(model="TINY"), load_catalog(), check_paths=False).model == "tiny"


def test_options_survive_the_trip_to_a_child_process_argv():
    options = RunOptions(
        model="tiny",
        nproc_per_node=2,
        tp=2,
        recompute=False,
        telemetry=False,
        lr=3e-4,
        timeout=60.0,
        data="synthetic",
        precision="bf16",
        fsdp=None,
    )
    assert parse_run_spec(options.to_argv(), check_paths=False) == build_run_spec(
        options, load_catalog(), check_paths=False
    )


def _sample(option):
    """A value of ``option`` other than its default, from its definition."""
    if option.type is bool:
        return not option.default
    if option.choices:
        return next(c for c in reversed(option.choices) if c != option.default)
    if option.name in ("adam_beta1", "adam_beta2"):  # a range no minimum and maximum state: 0 up to 1
        return 0.5
    if option.type in (int, float):
        return option.type(option.maximum if option.maximum is not None else (option.minimum or 0) + 3)
    return {"split": "98,2,0", "rdzv_endpoint": "node0:29400", "device_memory": "24GiB", "target_ppl": "floor*1.2"}.get(
        option.name, f"x-{option.name}"
    )


def test_every_option_survives_the_command_line_with_a_value_of_its_own():
    """Generated from the definitions: a new option is parsed, printed back by to_argv() and
    parsed again without anything else to write."""
    from hwbench.commands.run import options_from_namespace

    _, parser = command_parser("run")
    options = RunOptions(**{name: _sample(o) for name, o in RUN_OPTIONS.items()})
    assert options_from_namespace(parser.parse_args(options.to_argv())) == options
    assert all(value is not None for value in options.given().values()) and len(options.given()) == len(RUN_OPTIONS)


def test_the_help_shows_each_default_from_the_definition(capsys):
    _, parser = command_parser("run")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "timed optimizer steps (default: 20; an integer from 1 to 1000000)" in text
    assert "(default: 1800; seconds > 0, at most 2592000)" in text
    for option in RUN_OPTIONS.values():
        if option.default_text:
            assert f"(default: {option.default_text}" in text, option.name


@pytest.mark.parametrize(
    "values,message",
    [
        ({"tp": [1]}, "--tp [1] is not accepted; give an integer >= 1"),
        ({"steps": "3"}, "--steps '3' is not accepted; give an integer from 1 to 1000000"),
        ({"seq_length": True}, "--seq-length True is not accepted; give an integer >= 1"),
        ({"recompute": "false"}, "--recompute 'false' is not accepted; give true or false"),
        ({"lr": float("nan")}, "--lr nan is not accepted; give a number > 0"),
        ({"zero": 4}, "--zero 4 is not accepted; give one of 0, 1, 2, 3"),
        ({"tpp": 2}, "`tpp` is not a `hwbench run` option; accepted: adam_beta1, adam_beta2, adam_eps, async_save"),
    ],
)
def test_the_api_refuses_a_python_value_of_the_wrong_type_or_range(values, message):
    import hwbench

    with pytest.raises(UsageError) as refused:
        hwbench.run(**values)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    "argv,values",
    [
        (["--steps", "0"], {"steps": 0}),
        (["--tp", "0"], {"tp": 0}),
        (["--telemetry-interval", "90"], {"telemetry_interval": 90}),
        (["--master-port", "0"], {"master_port": 0}),
        (["--engine", "megatron"], {"engine": "megatron"}),
    ],
)
def test_the_api_and_the_command_line_refuse_with_the_same_line(argv, values, capsys):
    assert main(["run", "--quiet", *argv]) == 2
    line = capsys.readouterr().err.strip()
    with pytest.raises(UsageError) as refused:
        RunOptions.from_mapping(values)
    assert line == f"hwbench: error: {refused.value}"


def test_a_number_written_as_text_in_a_suite_is_read_as_the_command_line_reads_it(tmp_path):
    from hwbench.suites.suite import load_suite

    path = tmp_path / "s.yaml"
    path.write_text("defaults: {model: tiny, seq-length: '32', lr: 1e-4}\npoints: [{name: a, recompute: false}]\n")
    point = load_suite(path).points[0]
    assert point.run_options() == RunOptions(model="tiny", seq_length=32, lr=1e-4, recompute=False)
    path.write_text("points: [{name: a, steps: 0}]\n")
    with pytest.raises(UsageError, match=r"points\[0\]: --steps 0 is not accepted; give an integer from 1 to"):
        load_suite(path)
    path.write_text("points: [{name: a, fsdp: 'yes'}]\n")
    with pytest.raises(UsageError, match="--fsdp 'yes' is not accepted; give true or false"):
        load_suite(path)


def test_the_options_page_is_what_the_definitions_generate():
    """docs/options.md is written by `python -m hwbench.options > docs/options.md`."""
    from pathlib import Path

    from hwbench.options import markdown

    page = Path(__file__).resolve().parent.parent / "docs" / "options.md"
    assert page.read_text() == markdown(), "run: python -m hwbench.options > docs/options.md"


def test_every_command_names_the_same_thing_the_same_way():
    """The device kind is --device everywhere; a job's device count is --devices (plan, tune),
    per node --nproc-per-node (run, sweep, k8s); the report's projection has its own name."""
    flags = {}
    for name in ("run", "sweep", "tune", "plan", "k8s", "report"):
        _, parser = command_parser(name)
        flags[name] = {s for a in parser._actions for s in a.option_strings if a.help != "==SUPPRESS=="}
    assert all("--device" in flags[c] for c in ("run", "sweep", "tune", "plan"))
    assert "--backend" not in flags["plan"]
    assert {"--devices"} <= flags["plan"] & flags["tune"]
    assert all("--nproc-per-node" in flags[c] for c in ("run", "sweep", "k8s"))
    assert "--projection-devices" in flags["report"]
    assert {o.flag for o in RUN_OPTIONS.values()} <= flags["run"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["models"],
        ["plan", "--model", "1.3b", "--devices", "8", "--device-memory", "32GiB"],
        ["run", "--help"],
        ["calibrate", "--help"],
    ],
)
def test_commands_that_need_no_device_do_not_import_torch(argv):
    """What keeps `hwbench --help` and `hwbench models` well under a second (docs/performance.md)."""
    code = (
        f"import sys\nfrom hwbench.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "sys.stdout.flush()\nprint('TORCH' if 'torch' in sys.modules else 'NO TORCH', file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "NO TORCH", done.stderr[-2000:]


def test_the_run_table_says_why_a_figure_is_missing_and_names_the_formula():
    import json
    from pathlib import Path

    from hwbench.report.summary import run_summary_rows
    from hwbench.result.model import RunResult

    data = json.loads((Path(__file__).parent / "data" / "compare" / "tiny-cpu.json").read_text())
    rows = dict(run_summary_rows(RunResult.from_dict(data)))
    assert rows["peak memory"].startswith("allocated n/a on CPU: resident set below, resident set ")
    assert rows["TFLOP/s per device"].endswith("(FLOPs formula: megatron-core-v0.7)")  # its name since schema 2


@pytest.mark.parametrize("name", sorted(__import__("hwbench.cli", fromlist=["COMMANDS"]).COMMANDS))
def test_every_commands_help_prints(name, capsys):
    """argparse formats help with %: a default such as slurm's `hwbench-%j.log` must be escaped."""
    _, parser = command_parser(name)
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--help"])
    assert done.value.code == 0
    assert f"usage: hwbench {name}" in capsys.readouterr().out
