"""Every `hwbench run` option, defined once: a field of RunOptions.

The field gives the name (attribute, parser dest, `--name-with-dashes`), the type (its
annotation) and the order; its `Option` metadata the help, group, Megatron-LM's names,
default and what is accepted. Fields rather than a separate table: adding an option is
adding one field. Generated from them: the parser of `hwbench run` (commands/run.py, also
for the run options plan and tune take), suite coercion (suites/suite.py), the API's
checks (`RunOptions.from_mapping`), `to_argv()` and docs/options.md (`python -m
hwbench.options > docs/options.md`). A field is None until given; each given value is
checked by its definition when a RunOptions is made, however it is made.
hwbench.spec.build_run_spec resolves the defaults and checks what spans several options.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Callable, Mapping
from typing import Any

from hwbench.arguments import Option
from hwbench.catalog import LR_DECAY_STYLES, TrainingDefaults
from hwbench.device.kinds import AUTO_ORDER, DEVICE_CHOICES, FALLBACK_KIND
from hwbench.errors import UsageError
from hwbench.precision import DEFAULT_FP8_RECIPE, FP8_RECIPES, RUN_PRECISIONS
from hwbench.target import number_as_text, valid_target_ppl
from hwbench.units import parse_size
from hwbench.workload.config import CROSS_ENTROPY_CHOICES, CROSS_ENTROPY_CHUNK_TOKENS
from hwbench.workload.flops import DEFAULT_FLOPS_FORMULA, FLOPS_FORMULA_ALIASES, FLOPS_FORMULA_NAMES
from hwbench.workload.split import parse_split

ENGINES = ("native", "deepspeed")
SETTINGS = ("published", "fast")  # --settings: the workload's published ones, or hwbench.fast's choice
PP_SCHEDULES = ("1f1b", "gpipe")
DATA_KEYWORDS = ("builtin", "synthetic")
# run options whose value is a path (--data: unless a keyword)
PATH_OPTIONS = ("data", "valid_data", "out", "save", "load")
MULTI_NODE_PORT = 29500  # --master-port across nodes: every node must agree on it
LAYOUT, PROCESSES = "parallel layout", "processes and nodes (torchrun)"
TARGET = "time to a target quality (docs/scores.md)"
TARGET_EVAL_INTERVAL = 10  # --eval-interval when a target is given and none is
CHECKPOINTS = "checkpoints"
OPTIMIZER = "optimizer: AdamW and Megatron-LM's learning-rate schedule"
BETA = "a number from 0 up to, not including, 1"
PROFILE = "profile (where a step's time goes)"
MAX_PROFILE_STEPS = 50  # each profiled step is a trace of every op: a few show the pattern, many fill the disk
MAX_RESTARTS = 100  # torchrun restarts every rank each time: more than this is a crash loop, not a run

MAX_STEPS = 1_000_000  # every step is kept in the result: a million is already a 100 MB file
MAX_BATCH = 10_000_000  # samples; far beyond any published setting, and it keeps index arithmetic sane
MAX_SEED = 2**32 - 1  # Megatron seeds numpy's legacy generator, which takes 0 to 2**32 - 1
MAX_POSITIONS = 1_048_576  # a position table of 2^20 rows is already 8 GiB at hidden 2048 in fp32


def _host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535


def _parses(parse: Callable[[str], Any]) -> Callable[[str], bool]:
    """A ``valid`` of text that ``parse`` reads without a UsageError (--split's weights, a size)."""

    def valid(text: str) -> bool:
        try:
            parse(text)
        except UsageError:
            return False
        return True

    return valid


def _nonempty(text: str) -> bool:
    return bool(text.strip())


def _below_one(beta: float) -> bool:
    """An AdamW beta: a running mean's decay rate, 0 <= beta < 1 (torch refuses any other)."""
    return 0 <= beta < 1


# Where the resolved spec keeps an option as given, else as its default (the workload's, or the option's):
# a field of the option's own name in hwbench.spec's RunSpec, its OptimizerSpec or LaunchSpec, generated into
# hwbench/kept_options.py from the definition below (kept_options_module). Every other option is resolved
# by a rule of hwbench.spec (the batch sizes, the layout, the launch, ...) into a field declared there.
RUN_SPEC, OPTIMIZER_SPEC, LAUNCH_SPEC = "RunSpec", "OptimizerSpec", "LaunchSpec"


def option(help: str, kept: str | None = None, absent_means_default: bool = False, **definition: Any) -> Any:
    """A RunOptions field: None until given; ``definition`` holds Option's other fields. ``kept``: the
    spec part that keeps it (RUN_SPEC, OPTIMIZER_SPEC, LAUNCH_SPEC); ``absent_means_default``: a result written
    before the option existed lacks it, and ran with its default."""
    return dataclasses.field(default=None, metadata={"option": Option(help=help, **definition), "kept": kept,
                                                     "absent_means_default": absent_means_default})


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a user gave for one run, in `hwbench run --help`'s order; None = not given."""

    device: str | None = option(f"auto picks {AUTO_ORDER[0]}, then {', '.join(AUTO_ORDER[1:-1])}, then {FALLBACK_KIND}",
                                default="auto",
                                choices=DEVICE_CHOICES, kept=RUN_SPEC)
    model: str | None = option(
        "workload from the catalog, see `hwbench models`; any case", default="small", accepts="a workload name"
    )
    micro_batch_size: int | None = option(
        "samples per forward pass", default_rule="the workload's", minimum=1, maximum=MAX_BATCH
    )
    global_batch_size: int | None = option(
        "samples per optimizer step",
        minimum=1,
        maximum=MAX_BATCH,
        default_rule="the workload's, scaled with data parallelism when no batch size is given",
    )
    seq_length: int | None = option("tokens per sample", default_rule="the workload's", minimum=1, kept=RUN_SPEC)
    max_positions: int | None = option(
        "length of the learned position embedding, at least --seq-length; e.g. 2048 to run a GPT-2 size at seq "
        "2048. A model with rotary positions (the Llama sizes) has no such table: any other value than its own is "
        "refused",
        default_rule="the workload's",
        accepts=f"an integer from --seq-length to {MAX_POSITIONS}",
        megatron=("--max-position-embeddings",),
    )  # its range spans --seq-length: hwbench.spec checks it
    precision: str | None = option(
        "fp32, bf16/fp16 autocast, or fp8: torchao's float8 training of the transformer blocks' linear layers, "
        "the rest as a bf16 run (docs/methodology.md, 'FP8 training')",
        default_rule="the workload's",
        choices=RUN_PRECISIONS, kept=RUN_SPEC,
    )
    fp8_recipe: str | None = option(
        "how --precision fp8 scales its tensors: tensorwise (one scale per tensor), rowwise (one per row, powers "
        "of 2), mxfp8 (one per 32 elements; the matrix units of NVIDIA Blackwell)",
        default_rule=f"{DEFAULT_FP8_RECIPE} with --precision fp8",
        choices=FP8_RECIPES,
    )
    recompute: bool | None = option(
        "activation checkpointing of every block", default_rule="the workload's", kept=RUN_SPEC,
    )
    compile: bool | None = option(
        "torch.compile every transformer block", default=False, default_rule="off; --settings fast: on", kept=RUN_SPEC,
    )
    settings: str | None = option(
        "published: the workload's published micro batch and recompute; fast: what fits and is fastest on this "
        "device, chosen with the memory planner against its memory: no recompute where it fits, the largest micro "
        "batch that divides the global batch and fits, --compile, --cross-entropy chunked, --fused-qkv; options "
        "given explicitly win",
        default="published",
        choices=SETTINGS, kept=RUN_SPEC, absent_means_default=True,
    )
    cross_entropy: str | None = option(
        f"standard, or chunked: the output projection and the loss {CROSS_ENTROPY_CHUNK_TOKENS} tokens at a time, "
        "logits recomputed in the backward, so the [tokens, vocab] fp32 logits never exist (native engine, --tp 1)",
        default="standard",
        default_rule="standard; --settings fast: chunked where it can run",
        choices=CROSS_ENTROPY_CHOICES, kept=RUN_SPEC, absent_means_default=True,
    )
    fused_qkv: bool | None = option(
        "one [3h, h] q/k/v projection in Megatron's per-head layout, the same weights as the separate ones",
        default=False,
        default_rule="off; --settings fast: on where it can run", kept=RUN_SPEC, absent_means_default=True,
    )
    device_memory: str | None = option(
        "memory per device that --settings fast plans for, e.g. 24GiB or 80GB",
        default_rule="what the device reports, else its catalog entry's",
        valid=_parses(parse_size),
        accepts="a size such as 24GiB or 80GB",
    )
    data: str | None = option(
        "builtin (a synthetic language with a known entropy), synthetic (i.i.d. Zipf tokens) or the prefix of a "
        "Megatron dataset PREFIX.bin/.idx",
        default=DATA_KEYWORDS[0],
        accepts="builtin, synthetic or a path prefix",
        megatron=("--data-path",), kept=RUN_SPEC,
    )
    split: str | None = option(
        "train,valid,test weights for --data PREFIX",
        default="949,50,1",
        valid=_parses(parse_split),
        accepts="up to three non-negative weights", kept=RUN_SPEC,
    )
    valid_data: str | None = option(
        "prefix of a Megatron dataset PREFIX.bin/.idx to validate on, instead of --split's validation part of "
        "--data PREFIX: every validation reads its first --eval-iters x --global-batch-size sequences, in order, "
        "unshuffled (MLPerf Training's fixed validation set)",
        default_rule="the validation part of --data (--split)",
        valid=_nonempty,
        accepts="a path prefix", kept=RUN_SPEC,
    )
    eval_interval: int | None = option(
        "validate every N steps; 0: only after the last",
        default=0,
        minimum=0,
        maximum=MAX_STEPS,
        default_rule=f"0; with a target: {TARGET_EVAL_INTERVAL}",
    )
    eval_iters: int | None = option(
        "global batches per validation; 0: none", default=10, minimum=0, maximum=MAX_STEPS, kept=RUN_SPEC,
    )
    steps: int | None = option(
        "timed optimizer steps", default=20, minimum=1, maximum=MAX_STEPS, megatron=("--train-iters",), kept=RUN_SPEC,
    )
    warmup: int | None = option("untimed steps before them", default=5, minimum=0, maximum=MAX_STEPS, kept=RUN_SPEC)
    target_ppl: str | None = option(
        "stop at the first validation whose perplexity is at or below this; floor*F: F times the lowest reachable "
        "perplexity of --data builtin or synthetic; --steps is then the most steps (not reached: status "
        "not_converged, exit 1)",
        valid=valid_target_ppl,
        normalize=number_as_text,
        accepts="a perplexity > 1, or floor*F with F > 1",
        group=TARGET,
    )
    target_loss: float | None = option(
        "as --target-ppl, for the validation loss in nats", minimum=0, above_minimum=True, group=TARGET
    )
    seed: int | None = option(
        "seed for weights and data", default_rule="the workload's", minimum=0, maximum=MAX_SEED, kept=RUN_SPEC,
    )
    lr: float | None = option(
        "peak learning rate", default_rule="the workload's", minimum=0, above_minimum=True, group=OPTIMIZER,
        kept=OPTIMIZER_SPEC,
    )
    min_lr: float | None = option(
        "learning rate at the end of the decay, at most --lr", default_rule="the workload's", minimum=0,
        group=OPTIMIZER, kept=OPTIMIZER_SPEC,
    )
    lr_warmup_iters: int | None = option(
        "steps of linear warm-up from --lr-warmup-init to --lr, counted from the first step (the untimed --warmup "
        "steps included), below --lr-decay-iters; not with --lr-warmup-fraction",
        default_rule="the workload's", minimum=0, group=OPTIMIZER
    )
    lr_warmup_fraction: float | None = option(
        "warm-up as a fraction of --lr-decay-iters: round(F x decay iters) steps; not with --lr-warmup-iters",
        default_rule="the workload's", minimum=0, maximum=1, group=OPTIMIZER
    )
    lr_warmup_init: float | None = option(
        "learning rate the warm-up starts from, at most --lr", default=0.0, minimum=0, group=OPTIMIZER,
        kept=OPTIMIZER_SPEC, absent_means_default=True,
    )
    lr_decay_iters: int | None = option(
        "step at which the decay reaches --min-lr (it may lie far past --steps)", default_rule="the workload's",
        minimum=1, group=OPTIMIZER, kept=OPTIMIZER_SPEC,
    )
    lr_decay_style: str | None = option(
        "decay from --lr to --min-lr after the warm-up", default_rule="the workload's", choices=LR_DECAY_STYLES,
        group=OPTIMIZER, kept=OPTIMIZER_SPEC,
    )
    adam_beta1: float | None = option(
        "AdamW's decay rate of the gradient's running mean", default=0.9, valid=_below_one, accepts=BETA,
        group=OPTIMIZER, kept=OPTIMIZER_SPEC, absent_means_default=True,
    )
    adam_beta2: float | None = option(
        "AdamW's decay rate of the squared gradient's running mean", default=0.999, valid=_below_one, accepts=BETA,
        group=OPTIMIZER, kept=OPTIMIZER_SPEC, absent_means_default=True,
    )
    adam_eps: float | None = option(
        "AdamW's epsilon, added to the denominator", default=1e-8, minimum=0, above_minimum=True, group=OPTIMIZER,
        kept=OPTIMIZER_SPEC, absent_means_default=True,
    )
    weight_decay: float | None = option(
        "AdamW weight decay of the weight matrices (biases and norm gains get none)", default_rule="the workload's",
        minimum=0, group=OPTIMIZER, kept=OPTIMIZER_SPEC,
    )
    clip_grad: float | None = option(
        "clip the gradients to this global L2 norm; 0: no clipping", default_rule="the workload's", minimum=0,
        group=OPTIMIZER, kept=OPTIMIZER_SPEC,
    )
    out: str | None = option("folder for the result file", default="results/runs", accepts="a folder")
    telemetry: bool | None = option(
        "sample power, clocks and temperature during the timed steps", default=True, kept=RUN_SPEC,
    )
    telemetry_interval: float | None = option(
        "seconds between telemetry samples", default=0.5, minimum=0.01, maximum=60, accepts="seconds"
    )
    flops_formula: str | None = option(
        "FLOPs formula for TFLOP/s and MFU (megatron-deepspeed counts the recompute: HFU for a run that "
        "recomputes; it also counts every model as GPT-2's shape, multi-head attention and a 4h GELU MLP, "
        "and the result warns where the model has another); "
        + "; ".join(f"{old} is the old name of {new}" for old, new in FLOPS_FORMULA_ALIASES.items())
        + "; every formula's figures are in the result's metrics.by_formula",
        default=DEFAULT_FLOPS_FORMULA,
        choices=FLOPS_FORMULA_NAMES,
    )
    tp: int | None = option(
        "tensor-parallel degree",
        minimum=1,
        group=LAYOUT,
        default_rule="the workload's published layout when the world size allows, else 1",
        megatron=("--tensor-model-parallel-size",),
    )
    pp: int | None = option(
        "pipeline-parallel stages",
        default_rule="as --tp",
        minimum=1,
        group=LAYOUT,
        megatron=("--pipeline-model-parallel-size",),
    )
    dp: int | None = option("data-parallel degree", default_rule="world size / (tp x pp)", minimum=1, group=LAYOUT)
    ep: int | None = option(
        "expert-parallel degree of a mixture-of-experts model: each MoE layer's experts split over groups of this "
        "many data-parallel ranks, tokens sent to their experts' rank and back by all-to-all; divides dp and the "
        "experts",
        default=1,
        minimum=1,
        group=LAYOUT,
        megatron=("--expert-model-parallel-size",),
    )
    fsdp: bool | None = option(
        "shard parameters, gradients and optimizer state over dp with FSDP2 (native engine)",
        default=False,
        group=LAYOUT, kept=RUN_SPEC, absent_means_default=True,
    )
    zero: int | None = option(
        "DeepSpeed ZeRO stage (--engine deepspeed)",
        default=0,
        choices=(0, 1, 2, 3),
        group=LAYOUT,
        megatron=("--zero-stage",),
    )
    engine: str | None = option(
        "native (torch.distributed) or deepspeed", default=ENGINES[0], choices=ENGINES, group=LAYOUT,
        kept=RUN_SPEC, absent_means_default=True,
    )
    pp_schedule: str | None = option(
        "pipeline schedule",
        choices=PP_SCHEDULES,
        group=LAYOUT,
        default_rule="1f1b, or gpipe when there are fewer microbatches than stages",
    )
    nproc_per_node: int | None = option(
        "ranks on this node; 1 runs in this process", default=1, minimum=1, maximum=1024, group=PROCESSES,
        kept=LAUNCH_SPEC, absent_means_default=True,
    )
    threads_per_rank: int | None = option(
        "torch intra-op threads in each rank; more threads than cores marks the run oversubscribed",
        minimum=1,
        maximum=4096,
        default_rule="the usable cores of the node shared among its ranks",
        group=PROCESSES, kept=RUN_SPEC,
    )
    nnodes: int | None = option("nodes in the job", default=1, minimum=1, maximum=65_536, group=PROCESSES,
                                kept=LAUNCH_SPEC, absent_means_default=True)
    node_rank: int | None = option("this node's rank, below --nnodes", default=0, minimum=0, group=PROCESSES,
                                   kept=LAUNCH_SPEC, absent_means_default=True)
    master_addr: str | None = option(
        "address of node 0", default="127.0.0.1", accepts="a host name or address", group=PROCESSES,
        kept=LAUNCH_SPEC, absent_means_default=True,
    )
    master_port: int | None = option(
        "port on node 0",
        minimum=1,
        maximum=65535,
        accepts="a TCP port",
        default_rule=f"a free one on one node; {MULTI_NODE_PORT} across nodes",
        group=PROCESSES, kept=LAUNCH_SPEC,
    )
    rdzv_endpoint: str | None = option(
        "HOST:PORT of a c10d rendezvous, instead of --master-addr/--master-port",
        valid=_host_port,
        accepts="HOST:PORT",
        group=PROCESSES, kept=LAUNCH_SPEC,
    )
    timeout: float | None = option(
        "seconds before a run that has not finished is ended, every process with it",
        default=1800.0,
        minimum=0,
        above_minimum=True,
        maximum=30 * 86400.0,
        accepts="seconds",
        group=PROCESSES,
    )
    preflight: bool | None = option(
        "check the machine first (hwbench preflight): other processes on the device, clocks, governor, swap, ...; "
        "the readings go into the result's environment.preflight",
        default=True,
        group=PROCESSES,
    )
    max_restarts: int | None = option(
        "torchrun's restarts of every rank after one fails; with --save, each restart resumes from the last "
        "checkpoint of this run",
        default=0,
        minimum=0,
        maximum=MAX_RESTARTS,
        group=PROCESSES, kept=LAUNCH_SPEC, absent_means_default=True,
    )
    save: str | None = option(
        "folder to save checkpoints into, as Megatron-LM lays them out (iter_NNNNNNN/, "
        "latest_checkpointed_iteration.txt): after the last step, and every --save-interval steps",
        valid=_nonempty,
        accepts="a folder",
        group=CHECKPOINTS, kept=RUN_SPEC,
    )
    save_interval: int | None = option(
        "save also after every step whose number is a multiple of N (--save)",
        minimum=1,
        maximum=MAX_STEPS,
        default_rule="only after the last step",
        group=CHECKPOINTS, kept=RUN_SPEC,
    )
    load: str | None = option(
        "resume from a checkpoint: a --save folder (its latest) or one of its iter_NNNNNNN folders; the run trains "
        "--warmup + --steps more steps from there, in the same sample order",
        valid=_nonempty,
        accepts="a folder",
        group=CHECKPOINTS, kept=RUN_SPEC,
    )
    async_save: bool | None = option(
        "write each checkpoint in the background (torch.distributed.checkpoint's async_save; native engine): "
        "training stalls only while the state is copied to host memory",
        default=False,
        group=CHECKPOINTS, kept=RUN_SPEC, absent_means_default=True,
    )
    profile: bool | None = option(
        "torch.profiler over --profile-steps extra steps after the timed ones (kept out of every timed figure): "
        "a trace per rank beside the result (<run id>.profile/rank-N.json.gz, Chrome/Perfetto JSON), where each "
        "rank's step time goes, and the rank the others wait for (docs/methodology.md, 'Where the time goes')",
        default=False,
        group=PROFILE, kept=RUN_SPEC, absent_means_default=True,
    )
    profile_steps: int | None = option(
        "steps --profile records, after one more it discards (the profiler's warm-up)",
        default=2,
        minimum=1,
        maximum=MAX_PROFILE_STEPS,
        group=PROFILE,
    )

    def __post_init__(self) -> None:
        for name, value in self.given().items():
            object.__setattr__(self, name, RUN_OPTIONS[name].check(value))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunOptions:
        """From a suite point, the API or a namespace's dict: names with - or _, each value
        checked as its option's type and range (None: not given); an unknown name is refused
        with the accepted ones."""
        given: dict[str, Any] = {}
        for key, value in values.items():
            name = str(key).replace("-", "_")
            if name not in RUN_OPTIONS:
                raise UsageError(f"`{name}` is not a `hwbench run` option; accepted: {', '.join(sorted(RUN_OPTIONS))}")
            given[name] = value
        return cls(**given)

    def given(self) -> dict[str, Any]:
        """The options that were given, in definition order."""
        return {name: getattr(self, name) for name in RUN_OPTIONS if getattr(self, name) is not None}

    def value(self, name: str) -> Any:
        """The option as given, else its default (None where a rule decides it: build_run_spec)."""
        given = getattr(self, name)
        return RUN_OPTIONS[name].default if given is None else given

    def merged(self, **changes: Any) -> RunOptions:
        """These options with ``changes`` (None removes one), checked."""
        return RunOptions.from_mapping({**self.given(), **changes})

    def with_absolute_paths(self) -> RunOptions:
        """These options with every path made absolute from this process's folder, for a
        script that runs elsewhere (an sbatch job may start in another folder)."""
        paths = {name: value for name, value in self.given().items()
                 if name in PATH_OPTIONS and not (name == "data" and value in DATA_KEYWORDS)}
        for name, value in paths.items():
            if not value.strip():  # absolute, it would name this folder
                raise UsageError(f"{RUN_OPTIONS[name].flag} {value!r} is not accepted; give a path")
        return self.merged(**{name: os.path.abspath(value) for name, value in paths.items()})

    def to_argv(self) -> list[str]:
        """`hwbench run` arguments for a child process (a sweep point, a tune trial, a pod)."""
        argv: list[str] = []
        for name, value in self.given().items():
            option = RUN_OPTIONS[name]
            if option.type is bool:
                argv.append(option.flag if value else "--no-" + option.flag[2:])
            else:
                argv += [option.flag, repr(value) if isinstance(value, float) else str(value)]
        return argv


def _definitions() -> dict[str, Option]:
    hints = typing.get_type_hints(RunOptions)
    return {
        field.name: dataclasses.replace(
            field.metadata["option"],
            name=field.name,
            type=next(t for t in typing.get_args(hints[field.name]) if t is not None and t is not type(None)),
        )
        for field in dataclasses.fields(RunOptions)
    }


RUN_OPTIONS: dict[str, Option] = _definitions()  # name -> definition, in --help's order
KEPT: dict[str, str] = {field.name: field.metadata["kept"] for field in dataclasses.fields(RunOptions)
                        if field.metadata["kept"]}  # option -> the spec part that keeps it, in --help's order

# Megatron flags that set an hwbench option to a fixed value.
MEGATRON_CONSTANTS = {
    "--fp16": ("precision", "fp16"),
    "--bf16": ("precision", "bf16"),
    "--recompute-activations": ("recompute", True),
    "--checkpoint-activations": ("recompute", True),
}
# Megatron flags that take a value hwbench has no use for in `run`: accepted, and ignored with a reason.
MEGATRON_IGNORED = {
    "--vocab-file": "the dataset is already tokenized (hwbench data prepare takes the vocabulary)",
    "--merge-file": "the dataset is already tokenized (hwbench data prepare takes the merges)",
}
# Megatron flags hwbench does not take, with what to use instead. (Megatron's flags that hwbench
# spells the same, --micro-batch-size, --seq-length, --lr, ..., are simply its options.)
MEGATRON_INSTEAD = {
    "--num-layers": "the model's shape comes from --model (see `hwbench models`; add a workload YAML for another)",
    "--hidden-size": "the model's shape comes from --model (see `hwbench models`)",
    "--num-attention-heads": "the model's shape comes from --model (see `hwbench models`)",
    "--num-query-groups": ("the model's shape comes from --model: "
                           "its workload YAML's model.num_query_groups (see `hwbench models`)"),
    "--ffn-hidden-size": "the model's shape comes from --model: its workload YAML's model.ffn_hidden_size",
    "--swiglu": "the model's shape comes from --model: its workload YAML's model.swiglu",
    "--normalization": "the model's shape comes from --model: its workload YAML's model.normalization",
    "--norm-epsilon": "the model's shape comes from --model: its workload YAML's model.norm_epsilon",
    "--position-embedding-type": ("the model's shape comes from --model: "
                                  "its workload YAML's model.position_embedding_type"),
    "--rotary-base": "the model's shape comes from --model: its workload YAML's model.rotary_base",
    "--use-rope-scaling": "the model's shape comes from --model: its workload YAML's model.rope_scaling",
    "--disable-bias-linear": "the model's shape comes from --model: its workload YAML's model.add_bias_linear (false)",
    "--untie-embeddings-and-output-weights": ("the model's shape comes from --model: "
                                              "its workload YAML's model.untie_embeddings_and_output_weights"),
    "--group-query-attention": "the model's shape comes from --model: its workload YAML's model.num_query_groups",
    "--sequence-parallel": "sequence parallelism is not supported; drop it",
    "--use-flash-attn": "attention goes through torch's SDPA, which picks the fused kernel itself; drop it",
    "--tokenizer-type": "tokenization happens in `hwbench data prepare --tokenizer-type`",
    "--tokenizer-model": "tokenization happens in `hwbench data prepare --tokenizer-model`",
    "--distributed-backend": "the process-group backend follows --device (nccl, hccl or gloo)",
    "--valid-data-path": "give --valid-data PREFIX: one dataset, whose first sequences every validation reads in "
                         "order (Megatron-LM reads its --valid-data-path shuffled, moving on at each validation)",
    "--data-impl": "Megatron's mmap format is the one hwbench reads; drop it",
    "--log-interval": "hwbench records every step; drop it",
    "--DDP-impl": "data parallelism is DDP, or FSDP2 with --fsdp",
    "--deepspeed": "use --engine deepspeed",
    "--deepspeed_config": "hwbench writes the DeepSpeed config itself from --zero and --precision",
}


def markdown() -> str:
    """docs/options.md: every run option and Megatron-LM's names, from the definitions above."""

    def row(*cells: str) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    lines = [
        "# `hwbench run` options",
        "",
        "Written by `python -m hwbench.options > docs/options.md` from the definitions in `hwbench/options.py`",
        "(`tests/test_options.py` fails when it differs); `hwbench run --help` shows the same. Suite points",
        "(docs/sweeps.md) and the Python API (docs/api.md) take the names with underscores, switches as true or",
        'false. A value outside "accepted" is refused with one line naming the option, exit status 2.',
    ]
    for group in dict.fromkeys(o.group for o in RUN_OPTIONS.values()):
        lines += [
            "",
            f"## {group}",
            "",
            row("option", "what it does", "default", "accepted", "Megatron-LM"),
            row(*["---"] * 5),
        ]
        for o in (o for o in RUN_OPTIONS.values() if o.group == group):
            flag = f"`{o.flag}`, `--no-{o.flag[2:]}`" if o.type is bool else f"`{o.flag}`"
            lines.append(row(flag, o.help, o.default_text or "-", o.accepted, ", ".join(f"`{m}`" for m in o.megatron)))
    lines += [
        "",
        "## Megatron-LM's other flags",
        "",
        "Megatron-LM's flags that hwbench spells the same (`--micro-batch-size`, `--seq-length`, `--lr`, ...)",
        "are the options above.",
        "",
        row("flag", "in hwbench"),
        row("---", "---"),
    ]
    lines += [
        row(f"`{flag}`", f"as `{RUN_OPTIONS[name].flag}{'' if value is True else ' ' + str(value)}`")
        for flag, (name, value) in MEGATRON_CONSTANTS.items()
    ]
    lines += [row(f"`{flag}`", f"accepted and not used: {why}") for flag, why in MEGATRON_IGNORED.items()]
    lines += [row(f"`{flag}`", f"refused: {instead}") for flag, instead in MEGATRON_INSTEAD.items()]
    return "\n".join(lines) + "\n"


_KEPT_CLASSES = {RUN_SPEC: ("KeptRunOptions", "The run options RunSpec keeps (hwbench.spec)."),
                 OPTIMIZER_SPEC: ("KeptOptimizerOptions", "The run options OptimizerSpec keeps (hwbench.spec)."),
                 LAUNCH_SPEC: ("KeptLaunchOptions", "The run options LaunchSpec keeps (hwbench.spec).")}
_RANGE_TYPES = ("Positive", "Count")  # hwbench.fields' ranges of an integer


def _kept_type(option: Option) -> str:
    """The spec's type of a kept option's value: its own, an integer's range as hwbench.fields names it."""
    if option.type in (bool, str, float):
        return option.type.__name__
    lowest = None if option.minimum is None else option.minimum + int(option.above_minimum)  # of an integer
    if option.type is int and lowest in (0, 1):
        return "Positive" if lowest == 1 else "Count"
    raise ValueError(f"{option.flag} is kept in the spec, and its type {option.type.__name__} from minimum "
                     f"{option.minimum} has no spec type here: add one to _kept_type")


def _kept_field(name: str, absent_means_default: bool) -> str:
    """The spec field of a kept option: `seq_length: Positive`, `save: str | None = None`."""
    option, workload = RUN_OPTIONS[name], TrainingDefaults.model_fields.get(name)
    kind = _kept_type(option)
    # build_run_spec takes the option as given, else the workload's training default, else the option's
    if option.default is None and (workload is None or not workload.is_required()):
        return f"{name}: {kind} | None = None"
    default = json.dumps(option.default) if isinstance(option.default, str) else repr(option.default)
    return f"{name}: {kind}" + (f" = {default}" if absent_means_default else "")


def kept_options_module() -> str:
    """hwbench/kept_options.py: the fields of the options RunSpec, OptimizerSpec and LaunchSpec keep,
    from the definitions above (``kept=``)."""
    absent = {f.name for f in dataclasses.fields(RunOptions) if f.metadata["absent_means_default"]}
    fields = {part: [_kept_field(name, name in absent) for name, kept in KEPT.items() if kept == part]
              for part in _KEPT_CLASSES}
    ranges = [kind for kind in _RANGE_TYPES if any(f": {kind}" in line for lines in fields.values() for line in lines)]
    lines = [
        '"""The fields of hwbench.spec\'s RunSpec, OptimizerSpec and LaunchSpec that keep a run option as given,',
        "else as its default (the workload's training default, or the option's). Written by `python -m",
        "hwbench.options --kept-options > hwbench/kept_options.py` from the options' definitions in",
        "hwbench/options.py (``kept=``); tests/test_run_spec_declaration.py fails when this file differs: change",
        "the option, not this file. A field's type is the option's, with its range (hwbench.fields); None where",
        "the option has no default of its own or the workload's; a default where a result written before the",
        'option existed lacks it (``absent_means_default``): the option\'s, which that run ran with."""',
        "",
        "from __future__ import annotations",
        "",
        "import dataclasses",
        "",
        f"from hwbench.fields import {', '.join(sorted(ranges))}",
    ]
    for part, (name, doc) in _KEPT_CLASSES.items():
        lines += ["", "", "@dataclasses.dataclass(frozen=True, kw_only=True)", f"class {name}:", f'    """{doc}"""',
                  "", *(f"    {line}" for line in fields[part])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] not in ([], ["--kept-options"]):
        print(f"python -m hwbench.options {' '.join(sys.argv[1:])}: accepted: no argument (docs/options.md), or "
              "--kept-options (hwbench/kept_options.py)", file=sys.stderr)
        sys.exit(2)
    print(kept_options_module() if sys.argv[1:] else markdown(), end="")
