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

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, create_model

from hwbench import RESULT_SCHEMA_VERSION, __version__
from hwbench.point import PointKey

if TYPE_CHECKING:
    from hwbench.spec import RunSpec

Status = Literal["ok", "oom", "failed", "timeout", "invalid", "numerics", "skipped", "not_converged", "storage"]
MAX_COUNT = 2 ** 63 - 1  # what a 64-bit counter holds; SQLite's integers too

Figure = Annotated[float, Strict()]  # a measured figure: finite (the models refuse NaN and infinities)
Rate = Annotated[float, Strict(), Field(ge=0)]  # samples/s, FLOP/s, watts, joules, seconds: never negative
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, Strict(), Field(ge=1, le=MAX_COUNT)]
Integer = Annotated[int, Strict(), Field(ge=-MAX_COUNT, le=MAX_COUNT)]
Text = Annotated[str, Strict()]
Flag = Annotated[bool, Strict()]


class Section(BaseModel):
    """A mapping of a result file. Empty (nothing set, nothing extra) is false, as ``{}`` is.

    ``section["name"]`` and ``section.get("name")`` read a field as schema 1's dict sections
    were read, for code not yet moved to attributes; new code reads attributes."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, validate_assignment=True)

    def __bool__(self) -> bool:
        return bool(self.model_fields_set or self.model_extra)

    def get(self, key: str, default: Any = None) -> Any:
        value = self[key] if key in self else None
        return default if value is None else value

    def __getitem__(self, key: str) -> Any:
        if key in type(self).model_fields:
            return getattr(self, key)
        if self.model_extra and key in self.model_extra:
            return self.model_extra[key]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key in self.model_fields_set or bool(self.model_extra and key in self.model_extra)

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


def fields(kind: Any, names: str) -> dict[str, Any]:
    """Fields of one type, their names separated by spaces."""
    return dict.fromkeys(names.split(), kind)


def section(name: str, doc: str, base: type[Section] = Section, /, **types: Any) -> Any:
    """A section of a result: each field null or absent (None) unless given as (type, default)."""
    declared = {key: kind if isinstance(kind, tuple) else (kind | None, None) for key, kind in types.items()}
    return create_model(name, __base__=base, __module__=__name__, __doc__=doc, **declared)


REASONS = dict[str, Any]  # `unmeasured`: figure -> why it is null (text, or a nested mapping)


# --- spec --------------------------------------------------------------------------------------


class _Layout(Section):
    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


Parallel = section("Parallel", "Degrees of parallelism, and where tp and pp came from.", _Layout,
                   **fields((Positive, 1), "tp pp dp"), source=Text)
SpecLaunch = section("SpecLaunch", "How the run's processes are started.", nnodes=(Positive, 1),
                     nproc_per_node=(Positive, 1), node_rank=(Count, 0), master_port=Count, timeout_s=Rate,
                     max_restarts=Count,
                     under_torchrun=Flag, **fields(Text, "master_addr rdzv_endpoint"))


class _Requested(Section):
    def run_spec(self) -> RunSpec:
        """The typed RunSpec (KeyError or TypeError when the spec is partial)."""
        from hwbench.spec import RunSpec

        return RunSpec.from_dict(self.model_dump())


# The run as requested and resolved: hwbench.spec.RunSpec's fields, as a pydantic model of the same
# fields rather than the RunSpec itself, because a result's spec may be partial: a sweep's record of
# a point whose options were refused holds only `run_args`, and a file of an older writer lacks the
# fields added since. Defaults are what a field's absence meant before it existed.
Spec = section(
    "Spec", "The run as requested and resolved (RunSpec's fields; run_spec() is the RunSpec).", _Requested,
    **fields(Text, "model device precision pp_schedule data split flops_formula out_dir settings settings_choice save "
                   "load"), save_interval=Positive, async_save=Flag,
    device_memory_bytes=Count,
    **fields(Positive, "micro_batch_size global_batch_size seq_length steps threads_per_rank max_positions"),
    **fields(Count, "warmup seed initial_scale_power eval_interval eval_iters"),
    **fields(Flag, "recompute compile telemetry"), loss_scale=Figure, telemetry_interval_s=Rate,
    parallel=(Parallel, Field(default_factory=Parallel)), launch=(SpecLaunch, Field(default_factory=SpecLaunch)),
    engine=(Text, "native"), zero_stage=(Count, 0), fsdp=(Flag, False), fused_qkv=(Flag, False),
    cross_entropy=(Text, "standard"), optimizer=dict[str, Any],
    run_args=list[Text])  # a sweep's record of a point `hwbench run` refused: its arguments

# --- what ran: workload, device, engine, launch --------------------------------------------------

Workload = section("Workload", "The model trained: its shape, parameter counts and catalog entry.",
                   **fields(Text, "name title catalog_path"), published=dict[str, Any],
                   **fields(Positive, "num_layers hidden_size num_attention_heads max_position_embeddings vocab_size "
                                      "padded_vocab_size"),
                   **fields(Count, "parameters parameters_embedding parameters_non_embedding"))
MeasuredCeiling = section("MeasuredCeiling", "The GEMM rate `hwbench calibrate` measured, and where it came from.",
                          **fields(Rate, "flops cv copy_bytes_per_s"), size=Count,
                          **fields(Text, "precision measured_at device_model driver torch_version hwbench_version "
                                         "store"))
Device = section("Device", "The device, its catalog entry, peak and measured ceiling.",
                 **fields(Text, "backend dist_backend device_model torch_device catalog_entry catalog_path "
                                "catalog_match peak_flops_precision peak_flops_source peak_flops_read "
                                "peak_flops_basis peak_flops_unmeasured measured_ceiling_unmeasured price_source "
                                "price_date gfx_arch hpu_mode hpu_mode_basis"),
                 peak_flops_listed_with_sparsity=Flag, **fields(Rate, "peak_flops tdp_watts price_usd_per_hour"),
                 **fields(Count, "device_count memory_capacity_bytes"), simulated=Flag,
                 measured_ceiling=MeasuredCeiling, tuning=dict[str, Any], auto_passed_over=list[Text])
Engine = section("Engine", "The engine that trained and how it was set up.",
                 **fields(Text, "name data_parallel pipeline_schedule"), zero_stage=Count)
Launch = section("Launch", "How the processes were started.", launcher=Text, node_rank=Count,
                 **fields(Positive, "nnodes nproc_per_node"))

# --- figures -----------------------------------------------------------------------------------

StepTime = section("StepTime", "Statistics of step times, in seconds.", n=Count,
                   **fields(Rate, "mean median p10 p90 min max stdev cv"))
Memory = section("Memory", "Peak memory of the timed steps.", WithReasons,
                 **fields(Count, "peak_allocated_bytes peak_reserved_bytes capacity_bytes alloc_retries ooms "
                                 "heap_trims peak_allocated_rank"), source=Text, unmeasured=REASONS)
TelemetryDevice = section(
    "TelemetryDevice", "One sampled device over the window.", WithReasons,
    **fields(Count, "index chip package"),
    **fields(Text, "name host uuid pci_bus_id identified_by energy_method energy_scope energy_warning power_method"),
    **fields(Rate, "energy_j power_w_mean power_w_max energy_resolution_uj"),
    **fields(Figure, "temperature_c_mean temperature_c_max utilization_percent_mean utilization_percent_max "
                     "memory_used_mib_mean memory_used_mib_max"),
    throttle_reasons=list[Text], unmeasured=REASONS)


class _Totals(Section):
    @property
    def total_energy_j(self) -> float | None:
        """Energy of every device over the window: the merged total, else the sum of the
        devices' when each has one; None when a device's is unknown."""
        return self.energy_j if self.energy_j is not None else _sum_known(d.energy_j for d in self.devices or [])

    @property
    def total_power_w(self) -> float | None:
        """Mean power summed over the devices, None when a device's is unknown."""
        if self.power_w_mean_total is not None:
            return self.power_w_mean_total
        return _sum_known(d.power_w_mean for d in self.devices or [])


