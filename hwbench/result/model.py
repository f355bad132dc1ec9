"""The result of one run (`RunResult`), typed: every field hwbench writes, with its type.

A result file may come from another machine or night, truncated, edited by hand or written by a
buggy tool. It is validated once, when it is read (hwbench.result.store), so that every reader can
trust the type of every field, and a bad file is named with its reason instead of a traceback
somewhere below. Written with pydantic (v2) because that checking, which hwbench used to write by
hand, is what pydantic does: each field's type, bounds and nesting, with the failing field's
location in its errors (``metrics.step_time_s.median: must be >= 0``); unknown keys are kept
(``extra="allow"``), so a newer writer's fields survive a read and a write; JSON-shaped data in
and out. Rules (docs/results.md): any field but run_id, status and spec may be absent; numbers
are finite, rates and memory never negative, counts integers a 64-bit counter holds; nothing is
coerced ("12", true or a 400-digit integer where a float belongs is damage, not a value).

What readers need beyond the fields (backend, device model, point key, devices charged,
oversubscription, world size) are properties of `RunResult`, one definition whatever the file's
age: hwbench.result.upgrade brings older files to this shape first.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from operator import attrgetter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from hwbench import RESULT_SCHEMA_VERSION, __version__
from hwbench.fields import (  # noqa: F401  (problem_text, validation_problem: imported from here too)
    MAX_COUNT,
    Count,
    Figure,
    Flag,
    Integer,
    Positive,
    Rate,
    RunId,
    Text,
    problem_text,
    validation_problem,
)
from hwbench.point import EMULATED, FROM_RUN, FROM_SPEC, SIMULATED, PointKey
from hwbench.spec import LaunchSpec, OptimizerSpec, ParallelDims, RunSpec
from hwbench.workload.config import accumulation_steps

Status = Literal["ok", "oom", "failed", "timeout", "invalid", "numerics", "skipped", "not_converged", "storage"]


class Section(BaseModel):
    """A mapping of a result file. Empty (nothing set, nothing extra) is false, as ``{}`` is.

    Fields are read as attributes; a key the model does not declare is in ``model_extra``."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, validate_assignment=True)

    def __bool__(self) -> bool:
        return bool(self.model_fields_set or self.model_extra)

    def __contains__(self, key: object) -> bool:
        # pydantic iterates (name, value) pairs, so `"x" in section` would quietly be False, and a
        # test asserting `"x" not in result.metrics` could never fail: refused instead.
        raise TypeError("a result section is read by attribute (a key it does not declare: model_extra)")

    def dump(self) -> dict[str, Any]:
        """As the file holds it: the fields that were set (read or assigned), and the extra keys."""
        return self.model_dump(exclude_unset=True)


class WithReasons(Section):
    """A section whose null figures have their reason in ``unmeasured`` (figure -> why), a
    field each declares last, where the file has it."""

    def why(self, figure: str) -> str | None:
        """Why ``figure`` was not measured, or None."""
        reason = (getattr(self, "unmeasured", None) or {}).get(figure)
        return None if reason is None else str(reason)


REASONS = dict[str, Any]  # `unmeasured`: figure -> why it is null (text, or a nested mapping)


# --- spec --------------------------------------------------------------------------------------


# The run as requested and resolved: hwbench.spec.RunSpec's fields (and ParallelDims' and LaunchSpec's),
# made into sections here rather than written again, each optional, because a result's spec may be
# partial: a sweep's record of a point whose options were refused holds only `run_args`, and a file of an
# older writer lacks the fields added since. A field holds RunSpec's type (str as Text, bool as Flag,
# float as Figure); one whose absence in an older file meant a value has that value as its default (the
# dataclass's: for a kept option, its default where `absent_means_default`), the others None. mypy reads
# the made fields as Any (a class made at run time is a dynamic base to it).
_HELD = {str: Text, bool: Flag, float: Figure, int: Integer}


