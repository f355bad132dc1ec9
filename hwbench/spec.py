"""RunSpec: one benchmark point, validated once, before anything starts.

Every value a user can give is checked here; a bad one raises UsageError
naming the option, the value and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

from hwbench.catalog import PRECISIONS, Catalog, Workload
from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.errors import UsageError
from hwbench.options import ENGINES, PP_SCHEDULES, SETTINGS, RunOptions
from hwbench.results import check_output_folder
from hwbench.units import parse_size
from hwbench.workload.config import CROSS_ENTROPY_CHOICES, GPTConfig
from hwbench.workload.flops import DEFAULT_FLOPS_FORMULA, FLOPS_FORMULAS

DEFAULT_STEPS = 20
DEFAULT_WARMUP = 5
DEFAULT_MODEL = "small"  # the embedded default: trains on 2 CPU cores in well under a minute
DEFAULT_OUT = "results/runs"
DEFAULT_TELEMETRY_INTERVAL_S = 0.5
DEFAULT_DATA = "builtin"
DATA_KEYWORDS = ("builtin", "synthetic")
DEFAULT_SPLIT = "949,50,1"
DEFAULT_EVAL_ITERS = 10


ZERO_STAGES = (0, 1, 2, 3)
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
DEFAULT_TIMEOUT_S = 1800.0
MAX_TIMEOUT_S = 30 * 86400.0
MAX_SEED = 2**32 - 1  # Megatron seeds numpy's legacy generator, which takes 0 to 2**32 - 1
MAX_STEPS = 1_000_000  # every step is kept in the result: a million is already a 100 MB file
MAX_BATCH = 10_000_000  # samples; far beyond any published setting, and it keeps index arithmetic sane
MAX_RANKS_PER_NODE = 1024
MAX_NODES = 65_536
MAX_THREADS_PER_RANK = 4096
MAX_POSITIONS = 1_048_576  # a position table of 2^20 rows is already 8 GiB at hidden 2048 in fp32


@dataclasses.dataclass(frozen=True)
class ParallelDims:
    """Degrees of tensor, pipeline and data parallelism; world = tp x pp x dp.
    ``source`` says where tp and pp came from: the user, the workload's published
    layout, or the default of none."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    source: str = "default"

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """How the processes of a run are started (hwbench.harness.launcher).
    ``under_torchrun``: this command already runs as one rank of a torchrun job
    (in a Kubernetes pod, say) and does not launch again."""

    nnodes: int = 1
    nproc_per_node: int = 1
    node_rank: int = 0
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int | None = None  # None: a free port (single node only)
    rdzv_endpoint: str | None = None  # host:port of a c10d rendezvous, instead of master addr/port
    timeout_s: float = DEFAULT_TIMEOUT_S
    under_torchrun: bool = False

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """AdamW with Megatron's schedule: linear warm-up, then decay to min_lr."""

    lr: float
    min_lr: float
    weight_decay: float
    clip_grad: float
    lr_warmup_iters: int
    lr_decay_iters: int
    lr_decay_style: str
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


