"""`hwbench sweep SUITE`: every point of a suite, each isolated, resumable (docs/sweeps.md)."""

from __future__ import annotations

import argparse
import sys

from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.errors import UsageError
from hwbench.spec import DEFAULT_OUT

DESCRIPTION = "Run every point of a suite, each in its own process tree; resumable (docs/sweeps.md)."


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", metavar="SUITE", help="a suite file, or a shipped suite: smoke, nightly, table2, "
                        "table3, published-1dev")
    parser.add_argument("--device", choices=DEVICE_CHOICES, help="for every point that does not set its own")
    parser.add_argument("--nproc-per-node", type=int, help="for every point that does not set its own")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each point, with seeds seed, seed+1, ... "
                        "(default: 1)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"results go to OUT/<suite>/<point>/ (default: {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="run points again whose results already exist")
    parser.add_argument("--no-plan", dest="plan", action="store_false",
                        help="run points the memory planner predicts will not fit")
    parser.add_argument("--wait", action="store_true",
                        help="when another sweep is writing the same suite folder, wait for it instead of refusing")
    parser.add_argument("--quiet", action="store_true", help="no line per point")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hwbench.harness.launcher import recover_stranded_runs
    from hwbench.harness.suite import find_suite, load_suite
    from hwbench.harness.sweep import SweepInterrupted, SweepOptions, run_sweep
    from hwbench.report.summary import sweep_summary_table
    from hwbench.results import check_output_folder

    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats} is not accepted; give an integer >= 1")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node {args.nproc_per_node} is not accepted; give an integer >= 1")
    suite = load_suite(find_suite(args.suite))
    check_output_folder(args.out)
    for note in recover_stranded_runs():
        print(f"hwbench: note: {note}", file=sys.stderr)
    options = SweepOptions(out_dir=Path(args.out), device=args.device, nproc_per_node=args.nproc_per_node,
                           repeats=args.repeats, force=args.force, plan=args.plan, wait=args.wait)
    try:
        records = run_sweep(suite, options, show_progress=not args.quiet)
    except SweepInterrupted as stop:
        print(f"hwbench: sweep stopped by {stop}; finished points are kept, the same command resumes",
              file=sys.stderr)
        return 128 + stop.signal_number
    except OSError as error:  # --out filled up or vanished mid-sweep: finished points are on disk
        print(f"hwbench: error: the sweep could not write to {args.out!r} ({error.strerror or error}); finished "
              "points are kept (a point's result may be in the temp folder: see its repeat*.log), the same command "
              "resumes", file=sys.stderr)
        return 1
    print(sweep_summary_table(suite, records))
    bad = [r for r in records if any(x.status not in ("ok", "skipped") for x in r.results)]
    return 1 if bad else 0