def _held_type(hint: Any) -> Any:
    """A RunSpec field's type as the result holds it: None left out, a plain type as its strict one."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
    return _HELD.get(hint, hint)


def _optional_fields(dataclass: type, absent: dict[str, Any], nested: dict[type, Any] | None = None) -> type[Section]:
    """A Section of ``dataclass``'s fields, in its order: each optional, with ``absent``'s value or None
    as its default; a field of a dataclass type held as ``nested`` says (a section, or a mapping)."""
    hints = typing.get_type_hints(dataclass, include_extras=True)
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(dataclass):
        kind = _held_type(hints[field.name])
        kind = (nested or {}).get(kind, kind)
        if isinstance(kind, type) and issubclass(kind, Section):
            fields[field.name] = (kind, Field(default_factory=kind))
        elif field.name in absent:
            fields[field.name] = (kind, absent[field.name])
        else:
            fields[field.name] = (kind | None, None)
    return create_model(f"{dataclass.__name__}Fields", __base__=Section, __module__=__name__, **fields)


class Parallel(_optional_fields(ParallelDims, {"tp": 1, "pp": 1, "dp": 1, "ep": 1})):  # type: ignore[misc]
    """Degrees of parallelism, and where tp and pp came from."""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def layout(self) -> str:
        """ "TP2 PP1 DP4", with " EP2" where expert parallelism splits the experts over dp."""
        return f"TP{self.tp} PP{self.pp} DP{self.dp}" + (f" EP{self.ep}" if self.ep > 1 else "")


def _absence_meant(dataclass: type) -> dict[str, Any]:
    """What an older result's absent field meant: the dataclass's default where it has one (None: unknown)."""
    return {field.name: field.default for field in dataclasses.fields(dataclass)
            if field.default is not dataclasses.MISSING and field.default is not None}


class SpecLaunch(_optional_fields(LaunchSpec, _absence_meant(LaunchSpec))):  # type: ignore[misc]
    """How the run's processes are started."""


class Spec(_optional_fields(  # type: ignore[misc]
        RunSpec, _absence_meant(RunSpec),
        {ParallelDims: Parallel, LaunchSpec: SpecLaunch, OptimizerSpec: dict[str, Any]})):
    """The run as requested and resolved (RunSpec's fields; run_spec() is the RunSpec)."""

    run_args: list[Text] | None = None  # a sweep's record of a point whose options were refused

    @property
    def gradient_accumulation_steps(self) -> int | None:
        """RunSpec's, or None where the spec lacks a batch size (a refused point's record)."""
        if self.global_batch_size is None or self.micro_batch_size is None:
            return None
        return accumulation_steps(self.global_batch_size, self.micro_batch_size, self.parallel.dp)

    def run_spec(self) -> RunSpec:
        """The typed RunSpec (KeyError or TypeError when the spec is partial)."""
        return RunSpec.from_dict(self.model_dump())


# --- what ran: workload, device, engine, launch --------------------------------------------------


class Workload(Section):
    """The model trained: its shape, parameter counts and catalog entry."""

    name: Text | None = None
    title: Text | None = None
    catalog_path: Text | None = None
    published: dict[str, Any] | None = None
    num_layers: Positive | None = None
    hidden_size: Positive | None = None
    num_attention_heads: Positive | None = None
    max_position_embeddings: Positive | None = None
    vocab_size: Positive | None = None
    make_vocab_size_divisible_by: Positive | None = None
    # the architecture's switches (hwbench.workload.config.GPTConfig); absent in a result written
    # before the Llama architecture: Megatron GPT-2's
    num_query_groups: Positive | None = None
    ffn_hidden_size: Positive | None = None
    swiglu: bool | None = None
    normalization: Text | None = None
    norm_epsilon: Rate | None = None
    position_embedding_type: Text | None = None
    rotary_base: Rate | None = None
    rope_scaling: dict[str, float] | None = None
    add_bias_linear: bool | None = None
    untie_embeddings_and_output_weights: bool | None = None
    # QK-norm, the head size and the mixture of experts (absent before them: none, h / heads, a dense MLP)
    kv_channels: Positive | None = None
    qk_layernorm: bool | None = None
    num_experts: Positive | None = None
    moe_router_topk: Positive | None = None
    moe_ffn_hidden_size: Positive | None = None
    moe_shared_expert_intermediate_size: Positive | None = None
    moe_router_score_function: Text | None = None
    moe_router_pre_softmax: bool | None = None
    moe_aux_loss_coeff: Rate | None = None
    moe_expert_capacity_factor: Rate | None = None
    moe_layer_freq: Positive | None = None
    padded_vocab_size: Positive | None = None
    parameters: Count | None = None
    parameters_embedding: Count | None = None
    parameters_non_embedding: Count | None = None
    parameters_active: Count | None = None


class MeasuredCeiling(Section):
    """The GEMM rate `hwbench calibrate` measured, and where it came from."""

    flops: Rate | None = None
    cv: Rate | None = None
    copy_bytes_per_s: Rate | None = None
    size: Count | None = None
    precision: Text | None = None
    measured_at: Text | None = None
    device_model: Text | None = None
    driver: Text | None = None
    torch_version: Text | None = None
    hwbench_version: Text | None = None
    store: Text | None = None


