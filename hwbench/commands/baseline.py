"""`hwbench baseline save RESULTS... --out FILE`: a baseline file for `hwbench accept` from a set
of results: per point its tokens/s (median, min, max, n), per collective its busbw, and the machine, software and date
they came from (docs/accept.md). `hwbench baseline copy RESULTS... --out DIR`: the ok result files
copied into a folder, a baseline for `hwbench compare` (docs/compare.md). Both leave out every run
that is not ok, a line each saying which and why."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = ("Baselines from ok runs only: `hwbench baseline save RESULTS... --out FILE` keeps each point's "
               "tokens/s (median, min, max, n), and each collective's busbw of `hwbench collectives` results, with the "
               "machine, software and date of the results, for `hwbench accept`; `hwbench baseline copy RESULTS... "
               "--out DIR` copies the ok result files into a folder, for "
               "`hwbench compare`. A run that is not ok is left out with a line saying why.")


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    save = actions.add_parser("save", help="make a baseline file from results", description=DESCRIPTION)
    save.add_argument("results", nargs="+", metavar="RESULTS", help="result files or folders (searched recursively)")
    save.add_argument("--out", required=True, metavar="FILE", help="the baseline file (JSON) to write")
    copy = actions.add_parser("copy", help="copy the ok result files into a folder, a baseline for `hwbench "
                              "compare`", description=DESCRIPTION)
    copy.add_argument("results", nargs="+", metavar="RESULTS", help="result files or folders (searched recursively)")
    copy.add_argument("--out", required=True, metavar="DIR",
                      help="the folder to copy them into (made when missing; it must hold no result file)")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hwbench.judge.baseline import copy_ok_results, save_baseline
    from hwbench.paths import check_output_file
    from hwbench.result.store import read_input_files

    if args.action == "save":
        check_output_file(args.out, "--out", args.results)
    files = read_input_files(args.results, "RESULTS")
    found, fabric = files.runs, files.collectives
    for _path, reason in files.skipped:  # the reason names the file
        print(f"hwbench baseline: warning: left out {reason}", file=sys.stderr)
    if args.action == "copy":
        written = copy_ok_results(found, args.results, args.out)
        _say_left_out(found)
        print(f"{args.out}: {len(written)} ok result file(s) of {len(found)} copied")
        return 0
    content = save_baseline([result for result, _ in found], Path(args.out), [result for result, _ in fabric])
    _say_left_out(found, fabric)
    print(f"{args.out}: {len(content['points'])} point(s) from {len(found)} result(s), "
          f"{len(content['collectives'])} collective(s) from {len(fabric)} collectives result(s)")
    for point in content["points"]:
        figure = point["tokens_per_s"]
        print(f"  {point['label']}: {figure['median']:,.1f} tokens/s (n={figure['n']})")
    for entry in content["collectives"]:
        figure = entry["busbw_gbs"]
        print(f"  {entry['label']}: busbw {figure['median']:,.3f} GB/s (n={figure['n']})")
    return 0


def _say_left_out(found, fabric=()) -> None:
    from hwbench.judge import collectives_baseline
    from hwbench.judge.baseline import left_out

    for line in left_out(found) + collectives_baseline.left_out(list(fabric)):
        print(f"hwbench baseline: left out {line}", file=sys.stderr)