def _sum_known(values) -> float | None:
    known = list(values)
    return sum(known) if known and None not in known else None


Telemetry = section("Telemetry", "Device sensors during the timed region (several ranks: each device once).",
                    _Totals, **fields(Text, "source reason"), available=Flag, devices=list[TelemetryDevice],
                    **fields(Rate, "energy_j power_w_mean_total interval_s window_s"),
                    **fields(Count, "samples ranks ranks_available"), errors=list[Any])
HostSyncs = section("HostSyncs", "How often the host waited for the device in the timed window.", count=(Count, ...),
                    where=list[Text], **fields(Count, "rank ranks_counted"))
ValidationPoint = section("ValidationPoint", "One validation.", step=(Count, ...), **fields(Figure, "loss ppl"),
                          **fields(Count, "tokens iters"))
Straggler = section("Straggler", "The rank with the slowest median step.", rank=Count,
                    **fields(Rate, "median_step_time_s median_of_ranks_s ratio"))
FormulaFigures = section("FormulaFigures", "The figures of one FLOPs formula (metrics.by_formula).",
                         **fields(Rate, "flops_per_iteration tflops_per_device mfu"))
Metrics = section(
    "Metrics", "The figures of the timed steps.", WithReasons,
    **fields(Rate, "samples_per_s tokens_per_s tokens_per_s_per_device tflops_per_device mfu mfu_measured_ceiling "
                   "flops_per_iteration timed_wall_time_s"),
    **fields(Text, "flops_formula flops_formula_expression"), by_formula=dict[str, FormulaFigures],
    world_size=Positive, **fields(Count, "timed_steps valid_ppl_step skipped_steps"), step_time_s=StepTime,
    memory=Memory, **fields(Figure, "loss_start loss_end loss_floor valid_loss valid_ppl ppl_floor"),
    validation=list[ValidationPoint], straggler=Straggler, host_syncs=HostSyncs, telemetry=Telemetry,
    data=dict[str, Any], unmeasured=REASONS)