class Device(Section):
    """The device, its catalog entry, peak and measured ceiling."""

    backend: Text | None = None
    dist_backend: Text | None = None
    device_model: Text | None = None
    torch_device: Text | None = None
    catalog_entry: Text | None = None
    catalog_path: Text | None = None
    catalog_match: Text | None = None
    peak_flops_precision: Text | None = None
    peak_flops_source: Text | None = None
    peak_flops_read: Text | None = None
    peak_flops_basis: Text | None = None
    peak_flops_unmeasured: Text | None = None
    measured_ceiling_unmeasured: Text | None = None
    price_source: Text | None = None
    price_date: Text | None = None
    gfx_arch: Text | None = None
    hpu_mode: Text | None = None
    hpu_mode_basis: Text | None = None
    peak_flops_listed_with_sparsity: Flag | None = None
    peak_flops: Rate | None = None
    tdp_watts: Rate | None = None
    price_usd_per_hour: Rate | None = None
    device_count: Count | None = None
    memory_capacity_bytes: Count | None = None
    simulated: Flag | None = None
    # --precision fp8: why FP8 ran emulated on this device (the CPU), None on FP8 units; and the FP8 dense peak
    # beside the BF16 one its MFU is stated against (peak_flops), with its provenance or why there is none
    fp8_emulated: Text | None = None
    fp8_peak_flops: Rate | None = None
    fp8_peak_flops_basis: Text | None = None
    fp8_peak_flops_unmeasured: Text | None = None
    measured_ceiling: MeasuredCeiling | None = None
    tuning: dict[str, Any] | None = None
    auto_passed_over: list[Text] | None = None


class Fp8LayerGroup(Section):
    """Linear layers of one name pattern (``blocks.*.mlp.fc1``), and why they stayed in high precision."""

    layers: Text | None = None
    count: Count | None = None
    why: Text | None = None


class Fp8Conversion(Section):
    """Which GEMMs of a --precision fp8 run ran in FP8 (hwbench.engine.float8)."""

    recipe: Text | None = None
    emulated: Text | None = None  # why FP8 ran emulated (the CPU); None: on the device's FP8 units
    converted_layers: Count | None = None
    converted: list[Fp8LayerGroup] | None = None
    high_precision_layers: Count | None = None
    high_precision: list[Fp8LayerGroup] | None = None
    gemms: Text | None = None


class Engine(Section):
    """The engine that trained and how it was set up."""

    name: Text | None = None
    data_parallel: Text | None = None
    pipeline_schedule: Text | None = None
    zero_stage: Count | None = None
    fp8: Fp8Conversion | None = None


class Launch(Section):
    """How the processes were started."""

    launcher: Text | None = None
    node_rank: Count | None = None
    nnodes: Positive | None = None
    nproc_per_node: Positive | None = None


# --- figures -----------------------------------------------------------------------------------


class StepTime(Section):
    """Statistics of step times, in seconds."""

    n: Count | None = None
    mean: Rate | None = None
    median: Rate | None = None
    p10: Rate | None = None
    p90: Rate | None = None
    min: Rate | None = None
    max: Rate | None = None
    stdev: Rate | None = None
    cv: Rate | None = None


class Memory(WithReasons):
    """Peak memory of the timed steps."""

    peak_allocated_bytes: Count | None = None
    peak_reserved_bytes: Count | None = None
    capacity_bytes: Count | None = None
    alloc_retries: Count | None = None
    ooms: Count | None = None
    heap_trims: Count | None = None
    peak_allocated_rank: Count | None = None
    source: Text | None = None
    unmeasured: REASONS | None = None


class TelemetryDevice(WithReasons):
    """One sampled device over the window."""

    index: Count | None = None
    chip: Count | None = None
    package: Count | None = None
    name: Text | None = None
    host: Text | None = None
    uuid: Text | None = None
    pci_bus_id: Text | None = None
    identified_by: Text | None = None
    energy_method: Text | None = None
    energy_scope: Text | None = None
    energy_warning: Text | None = None
    power_method: Text | None = None
    energy_j: Rate | None = None
    power_w_mean: Rate | None = None
    power_w_max: Rate | None = None
    energy_resolution_uj: Rate | None = None
    temperature_c_mean: Figure | None = None
    temperature_c_max: Figure | None = None
    utilization_percent_mean: Figure | None = None
    utilization_percent_max: Figure | None = None
    memory_used_mib_mean: Figure | None = None
    memory_used_mib_max: Figure | None = None
    throttle_reasons: list[Text] | None = None
    unmeasured: REASONS | None = None


