"""The same training step as `hwbench run`, in the plainest PyTorch loop: the yardstick
for hwbench's own cost.

    python benchmarks/bare_loop.py --device cuda --model 345m --precision bf16 --json bare.json
    python benchmarks/bare_loop.py --device cpu --model tiny --steps 3 --warmup 1   # the mechanics

What is the same as `hwbench run` with the same options: the model (built by
hwbench.workload.model.build_model, so the architecture, the tied output layer, the
initial weights, activation checkpointing, the fused q/k/v projection and the chunked
cross-entropy are hwbench's own, not a second copy that could drift), the batch (micro
and global batch, sequence, gradient accumulation: the options are resolved by
hwbench.spec.build_run_spec and --settings fast by hwbench.fast, as `hwbench run`
resolves them, defaults and validation included), the precision (autocast to bf16/fp16
over fp32 weights; fp16 with torch's GradScaler), AdamW with the workload's betas, eps and weight
decay (fused where torch has the kernel, as hwbench's CUDA and CPU backends ask for),
gradient clipping at the workload's clip_grad, and the FLOPs (hwbench.workload.flops,
the one place they are computed).

What is deliberately bare: no hwbench engine, device backend, data source, telemetry,
progress, heartbeat or result store; synthetic tokens (uniform, not hwbench's Zipf:
the step's arithmetic does not depend on the token values) are generated once on the
device before timing; a constant learning rate; the loss goes to the host only after
the timed steps. Step times come from device events (host clock on the CPU, where work
is synchronous), after warm-up steps, and the median of the timed steps is reported.
So `hwbench run`'s median step over this one is what hwbench's harness costs
(benchmarks/side_by_side.py computes it).

Prints one summary and, with --json, writes every figure; exit 2 with one line on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from a checkout: hwbench from this tree
    sys.path.insert(0, str(REPO))

from hwbench.catalog import PRECISIONS, load_catalog  # noqa: E402
from hwbench.cli import Parser  # noqa: E402  (argparse with one-line errors, exit 2)
from hwbench.device.kinds import KINDS, choose_allocator_setting  # noqa: E402  (torch-free: each device kind)
from hwbench.errors import UsageError  # noqa: E402
from hwbench.fast import resolve_settings  # noqa: E402
from hwbench.options import SETTINGS  # noqa: E402
from hwbench.spec import RunSpec, build_run_spec, find_workload  # noqa: E402
from hwbench.workload.config import CROSS_ENTROPY_CHOICES  # noqa: E402
from hwbench.workload.flops import model_flops_per_iteration, uncounted  # noqa: E402
from hwbench.workload.params import count_parameters  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(prog="bare_loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="a torch device type: cpu, cuda, npu, ... (default: "
                        "auto, torch's current accelerator, else cpu)")
    parser.add_argument("--model", default="small", help="workload from hwbench's catalog (default: small)")
    parser.add_argument("--micro-batch-size", type=int)
    parser.add_argument("--global-batch-size", type=int)
    parser.add_argument("--seq-length", type=int)
    parser.add_argument("--max-positions", type=int)
    parser.add_argument("--precision", choices=PRECISIONS)
    parser.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile every block, as hwbench --compile")
    parser.add_argument("--settings", choices=SETTINGS, help="as hwbench run --settings (default: published)")
    parser.add_argument("--device-memory", help="as hwbench run --device-memory (with --settings fast)")
    parser.add_argument("--cross-entropy", choices=CROSS_ENTROPY_CHOICES, help="as hwbench run --cross-entropy")
    parser.add_argument("--fused-qkv", action=argparse.BooleanOptionalAction, default=None,
                        help="as hwbench run --fused-qkv")
    parser.add_argument("--steps", type=int, help="timed steps (default: hwbench run's, 20)")
    parser.add_argument("--warmup", type=int, help="untimed steps before them (default: hwbench run's, 5)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", help="write every figure to this file")
    return parser.parse_args(argv)


def resolve_spec(args: argparse.Namespace) -> RunSpec:
    """The RunSpec `hwbench run` would build from the same options (one process), --settings
    fast resolved for this machine's device as `hwbench run` resolves it."""
    options = {"model": args.model, "micro_batch_size": args.micro_batch_size,
               "global_batch_size": args.global_batch_size, "seq_length": args.seq_length,
               "max_positions": args.max_positions, "precision": args.precision, "recompute": args.recompute,
               "compile": args.compile, "steps": args.steps, "warmup": args.warmup, "seed": args.seed,
               "data": "synthetic", "eval_iters": 0, "telemetry": False}
    for name in ("settings", "device_memory", "cross_entropy", "fused_qkv"):  # side_by_side's args may lack them
        options[name] = getattr(args, name, None)
    if args.device in KINDS:
        options["device"] = args.device  # the device whose memory --settings fast plans for
    catalog = load_catalog()
    return resolve_settings(build_run_spec(options, catalog, check_paths=False), options, catalog)


