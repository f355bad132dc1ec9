"""The one table of `hwbench run` options.

Everything that takes run options reads this table: the `hwbench run` parser (and
`hwbench k8s`, which passes them on), suite files (which options a point may set,
which are switches), `hwbench tune` and `hwbench plan` (which build RunOptions
directly), the Python API. An option is named once here, with its type, its help,
and the names Megatron-LM gives it, so that a Megatron launch line's model and
parallel flags can be pasted.

RunOptions is the typed value: every field None unless given ("the workload's
default"); hwbench.spec.build_run_spec turns it into a validated RunSpec.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from hwbench.catalog import PRECISIONS
from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.errors import UsageError
from hwbench.workload.config import CROSS_ENTROPY_CHOICES, CROSS_ENTROPY_CHUNK_TOKENS
from hwbench.workload.flops import FLOPS_FORMULAS

ENGINES = ("native", "deepspeed")
SETTINGS = ("published", "fast")  # --settings: the workload's published ones, or hwbench.fast's choice
PP_SCHEDULES = ("1f1b", "gpipe")
FLAG = "flag"  # --x sets True
NEGATABLE = "negatable"  # --x / --no-x


@dataclasses.dataclass(frozen=True)
class Option:
    """One `hwbench run` option: ``name`` is its RunOptions field and the parser's dest."""

    name: str
    help: str
    type: Callable[[str], Any] | None = str
    choices: tuple[Any, ...] | None = None
    switch: str | None = None  # FLAG or NEGATABLE; type is then None
    group: str = "workload"
    megatron: tuple[str, ...] = ()  # Megatron-LM's flags for the same option
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


W, P, L = "workload", "parallel layout", "processes and nodes (torchrun)"
RUN_OPTIONS: tuple[Option, ...] = (
    Option("device", "auto picks npu, then cuda, then cpu (default: auto)", choices=DEVICE_CHOICES),
    Option("model", "workload from the catalog, see `hwbench models`; any case (default: small)"),
    Option("micro_batch_size", "samples per forward pass (default: the workload's)", int),
    Option("global_batch_size", "samples per optimizer step (default: the workload's, scaled with data "
           "parallelism when no batch size is given)", int),
    Option("seq_length", "tokens per sample (default: the workload's)", int),
    Option("max_positions", "length of the learned position embedding, at least --seq-length (default: the "
           "workload's; e.g. 2048 to run a GPT-2 size at seq 2048)", int, megatron=("--max-position-embeddings",)),
    Option("precision", "fp32, or bf16/fp16 autocast (default: the workload's)", choices=PRECISIONS),
    Option("recompute", "activation checkpointing of every block (default: the workload's)", None, switch=NEGATABLE),
    Option("compile", "torch.compile every transformer block (default: off; --settings fast: on)", None,
           switch=NEGATABLE),
    Option("settings", "published: the workload's published micro batch and recompute (default); fast: what fits "
           "and is fastest on this device, chosen with the memory planner against its memory: no recompute where "
           "it fits, the largest micro batch that divides the global batch and fits, --compile, --cross-entropy "
           "chunked, --fused-qkv; options given explicitly win", choices=SETTINGS),
    Option("cross_entropy", f"standard, or chunked: the output projection and the loss {CROSS_ENTROPY_CHUNK_TOKENS} "
           "tokens at a time, logits recomputed in the backward, so the [tokens, vocab] fp32 logits never exist "
           "(native engine, --tp 1) (default: standard; --settings fast: chunked where it can run)",
           choices=CROSS_ENTROPY_CHOICES),
    Option("fused_qkv", "one [3h, h] q/k/v projection in Megatron's per-head layout, the same weights as the "
           "separate ones (default: off; --settings fast: on where it can run)", None, switch=NEGATABLE),
    Option("device_memory", "memory per device that --settings fast plans for, e.g. 24GiB or 80GB (default: what "
           "the device reports, else its catalog entry's)", metavar="SIZE"),
    Option("data", "builtin (a synthetic language with a known entropy), synthetic (i.i.d. Zipf tokens) or the "
           "prefix of a Megatron dataset PREFIX.bin/.idx (default: builtin)", megatron=("--data-path",)),
    Option("split", "train,valid,test weights for --data PREFIX (default: 949,50,1)"),
    Option("eval_interval", "validate every N steps; 0: only after the last (default: 0)", int),
    Option("eval_iters", "global batches per validation; 0: none (default: 10)", int),
    Option("steps", "timed optimizer steps (default: 20)", int, megatron=("--train-iters",)),
    Option("warmup", "untimed steps before them (default: 5)", int),
    Option("seed", "seed for weights and data, 0 to 2^32-1 (default: the workload's)", int),
    Option("lr", "peak learning rate (default: the workload's)", float),
    Option("min_lr", "learning rate at the end of the decay (default: the workload's)", float),
    Option("out", "folder for the result file (default: results/runs)"),
    Option("telemetry", "sample power, clocks and temperature during the timed steps (default: on)", None,
           switch=NEGATABLE),
    Option("telemetry_interval", "seconds between telemetry samples (default: 0.5)", float),
    Option("flops_formula", "model FLOPs formula for TFLOP/s and MFU (default: megatron-lm)",
           choices=tuple(FLOPS_FORMULAS)),
    Option("tp", "tensor-parallel degree (default: the workload's published layout when the world size allows, "
           "else 1)", int, group=P, megatron=("--tensor-model-parallel-size",)),
    Option("pp", "pipeline-parallel stages (default: as --tp)", int, group=P,
           megatron=("--pipeline-model-parallel-size",)),
    Option("dp", "data-parallel degree (default: world size / (tp x pp))", int, group=P),
    Option("fsdp", "shard parameters, gradients and optimizer state over dp with FSDP2 (native engine)", None,
           switch=FLAG, group=P),
    Option("zero", "DeepSpeed ZeRO stage 0-3 (--engine deepspeed; default: 0)", int, group=P,
           megatron=("--zero-stage",)),
    Option("engine", "native (torch.distributed) or deepspeed (default: native)", choices=ENGINES, group=P),
    Option("pp_schedule", "pipeline schedule (default: 1f1b, or gpipe when there are fewer microbatches than "
           "stages)", choices=PP_SCHEDULES, group=P),
    Option("nproc_per_node", "ranks on this node (default: 1, in this process)", int, group=L),
    Option("threads_per_rank", "torch intra-op threads in each rank (default: the usable cores of the node "
           "shared among its ranks); more threads than cores marks the run oversubscribed", int, group=L),
    Option("nnodes", "nodes in the job (default: 1)", int, group=L),
    Option("node_rank", "this node's rank, 0 to nnodes-1 (default: 0)", int, group=L),
    Option("master_addr", "address of node 0 (default: 127.0.0.1)", group=L),
    Option("master_port", "port on node 0 (default: a free one on one node; 29500 across nodes)", int, group=L),
    Option("rdzv_endpoint", "HOST:PORT of a c10d rendezvous, instead of --master-addr/--master-port", group=L),
    Option("timeout", "seconds before a run that has not finished is ended, every process with it (default: 1800)",
           float, group=L),
)
BY_NAME = {option.name: option for option in RUN_OPTIONS}
OPTION_NAMES = frozenset(BY_NAME)
SWITCHES = frozenset(o.name for o in RUN_OPTIONS if o.switch)