def sum_known(values) -> float | None:
    """The sum, None when a value is unknown or there is none."""
    known = list(values)
    return sum(known) if known and None not in known else None


class Telemetry(Section):
    """Device sensors during the timed region (several ranks: each device once)."""

    source: Text | None = None
    reason: Text | None = None
    available: Flag | None = None
    devices: list[TelemetryDevice] | None = None
    energy_j: Rate | None = None
    power_w_mean_total: Rate | None = None
    interval_s: Rate | None = None
    window_s: Rate | None = None
    samples: Count | None = None
    ranks: Count | None = None
    ranks_available: Count | None = None
    errors: list[Any] | None = None

    @property
    def total_energy_j(self) -> float | None:
        """Energy of every device over the window: the merged total, else the sum of the
        devices' when each has one; None when a device's is unknown."""
        return self.energy_j if self.energy_j is not None else sum_known(d.energy_j for d in self.devices or [])

    @property
    def total_power_w(self) -> float | None:
        """Mean power summed over the devices, None when a device's is unknown."""
        if self.power_w_mean_total is not None:
            return self.power_w_mean_total
        return sum_known(d.power_w_mean for d in self.devices or [])


class HostSyncs(Section):
    """How often the host waited for the device in the timed window."""

    count: Count
    where: list[Text] | None = None
    rank: Count | None = None
    ranks_counted: Count | None = None


class ValidationPoint(Section):
    """One validation."""

    step: Count
    loss: Figure | None = None
    ppl: Figure | None = None
    tokens: Count | None = None
    iters: Count | None = None
    elapsed_s: Rate | None = None


class TimeToTarget(WithReasons):
    """Time to a target quality (--target-ppl / --target-loss)."""

    metric: Text | None = None
    given: Text | None = None
    value: Figure | None = None
    reached: Flag | None = None
    step: Count | None = None
    samples: Count | None = None
    tokens: Count | None = None
    time_s: Rate | None = None
    init_s: Rate | None = None
    scored_time_s: Rate | None = None
    device_hours: Rate | None = None
    energy_j: Rate | None = None
    cost_usd: Rate | None = None
    unmeasured: REASONS | None = None


# The phases of metrics.goodput, in order, with the label the summary and the report give each:
# hwbench/harness/goodput.py charges every moment of a run to one of them.
GOODPUT_PHASES = {"init": "init", "checkpoint_load": "load", "warmup": "warm-up", "timed_steps": "timed steps",
                  "eval": "validation", "checkpoint_save": "saves", "restarts": "restarts", "other": "rest"}


class Goodput(Section):
    """Where the run's wall time went, on one rank's host clock: the training steps (warm-up and
    timed) against initialisation, checkpoint loads and saves, validation, restarts and the rest."""

    rank: Count | None = None
    total_s: Rate | None = None
    goodput: Rate | None = None
    init_s: Rate | None = None
    checkpoint_load_s: Rate | None = None
    warmup_s: Rate | None = None
    timed_steps_s: Rate | None = None
    eval_s: Rate | None = None
    checkpoint_save_s: Rate | None = None
    restarts_s: Rate | None = None
    other_s: Rate | None = None
    shares: dict[str, Rate | None] | None = None


class SteadyState(WithReasons):
    """How the step time settled and drifted over the timed window."""

    settled_after_steps: Count | None = None
    settle_window: Count | None = None
    drift: Figure | None = None
    drifting: Flag | None = None
    settle_tolerance: Rate | None = None
    drift_threshold: Rate | None = None
    first_quarter_median_s: Rate | None = None
    last_quarter_median_s: Rate | None = None
    throttle_reasons: list[Text] | None = None
    unmeasured: REASONS | None = None


class Straggler(Section):
    """The rank with the slowest median step."""

    rank: Count | None = None
    median_step_time_s: Rate | None = None
    median_of_ranks_s: Rate | None = None
    ratio: Rate | None = None


class FormulaFigures(WithReasons):
    """The figures of one FLOPs formula (metrics.by_formula); null, with the reason, where the
    formula cannot count the model (hwbench.workload.flops.uncounted)."""

    flops_per_iteration: Rate | None = None
    tflops_per_device: Rate | None = None
    mfu: Rate | None = None
    unmeasured: REASONS | None = None


class MoeRouting(Section):
    """A mixture-of-experts run's routing over its timed steps (every data-parallel rank's tokens)."""

    moe_layers: Positive | None = None
    experts: Positive | None = None
    top_k: Positive | None = None
    tokens_per_expert: list[list[Count]] | None = None  # per MoE layer, per expert: assignments received
    imbalance_median: Rate | None = None  # per step: the busiest expert's assignments / the mean, worst layer
    imbalance_max: Rate | None = None
    dropped_tokens: Count | None = None  # assignments over an expert's capacity
    dropped_fraction: Rate | None = None
    aux_loss_mean: Rate | None = None  # the load-balancing loss added to the objective, per step


