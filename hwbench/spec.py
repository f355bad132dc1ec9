"""RunSpec: one benchmark point, validated once, before anything starts.

Each option's own type and range are checked where it is defined (hwbench.options, when
a RunOptions is made); here the defaults that depend on the workload or on other
options are resolved, and the rules that span several options are checked. A bad
combination raises UsageError naming the options, the values and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hwbench.catalog import Catalog, TrainingDefaults, Workload
from hwbench.errors import UsageError
from hwbench.fields import Count, Positive, Rate
from hwbench.kept_options import KeptLaunchOptions, KeptOptimizerOptions, KeptRunOptions
from hwbench.options import (
    DATA_KEYWORDS,
    ENGINES,  # noqa: F401  (hwbench.planner reads it here)
    MAX_POSITIONS,
    MULTI_NODE_PORT,
    RUN_OPTIONS,
    RunOptions,
)
from hwbench.paths import check_output_folder
from hwbench.precision import DEFAULT_FP8_RECIPE, FP8
from hwbench.target import Target, resolve_target
from hwbench.units import parse_size
from hwbench.workload.config import GPTConfig, accumulation_steps
from hwbench.workload.flops import canonical_formula


@dataclasses.dataclass(frozen=True)
class ParallelDims:
    """Degrees of tensor, pipeline and data parallelism; world = tp x pp x dp.
    Expert parallelism (``ep``, a mixture-of-experts model's) is carved out of the
    data-parallel ranks, as torchtitan and Megatron-LM compose it: the dp ranks form
    dp / ep groups of ep neighbours, each group holding every expert once (E / ep on
    each rank), so ep divides dp and adds no ranks. ``source`` says where tp and pp
    came from: the user, the workload's published layout, or the default of none."""

    tp: Positive = 1
    pp: Positive = 1
    dp: Positive = 1
    ep: Positive = RUN_OPTIONS["ep"].default  # also what a result written before --ep ran with
    source: str = "default"

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def expert_dp(self) -> int:
        """The ranks that hold the same experts (Megatron's expert-data-parallel size): dp / ep."""
        return self.dp // self.ep


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchSpec(KeptLaunchOptions):
    """How the processes of a run are started (hwbench.harness.launcher): the kept options
    (hwbench.kept_options; --master-port None: a free port, single node only) and these.
    ``under_torchrun``: this command already runs as one rank of a torchrun job
    (in a Kubernetes pod, say) and does not launch again."""

    timeout_s: Rate = RUN_OPTIONS["timeout"].default
    under_torchrun: bool = False

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerSpec(KeptOptimizerOptions):
    """AdamW with Megatron's schedule: linear warm-up, then decay to min_lr. Each kept field
    (hwbench.kept_options) is the run option of its name, else the workload's training default, else
    the option's; the warm-up is resolved from two options as Megatron-LM resolves it."""

    lr_warmup_iters: int
    lr_warmup_fraction: float | None = None  # the fraction of lr_decay_iters the warm-up is; None: a count


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec(KeptRunOptions):
    """One benchmark point, resolved. The one declaration of the run spec: the options it keeps as
    given are generated from their definitions (hwbench.kept_options), the fields below are resolved
    from several options and the workload; the result's spec section (hwbench.result.model.Spec) is made
    from all of them, so each field's type is also what a result file may hold there (Positive, Count,
    Rate: hwbench.fields' ranges)."""

    model: str  # the catalog's name of --model
    micro_batch_size: Positive
    global_batch_size: Positive
    parallel: ParallelDims
    zero_stage: Count = 0  # DeepSpeed ZeRO stage (deepspeed engine only); a result older than --zero ran 0
    pp_schedule: str  # 1f1b or gpipe (pipeline parallelism only)
    launch: LaunchSpec
    optimizer: OptimizerSpec
    initial_scale_power: Count  # the workload's: the fp16 dynamic loss scale starts at 2**this
    loss_scale: float | None  # the workload's fixed fp16 loss scale, or None for dynamic
    eval_interval: Count  # evaluate every this many steps; 0 = only after the last step
    telemetry_interval_s: Rate
    flops_formula: str
    out_dir: str
    # Rows of the learned position embedding (--max-positions). build_run_spec always sets it;
    # None only in a spec read back from a result written before the option existed: the workload's.
    max_positions: Positive | None = None
    # The defaults below are what a result written before these options ran with.
    settings_choice: str | None = None  # under --settings fast: what was chosen and why, in words
    device_memory_bytes: Count | None = None  # under fast: the memory per device it planned for
    # --target-ppl / --target-loss (hwbench.target): the run stops at the first validation that
    # reaches it. The resolved figure (floor*1.2 on the built-in language: 5.06) and the text given.
    target_ppl: float | None = None
    target_loss: float | None = None
    target_given: str | None = None
    fp8_recipe: str | None = None  # --fp8-recipe of a --precision fp8 run (hwbench.engine.float8); None otherwise
    profile_steps: Positive | None = None  # --profile-steps of a profiled run; None otherwise

    @property
    def gradient_accumulation_steps(self) -> int:
        return accumulation_steps(self.global_batch_size, self.micro_batch_size, self.parallel.dp)

    @property
    def target(self) -> Target | None:
        if self.target_ppl is not None:
            return Target("ppl", self.target_ppl, self.target_given or repr(self.target_ppl))
        if self.target_loss is not None:
            return Target("loss", self.target_loss, self.target_given or repr(self.target_loss))
        return None

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSpec:
        """The inverse of to_dict (a result's `spec`): keys it does not know are left out (a
        newer writer's); KeyError or TypeError when a field without a default is missing."""
        fields = _known_fields(cls, data)
        fields.update(parallel=ParallelDims(**_known_fields(ParallelDims, data["parallel"])),
                      launch=LaunchSpec(**_known_fields(LaunchSpec, data["launch"])),
                      optimizer=OptimizerSpec(**_known_fields(OptimizerSpec, data["optimizer"])))
        return cls(**fields)

    def model_config(self, workload_model: GPTConfig) -> GPTConfig:
        """The shape this run trains: the workload's, with --max-positions applied. Everything
        that builds, counts or plans the model of a run goes through here."""
        if self.max_positions is None or self.max_positions == workload_model.max_position_embeddings:
            return workload_model
        return dataclasses.replace(workload_model, max_position_embeddings=self.max_positions)


def _known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {field.name for field in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def check_data(data: str, flag: str = "--data") -> str:
    """``data`` names a keyword --data takes or a whole Megatron dataset: UsageError naming ``flag`` otherwise."""
    if data in DATA_KEYWORDS and flag == "--data":
        return data
    missing = [suffix for suffix in (".idx", ".bin") if not Path(data + suffix).is_file()]
    if missing:
        prepared = sorted(str(idx)[:-len(".idx")] for idx in Path(data).parent.glob(Path(data).name + "_*_document.idx")
                          if Path(str(idx)[:-len(".idx")] + ".bin").is_file())
        keywords = f", or one of: {', '.join(DATA_KEYWORDS)}" if flag == "--data" else ""
        hint = (f"`hwbench data prepare --output-prefix {data}` wrote {', '.join(prepared)}: give {flag} "
                f"{prepared[0]}" if prepared else "give the prefix of a Megatron dataset (as `hwbench data "
                f"prepare` writes){keywords}")
        raise UsageError(f"{flag} {data!r}: no {' or '.join(data + m for m in missing)}; {hint}")
    return data


def _check_valid_data(options: RunOptions) -> None:
    """--valid-data validates a Megatron --data PREFIX; the keywords make their own validation samples."""
    data = options.value("data")
    if options.valid_data is not None and data in DATA_KEYWORDS:
        raise UsageError(f"--valid-data is a dataset to validate --data PREFIX on, and --data {data} makes its own "
                         "validation samples; leave --valid-data out, or give --data PREFIX")


def _profile_steps(options: RunOptions) -> int | None:
    """--profile-steps of a --profile run (None without one); given alone, refused."""
    if not options.value("profile"):
        if options.profile_steps is not None:
            raise UsageError(f"--profile-steps {options.profile_steps} sets how many steps --profile records, and "
                             "--profile is not given; add --profile, or leave --profile-steps out")
        return None
    return int(options.value("profile_steps"))


def _check_checkpoint_options(options: RunOptions, engine: str, launch: LaunchSpec) -> None:
    """What --save-interval, --async-save and --max-restarts need beside them."""
    for name in ("save_interval", "async_save"):
        if options.value(name) and options.save is None:
            raise UsageError(f"{RUN_OPTIONS[name].flag} needs --save DIR, the folder the checkpoints go to")
    if options.async_save and engine == "deepspeed":
        raise UsageError("--async-save is torch.distributed.checkpoint's (the native engine); DeepSpeed saves through "
                         "its own save_checkpoint: leave --async-save out, or give --engine native")
    restarts = options.value("max_restarts")
    if restarts and launch.world_size == 1 and not launch.under_torchrun:
        raise UsageError(f"--max-restarts {restarts} restarts torchrun's ranks, and this run has one process; give "
                         "--nproc-per-node N (N >= 2), or leave --max-restarts out")


def check_load(load: str, workload: Workload, model_config: GPTConfig, engine: str, parallel: ParallelDims,
               zero_stage: int, fsdp: bool, fused_qkv: bool) -> None:
    """--load names a whole checkpoint this run can take (hwbench.checkpoint): UsageError otherwise."""
    from hwbench.checkpoint import check_resumable, find_checkpoint

    layout = {"tp": parallel.tp, "pp": parallel.pp, "dp": parallel.dp, "zero_stage": zero_stage, "fsdp": fsdp}
    check_resumable(find_checkpoint(load), workload.name, dataclasses.asdict(model_config), engine, layout,
                    fused_qkv)


def _or(given: Any, default: Any) -> Any:
    """The option's value, or ``default`` when it was not given (None)."""
    return default if given is None else given


def _build_launch(options: RunOptions, torchrun_world_size: int | None) -> LaunchSpec:
    nnodes, node_rank = options.value("nnodes"), options.value("node_rank")
    if node_rank >= nnodes:
        raise UsageError(f"--node-rank {node_rank} is not below --nnodes {nnodes}; accepted: 0 to {nnodes - 1}")
    port = options.master_port
    if nnodes > 1 and port is None and options.rdzv_endpoint is None:
        port = MULTI_NODE_PORT  # every node must agree on it
    launch = LaunchSpec(**{name: options.value(name) for name in _KEPT_LAUNCH_FIELDS} | {"master_port": port},
                        timeout_s=options.value("timeout"), under_torchrun=torchrun_world_size is not None)
    if torchrun_world_size is not None and torchrun_world_size != launch.world_size:
        # Already one rank of a torchrun job: the job's size is torchrun's.
        launch = dataclasses.replace(launch, nnodes=1, nproc_per_node=torchrun_world_size, node_rank=0)
    return launch


def _check_engine_options(options: RunOptions) -> None:
    engine, zero = options.value("engine"), options.value("zero")
    if zero > 0 and engine != "deepspeed":
        raise UsageError(f"--zero {zero} needs --engine deepspeed; the native engine shards with --fsdp")
    if options.fsdp and engine == "deepspeed":
        raise UsageError("--fsdp is a native-engine option; with --engine deepspeed use --zero 3 to shard parameters")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _build_parallel(options: RunOptions, workload: Workload, launch: LaunchSpec, engine: str) -> ParallelDims:
    """tp, pp and dp for the world size, checked against the model: tp divides the
    heads and the key/value heads (and so the hidden size and the padded vocabulary), pp does not exceed
    the layers, tp x pp x dp is the world size."""
    world = launch.world_size
    where = (f"the world size {world} (--nnodes {launch.nnodes} x --nproc-per-node {launch.nproc_per_node})"
             if not launch.under_torchrun else f"the world size {world} that torchrun started")
    tp, pp, dp = options.tp, options.pp, options.dp
    source = "user" if tp is not None or pp is not None else "default"
    published = workload.published
    if source == "default" and published and engine == "native" and world % (published.tp * published.pp) == 0:
        tp, pp, source = published.tp, published.pp, "published"  # the layout the published tables used
    tp, pp = _or(tp, 1), _or(pp, 1)
    model = workload.model
    heads = model.num_attention_heads
    if heads % tp:
        raise UsageError(f"--tp {tp} does not divide the {heads} attention heads of --model {workload.name}; "
                         f"accepted: {_divisors(heads)}")
    if model.kv_heads % tp:  # grouped-query attention: each rank holds whole key/value heads and their query groups
        raise UsageError(f"--tp {tp} does not divide the {model.kv_heads} key/value heads (num_query_groups) of "
                         f"--model {workload.name}; tensor parallelism gives each rank whole key/value heads; "
                         f"accepted: {_divisors(model.kv_heads)}")
    if pp > model.num_layers:
        raise UsageError(f"--pp {pp} exceeds the {model.num_layers} layers of --model {workload.name}; "
                         f"accepted: 1 to {model.num_layers}")
    if dp is None:
        if world % (tp * pp):
            raise UsageError(f"--tp {tp} x --pp {pp} = {tp * pp} does not divide {where}; "
                             f"accepted: tp x pp among {_divisors(world)}")
        dp = world // (tp * pp)
    if tp * pp * dp != world:
        raise UsageError(f"--tp {tp} x --pp {pp} x --dp {dp} = {tp * pp * dp} is not {where}")
    ep = _expert_parallel(options.value("ep"), workload, dp, tp, pp)
    _check_moe_layout(workload, engine, tp, pp)
    if tp > 1 and model.qk_layernorm:
        # the query/key norms' gain is shared by every head, and each rank would see only its own heads'
        # part of its gradient: the engines' plans do not sum it over the tensor-parallel ranks yet
        raise UsageError(f"--tp {tp} with --model {workload.name}: its per-head query and key norms "
                         "(qk_layernorm) are not split over tensor-parallel ranks yet; accepted: --tp 1 "
                         "(pipeline and data parallelism run it)")
    return ParallelDims(tp=tp, pp=pp, dp=dp, ep=ep, source=source)


def _check_moe_layout(workload: Workload, engine: str, tp: int, pp: int) -> None:
    """A mixture-of-experts model runs on the native engine over data-parallel ranks (DDP or FSDP2),
    expert-parallel ones, or tensor-parallel ones (each expert's width split) so far: pipeline
    parallelism and DeepSpeed's engines are not built for its layers yet."""
    if not workload.model.moe:
        return
    given = [flag for flag, used in (("--engine deepspeed", engine == "deepspeed"), (f"--pp {pp}", pp > 1)) if used]
    if given:
        raise UsageError(f"{' '.join(given)} with --model {workload.name}: a mixture-of-experts model runs on the "
                         "native engine, over data-parallel ranks (DDP or --fsdp), expert-parallel ones (--ep) or "
                         "tensor-parallel ones (--tp), so far; accepted: --engine native --pp 1")
    model = workload.model
    for what, width, field in (("experts'", model.moe_ffn_size, "moe_ffn_hidden_size"),
                               ("shared experts'", model.moe_shared_expert_intermediate_size,
                                "moe_shared_expert_intermediate_size")):
        if width and width % tp:  # each tensor-parallel rank holds an equal share of every expert's width
            raise UsageError(f"--tp {tp} does not divide the {what} width {width} ({field}) of --model "
                             f"{workload.name}; accepted: "
                             f"{_divisors(math.gcd(width, model.num_attention_heads, model.kv_heads))}")


def expert_parallel_degrees(experts: int, dp: int) -> list[int]:
    """The --ep a mixture of ``experts`` experts takes over ``dp`` data-parallel ranks: each divides
    both (a rank holds whole experts; ep ranks of one group hold every expert once)."""
    return [d for d in range(1, min(experts, dp) + 1) if experts % d == 0 and dp % d == 0]


def _expert_parallel(ep: int, workload: Workload, dp: int, tp: int, pp: int) -> int:
    """--ep for this model and layout: 1 for a dense model; else a divisor of both the experts
    (each rank holds E / ep whole experts) and dp (ep ranks of one group hold every expert once),
    without tensor or pipeline parallelism."""
    experts = workload.model.num_experts
    if ep == 1:
        return ep
    if tp > 1 or pp > 1:  # the experts would need their own tensor-parallel split (Megatron's ETP)
        raise UsageError(f"--ep {ep} with --tp {tp} --pp {pp}: expert parallelism runs beside data parallelism "
                         "only so far; accepted: --tp 1 --pp 1 with --ep, or --ep 1")
    if experts is None:
        raise UsageError(f"--ep {ep} with --model {workload.name}: expert parallelism splits the experts of a "
                         f"mixture-of-experts model, and {workload.name} is dense; accepted: --ep 1, or a model "
                         "with experts (`hwbench models` lists their experts)")
    accepted = ", ".join(map(str, expert_parallel_degrees(experts, dp)))
    if experts % ep:
        raise UsageError(f"--ep {ep} does not divide the {experts} experts of --model {workload.name}; accepted: "
                         f"{accepted} (divisors of the experts and of the data-parallel size {dp})")
    if dp % ep:
        raise UsageError(f"--ep {ep} does not divide the data-parallel size {dp}: expert-parallel ranks are "
                         f"data-parallel ones; accepted: {accepted} (divisors of the experts and of dp), or more "
                         "ranks (--nproc-per-node)")
    return ep


def find_workload(catalog: Catalog, name: str) -> Workload:
    """The catalog's workload by name, in any case (`--model 1.3B`, as reports print it)."""
    by_lower = {key.lower(): workload for key, workload in catalog.workloads.items()}
    workload = by_lower.get(str(name).lower())
    if workload is None:
        raise UsageError(f"--model {name!r} is not in the catalog; accepted: {', '.join(sorted(catalog.workloads))}")
    return workload


def _batch_sizes(options: RunOptions, defaults, dp: int) -> tuple[int, int]:
    """(micro, global) batch sizes for ``dp`` data-parallel replicas. Given both, they
    must fit. Given neither, the workload's micro batch, and its global batch rounded up
    to a multiple of micro x dp (Megatron's micro x dp when the workload accumulates
    nothing; unchanged when it already fits). Given one, the other follows: the global
    batch rounded up likewise, or the workload's micro batch cut to a divisor of the
    per-replica batch."""
    micro, global_batch = _or(options.micro_batch_size, defaults.micro_batch_size), options.global_batch_size
    if global_batch is None:
        step = micro * dp
        return micro, max(step, -(-defaults.global_batch_size // step) * step)
    if options.micro_batch_size is None and global_batch % dp == 0:
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


def _max_positions(options: RunOptions, workload: Workload, seq: int) -> int:
    """Rows of the position embedding: the workload's, or --max-positions; at least the sequence.
    A model with rotary positions has no table to lengthen: its own bound stands."""
    own = workload.model.max_position_embeddings
    given = options.max_positions
    if workload.model.rope and given not in (None, own):
        raise UsageError(
            f"--max-positions {given} with --model {workload.name}: its positions are rotary (RoPE), with no "
            f"position table to lengthen; leave it out (sequences of 1 to {own} tokens run as they are)"
        )
    if given is None or workload.model.rope:
        if seq > own:
            lengthen = ("" if workload.model.rope else
                        f", or give --max-positions {seq} (or more) to lengthen the position embedding")
            raise UsageError(
                f"--seq-length {seq} exceeds the {own} positions of --model {workload.name}; accepted: 1 to {own}"
                + lengthen
            )
        return own
    if not seq <= given <= MAX_POSITIONS:
        raise UsageError(f"--max-positions {given} is not accepted; give an integer from --seq-length {seq} "
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
    beside pipelining); the fused q/k/v projection everywhere but DeepSpeed's pipeline
    engine, whose layers are its own."""
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


def _fp8_recipe(options: RunOptions, precision: str, engine: str, parallel: ParallelDims) -> str | None:
    """--fp8-recipe resolved (None unless --precision fp8), where FP8 runs: torchao's float8 training on the
    native engine, without tensor parallelism (its Float8ColwiseParallel/RowwiseParallel plans are not wired
    here), with DDP, FSDP2 and pipelining (tensorwise, rowwise); MXFP8 on one process."""
    recipe = options.fp8_recipe
    if precision != FP8:
        if recipe is not None:
            raise UsageError(f"--fp8-recipe {recipe} is the recipe of --precision fp8, and this run is --precision "
                             f"{precision}; give --precision fp8, or leave --fp8-recipe out")
        return None
    recipe = recipe or DEFAULT_FP8_RECIPE
    if engine != "native":
        raise UsageError(f"--precision fp8 runs on the native engine (torchao's float8 training), not --engine "
                         f"{engine}; accepted: --engine native, or --precision bf16")
    if parallel.tp > 1:
        raise UsageError(f"--precision fp8 with --tp {parallel.tp}: hwbench does not apply torchao's float8 tensor "
                         "parallel plans; accepted: --tp 1, or --precision bf16")
    if recipe == "mxfp8" and parallel.world_size > 1:
        raise UsageError(f"--fp8-recipe mxfp8 with {parallel.world_size} processes: torchao's MXFP8 training wraps "
                         "the weights in a tensor subclass that DDP does not reduce (and hwbench does not shard or "
                         "pipeline), so it runs on one process; accepted: --fp8-recipe tensorwise or rowwise, or "
                         "--nproc-per-node 1")
    return recipe


def _settings(options: RunOptions) -> tuple[str, int | None]:
    """(--settings, --device-memory in bytes or None)."""
    settings, memory = options.value("settings"), options.device_memory
    if memory is None:
        return settings, None
    if settings != "fast":
        raise UsageError(f"--device-memory {memory} is what --settings fast plans for; give --settings fast with it, "
                         "or leave it out")
    return settings, parse_size(memory, "--device-memory")


def _check_engine_layout(engine: str, parallel: ParallelDims, zero_stage: int, pp_schedule: str | None) -> None:
    """--engine deepspeed runs --tp/--pp on DeepSpeed's pipeline engine, which
    takes ZeRO 0 or 1 only and has one schedule, 1F1B."""
    if not _deepspeed_pipeline(engine, parallel):
        return
    if zero_stage > 1:
        raise UsageError(
            f"--zero {zero_stage} with --tp {parallel.tp} --pp {parallel.pp}: DeepSpeed's pipeline engine "
            "takes ZeRO 0 or 1; accepted: --zero 0, --zero 1, or --tp 1 --pp 1 for ZeRO 2 and 3"
        )
    if pp_schedule not in (None, "1f1b"):
        raise UsageError(
            f"--pp-schedule {pp_schedule} with --engine deepspeed: DeepSpeed's pipeline engine runs 1F1B; "
            "accepted: 1f1b, or --engine native"
        )


def _warmup(options: RunOptions, training: TrainingDefaults, decay_iters: int) -> dict[str, Any]:
    """lr_warmup_iters and the lr_warmup_fraction it came from (None: a count), as Megatron-LM
    resolves them: one of the two, a fraction being of the decay iterations (--lr-decay-iters
    when given, so a workload's fraction follows it)."""
    iters, fraction = options.lr_warmup_iters, options.lr_warmup_fraction
    if iters is not None and fraction is not None:
        raise UsageError(f"--lr-warmup-iters {iters} and --lr-warmup-fraction {fraction!r} both set the warm-up; "
                         "give one of them")
    if iters is None and fraction is None:
        iters, fraction = training.lr_warmup_iters, training.lr_warmup_fraction  # the fraction: None beside a count
    if fraction is not None:
        iters = round(fraction * decay_iters)
    return {"lr_warmup_iters": iters, "lr_warmup_fraction": fraction}


def _check_schedule(optimizer: OptimizerSpec, options: RunOptions) -> None:
    """What spans several optimizer options, as Megatron-LM's OptimizerParamScheduler asserts it:
    min_lr <= lr, lr_warmup_init <= lr, and the warm-up ends before the decay does."""

    def named(name: str) -> str:
        text = f"{RUN_OPTIONS[name].flag} {getattr(optimizer, name)!r}"
        return text if getattr(options, name) is not None else f"{text} (the workload's)"

    for low in ("min_lr", "lr_warmup_init"):
        if getattr(optimizer, low) > optimizer.lr:
            raise UsageError(f"{named(low)} is above {named('lr')}; give {RUN_OPTIONS[low].flag} at most "
                             f"{optimizer.lr!r}, or a larger --lr")
    if optimizer.lr_warmup_iters >= optimizer.lr_decay_iters:
        warmup = named("lr_warmup_iters") if optimizer.lr_warmup_fraction is None else (
            f"{named('lr_warmup_fraction')} ({optimizer.lr_warmup_iters} steps)")
        raise UsageError(f"{warmup} is not below {named('lr_decay_iters')}, where the decay ends; give a shorter "
                         "warm-up or a later --lr-decay-iters")


def _check_no_clipping(optimizer: OptimizerSpec, engine: str, parallel: ParallelDims, zero_stage: int,
                       precision: str) -> None:
    """--clip-grad 0 turns clipping off; DeepSpeed's pipeline engine in fp32 with ZeRO 0 measures the
    gradient norm only in the clipping hwbench gives it (hwbench.engine.deepspeed_pipeline), so
    there each step would lack its norm."""
    if optimizer.clip_grad == 0 and _deepspeed_pipeline(engine, parallel) and precision == "fp32" and not zero_stage:
        raise UsageError(f"--clip-grad 0 with --engine deepspeed --tp {parallel.tp} --pp {parallel.pp} in fp32 "
                         "with ZeRO 0: DeepSpeed's pipeline engine takes the gradient norm only while it clips; "
                         "accepted: --clip-grad > 0, --zero 1, --precision bf16 or fp16, or --engine native")


def _build_optimizer(options: RunOptions, training: TrainingDefaults,
                     given_or_default: Callable[[str], Any]) -> OptimizerSpec:
    """The OptimizerSpec: each kept field the option of its name, else the workload's training default,
    else the option's default; the warm-up resolved as Megatron-LM does (``_warmup``)."""
    warmup = _warmup(options, training, given_or_default("lr_decay_iters"))
    optimizer = OptimizerSpec(**{name: given_or_default(name) for name in _KEPT_OPTIMIZER_FIELDS}, **warmup)
    _check_schedule(optimizer, options)
    return optimizer


def _target(options: RunOptions, workload: Workload, data: str, seed: int, split: str) -> tuple[Target | None, int]:
    """(the run's target, --eval-interval): a target needs validations, TARGET_EVAL_INTERVAL
    steps apart unless --eval-interval says otherwise."""
    from hwbench.options import TARGET_EVAL_INTERVAL
    from hwbench.workload.corpus import entropy_floor_nats
    from hwbench.workload.split import parse_split

    interval = options.value("eval_interval")
    if options.target_ppl is None and options.target_loss is None:
        return None, interval
    floor = entropy_floor_nats(data, seed, workload.model.vocab_size)
    where = {"builtin": f"the built-in language of --seed {seed}", "synthetic": "--data synthetic"}.get(data, "")
    target = resolve_target(options.target_ppl, options.target_loss, data, floor, where)
    flag = "--target-ppl" if options.target_ppl is not None else "--target-loss"
    if options.value("eval_iters") == 0:
        raise UsageError(
            f"{flag} is checked at validations, and --eval-iters 0 turns them off; give --eval-iters 1 or more"
        )
    if data not in ("builtin", "synthetic") and not parse_split(split)[1] and options.valid_data is None:
        raise UsageError(
            f"{flag} is checked at validations, and --split {split} leaves no validation documents; "
            "give the validation part a weight, or --valid-data PREFIX"
        )
    if options.eval_interval == 0:
        raise UsageError(
            f"{flag} with --eval-interval 0 would validate only after the last step; give "
            f"--eval-interval N (validate every N steps), or leave it out ({TARGET_EVAL_INTERVAL})"
        )
    return target, options.eval_interval or TARGET_EVAL_INTERVAL


def build_run_spec(
    options: RunOptions | dict[str, Any],
    catalog: Catalog,
    torchrun_world_size: int | None = None,
    check_paths: bool = True,
) -> RunSpec:
    """RunSpec from run options (None = the default, which may be the workload's).
    ``torchrun_world_size``: set when this process is already a torchrun rank.
    ``check_paths``: False when the run happens elsewhere (a Kubernetes pod), so
    --data and --out name paths there, not here."""

    if not isinstance(options, RunOptions):
        options = RunOptions.from_mapping(options)
    value = options.value
    workload = find_workload(catalog, value("model"))
    defaults = workload.training
    launch = _build_launch(options, torchrun_world_size)
    _check_engine_options(options)
    engine, zero_stage, fsdp = value("engine"), value("zero"), value("fsdp")
    pp_schedule = options.pp_schedule or "1f1b"  # turned to gpipe below where 1F1B cannot run
    parallel = _build_parallel(options, workload, launch, engine)
    _check_engine_layout(engine, parallel, zero_stage, options.pp_schedule)
    if fsdp and parallel.world_size == 1:
        raise UsageError(
            "--fsdp shards over the data-parallel ranks, and this run has one process; give "
            "--nproc-per-node N (N >= 2), or leave --fsdp out"
        )
    settings, device_memory = _settings(options)
    chosen = fast_defaults(engine, parallel, fsdp) if settings == "fast" else {}
    training = defaults.model_dump()

    def given_or_default(name: str) -> Any:
        """The option as given; else --settings fast's choice, the workload's training default, the option's."""
        if name in RUN_OPTIONS and getattr(options, name) is not None:
            return getattr(options, name)
        return chosen[name] if name in chosen else training[name] if name in training else value(name)

    seq, seed = given_or_default("seq_length"), given_or_default("seed")
    cross_entropy, fused_qkv = given_or_default("cross_entropy"), given_or_default("fused_qkv")
    _check_model_options(cross_entropy, fused_qkv, engine, parallel, fsdp)
    fp8_recipe = _fp8_recipe(options, given_or_default("precision"), engine, parallel)
    micro, global_batch = _batch_sizes(options, defaults, parallel.dp)
    microbatches = accumulation_steps(global_batch, micro, parallel.dp)
    # DeepSpeed's pipeline engine runs 1F1B whatever the microbatch count; the native one falls back
    if engine == "native" and parallel.pp > 1 and pp_schedule == "1f1b" and microbatches < parallel.pp:
        if options.pp_schedule:
            raise UsageError(
                f"--pp-schedule 1f1b needs at least --pp {parallel.pp} microbatches per step; --global-batch-size "
                f"{global_batch} / (--micro-batch-size {micro} x dp {parallel.dp}) gives {microbatches}; accepted: "
                "a smaller micro batch, a larger global batch, or --pp-schedule gpipe"
            )
        pp_schedule = "gpipe"  # the default schedule, where 1F1B cannot run
    positions = _max_positions(options, workload, seq)
    target, eval_interval = _target(options, workload, value("data"), seed, value("split"))
    _check_checkpoint_options(options, engine, launch)
    _check_valid_data(options)
    if check_paths:
        check_data(value("data"))
        if options.valid_data is not None:
            check_data(options.valid_data, "--valid-data")
        check_output_folder(value("out"))
        if options.save is not None:
            check_output_folder(options.save, "--save")
        if options.load is not None:
            model_config = dataclasses.replace(workload.model, max_position_embeddings=positions)
            check_load(options.load, workload, model_config, engine, parallel, zero_stage, fsdp, fused_qkv)
    resolved: dict[str, Any] = dict(
        model=workload.name,
        micro_batch_size=micro,
        global_batch_size=global_batch,
        parallel=parallel,
        zero_stage=zero_stage,
        pp_schedule=pp_schedule,
        launch=launch,
        optimizer=_build_optimizer(options, defaults, given_or_default),
        eval_interval=eval_interval,
        telemetry_interval_s=value("telemetry_interval"),
        flops_formula=canonical_formula(value("flops_formula")),  # an old name recorded as the formula it means
        out_dir=value("out"),
        max_positions=positions,
        device_memory_bytes=device_memory,
        initial_scale_power=defaults.initial_scale_power,
        loss_scale=defaults.loss_scale,
        target_ppl=target.value if target and target.metric == "ppl" else None,
        target_loss=target.value if target and target.metric == "loss" else None,
        target_given=target.given if target else None,
        fp8_recipe=fp8_recipe,
        profile_steps=_profile_steps(options),
    )
    # The options the spec keeps (--steps, --data, --save, --precision, ...: `kept=` in hwbench.options)
    # are given_or_default's; a new one is its option's definition, nothing more.
    kept = {name: given_or_default(name) for name in _KEPT_RUN_FIELDS}
    _check_no_clipping(resolved["optimizer"], engine, parallel, zero_stage, kept["precision"])
    return RunSpec(**kept, **resolved)


_KEPT_RUN_FIELDS = [field.name for field in dataclasses.fields(KeptRunOptions)]
_KEPT_OPTIMIZER_FIELDS = [field.name for field in dataclasses.fields(KeptOptimizerOptions)]
_KEPT_LAUNCH_FIELDS = [field.name for field in dataclasses.fields(KeptLaunchOptions)]