def torch_device(name: str):
    import torch

    if name == "auto":
        accelerator = torch.accelerator.current_accelerator(check_available=True)
        return accelerator if accelerator is not None else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise UsageError(f"--device {name!r} is not a torch device ({error}); accepted: cpu, or an accelerator "
                         "type torch has here") from None
    if device.type != "cpu":
        if stand_in(device.type):
            return torch.device("cpu")  # a test stand-in computes on the host, as hwbench's backend does
        accelerator = torch.accelerator.current_accelerator(check_available=True)
        if accelerator is None or accelerator.type != device.type:
            raise UsageError(f"--device {name}: torch sees no such device here (its accelerator: "
                             f"{accelerator.type if accelerator else 'none'}); accepted: cpu"
                             + (f", {accelerator.type}" if accelerator else ""))
    return device


def stand_in(kind: str) -> bool:
    """Whether torch's ``kind`` module is one of hwbench's test stand-ins (tests/fakes: a CPU build made
    to look like a CUDA, ROCm or NPU build), whose work runs on the host CPU: hwbench's backend then
    computes on the CPU and marks its results simulated, and so does this loop."""
    import torch

    return bool(getattr(getattr(torch, kind, None), "__hwbench_stand_in__", False))


class StepClock:
    """Step times: device events on an accelerator (no host sync inside the timed
    steps), the host clock on the CPU (whose work is synchronous)."""

    def __init__(self, device) -> None:
        import torch

        self.device, self.torch = device, torch
        self.marks: list = []

    def mark(self) -> None:
        if self.device.type == "cpu":
            self.marks.append(time.perf_counter())
        else:
            event = self.torch.Event(device=self.device, enable_timing=True)
            event.record()
            self.marks.append(event)

    def step_times_s(self) -> list[float]:
        if self.device.type == "cpu":
            return [b - a for a, b in zip(self.marks, self.marks[1:])]
        self.torch.accelerator.synchronize()
        return [a.elapsed_time(b) / 1000.0 for a, b in zip(self.marks, self.marks[1:])]


def _accelerator_memory(name: str):
    """torch.accelerator's memory call ``name`` (top level since torch 2.8, also in
    torch.accelerator.memory), or None where this torch has neither."""
    import torch

    for owner in (torch.accelerator, getattr(torch.accelerator, "memory", None)):
        if owner is not None and hasattr(owner, name):
            return getattr(owner, name)
    return None


def peak_memory(device) -> tuple[int | None, str]:
    import torch

    if device.type == "cpu":
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
        return kib * 1024, "process peak resident set (getrusage ru_maxrss), model building included"
    peak = _accelerator_memory("max_memory_reserved")
    if peak is None:
        return None, f"torch {torch.__version__} has no torch.accelerator.max_memory_reserved"
    return int(peak()), "torch.accelerator.max_memory_reserved over the timed steps"


