"""`hwbench tune`: measure the layouts of a model on N devices that fit, and rank them."""

from __future__ import annotations

import argparse

from hwbench.catalog import PRECISIONS
from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.errors import UsageError
from hwbench.options import ENGINES, RunOptions

DESCRIPTION = "Measure layouts of a model on N devices and rank the fastest that fit (docs/planner.md)."


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="workload from the catalog, any case")
    parser.add_argument("--devices", type=int, required=True, help="devices (ranks) in the job, on this node")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto", help="device kind (default: auto)")
    parser.add_argument("--device-memory", help="capacity per device for the planner, e.g. 32GiB (default: the "
                        "device's own, or the catalog's)")
    parser.add_argument("--engines", default="native", help="native, deepspeed or native,deepspeed (default: native)")
    parser.add_argument("--max-trials", type=int, default=8, help="layouts to measure at most (default: 8)")
    parser.add_argument("--patience", type=int, default=3,
                        help="stop after this many trials in a row without a 2%% gain (default: 3)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per trial (default: 10)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per trial (default: 3)")
    parser.add_argument("--precision", choices=PRECISIONS, help="as for `hwbench run`")
    parser.add_argument("--seq-length", type=int, help="as for `hwbench run`")
    parser.add_argument("--global-batch-size", type=int, help="as for `hwbench run`")
    parser.add_argument("--data", help="as for `hwbench run` (default: synthetic)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per trial (default: 600)")
    parser.add_argument("--out", default="results/tune", help="trials go to OUT/<candidate>/ (default: results/tune)")
    parser.add_argument("--quiet", action="store_true", help="no line per trial")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tabulate import tabulate

    from hwbench.catalog import load_catalog
    from hwbench.device import select_backend
    from hwbench.harness.device_check import device_capacity_bytes
    from hwbench.harness.tune import ranking, tune, write_ranking
    from hwbench.result.files import RANKING_FILE, check_output_folder
    from hwbench.spec import build_run_spec, check_data
    from hwbench.units import gib, parse_size

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in ENGINES for e in engines):
        raise UsageError(f"--engines {args.engines!r} is not accepted; give native, deepspeed or native,deepspeed")
    for option, value, minimum in (("--devices", args.devices, 1), ("--max-trials", args.max_trials, 1),
                                   ("--patience", args.patience, 1), ("--steps", args.steps, 1),
                                   ("--warmup", args.warmup, 0)):
        if value < minimum:
            raise UsageError(f"{option} {value} is not accepted; give an integer >= {minimum}")
    base = RunOptions(model=args.model, device=args.device, steps=args.steps, warmup=args.warmup, eval_iters=0,
                      telemetry=False, timeout=args.timeout, data=args.data or "synthetic", precision=args.precision,
                      seq_length=args.seq_length, global_batch_size=args.global_batch_size)
    catalog = load_catalog()
    model = build_run_spec(base, catalog, check_paths=False).model  # the fixed options must be valid on their own
    if args.data:
        check_data(args.data)  # before the first trial, not once per trial
    check_output_folder(args.out)
    capacity = (parse_size(args.device_memory, "--device-memory") if args.device_memory
                else device_capacity_bytes(select_backend(args.device), catalog))
    folder = Path(args.out) / f"{model}-{args.devices}"
    trials = tune(base, args.devices, folder, capacity, engines, args.max_trials, args.patience,
                  show_progress=not args.quiet)
    write_ranking(trials, folder / RANKING_FILE)
    ranked = ranking(trials)
    rows = [[i, t.candidate.name, f"{t.samples_per_s:,.2f}", f"{t.samples_per_s / ranked[0].samples_per_s:.0%}",
             gib(t.predicted_peak_bytes or None)] for i, t in enumerate(ranked, start=1)]
    print(tabulate(rows, headers=["rank", "layout", "samples/s", "of best", "predicted GiB/rank"],
                   disable_numparse=True))
    counts: dict[str, int] = {}
    for t in trials:
        if not t.samples_per_s:
            counts[t.status] = counts.get(t.status, 0) + 1
    print("not ranked: " + (", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"))
    print(f"ranking and every trial: {folder / RANKING_FILE}")
    return 0 if ranked else 1