class ExpertParallelFigures(Section):
    """An expert-parallel run's all-to-alls (dispatch and combine, forward and backward) over its
    timed steps, every rank's (hwbench.harness.routing.expert_parallel_figures)."""

    ep: Positive | None = None
    all_to_all_share: Rate | None = None  # time in the all-to-alls over step time, every rank's timed steps summed
    all_to_all_share_max: Rate | None = None  # the share of the rank with the largest one
    all_to_all_share_max_rank: Count | None = None
    all_to_all_s_median: Rate | None = None  # per timed step: seconds in the all-to-alls, mean over ranks


class Metrics(WithReasons):
    """The figures of the timed steps."""

    samples_per_s: Rate | None = None
    tokens_per_s: Rate | None = None
    tokens_per_s_per_device: Rate | None = None
    tflops_per_device: Rate | None = None
    mfu: Rate | None = None
    mfu_measured_ceiling: Rate | None = None
    mfu_fp8_peak: Rate | None = None  # --precision fp8: against the FP8 dense peak (mfu: the BF16 one)
    flops_per_iteration: Rate | None = None
    timed_wall_time_s: Rate | None = None
    flops_formula: Text | None = None
    flops_formula_expression: Text | None = None
    flops_counts: Text | None = None  # what the FLOPs count: every weight, or an MoE model's active parameters
    by_formula: dict[str, FormulaFigures] | None = None
    world_size: Positive | None = None
    timed_steps: Count | None = None
    valid_ppl_step: Count | None = None
    skipped_steps: Count | None = None
    step_time_s: StepTime | None = None
    memory: Memory | None = None
    loss_start: Figure | None = None
    loss_end: Figure | None = None
    loss_floor: Figure | None = None
    valid_loss: Figure | None = None
    valid_ppl: Figure | None = None
    ppl_floor: Figure | None = None
    validation: list[ValidationPoint] | None = None
    time_to_target: TimeToTarget | None = None
    goodput: Goodput | None = None
    steady_state: SteadyState | None = None
    straggler: Straggler | None = None
    host_syncs: HostSyncs | None = None
    telemetry: Telemetry | None = None
    data: dict[str, Any] | None = None
    routing: MoeRouting | None = None
    expert_parallel: ExpertParallelFigures | None = None
    unmeasured: REASONS | None = None


class Step(Section):
    """One optimizer step."""

    step: Count
    phase: Text | None = None
    time_s: Rate | None = None
    skipped: Flag | None = None
    loss: Figure | None = None
    grad_norm: Figure | None = None
    lr: Figure | None = None
    loss_scale: Figure | None = None
    # a mixture-of-experts model's routing in this step (hwbench.harness.routing)
    moe_aux_loss: Rate | None = None
    moe_imbalance: Rate | None = None
    moe_dropped_tokens: Count | None = None
    all_to_all_s: Rate | None = None  # expert parallelism: seconds in the step's all-to-alls, mean over ranks


class CheckpointRank(Section):
    """One rank's part of a checkpoint save or load."""

    rank: Count
    bytes: Count | None = None
    wall_time_s: Rate | None = None
    gb_per_s: Rate | None = None
    stall_s: Rate | None = None


class CheckpointOperation(Section):
    """One save or load over every rank: the bytes of all, the slowest rank's time."""

    iteration: Count | None = None
    path: Text | None = None
    timed: Flag | None = None
    bytes: Count | None = None
    wall_time_s: Rate | None = None
    gb_per_s: Rate | None = None
    stall_s: Rate | None = None
    ranks: list[CheckpointRank] | None = None


class Restart(Section):
    """A torchrun restart: where it resumed, what the failure cost."""

    attempt: Positive | None = None
    resumed_from_iteration: Count | None = None
    reached_iteration: Count | None = None
    steps_lost: Count | None = None
    time_lost_s: Rate | None = None


class Checkpoints(WithReasons):
    """The run's checkpoint saves and loads, measured, and its restarts."""

    save_dir: Text | None = None
    load: Text | None = None
    latest: Text | None = None
    save_interval: Positive | None = None
    async_save: Flag | None = None
    saves: list[CheckpointOperation] | None = None
    loads: list[CheckpointOperation] | None = None
    save_bytes: Count | None = None
    save_gb_per_s: Rate | None = None
    save_stall_s: Rate | None = None
    stall_s_total: Rate | None = None
    stall_fraction: Rate | None = None
    stall_s_per_hour: Rate | None = None
    restarts: list[Restart] | None = None
    unmeasured: REASONS | None = None