@dataclasses.dataclass(frozen=True)
class RunSpec:
    model: str
    device: str  # as requested: auto, cpu, cuda or npu
    micro_batch_size: int
    global_batch_size: int
    seq_length: int
    precision: str
    recompute: bool
    compile: bool
    steps: int
    warmup: int
    seed: int
    parallel: ParallelDims
    engine: str  # native or deepspeed
    zero_stage: int  # DeepSpeed ZeRO stage (deepspeed engine only)
    fsdp: bool  # FSDP2 sharding of the data-parallel dimension (native engine only)
    pp_schedule: str  # 1f1b or gpipe (pipeline parallelism only)
    launch: LaunchSpec
    optimizer: OptimizerSpec
    initial_scale_power: int  # fp16 dynamic loss scale starts at 2**this
    loss_scale: float | None  # fixed fp16 loss scale, or None for dynamic
    data: str  # builtin, synthetic, or a Megatron dataset prefix
    split: str
    eval_interval: int  # evaluate every this many steps; 0 = only after the last step
    eval_iters: int  # global batches per evaluation; 0 = no validation
    telemetry: bool
    telemetry_interval_s: float
    flops_formula: str
    out_dir: str
    threads_per_rank: int | None = None  # None: the backend shares the usable cores among the ranks
    # Rows of the learned position embedding (--max-positions). build_run_spec always sets it;
    # None only in a spec read back from a result written before the option existed: the workload's.
    max_positions: int | None = None
    # The defaults below are what a result written before these options ran with.
    settings: str = "published"  # --settings: published, or fast (hwbench.fast chose the values)
    settings_choice: str | None = None  # under fast: what was chosen and why, in words
    device_memory_bytes: int | None = None  # under fast: the memory per device it planned for
    cross_entropy: str = "standard"  # --cross-entropy: standard or chunked
    fused_qkv: bool = False  # --fused-qkv: one q/k/v projection in Megatron's per-head layout

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.parallel.dp)

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def model_config(self, workload_model: GPTConfig) -> GPTConfig:
        """The shape this run trains: the workload's, with --max-positions applied. Everything
        that builds, counts or plans the model of a run goes through here."""
        if self.max_positions is None or self.max_positions == workload_model.max_position_embeddings:
            return workload_model
        return dataclasses.replace(workload_model, max_position_embeddings=self.max_positions)


def _positive(option: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        accepted = f"from {minimum} to {maximum}" if maximum else f">= {minimum}"
        raise UsageError(f"{option} {value!r} is not accepted; give an integer {accepted}")
    return value


def _positive_number(option: str, value: Any, minimum: float | None = None) -> float:
    """A finite number > 0 (or >= ``minimum``)."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value >= minimum if minimum is not None else value > 0))
    if not ok:
        raise UsageError(f"{option} {value!r} is not accepted; give a number "
                         + (f">= {minimum:g}" if minimum is not None else "> 0"))
    return float(value)


def _check_out_dir(out: str) -> str:
    check_output_folder(out)
    return out


def check_data(data: str) -> str:
    if data in DATA_KEYWORDS:
        return data
    missing = [suffix for suffix in (".idx", ".bin") if not Path(data + suffix).is_file()]
    if missing:
        raise UsageError(
            f"--data {data!r}: no {' or '.join(data + m for m in missing)}; give the prefix of a Megatron "
            f"dataset (as `hwbench data prepare` writes), or one of: {', '.join(DATA_KEYWORDS)}"
        )
    return data


def _check_split(split: str) -> str:
    from hwbench.workload.split import parse_split

    parse_split(split)
    return split


def _given(options: dict[str, Any], key: str, default: Any) -> Any:
    """The option's value, or ``default`` when it was not given (None)."""
    value = options.get(key)
    return default if value is None else value


def _build_launch(options: dict[str, Any], torchrun_world_size: int | None) -> LaunchSpec:
    given = functools.partial(_given, options)
    nnodes = _positive("--nnodes", given("nnodes", 1), maximum=MAX_NODES)
    nproc = _positive("--nproc-per-node", given("nproc_per_node", 1), maximum=MAX_RANKS_PER_NODE)
    node_rank = _positive("--node-rank", given("node_rank", 0), minimum=0)
    if node_rank >= nnodes:
        raise UsageError(f"--node-rank {node_rank} is not below --nnodes {nnodes}; accepted: 0 to {nnodes - 1}")
    port = options.get("master_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
        raise UsageError(f"--master-port {port!r} is not accepted; give a TCP port from 1 to 65535")
    endpoint = options.get("rdzv_endpoint")
    if endpoint is not None:
        host, _, endpoint_port = endpoint.rpartition(":")
        if not host or not endpoint_port.isdigit() or not 1 <= int(endpoint_port) <= 65535:
            raise UsageError(f"--rdzv-endpoint {endpoint!r} is not accepted; give HOST:PORT")
    if nnodes > 1 and port is None and endpoint is None:
        port = DEFAULT_MASTER_PORT  # every node must agree on it
    timeout = given("timeout", DEFAULT_TIMEOUT_S)
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout)
            or not 0 < timeout <= MAX_TIMEOUT_S):
        raise UsageError(f"--timeout {timeout!r} is not accepted; give seconds > 0, at most {MAX_TIMEOUT_S:g} "
                         "(30 days)")
    launch = LaunchSpec(nnodes=nnodes, nproc_per_node=nproc, node_rank=node_rank,
                        master_addr=given("master_addr", DEFAULT_MASTER_ADDR), master_port=port,
                        rdzv_endpoint=endpoint, timeout_s=float(timeout),
                        under_torchrun=torchrun_world_size is not None)
    if torchrun_world_size is not None and torchrun_world_size != launch.world_size:
        # Already one rank of a torchrun job: the job's size is torchrun's.
        launch = dataclasses.replace(launch, nnodes=1, nproc_per_node=torchrun_world_size, node_rank=0)
    return launch