def train(spec: RunSpec, device) -> dict:
    import torch

    from hwbench.workload.model import build_model

    catalog = load_catalog()
    config = spec.model_config(find_workload(catalog, spec.model).model)
    kind = KINDS.get(device.type)
    # the caching allocator's settings hwbench's backend makes (expandable segments on CUDA), made
    # the same way here before the device is initialised, so both sides allocate alike
    allocator = None
    if kind is not None and kind.allocator is not None:
        module = getattr(torch, device.type, None)
        initialised = bool(module is not None and hasattr(module, "is_initialized") and module.is_initialized())
        allocator = choose_allocator_setting(kind.allocator, os.environ, initialised)
    torch.manual_seed(spec.seed)
    model = build_model(config, device=device, seed=spec.seed, recompute=spec.recompute,
                        cross_entropy=spec.cross_entropy, fused_qkv=spec.fused_qkv)
    model.train()
    if spec.compile:
        for block in model.blocks.values():  # as hwbench's native engine compiles
            block.compile()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    kind = KINDS.get(device.type)
    fused = bool(kind and kind.fused_adamw)  # as hwbench's backends choose (device/kinds.py); else foreach
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.optimizer.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.optimizer.lr, betas=(spec.optimizer.adam_beta1, spec.optimizer.adam_beta2), eps=spec.optimizer.adam_eps,
        **({"fused": True} if fused else {"foreach": True}))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.precision)
    scaler = torch.amp.GradScaler(device.type) if spec.precision == "fp16" else None
    accumulation = spec.global_batch_size // spec.micro_batch_size

    # Synthetic tokens on the device, made before anything is timed: 2 steps' worth, in rotation.
    generator = torch.Generator(device=device).manual_seed(spec.seed)
    tokens = torch.randint(0, config.vocab_size, (2 * accumulation, spec.micro_batch_size, spec.seq_length + 1),
                           device=device, generator=generator)
    batches = [(t[:, :-1], t[:, 1:]) for t in tokens]

    def step(index: int) -> torch.Tensor:
        total = torch.zeros((), device=device)
        for micro in range(accumulation):
            inputs, labels = batches[(index * accumulation + micro) % len(batches)]
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = model(inputs, labels) / accumulation
            (scaler.scale(loss) if scaler else loss).backward()
            total += loss.detach()
        if scaler:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.optimizer.clip_grad, foreach=True)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    losses = [step(i) for i in range(spec.warmup)]
    clock = StepClock(device)
    if device.type != "cpu":
        torch.accelerator.synchronize()
        reset = _accelerator_memory("reset_peak_memory_stats")
        if reset is not None:
            reset()
    clock.mark()
    for i in range(spec.warmup, spec.warmup + spec.steps):
        losses.append(step(i))
        clock.mark()
    times = clock.step_times_s()
    peak, peak_source = peak_memory(device)
    median = statistics.median(times)
    not_counted = uncounted(spec.flops_formula, config)  # an MoE model under a formula without expert terms
    flops = None if not_counted else model_flops_per_iteration(
        config, spec.global_batch_size, spec.seq_length, recompute=spec.recompute, formula=spec.flops_formula)
    loss_values = [float(loss) for loss in losses]
    return {
        "tool": "benchmarks/bare_loop.py",
        "model": spec.model, "device": device.type, "device_name": device_name(device), "simulated": False,
        "torch_version": torch.__version__, "host": platform.node(),
        "precision": spec.precision, "recompute": spec.recompute, "compile": spec.compile,
        "settings": spec.settings, "settings_choice": spec.settings_choice, "cross_entropy": spec.cross_entropy,
        "fused_qkv": spec.fused_qkv,
        "micro_batch_size": spec.micro_batch_size, "global_batch_size": spec.global_batch_size,
        "gradient_accumulation_steps": accumulation, "seq_length": spec.seq_length,
        "max_positions": config.max_position_embeddings, "parameters": count_parameters(config).total,
        "optimizer": "AdamW " + ("fused" if fused else "foreach"), "allocator": allocator,
        "warmup": spec.warmup, "steps": spec.steps,
        "step_time_s": {"median": median, "mean": statistics.fmean(times), "min": min(times), "max": max(times),
                        "all": times},
        "tokens_per_s": spec.tokens_per_iteration / median,
        "flops_per_iteration": flops, "flops_formula": spec.flops_formula, "flops_unmeasured": not_counted,
        "tflops_per_device": flops / median / 1e12 if flops is not None else None,
        "peak_memory_bytes": peak, "peak_memory_source": peak_source,
        "loss_start": loss_values[0], "loss_end": loss_values[-1],
    }


def device_name(device) -> str:
    import torch

    if device.type == "cpu":
        return platform.processor() or platform.machine()
    properties = getattr(torch, device.type).get_device_properties(device)  # the accelerator module's own call
    return getattr(properties, "name", device.type)


def summary(figures: dict) -> str:
    peak = figures["peak_memory_bytes"]
    return (f"bare loop: {figures['model']} {figures['precision']} on {figures['device_name']}: "
            f"micro {figures['micro_batch_size']} x {figures['gradient_accumulation_steps']} = global "
            f"{figures['global_batch_size']}, seq {figures['seq_length']}; median step "
            f"{figures['step_time_s']['median'] * 1000:.1f} ms over {figures['steps']}, "
            f"{figures['tokens_per_s']:,.0f} tokens/s, "
            + (f"{figures['tflops_per_device']:.1f} TFLOP/s" if figures["tflops_per_device"] is not None
               else f"TFLOP/s not counted ({figures['flops_formula']})") + ", peak memory "
            + (f"{peak / 2**30:.2f} GiB" if peak is not None else "not measured"))


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except UsageError as error:  # the Parser's line already starts with "bare_loop:"
        print(error, file=sys.stderr)
        return 2
    try:
        spec = resolve_spec(args)  # --steps, --warmup and the rest checked as `hwbench run` checks them
        device = torch_device(args.device)
    except UsageError as error:
        print(f"bare_loop: {error}", file=sys.stderr)
        return 2
    figures = train(spec, device)
    if device.type == "cpu" and args.device not in ("cpu", "auto") and stand_in(args.device):
        figures.update(device=args.device, simulated=True,
                       device_name=f"{figures['device_name']} (simulating {args.device} with a test stand-in)")
    print(summary(figures))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
