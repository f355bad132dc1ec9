"""`hwbench baseline save RESULTS... --out FILE`: a baseline file for `hwbench accept` from a set
of results: per point its tokens/s (median, min, max, n), and the machine, software and date
they came from (docs/accept.md)."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = ("Baseline files for `hwbench accept`: `hwbench baseline save RESULTS... --out FILE` keeps each "
               "point's tokens/s (median, min, max, n) with the machine, software and date of the results.")


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    save = actions.add_parser("save", help="make a baseline file from results", description=DESCRIPTION)
    save.add_argument("results", nargs="+", metavar="RESULTS", help="result files or folders (searched recursively)")
    save.add_argument("--out", required=True, metavar="FILE", help="the baseline file (JSON) to write")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hwbench.paths import check_output_file
    from hwbench.report.baseline import save_baseline
    from hwbench.result.store import read_inputs

    check_output_file(args.out, "--out", args.results)
    found, skipped = read_inputs(args.results, "RESULTS")
    for _path, reason in skipped:  # the reason names the file
        print(f"hwbench baseline: warning: left out {reason}", file=sys.stderr)
    content = save_baseline([result for result, _ in found], Path(args.out))
    print(f"{args.out}: {len(content['points'])} point(s) from {len(found)} result(s)")
    for point in content["points"]:
        figure = point["tokens_per_s"]
        print(f"  {point['label']}: {figure['median']:,.1f} tokens/s (n={figure['n']})")
    return 0