# --- where it ran -------------------------------------------------------------------------------


class HwbenchGit(Section):
    """The hwbench checkout the code ran from."""

    commit: Text | None = None
    reason: Text | None = None
    dirty: Flag | None = None


class SlurmJob(Section):
    """The Slurm job the run ran in."""

    nnodes: Count | None = None
    ntasks: Count | None = None
    job_id: Text | None = None
    step_id: Text | None = None
    nodelist: Text | None = None
    partition: Text | None = None
    cluster: Text | None = None
    account: Text | None = None


class PreflightCheck(Section):
    """One check of `hwbench preflight`: its status and reading."""

    name: Text
    status: Literal["ok", "warning", "failure"] | None = None
    reading: Text | None = None
    value: Text | None = None
    reason: Text | None = None


class Preflight(Section):
    """The machine checked before the run (hwbench/harness/preflight.py)."""

    checked_at: Text | None = None
    device: Text | None = None
    source: Text | None = None
    worst: Text | None = None
    duration_s: Rate | None = None
    checks: list[PreflightCheck] | None = None


class Environment(Section):
    """The environment fingerprint."""

    host: Text | None = None
    os: Text | None = None
    machine: Text | None = None
    python: Text | None = None
    hwbench_version: Text | None = None
    torch_version: Text | None = None
    torch_npu_version: Text | None = None
    deepspeed_version: Text | None = None
    backend: Text | None = None
    driver_version: Text | None = None
    cuda_version: Text | None = None
    nccl_version: Text | None = None
    cann_version: Text | None = None
    hccl_version: Text | None = None
    rocm_version: Text | None = None
    hip_version: Text | None = None
    rccl_version: Text | None = None
    habana_frameworks_version: Text | None = None
    hpu_mode: Text | None = None
    oversubscribed_reason: Text | None = None
    devices_used_basis: Text | None = None
    hwbench_git: HwbenchGit | None = None
    simulated: Flag | None = None
    oversubscribed: Flag | None = None
    tuning: dict[str, Any] | None = None
    device_models: list[Text] | None = None
    gfx_arch: list[Text | None] | None = None
    compute_units: list[Count | None] | None = None
    device_count: Count | None = None
    cpu_cores_usable: Count | None = None
    devices_used: Count | None = None
    cudnn_version: Integer | None = None
    threads_per_rank: Positive | None = None
    slurm: SlurmJob | None = None
    preflight: Preflight | None = None

    def value_text(self, field: str) -> str | None:
        """One field as comparable text (a mapping as sorted key=value pairs); None when unknown."""
        value = getattr(self, field) if field in type(self).model_fields else (self.model_extra or {}).get(field)
        if isinstance(value, BaseModel):
            value = value.model_dump(exclude_unset=True)
        if isinstance(value, dict):
            return ", ".join(f"{key}={value[key]}" for key in sorted(value))
        return None if value is None else str(value)


class RankPlacement(Section):
    """Where a rank ran."""

    threads: Positive | None = None
    usable_cores: Count | None = None
    cpus: Text | None = None
    devices: list[Text] | None = None


class NodePlacement(Section):
    """Where a host's ranks ran, judged together."""

    threads_per_rank: list[Positive] | None = None
    usable_cores: Count | None = None
    devices: list[Text] | None = None
    oversubscribed: Flag | None = None
    oversubscribed_reason: Text | None = None


class RankSummary(Section):
    """One rank's own figures; for a failed run, what the launcher knows of it (its heartbeat)."""

    rank: Count
    local_rank: Count | None = None
    node_rank: Count | None = None
    pid: Count | None = None
    last_step: Count | None = None
    host: Text | None = None
    phase: Text | None = None
    signal: Text | None = None
    error: Text | None = None
    coordinates: dict[str, Count | None] | None = None
    memory: Memory | None = None
    step_time_s: StepTime | None = None
    telemetry: Telemetry | None = None
    placement: RankPlacement | None = None
    exitcode: Integer | None = None


class NodeSummary(Section):
    """One node: its rank, host, ranks and environment."""

    node_rank: Count
    host: Text | None = None
    ranks: list[Count] = []
    environment: Environment | None = None
    placement: NodePlacement | None = None


