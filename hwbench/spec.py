"""RunSpec: one benchmark point, validated once, before anything starts.

Every value a user can give is checked here; a bad one raises UsageError
naming the option, the value and what would be accepted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hwbench.catalog import PRECISIONS, Catalog, Workload
from hwbench.device import DEVICE_CHOICES
from hwbench.errors import UsageError
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


@dataclasses.dataclass(frozen=True)
class ParallelDims:
    """Degrees of tensor, pipeline and data parallelism; world = tp x pp x dp."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


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

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.parallel.dp)

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _positive(option: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{option} {value!r} is not accepted; give an integer >= {minimum}")
    return value


def _check_out_dir(out: str) -> str:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out!r} is a file; give a directory (it is created when missing)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"--out {out!r} lies under the file {str(parent)!r}; give a directory")
            break
    return out


def _check_data(data: str) -> str:
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
    from hwbench.workload.gpt_dataset import parse_split

    parse_split(split)
    return split


def build_run_spec(options: dict[str, Any], catalog: Catalog) -> RunSpec:
    """RunSpec from CLI-style options (None = the workload's default)."""

    def given(key: str, default: Any) -> Any:
        value = options.get(key)
        return default if value is None else value

    model_name = given("model", DEFAULT_MODEL)
    if model_name not in catalog.workloads:
        raise UsageError(f"--model {model_name!r} is not in the catalog; accepted: {', '.join(sorted(catalog.workloads))}")
    workload: Workload = catalog.workloads[model_name]
    defaults = workload.training

    device = given("device", "auto")
    if device not in DEVICE_CHOICES:
        raise UsageError(f"--device {device!r} is not known; accepted: {', '.join(DEVICE_CHOICES)}")
    precision = given("precision", defaults.precision)
    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r} is not known; accepted: {', '.join(PRECISIONS)}")

    micro = _positive("--micro-batch-size", given("micro_batch_size", defaults.micro_batch_size))
    global_batch = _positive("--global-batch-size", given("global_batch_size", defaults.global_batch_size))
    seq = _positive("--seq-length", given("seq_length", defaults.seq_length))
    steps = _positive("--steps", given("steps", DEFAULT_STEPS))
    warmup = _positive("--warmup", given("warmup", DEFAULT_WARMUP), minimum=0)
    seed = _positive("--seed", given("seed", defaults.seed), minimum=0)
    parallel = ParallelDims()

    if global_batch % (micro * parallel.dp):
        step = micro * parallel.dp
        raise UsageError(
            f"--global-batch-size {global_batch} is not a multiple of --micro-batch-size {micro}"
            + (f" x data parallel {parallel.dp}" if parallel.dp > 1 else "")
            + f"; accepted: {step}, {2 * step}, {3 * step}, ..."
        )
    positions = workload.model.max_position_embeddings
    if seq > positions:
        raise UsageError(
            f"--seq-length {seq} exceeds the {positions} positions of --model {model_name}; accepted: 1 to {positions}"
        )
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
        compile=bool(given("compile", False)),
        steps=steps,
        warmup=warmup,
        seed=seed,
        parallel=parallel,
        optimizer=OptimizerSpec(
            lr=defaults.lr,
            min_lr=defaults.min_lr,
            weight_decay=defaults.weight_decay,
            clip_grad=defaults.clip_grad,
            lr_warmup_iters=defaults.lr_warmup_iters,
            lr_decay_iters=defaults.lr_decay_iters,
            lr_decay_style=defaults.lr_decay_style,
        ),
        initial_scale_power=defaults.initial_scale_power,
        loss_scale=defaults.loss_scale,
        data=_check_data(given("data", DEFAULT_DATA)),
        split=_check_split(given("split", DEFAULT_SPLIT)),
        eval_interval=_positive("--eval-interval", given("eval_interval", 0), minimum=0),
        eval_iters=_positive("--eval-iters", given("eval_iters", DEFAULT_EVAL_ITERS), minimum=0),
        telemetry=bool(given("telemetry", True)),
        telemetry_interval_s=float(interval),
        flops_formula=formula,
        out_dir=_check_out_dir(given("out", DEFAULT_OUT)),
    )