def _build_engine_options(options: dict[str, Any]) -> tuple[str, int, bool, str]:
    engine = options.get("engine") or "native"
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r} is not known; accepted: {', '.join(ENGINES)}")
    zero = options.get("zero")
    if zero is not None and zero not in ZERO_STAGES:
        raise UsageError(f"--zero {zero!r} is not a ZeRO stage; accepted: 0, 1, 2, 3")
    schedule = options.get("pp_schedule") or "1f1b"  # build_run_spec turns it to gpipe when 1F1B cannot run
    if schedule not in PP_SCHEDULES:
        raise UsageError(f"--pp-schedule {schedule!r} is not known; accepted: {', '.join(PP_SCHEDULES)}")
    fsdp = bool(options.get("fsdp"))
    if zero is not None and zero > 0 and engine != "deepspeed":
        raise UsageError(f"--zero {zero} needs --engine deepspeed; the native engine shards with --fsdp")
    if fsdp and engine == "deepspeed":
        raise UsageError("--fsdp is a native-engine option; with --engine deepspeed use --zero 3 to shard parameters")
    return engine, zero or 0, fsdp, schedule


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _build_parallel(options: dict[str, Any], workload: Workload, launch: LaunchSpec, engine: str) -> ParallelDims:
    """tp, pp and dp for the world size, checked against the model: tp divides the
    heads (and so the hidden size and the padded vocabulary), pp does not exceed
    the layers, tp x pp x dp is the world size."""
    world = launch.world_size
    where = (f"the world size {world} (--nnodes {launch.nnodes} x --nproc-per-node {launch.nproc_per_node})"
             if not launch.under_torchrun else f"the world size {world} that torchrun started")
    tp, pp, dp = options.get("tp"), options.get("pp"), options.get("dp")
    source = "user" if tp is not None or pp is not None else "default"
    published = workload.published
    if source == "default" and published and engine == "native" and world % (published.tp * published.pp) == 0:
        tp, pp, source = published.tp, published.pp, "published"  # the layout the published tables used
    tp = _positive("--tp", 1 if tp is None else tp)
    pp = _positive("--pp", 1 if pp is None else pp)
    model = workload.model
    heads = model.num_attention_heads
    if heads % tp:
        raise UsageError(f"--tp {tp} does not divide the {heads} attention heads of --model {workload.name}; "
                         f"accepted: {_divisors(heads)}")
    if pp > model.num_layers:
        raise UsageError(f"--pp {pp} exceeds the {model.num_layers} layers of --model {workload.name}; "
                         f"accepted: 1 to {model.num_layers}")
    if dp is None:
        if world % (tp * pp):
            raise UsageError(f"--tp {tp} x --pp {pp} = {tp * pp} does not divide {where}; "
                             f"accepted: tp x pp among {_divisors(world)}")
        dp = world // (tp * pp)
    dp = _positive("--dp", dp)
    if tp * pp * dp != world:
        raise UsageError(f"--tp {tp} x --pp {pp} x --dp {dp} = {tp * pp * dp} is not {where}")
    return ParallelDims(tp=tp, pp=pp, dp=dp, source=source)


def find_workload(catalog: Catalog, name: str) -> Workload:
    """The catalog's workload by name, in any case (`--model 1.3B`, as reports print it)."""
    by_lower = {key.lower(): workload for key, workload in catalog.workloads.items()}
    workload = by_lower.get(str(name).lower())
    if workload is None:
        raise UsageError(f"--model {name!r} is not in the catalog; accepted: {', '.join(sorted(catalog.workloads))}")
    return workload