class RunError(Section):
    """What went wrong."""

    rank: Count | None = None
    local_rank: Count | None = None
    exitcode: Integer | None = None
    type: Text | None = None
    message: Text | None = None
    traceback: Text | None = None
    signal: Text | None = None
    log_tail: Text | None = None
    slurm_state: Text | None = None
    slurm_job_id: Text | None = None


# --- the profile (--profile) -------------------------------------------------------------------

# The categories of a profiled step (hwbench.result.breakdown), in order, with the label the summary
# and the report give each. Every moment of a profiled step on the rank's timeline is charged to
# exactly one: communication here is the exposed part (nothing else ran); the whole of it, hidden
# under compute or not, is TimeBreakdown.communication_s.
BREAKDOWN_CATEGORIES = {"matmul": "GEMMs", "attention": "attention", "other_compute": "other compute",
                        "exposed_communication": "exposed comm.", "memory_copy": "copies",
                        "optimizer": "optimizer", "data_loading": "data", "host_idle": "host/idle"}


class TimeBreakdown(WithReasons):
    """One rank's profiled steps: seconds per step (the mean over the profiled steps) in each
    category of BREAKDOWN_CATEGORIES, which sum to step_s; and each one's share of the step."""

    rank: Count | None = None
    timeline: Text | None = None  # what the categories partition: the main thread's CPU ops, or device kernels
    trace: Text | None = None  # the rank's trace file, relative to the result's folder
    steps: Count | None = None
    step_s: Rate | None = None
    matmul_s: Rate | None = None
    attention_s: Rate | None = None
    other_compute_s: Rate | None = None
    exposed_communication_s: Rate | None = None
    memory_copy_s: Rate | None = None
    optimizer_s: Rate | None = None
    data_loading_s: Rate | None = None
    host_idle_s: Rate | None = None
    communication_s: Rate | None = None  # all of it, hidden under compute or not (>= exposed)
    shares: dict[str, Rate] | None = None  # category -> its seconds / step_s
    unmeasured: REASONS | None = None

    def seconds(self, category: str) -> float | None:
        """The seconds per step of one of BREAKDOWN_CATEGORIES."""
        value = getattr(self, f"{category}_s")
        return None if value is None else float(value)


class WaitStraggler(Section):
    """The rank the others wait for in the profiled steps: the one that spent least time waiting in
    collectives, when the other ranks' median wait exceeds its own by more than the threshold."""

    rank: Count | None = None
    wait_s: Rate | None = None  # its exposed communication per profiled step
    peers_wait_s: Rate | None = None  # the median of the other ranks'
    lag_s: Rate | None = None  # peers_wait_s - wait_s: what the others lose to it per step
    lag_share: Rate | None = None  # lag_s over the median profiled step


class Profile(WithReasons):
    """--profile: torch.profiler over extra steps after the timed window (never in the timed
    statistics), a trace per rank beside the result, each rank's breakdown and the straggler."""

    steps: list[Count] | None = None  # the profiled steps' numbers (after the timed ones)
    profiler_warmup_steps: Count | None = None  # run under the profiler before them, discarded
    trace_dir: Text | None = None  # relative to the result's folder
    traces: list[Text] | None = None  # one per rank, relative to the result's folder
    sum_tolerance: Rate | None = None  # the categories sum to the step within this fraction
    ranks: list[TimeBreakdown] | None = None
    straggler_threshold: Rate | None = None  # lag_share above which a rank is named
    straggler: WaitStraggler | None = None  # None: nobody held the others back (or one rank)
    unmeasured: REASONS | None = None


class SweepRecord(Section):
    """The sweep that ran the point: suite, point, repeat, resume key."""

    suite: Text | None = None
    suite_path: Text | None = None
    point: Text | None = None
    key: Text | None = None
    repeat: Count | None = None
    repeats: Count | None = None


# --- the result ---------------------------------------------------------------------------------

ONE_SOCKET_PER_NODE = "assumed: one CPU socket per node (the result does not record devices_used)"