Step = section("Step", "One optimizer step.", step=(Count, ...), phase=Text, time_s=Rate, skipped=Flag,
               **fields(Figure, "loss grad_norm lr loss_scale"))

CheckpointRank = section("CheckpointRank", "One rank's part of a checkpoint save or load.", rank=(Count, ...),
                         bytes=Count, **fields(Rate, "wall_time_s gb_per_s stall_s"))
CheckpointOperation = section(
    "CheckpointOperation", "One save or load over every rank: the bytes of all, the slowest rank's time.",
    iteration=Count, path=Text, timed=Flag, bytes=Count, **fields(Rate, "wall_time_s gb_per_s stall_s"),
    ranks=list[CheckpointRank])
Restart = section("Restart", "A torchrun restart: where it resumed, what the failure cost.", attempt=Positive,
                  **fields(Count, "resumed_from_iteration reached_iteration steps_lost"), time_lost_s=Rate)
Checkpoints = section(
    "Checkpoints", "The run's checkpoint saves and loads, measured, and its restarts.", WithReasons,
    **fields(Text, "save_dir load latest"), save_interval=Positive, async_save=Flag,
    saves=list[CheckpointOperation], loads=list[CheckpointOperation], save_bytes=Count,
    **fields(Rate, "save_gb_per_s save_stall_s stall_s_total stall_fraction stall_s_per_hour"),
    restarts=list[Restart], unmeasured=REASONS)

# --- where it ran -------------------------------------------------------------------------------

HwbenchGit = section("HwbenchGit", "The hwbench checkout the code ran from.", **fields(Text, "commit reason"),
                     dirty=Flag)
SlurmJob = section("SlurmJob", "The Slurm job the run ran in.", **fields(Count, "nnodes ntasks"),
                   **fields(Text, "job_id step_id nodelist partition cluster account"))


class _Fingerprint(Section):
    def value_text(self, field: str) -> str | None:
        """One field as comparable text (a mapping as sorted key=value pairs); None when unknown."""
        value = self[field] if field in type(self).model_fields or field in self else None
        if isinstance(value, BaseModel):
            value = value.model_dump(exclude_unset=True)
        if isinstance(value, dict):
            return ", ".join(f"{key}={value[key]}" for key in sorted(value))
        return None if value is None else str(value)


Environment = section(
    "Environment", "The environment fingerprint.", _Fingerprint,
    **fields(Text, "host os machine python hwbench_version torch_version torch_npu_version deepspeed_version backend "
                   "driver_version cuda_version nccl_version cann_version hccl_version rocm_version hip_version "
                   "rccl_version gfx_arch habana_frameworks_version hpu_mode oversubscribed_reason "
                   "devices_used_basis"),
    hwbench_git=HwbenchGit, **fields(Flag, "simulated oversubscribed"), tuning=dict[str, Any],
    device_models=list[Text], **fields(Count, "device_count cpu_cores_usable devices_used"), cudnn_version=Integer,
    threads_per_rank=Positive, slurm=SlurmJob)
RankPlacement = section("RankPlacement", "Where a rank ran.", threads=Positive, usable_cores=Count, cpus=Text,
                        devices=list[Text])
NodePlacement = section("NodePlacement", "Where a host's ranks ran, judged together.",
                        threads_per_rank=list[Positive], usable_cores=Count, devices=list[Text],
                        oversubscribed=Flag, oversubscribed_reason=Text)