# Megatron flags that set an hwbench option to a fixed value.
MEGATRON_CONSTANTS = {"--fp16": ("precision", "fp16"), "--bf16": ("precision", "bf16"),
                      "--recompute-activations": ("recompute", True), "--checkpoint-activations": ("recompute", True)}
# Megatron flags that take a value hwbench has no use for in `run`: accepted, and ignored with a reason.
MEGATRON_IGNORED = {"--vocab-file": "the dataset is already tokenized (hwbench data prepare takes the vocabulary)",
                    "--merge-file": "the dataset is already tokenized (hwbench data prepare takes the merges)"}
# Megatron flags hwbench does not take, with what to use instead.
MEGATRON_INSTEAD = {
    "--num-layers": "the model's shape comes from --model (see `hwbench models`; add a workload YAML for another)",
    "--hidden-size": "the model's shape comes from --model (see `hwbench models`)",
    "--num-attention-heads": "the model's shape comes from --model (see `hwbench models`)",
    "--micro-batch-size": None, "--global-batch-size": None, "--seq-length": None, "--seed": None,
    "--lr": None, "--min-lr": None, "--eval-interval": None, "--eval-iters": None, "--split": None,
    "--sequence-parallel": "sequence parallelism is not supported; drop it",
    "--use-flash-attn": "attention goes through torch's SDPA, which picks the fused kernel itself; drop it",
    "--tokenizer-type": "tokenization happens in `hwbench data prepare --tokenizer-type`",
    "--distributed-backend": "the process-group backend follows --device (nccl, hccl or gloo)",
    "--lr-decay-style": "the schedule comes from the workload (its YAML's training.lr_decay_style)",
    "--lr-decay-iters": "the schedule comes from the workload (its YAML's training.lr_decay_iters)",
    "--lr-warmup-fraction": "the schedule comes from the workload (its YAML's training.lr_warmup_fraction)",
    "--weight-decay": "it comes from the workload (its YAML's training.weight_decay)",
    "--clip-grad": "it comes from the workload (its YAML's training.clip_grad)",
    "--data-impl": "Megatron's mmap format is the one hwbench reads; drop it",
    "--log-interval": "hwbench records every step; drop it",
    "--save": "hwbench saves no checkpoints; drop it", "--load": "hwbench loads no checkpoints; drop it",
    "--save-interval": "hwbench saves no checkpoints; drop it",
    "--DDP-impl": "data parallelism is DDP, or FSDP2 with --fsdp",
    "--deepspeed": "use --engine deepspeed", "--deepspeed_config": "hwbench writes the DeepSpeed config itself "
    "from --zero and --precision",
}


