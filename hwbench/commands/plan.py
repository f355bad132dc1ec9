"""`hwbench plan`: the predicted per-rank peak memory of a model's layouts, and which
fit a device (docs/planner.md). Needs no device and no torch."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Sequence

from hwbench.catalog import PRECISIONS
from hwbench.device.kinds import DEVICE_KINDS
from hwbench.errors import UsageError
from hwbench.options import ENGINES, PP_SCHEDULES, RunOptions
from hwbench.planner import DEFAULT_HEADROOM, OVERHEAD_BYTES, layouts, variants
from hwbench.units import gib, parse_size

DESCRIPTION = "Predict the per-rank peak memory of training layouts and which fit a device (docs/planner.md)."
HEADERS = ["layout tp x pp x dp", "variant", "precision", "stage", "weights", "grads", "optimizer", "activations",
           "logits", "16-bit casts", "buffers+gathered", "step transient", "overhead", "total GiB", "fits"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="workload from the catalog, any case (default: the run default)")
    parser.add_argument("--devices", type=int, default=1, help="devices (ranks) in the job, all nodes together "
                        "(default: 1)")
    parser.add_argument("--device-memory", help="memory of one device: 32GiB, 80GB, 24G (G = GiB)")
    parser.add_argument("--device-model", help="take the memory from the device catalog, e.g. h100-sxm")
    parser.add_argument("--device", choices=DEVICE_KINDS,
                        help="device kind, for its framework overhead (default: the device model's, else cuda)")
    parser.add_argument("--backend", dest="device", choices=DEVICE_KINDS, help=argparse.SUPPRESS)  # the old name
    parser.add_argument("--layout", help="one layout TPxPPxDP (e.g. 2x2x2): show every pipeline stage")
    parser.add_argument("--engine", choices=ENGINES, help="only this engine's variants")
    parser.add_argument("--fsdp", action="store_true", default=None, help="with --layout: FSDP2 (native engine)")
    parser.add_argument("--zero", type=int, help="with --layout: ZeRO stage 0-3 (deepspeed engine)")
    parser.add_argument("--precision", choices=PRECISIONS)
    parser.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--micro-batch-size", type=int)
    parser.add_argument("--global-batch-size", type=int)
    parser.add_argument("--seq-length", type=int)
    parser.add_argument("--max-positions", type=int, help="length of the position embedding, at least "
                        "--seq-length (default: the workload's)")
    parser.add_argument("--pp-schedule", choices=PP_SCHEDULES)
    parser.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                        help=f"fraction of the device memory a plan may use (default: {DEFAULT_HEADROOM})")


def _capacity_and_kind(args: argparse.Namespace, catalog) -> tuple[int, str]:
    kind = args.device
    if args.device_memory is not None:
        return parse_size(args.device_memory), kind or "cuda"
    if args.device_model is None:
        raise UsageError("hwbench plan needs --device-memory SIZE (e.g. 32GiB) or --device-model NAME "
                         f"(accepted: {', '.join(sorted(catalog.devices))})")
    device = catalog.devices.get(args.device_model)
    if device is None:
        raise UsageError(f"--device-model {args.device_model!r} is not in the catalog; accepted: "
                         f"{', '.join(sorted(catalog.devices))}")
    if device.memory_bytes is None:
        raise UsageError(f"--device-model {args.device_model} has no fixed memory in the catalog; "
                         "give --device-memory SIZE")
    return device.memory_bytes, kind or (device.backend if device.backend in OVERHEAD_BYTES else "cuda")


def _base_options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(data="synthetic", model=args.model, precision=args.precision, recompute=args.recompute,
                      micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
                      seq_length=args.seq_length, max_positions=args.max_positions, pp_schedule=args.pp_schedule)


def _row(layout: str, variant: str, spec, plan, capacity: int, headroom: float) -> list:
    other = plan.buffers_bytes + plan.gathered_bytes
    precision = spec.precision + ("+recompute" if spec.recompute else "")
    return [layout, variant, precision, plan.stage, gib(plan.weights_bytes), gib(plan.gradients_bytes),
            gib(plan.optimizer_bytes), gib(plan.activations_bytes), gib(plan.logits_bytes),
            gib(plan.cast_weights_bytes), gib(other),
            gib(plan.step_transient_bytes), gib(plan.overhead_bytes), gib(plan.total_bytes),
            "yes" if plan.fits(capacity, headroom) else "no"]


def main(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from hwbench.catalog import load_catalog
    from hwbench.planner import Variant, plan_for_all_stages, plan_memory
    from hwbench.spec import build_run_spec

    catalog = load_catalog()
    if args.devices < 1:
        raise UsageError(f"--devices {args.devices} is not accepted; give an integer >= 1")
    if not 0 < args.headroom <= 1:
        raise UsageError(f"--headroom {args.headroom} is not accepted; give a fraction in (0, 1]")
    capacity, kind = _capacity_and_kind(args, catalog)
    base = _base_options(args)
    if args.layout is not None:
        match = re.fullmatch(r"(\d+)x(\d+)x(\d+)", args.layout.strip().lower())
        if not match or min(int(g) for g in match.groups()) < 1:
            raise UsageError(f"--layout {args.layout!r} is not a layout; accepted: TPxPPxDP with positive "
                             "integers, e.g. 2x2x2")
        tp, pp, dp = (int(g) for g in match.groups())
        engine = args.engine or ("deepspeed" if args.zero is not None else "native")
        variant = Variant(engine, fsdp=bool(args.fsdp), zero=args.zero or 0)
        chosen = {**variant.options(), "zero": args.zero}  # a --zero the native engine refuses stays given
        spec = build_run_spec(base.merged(**chosen, nproc_per_node=tp * pp * dp, tp=tp, pp=pp, dp=dp), catalog,
                              check_paths=False)
        config = catalog.workloads[spec.model].model
        rows = [_row(args.layout, variant.name, spec, plan, capacity, args.headroom)
                for plan in plan_for_all_stages(spec, config, kind)]
        print(tabulate(rows, headers=HEADERS))
        _print_footer(spec, capacity, args.headroom, kind, plan_memory(spec, config, kind).notes, [])
        return 0

    rows: list[tuple[int, list]] = []
    skipped: list[str] = []
    spec = None
    for tp, pp, dp in layouts(args.devices):
        name = f"{tp}x{pp}x{dp}"
        for variant in variants(tp, pp, dp, (args.engine,) if args.engine else ENGINES):
            try:
                point = build_run_spec(base.merged(**variant.options(), nproc_per_node=args.devices, tp=tp, pp=pp),
                                       catalog, check_paths=False)
            except UsageError as error:
                line = f"{name}: {error}"
                if line not in skipped:  # the same reason for every variant: once
                    skipped.append(line)
                continue
            spec = point
            plan = plan_memory(point, catalog.workloads[point.model].model, kind)
            rows.append((plan.total_bytes, _row(name, variant.name, point, plan, capacity, args.headroom)))
    rows.sort(key=lambda item: item[0])
    print(tabulate([row for _, row in rows], headers=HEADERS))
    _print_footer(spec, capacity, args.headroom, kind, (), skipped)
    return 0


def _print_footer(spec, capacity: int, headroom: float, kind: str, notes: Sequence[str], skipped: list[str]) -> None:
    print(f"\ndevice memory {gib(capacity)} GiB; fits: total <= {headroom:g} x that; overhead for {kind}: "
          f"{gib(OVERHEAD_BYTES[kind])} GiB (an estimate). GiB = 2^30 bytes; the stage shown is the "
          "rank with the largest prediction. Not yet checked against a GPU (docs/planner.md).")
    if spec is not None:
        print(f"model {spec.model}, micro batch {spec.micro_batch_size}, seq {spec.seq_length}, "
              f"global batch {spec.global_batch_size}")
    for note in notes:
        print(f"note: {note}")
    for line in skipped:
        print(f"skipped {line}")
    sys.stdout.flush()