class RunResult(Section):
    """One run's result: the JSON file hwbench writes (docs/results.md)."""

    schema_version: Integer = RESULT_SCHEMA_VERSION
    run_id: RunId
    status: Status
    spec: Spec
    workload: Workload = Field(default_factory=Workload)
    device: Device = Field(default_factory=Device)
    metrics: Metrics = Field(default_factory=Metrics)
    steps: list[Step] = Field(default_factory=list)
    ranks: list[RankSummary] = Field(default_factory=list)
    engine: Engine = Field(default_factory=Engine)
    launch: Launch = Field(default_factory=Launch)
    environment: Environment = Field(default_factory=Environment)
    nodes: list[NodeSummary] = Field(default_factory=list)
    sweep: SweepRecord | None = None
    checkpoint: Checkpoints | None = None  # saves, loads and restarts (--save, --load, --max-restarts)
    profile: Profile | None = None  # --profile: where a step's time goes, per rank (docs/methodology.md)
    error: RunError | None = None
    warnings: list[Text] = []
    started_at: Text = ""
    finished_at: Text = ""
    hwbench_version: Text = __version__

    # the file's mapping in and out, and the facts derived from its fields

    def model_post_init(self, context: Any) -> None:
        # every top-level field is written, set or not (an empty section as {})
        self.__pydantic_fields_set__.update(type(self).model_fields)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """A result from the mapping a file holds, of any schema version this hwbench reads
        (hwbench.result.upgrade); ValidationError when it does not fit."""
        from hwbench.result.upgrade import upgrade

        return cls.model_validate(upgrade(data))

    def to_dict(self) -> dict[str, Any]:
        """The mapping the file holds, schema_version first (so `head` on a file shows what it is)."""
        return self.dump()

    # --- derived facts: one definition for every reader ---

    @property
    def backend(self) -> str | None:
        """The backend it ran on (a kind of hwbench.device.kinds); what was asked for when it never ran."""
        return self.device.backend or self.environment.backend or self.spec.device

    @property
    def device_model(self) -> str | None:
        return self.device.device_model or next(iter(self.environment.device_models or []), None)

    @property
    def world_size(self) -> int:
        return self.metrics.world_size or self.spec.parallel.world_size

    @property
    def point_key(self) -> PointKey | None:
        """The benchmark point it measured; None without a resolved spec (a sweep's record of a
        point whose options `hwbench run` refused)."""
        spec = self.spec
        if spec.model is None:
            return None
        return PointKey(**{name: attrgetter(path)(spec) for name, path in FROM_SPEC.items()},
                        **{name: getattr(self, name) for name in FROM_RUN})

    @property
    def stand_in(self) -> str | None:
        """What ran in place of the device's own path (PointKey.stand_in): SIMULATED (a stand-in
        runtime on the host), EMULATED (FP8 computed without FP8 units), or None. Either keeps the
        run out of every comparison, price, projection and history series of the real device's."""
        if self.simulated:
            return SIMULATED
        return EMULATED if self.device.fp8_emulated else None

    @property
    def simulated(self) -> bool:
        """Whether a stand-in ran the device's code path on the host (hwbench/device/base.py):
        as the device recorded it, or, for a run that failed before describing its device, the
        environment."""
        return bool(self.device.simulated or self.environment.simulated)

    @property
    def devices_charged(self) -> int:
        """The devices its cost is charged for (devices_charged_basis says how they were counted)."""
        return self._devices_charged()[0]

    @property
    def devices_charged_basis(self) -> str:
        return self._devices_charged()[1]

    def _devices_charged(self) -> tuple[int, str]:
        """What the run recorded (environment.devices_used); else ranks that may share a CPU
        socket are one device per node, and a GPU or NPU run one device per rank."""
        used = self.environment.devices_used
        if used:
            return used, self.environment.devices_used_basis or "recorded by the run (environment.devices_used)"
        if self.backend == "cpu":
            return self.spec.launch.nnodes, ONE_SOCKET_PER_NODE
        return self.world_size, "one device per rank (world size)"

    @property
    def oversubscribed(self) -> bool | None:
        """Whether its ranks competed for cores or devices (None: unknown; oversubscribed_reason says why)."""
        return self._oversubscription()[0]

    @property
    def oversubscribed_reason(self) -> str | None:
        return self._oversubscription()[1]

    def _oversubscription(self) -> tuple[bool | None, str | None]:
        """What the run recorded; else, on the CPU, ranks per node x threads per rank against the
        usable cores; else unknown."""
        environment = self.environment
        if environment.oversubscribed is not None:
            return environment.oversubscribed, environment.oversubscribed_reason if environment.oversubscribed else None
        if self.backend != "cpu":
            return None, "not recorded by the run"
        cores, threads = environment.cpu_cores_usable, self._threads_per_rank()
        if cores is None or threads is None:
            return None, "the run recorded no usable cores or threads per rank"
        ranks = self.spec.launch.nproc_per_node
        if ranks * threads > cores:
            return True, f"{ranks} ranks x {threads} threads per rank on {cores} usable cores"
        return False, None

    def _threads_per_rank(self) -> int | None:
        for value in (
            self.environment.threads_per_rank,
            (self.environment.tuning or {}).get("intra_op_threads"),
            (self.device.tuning or {}).get("intra_op_threads"),
        ):
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value
        return None
