"""`hwbench plan`: the predicted per-rank peak memory of a model's layouts, and which
fit a device (docs/planner.md). Needs no device and no torch."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hwbench.commands.run import add_run_options
from hwbench.device.kinds import DEVICE_KINDS
from hwbench.errors import UsageError
from hwbench.options import ENGINES, RUN_OPTIONS, RunOptions
from hwbench.planner import DEFAULT_HEADROOM, OVERHEAD_BYTES
from hwbench.units import decimal_size_note, gib

if TYPE_CHECKING:
    from hwbench.layouts import LayoutPlan

DESCRIPTION = "Predict the per-rank peak memory of training layouts and which fit a device (docs/planner.md)."
HEADERS = ["layout tp x pp x dp", "variant", "precision", "stage", "weights", "grads", "optimizer", "activations",
           "logits", "16-bit casts", "buffers+gathered", "step transient", "overhead", "total GiB", "fits"]


# The terms of a plan as the table names them, for the lines that say why a layout does not fit.
TERMS = (("weights", "weights_bytes"), ("grads", "gradients_bytes"), ("optimizer", "optimizer_bytes"),
         ("activations", "activations_bytes"), ("logits", "logits_bytes"), ("16-bit casts", "cast_weights_bytes"),
         ("buffers", "buffers_bytes"), ("gathered", "gathered_bytes"), ("step transient", "step_transient_bytes"))


# `hwbench run` options that shape the memory a layout needs; --fsdp and --zero (with
# --layout) and --engine (a filter) are plan's own.
RUN_OPTIONS_TAKEN = ("model", "precision", "recompute", "micro_batch_size", "global_batch_size", "seq_length",
                     "max_positions", "pp_schedule")


def configure(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser, RUN_OPTIONS_TAKEN, megatron=False)
    parser.add_argument("--devices", type=int, default=1, help="devices (ranks) in the job, at most "
                        f"{RUN_OPTIONS['nproc_per_node'].maximum:g} as one launch's (default: 1)")
    parser.add_argument("--device-memory", help="memory of one device: 32GiB, 80GB, 24G (G = GiB)")
    parser.add_argument("--device-model", help="take the memory from the device catalog, e.g. h100-sxm")
    parser.add_argument("--device", choices=DEVICE_KINDS,
                        help="device kind, for its framework overhead (default: the device model's, else cuda)")
    parser.add_argument("--backend", dest="device", choices=DEVICE_KINDS, help=argparse.SUPPRESS)  # the old name
    parser.add_argument("--layout", help="one layout TPxPPxDP (e.g. 2x2x2): show every pipeline stage")
    parser.add_argument("--engine", choices=ENGINES, help="only this engine's variants")
    parser.add_argument("--fsdp", action="store_true", default=None, help="with --layout: FSDP2 (native engine)")
    parser.add_argument("--zero", type=int, help="with --layout: ZeRO stage 0-3 (deepspeed engine)")
    parser.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                        help=f"fraction of the device memory a plan may use (default: {DEFAULT_HEADROOM})")


def _base_options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(data="synthetic", **{name: getattr(args, name) for name in RUN_OPTIONS_TAKEN})


def _row(layout, plan, capacity: int, headroom: float) -> list:
    other = plan.buffers_bytes + plan.gathered_bytes
    precision = layout.spec.precision + ("+recompute" if layout.spec.recompute else "")
    return [layout.name, layout.variant, precision, plan.stage, gib(plan.weights_bytes), gib(plan.gradients_bytes),
            gib(plan.optimizer_bytes), gib(plan.activations_bytes), gib(plan.logits_bytes),
            gib(plan.cast_weights_bytes), gib(other), gib(plan.step_transient_bytes), gib(plan.overhead_bytes),
            gib(plan.total_bytes),
            "yes" if plan.fits(capacity, headroom) else "no"]


def main(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from hwbench.layouts import plan_layouts

    base, layout = _base_options(args), None
    if args.layout is not None:
        # at most 9 digits each: a number of thousands of digits is beyond int()'s limit, and beyond any layout
        match = re.fullmatch(r"(\d{1,9})x(\d{1,9})x(\d{1,9})", args.layout.strip().lower())
        if not match or min(int(g) for g in match.groups()) < 1:
            shown = args.layout if len(args.layout) <= 40 else args.layout[:37] + "..."
            raise UsageError(f"--layout {shown!r} is not a layout; accepted: TPxPPxDP with positive "
                             "integers, e.g. 2x2x2")
        layout = (int(match[1]), int(match[2]), int(match[3]))
        engine = args.engine or ("deepspeed" if args.zero is not None else "native")
        base = base.merged(engine=engine, fsdp=args.fsdp, zero=args.zero)  # a --zero the native engine refuses
    found = plan_layouts(base, args.devices, device_memory=args.device_memory, device_model=args.device_model,
                         device=args.device, headroom=args.headroom, engines=(args.engine,) if args.engine else ENGINES,
                         layout=layout)
    if layout is not None and found.refused:
        raise UsageError(found.refused[0].refused)
    rows = [_row(planned, plan, found.capacity_bytes, found.headroom) for planned in found.layouts
            for plan in (planned.stages if layout else [planned.peak])]  # --layout: every stage
    print(tabulate(rows, headers=HEADERS))
    too_big = [_why_not(planned, plan, found.capacity_bytes, found.headroom) for planned in found.layouts
               for plan in (planned.stages if layout else [planned.peak])
               if not plan.fits(found.capacity_bytes, found.headroom)]
    skipped = list(dict.fromkeys(f"{refused.name}: {refused.refused}" for refused in found.refused))
    notes = [*filter(None, [decimal_size_note(args.device_memory, "--device-memory")]),
             *(found.layouts[0].peak.notes if layout else ())]
    none_fits = _none_fits(found) if found.layouts and not any(planned.fits for planned in found.layouts) else None
    _print_footer(found.layouts[-1].spec if found.layouts else None, found.capacity_bytes, found.headroom,
                  found.device_kind, notes, too_big, skipped, none_fits)
    return 0


def _none_fits(found: LayoutPlan) -> str:
    """Why no layout fits, where the states alone say it: every parameter's weight, gradient and
    optimizer state, which sharding divides but never removes, against the usable memory of all
    the devices; and the devices they would need at the least."""
    from hwbench.catalog import load_catalog
    from hwbench.planner import state_bytes

    specs = [planned.spec for planned in found.layouts if planned.spec is not None]  # a planned layout has one
    spec = specs[0]
    states = min(state_bytes(planned, load_catalog().workloads[spec.model].model) for planned in specs)
    usable = found.headroom * found.capacity_bytes
    devices = spec.parallel.world_size
    line = f"no layout fits: the weights, gradients and optimizer state alone are {gib(states)} GiB"
    if states > devices * usable:
        return (f"{line}, more than the {devices} devices' {gib(devices * usable)} GiB usable; fully sharded they "
                f"need at least {-(-states // int(usable))} devices, before any activation")
    return (f"{line}, within the {devices} devices' {gib(devices * usable)} GiB usable: the largest terms above say "
            "what else each layout needs")


def _why_not(layout, plan, capacity: int, headroom: float) -> str:
    """One line: what a layout that does not fit needs, against what may be used, and its three largest terms."""
    largest = sorted(TERMS, key=lambda term: -getattr(plan, term[1]))[:3]
    stage = f" stage {plan.stage}" if layout.pp > 1 else ""
    variant = layout.variant + ("+recompute" if layout.spec.recompute else "")
    return (f"{layout.name} {variant}{stage}: {gib(plan.total_bytes)} GiB > {gib(headroom * capacity)} GiB "
            "usable; largest: " + ", ".join(f"{label} {gib(getattr(plan, field))}" for label, field in largest))


def _print_footer(spec, capacity: int, headroom: float, kind: str, notes: Sequence[str], too_big: list[str],
                  skipped: list[str], none_fits: str | None = None) -> None:
    print(f"\ndevice memory {gib(capacity)} GiB; fits: total <= {headroom:g} x that; overhead for {kind}: "
          f"{gib(OVERHEAD_BYTES[kind])} GiB (an estimate). GiB = 2^30 bytes; the stage shown is the "
          "rank with the largest prediction. Not yet checked against a GPU (docs/planner.md).")
    if spec is not None:
        print(f"model {spec.model}, micro batch {spec.micro_batch_size}, seq {spec.seq_length}, "
              f"global batch {spec.global_batch_size}")
    for note in notes:
        print(f"note: {note}")
    for line in too_big:
        print(f"does not fit: {line}")
    if none_fits:
        print(none_fits)
    for line in skipped:
        print(f"skipped {line}")
    sys.stdout.flush()