RankSummary = section(
    "RankSummary", "One rank's own figures; for a failed run, what the launcher knows of it (its heartbeat).",
    rank=(Count, ...), **fields(Count, "local_rank node_rank pid last_step"), **fields(Text, "host phase signal error"),
    coordinates=dict[str, Count | None], memory=Memory, step_time_s=StepTime, telemetry=Telemetry,
    placement=RankPlacement, exitcode=Integer)
NodeSummary = section("NodeSummary", "One node: its rank, host, ranks and environment.", node_rank=(Count, ...),
                      host=Text, ranks=(list[Count], []), environment=Environment, placement=NodePlacement)
RunError = section("RunError", "What went wrong.", **fields(Count, "rank local_rank"), exitcode=Integer,
                   **fields(Text, "type message traceback signal log_tail slurm_state slurm_job_id"))
SweepRecord = section("SweepRecord", "The sweep that ran the point: suite, point, repeat, resume key.",
                      **fields(Text, "suite suite_path point key"), **fields(Count, "repeat repeats"))

# --- the result ---------------------------------------------------------------------------------

ONE_SOCKET_PER_NODE = "assumed: one CPU socket per node (the result does not record devices_used)"


class _RunFacts(Section):
    """The file's mapping in and out, and the facts derived from its fields."""

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
        """The backend it ran on (cpu, cuda, npu); what was asked for when it never ran."""
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
        layout = {name: getattr(spec.parallel, name) for name in ("tp", "pp", "dp")}
        return PointKey(**{name: getattr(spec, name) for name in PointKey.fields() if name in Spec.model_fields},
                        **layout, backend=self.backend, device_model=self.device_model, nnodes=spec.launch.nnodes)

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
        for value in (self.environment.threads_per_rank, (self.environment.tuning or {}).get("intra_op_threads"),
                      (self.device.tuning or {}).get("intra_op_threads")):
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value
        return None


RunResult = section(
    "RunResult", "One run's result: the JSON file hwbench writes (docs/results.md).", _RunFacts,
    schema_version=(Integer, RESULT_SCHEMA_VERSION), run_id=(Text, ...), status=(Status, ...), spec=(Spec, ...),
    **{name: (kind, Field(default_factory=kind)) for name, kind in (
        ("workload", Workload), ("device", Device), ("metrics", Metrics), ("steps", list[Step]),
        ("ranks", list[RankSummary]), ("engine", Engine), ("launch", Launch), ("environment", Environment),
        ("nodes", list[NodeSummary]))},
    sweep=SweepRecord,  # suite, point, repeat and resume key when a sweep ran it
    checkpoint=Checkpoints,  # saves, loads and restarts (--save, --load, --max-restarts)
    error=RunError, warnings=(list[Text], []), **fields((Text, ""), "started_at finished_at"),
    hwbench_version=(Text, __version__))


# --- validation problems as one line ------------------------------------------------------------


def validation_problem(model: type[BaseModel], data: Any, where: str = "") -> str | None:
    """Where ``data`` departs from ``model``, as "field: what is wrong", or None when it fits."""
    try:
        model.model_validate(data)
    except ValidationError as error:
        return problem_text(error, where)
    return None


def problem_text(error: ValidationError, where: str = "") -> str:
    """The first problem of a ValidationError as one line: "metrics.mfu: must be >= 0, not -1"."""
    first = error.errors(include_url=False)[0]
    path = where
    for part in first["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{path or 'the file'}: {_problem(first)}"[:300]


_PROBLEMS = {  # pydantic's error type -> the line it makes, as hwbench has always said it
    "missing": "is missing", "finite_number": "must be a finite number, not {value!r}",
    "float_type": "must be a number, not {kind}", "int_type": "must be an integer, not {kind}",
    "string_type": "must be text, not {kind}", "bool_type": "must be true/false, not {kind}",
    "model_type": "must be a mapping, not {kind}", "dict_type": "must be a mapping, not {kind}",
    "list_type": "must be a list, not {kind}", "greater_than_equal": "must be >= {ge}, not {short}",
    "less_than_equal": "must be <= {le}, not {short}", "literal_error": "must be one of {expected}, not {short}",
    "recursion_loop": "nested too deeply",
}


def _problem(error: Any) -> str:
    value, kind = error.get("input"), error["type"]
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        return f"must be a number a float holds, not an integer of {len(str(abs(value)))} digits"
    template = _PROBLEMS.get(kind)
    if template is None:
        return str(error.get("msg"))
    return template.format(value=value, kind=_kind(value), short=_short(value), **(error.get("ctx") or {}))


def _kind(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "text", bool: "true/false", type(None): "null",
             int: "an integer", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
