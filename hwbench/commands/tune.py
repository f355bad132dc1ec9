"""`hwbench tune`: measure the layouts of a model on N devices that fit, and rank them."""

from __future__ import annotations

import argparse
import sys

from hwbench.commands.run import add_run_options
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
    parser.add_argument("--repeats", type=int, default=1, help="runs of each trial; layouts whose repeats cannot be "
                        "told apart share a rank (default: 1: one run each, told apart by the 5%% threshold alone)")
    add_run_options(parser, ("precision", "seq_length", "global_batch_size"), megatron=False)
    parser.add_argument("--data", help="as for `hwbench run` (default: synthetic)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per trial (default: 600)")
    parser.add_argument("--out", default="results/tune", help="trials go to OUT/<candidate>/ (default: results/tune)")
    parser.add_argument("--quiet", action="store_true", help="no line per trial")
    parser.epilog = ("Examples: on a CPU, `hwbench tune --model tiny --devices 2 --repeats 3` (minutes); "
                     "accelerator-sized (hours to days on a CPU), `hwbench tune --model 1.3b --devices 8 --device cuda "
                     "--repeats 3`. Before the first trial it prints the estimated duration (from `hwbench calibrate`) "
                     "and a precision the device emulates.")


def main(args: argparse.Namespace) -> int:
    from collections import Counter

    from tabulate import tabulate

    from hwbench.layouts import MAX_DEVICES, check_count
    from hwbench.paths import RANKING_FILE
    from hwbench.suites.executor import SweepInterrupted
    from hwbench.suites.tune import ranking, tune
    from hwbench.units import gib

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in ENGINES for e in engines):
        raise UsageError(f"--engines {args.engines!r} is not accepted; give native, deepspeed or native,deepspeed")
    check_count("--devices", args.devices, maximum=MAX_DEVICES)
    for option, value, minimum in (("--max-trials", args.max_trials, 1),
                                   ("--patience", args.patience, 1), ("--steps", args.steps, 1),
                                   ("--repeats", args.repeats, 1),
                                   ("--warmup", args.warmup, 0)):
        check_count(option, value, minimum)
    base = RunOptions(model=args.model, device=args.device, steps=args.steps, warmup=args.warmup, eval_iters=0,
                      telemetry=False, timeout=args.timeout, data=args.data or "synthetic", precision=args.precision,
                      seq_length=args.seq_length, global_batch_size=args.global_batch_size)
    try:
        trials, folder = tune(base, args.devices, args.out, args.device_memory, engines, args.max_trials,
                              args.patience, progress=not args.quiet, repeats=args.repeats)
    except SweepInterrupted as stop:
        print(f"hwbench: tune stopped by {stop}; measured trials are kept, the same command resumes", file=sys.stderr)
        return 128 + stop.signal_number
    ranked = ranking(trials)
    rows = [[r.rank, r.trial.candidate.name, _samples_text(r.trial), f"{r.of_best:.0%}",
             gib(r.trial.predicted_peak_bytes or None), r.confidence] for r in ranked]
    print(tabulate(rows, headers=["rank", "layout", "samples/s: median (min-max, runs)", "of best",
                                  "predicted GiB/rank", "against the rank above"], disable_numparse=True))
    shared = [r for r in ranked if r.shares_with]
    if shared:
        print(f"{len(shared)} layout(s) share a rank: their runs cannot tell them from the layout that rank "
              f"starts with" + ("; --repeats 3 or more measures their spread" if args.repeats < 3 else ""))
    counts = Counter(t.status for t in trials if not t.samples_per_s)
    print("not ranked: " + (", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"))
    print(f"ranking and every trial: {folder / RANKING_FILE}")
    return 0 if ranked else 1


def _samples_text(trial) -> str:
    """"6.40 (6.23-6.51, 3 runs)": the trial's median samples/s, its range and its runs."""
    samples = trial.samples
    spread = f"{min(samples):,.2f}-{max(samples):,.2f}, " if len(samples) > 1 else ""
    return f"{trial.samples_per_s:,.2f} ({spread}{len(samples)} run{'s' if len(samples) != 1 else ''})"