def _bool(value: Any, option: Option) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise UsageError(f"{option.flag} {value!r} is not accepted; give true or false")


def coerce(option: Option, value: Any) -> Any:
    """A value from a suite file or the API as the option's type (YAML may give 2 or "2")."""
    if value is None:
        return None
    if option.switch:
        return _bool(value, option)
    if isinstance(value, (list, dict)):
        raise UsageError(f"{option.flag} must be one value, not {value!r}"[:200])
    if option.type in (int, float) and isinstance(value, bool):
        raise UsageError(f"{option.flag} {value!r} is not accepted; give a number")
    try:
        converted = option.type(value) if option.type is not str else str(value)
    except (TypeError, ValueError):
        kind = "an integer" if option.type is int else "a number"
        raise UsageError(f"{option.flag} {value!r} is not accepted; give {kind}") from None
    if option.type is int and isinstance(value, float) and value != converted:
        raise UsageError(f"{option.flag} {value!r} is not accepted; give an integer")
    if option.choices and converted not in option.choices:
        raise UsageError(f"{option.flag} {converted!r} is not known; accepted: {', '.join(map(str, option.choices))}")
    return converted


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a user gave for one run; None = not given (the workload's default applies)."""

    device: str | None = None
    model: str | None = None
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    seq_length: int | None = None
    max_positions: int | None = None
    precision: str | None = None
    recompute: bool | None = None
    compile: bool | None = None
    settings: str | None = None
    cross_entropy: str | None = None
    fused_qkv: bool | None = None
    device_memory: str | None = None
    data: str | None = None
    split: str | None = None
    eval_interval: int | None = None
    eval_iters: int | None = None
    steps: int | None = None
    warmup: int | None = None
    seed: int | None = None
    lr: float | None = None
    min_lr: float | None = None
    out: str | None = None
    telemetry: bool | None = None
    telemetry_interval: float | None = None
    flops_formula: str | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    fsdp: bool | None = None
    zero: int | None = None
    engine: str | None = None
    pp_schedule: str | None = None
    nproc_per_node: int | None = None
    threads_per_rank: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    timeout: float | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "") -> "RunOptions":
        """From a suite point, the API or a namespace's dict: names with - or _, values
        coerced to each option's type; an unknown name is refused with the accepted ones."""
        given: dict[str, Any] = {}
        for key, value in values.items():
            name = str(key).replace("-", "_")
            if name not in BY_NAME:
                prefix = f"{where}: " if where else ""
                raise UsageError(f"{prefix}`{name}` is not a `hwbench run` option; accepted: "
                                 f"{', '.join(sorted(OPTION_NAMES))}")
            given[name] = coerce(BY_NAME[name], value)
        return cls(**given)

    def given(self) -> dict[str, Any]:
        """The options that were given, in table order."""
        return {o.name: getattr(self, o.name) for o in RUN_OPTIONS if getattr(self, o.name) is not None}

    def merged(self, **changes: Any) -> "RunOptions":
        """These options with ``changes`` (None removes one), coerced and checked."""
        return RunOptions.from_mapping({**self.given(), **changes})

    def to_argv(self) -> list[str]:
        """`hwbench run` arguments for a child process (a sweep point, a tune trial, a pod)."""
        argv: list[str] = []
        for name, value in self.given().items():
            option = BY_NAME[name]
            if option.switch == FLAG:
                argv += [option.flag] if value else []
            elif option.switch == NEGATABLE:
                argv.append(option.flag if value else "--no-" + option.flag[2:])
            else:
                argv += [option.flag, repr(value) if isinstance(value, float) else str(value)]
        return argv