def _batch_sizes(options: dict[str, Any], defaults, dp: int) -> tuple[int, int]:
    """(micro, global) batch sizes for ``dp`` data-parallel replicas. Given both, they
    must fit. Given neither, the workload's micro batch, and its global batch rounded up
    to a multiple of micro x dp (Megatron's micro x dp when the workload accumulates
    nothing; unchanged when it already fits). Given one, the other follows: the global
    batch rounded up likewise, or the workload's micro batch cut to a divisor of the
    per-replica batch."""
    micro_given, global_given = options.get("micro_batch_size"), options.get("global_batch_size")
    micro = _positive("--micro-batch-size", _given(options, "micro_batch_size", defaults.micro_batch_size),
                      maximum=MAX_BATCH)
    if global_given is None:
        step = micro * dp
        return micro, max(step, -(-defaults.global_batch_size // step) * step)
    global_batch = _positive("--global-batch-size", global_given, maximum=MAX_BATCH)
    if micro_given is None and global_batch % dp == 0:
        per_replica = global_batch // dp
        micro = max(m for m in range(1, min(micro, per_replica) + 1) if per_replica % m == 0)
    if global_batch % (micro * dp):
        step = micro * dp
        raise UsageError(
            f"--global-batch-size {global_batch} is not a multiple of --micro-batch-size {micro}"
            + (f" x data parallel {dp}" if dp > 1 else "")
            + f"; accepted: {step}, {2 * step}, {3 * step}, ..."
        )
    return micro, global_batch


def _max_positions(options: dict[str, Any], workload: Workload, seq: int) -> int:
    """Rows of the position embedding: the workload's, or --max-positions; at least the sequence."""
    own = workload.model.max_position_embeddings
    given = options.get("max_positions")
    if given is None:
        if seq > own:
            raise UsageError(
                f"--seq-length {seq} exceeds the {own} positions of --model {workload.name}; accepted: 1 to {own}, "
                f"or give --max-positions {seq} (or more) to lengthen the position embedding"
            )
        return own
    if isinstance(given, bool) or not isinstance(given, int) or not seq <= given <= MAX_POSITIONS:
        raise UsageError(f"--max-positions {given!r} is not accepted; give an integer from --seq-length {seq} "
                         f"to {MAX_POSITIONS}")
    return given


def fast_defaults(engine: str, parallel: ParallelDims, fsdp: bool) -> dict[str, Any]:
    """What --settings fast gives the options that do not depend on the device's memory,
    where the engine and layout can run them (hwbench.fast chooses the rest)."""
    return {"compile": engine == "native",  # the DeepSpeed engines do not compile
            "cross_entropy": "chunked" if engine == "native" and parallel.tp == 1 and not (
                fsdp and parallel.pp > 1) else "standard",
            "fused_qkv": not _deepspeed_pipeline(engine, parallel)}


def _deepspeed_pipeline(engine: str, parallel: ParallelDims) -> bool:
    return engine == "deepspeed" and (parallel.tp > 1 or parallel.pp > 1)


def _check_model_options(cross_entropy: str, fused_qkv: bool, engine: str, parallel: ParallelDims,
                         fsdp: bool) -> None:
    """The chunked loss runs on the native engine without tensor parallelism (nor FSDP2
    beside pipelining); the fused
    q/k/v projection everywhere but DeepSpeed's pipeline engine, whose layers are its own."""
    if cross_entropy not in CROSS_ENTROPY_CHOICES:
        raise UsageError(f"--cross-entropy {cross_entropy!r} is not known; accepted: "
                         f"{', '.join(CROSS_ENTROPY_CHOICES)}")
    if cross_entropy == "chunked" and engine != "native":
        raise UsageError(f"--cross-entropy chunked runs on the native engine, not --engine {engine}; accepted: "
                         "--cross-entropy standard, or --engine native")
    if cross_entropy == "chunked" and parallel.tp > 1:
        raise UsageError(f"--cross-entropy chunked with --tp {parallel.tp}: the chunked loss needs the whole "
                         "vocabulary on each rank and tensor parallelism splits it; accepted: --cross-entropy "
                         "standard, or --tp 1")
    if cross_entropy == "chunked" and fsdp and parallel.pp > 1:
        raise UsageError(f"--cross-entropy chunked with --fsdp and --pp {parallel.pp}: a pipeline's last stage "
                         "computes its loss outside the model, where FSDP2 holds the output weight sharded; "
                         "accepted: --cross-entropy standard, or --fsdp without --pp")
    if fused_qkv and _deepspeed_pipeline(engine, parallel):
        raise UsageError(f"--fused-qkv with --engine deepspeed --tp {parallel.tp} --pp {parallel.pp}: DeepSpeed's "
                         "pipeline engine builds separate q, k and v projections; accepted: --no-fused-qkv, "
                         "--engine native, or --tp 1 --pp 1")


def _settings(options: dict[str, Any]) -> tuple[str, int | None]:
    """(--settings, --device-memory in bytes or None)."""
    settings = _given(options, "settings", "published")
    if settings not in SETTINGS:
        raise UsageError(f"--settings {settings!r} is not known; accepted: {', '.join(SETTINGS)}")
    memory = options.get("device_memory")
    if memory is None:
        return settings, None
    if settings != "fast":
        raise UsageError(f"--device-memory {memory} is what --settings fast plans for; give --settings fast with it, "
                         "or leave it out")
    return settings, parse_size(str(memory), "--device-memory")


def _check_engine_layout(engine: str, parallel: ParallelDims, zero_stage: int = 0, pp_schedule: str | None = None) -> None:
    """--engine deepspeed runs --tp/--pp on DeepSpeed's pipeline engine, which
    takes ZeRO 0 or 1 only and has one schedule, 1F1B."""
    if engine != "deepspeed" or (parallel.tp == 1 and parallel.pp == 1):
        return
    if zero_stage > 1:
        raise UsageError(f"--zero {zero_stage} with --tp {parallel.tp} --pp {parallel.pp}: DeepSpeed's pipeline engine "
                         "takes ZeRO 0 or 1; accepted: --zero 0, --zero 1, or --tp 1 --pp 1 for ZeRO 2 and 3")
    if pp_schedule not in (None, "1f1b"):
        raise UsageError(f"--pp-schedule {pp_schedule} with --engine deepspeed: DeepSpeed's pipeline engine runs 1F1B; "
                         "accepted: 1f1b, or --engine native")


def build_run_spec(options: RunOptions | dict[str, Any], catalog: Catalog, torchrun_world_size: int | None = None,
                   check_paths: bool = True) -> RunSpec:
    """RunSpec from CLI-style options (None = the workload's default).
    ``torchrun_world_size``: set when this process is already a torchrun rank.
    ``check_paths``: False when the run happens elsewhere (a Kubernetes pod), so
    --data and --out name paths there, not here."""

    if isinstance(options, RunOptions):
        options = dataclasses.asdict(options)
    given = functools.partial(_given, options)
    workload = find_workload(catalog, given("model", DEFAULT_MODEL))
    model_name = workload.name
    defaults = workload.training

    device = given("device", "auto")
    if device not in DEVICE_CHOICES:
        raise UsageError(f"--device {device!r} is not known; accepted: {', '.join(DEVICE_CHOICES)}")
    precision = given("precision", defaults.precision)
    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r} is not known; accepted: {', '.join(PRECISIONS)}")

    seq = _positive("--seq-length", given("seq_length", defaults.seq_length))
    steps = _positive("--steps", given("steps", DEFAULT_STEPS), maximum=MAX_STEPS)
    warmup = _positive("--warmup", given("warmup", DEFAULT_WARMUP), minimum=0, maximum=MAX_STEPS)
    seed = _positive("--seed", given("seed", defaults.seed), minimum=0, maximum=MAX_SEED)
    launch = _build_launch(options, torchrun_world_size)
    engine, zero_stage, fsdp, pp_schedule = _build_engine_options(options)
    parallel = _build_parallel(options, workload, launch, engine)
    _check_engine_layout(engine, parallel, zero_stage, options.get("pp_schedule"))
    if fsdp and parallel.world_size == 1:
        raise UsageError("--fsdp shards over the data-parallel ranks, and this run has one process; give "
                         "--nproc-per-node N (N >= 2), or leave --fsdp out")
    settings, device_memory = _settings(options)
    chosen = fast_defaults(engine, parallel, fsdp) if settings == "fast" else {}
    cross_entropy = given("cross_entropy", chosen.get("cross_entropy", "standard"))
    fused_qkv = bool(given("fused_qkv", chosen.get("fused_qkv", False)))
    _check_model_options(cross_entropy, fused_qkv, engine, parallel, fsdp)
    micro, global_batch = _batch_sizes(options, defaults, parallel.dp)
    microbatches = global_batch // (micro * parallel.dp)
    # DeepSpeed's pipeline engine runs 1F1B whatever the microbatch count; the native one falls back
    if engine == "native" and parallel.pp > 1 and pp_schedule == "1f1b" and microbatches < parallel.pp:
        if options.get("pp_schedule"):
            raise UsageError(
                f"--pp-schedule 1f1b needs at least --pp {parallel.pp} microbatches per step; --global-batch-size "
                f"{global_batch} / (--micro-batch-size {micro} x dp {parallel.dp}) gives {microbatches}; accepted: "
                "a smaller micro batch, a larger global batch, or --pp-schedule gpipe")
        pp_schedule = "gpipe"  # the default schedule, where 1F1B cannot run
    positions = _max_positions(options, workload, seq)
    formula = given("flops_formula", DEFAULT_FLOPS_FORMULA)
    if formula not in FLOPS_FORMULAS:
        raise UsageError(f"--flops-formula {formula!r} is not known; accepted: {', '.join(FLOPS_FORMULAS)}")
    interval = given("telemetry_interval", DEFAULT_TELEMETRY_INTERVAL_S)
    if not isinstance(interval, (int, float)) or not 0.01 <= interval <= 60:
        raise UsageError(f"--telemetry-interval {interval!r} is not accepted; give seconds from 0.01 to 60")

    return RunSpec(
        model=model_name,
        device=device,
        micro_batch_size=micro,
        global_batch_size=global_batch,
        seq_length=seq,
        precision=precision,
        recompute=bool(given("recompute", defaults.recompute)),
        compile=bool(given("compile", chosen.get("compile", False))),
        steps=steps,
        warmup=warmup,
        seed=seed,
        parallel=parallel,
        engine=engine,
        zero_stage=zero_stage,
        fsdp=fsdp,
        pp_schedule=pp_schedule,
        launch=launch,
        optimizer=OptimizerSpec(
            lr=_positive_number("--lr", given("lr", defaults.lr)),
            min_lr=_positive_number("--min-lr", given("min_lr", defaults.min_lr), minimum=0.0),
            weight_decay=defaults.weight_decay,
            clip_grad=defaults.clip_grad,
            lr_warmup_iters=defaults.lr_warmup_iters,
            lr_decay_iters=defaults.lr_decay_iters,
            lr_decay_style=defaults.lr_decay_style,
        ),
        initial_scale_power=defaults.initial_scale_power,
        loss_scale=defaults.loss_scale,
        data=check_data(given("data", DEFAULT_DATA)) if check_paths else given("data", DEFAULT_DATA),
        split=_check_split(given("split", DEFAULT_SPLIT)),
        eval_interval=_positive("--eval-interval", given("eval_interval", 0), minimum=0, maximum=MAX_STEPS),
        eval_iters=_positive("--eval-iters", given("eval_iters", DEFAULT_EVAL_ITERS), minimum=0, maximum=MAX_STEPS),
        telemetry=bool(given("telemetry", True)),
        telemetry_interval_s=float(interval),
        flops_formula=formula,
        out_dir=_check_out_dir(given("out", DEFAULT_OUT)) if check_paths else given("out", DEFAULT_OUT),
        threads_per_rank=(None if options.get("threads_per_rank") is None else
                          _positive("--threads-per-rank", options["threads_per_rank"], maximum=MAX_THREADS_PER_RANK)),
        max_positions=positions,
        settings=settings,
        device_memory_bytes=device_memory,
        cross_entropy=cross_entropy,
        fused_qkv=fused_qkv,
    )
