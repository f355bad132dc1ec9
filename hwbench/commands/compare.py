"""`hwbench compare BASELINE CURRENT`: did performance change? Exit 3 on a significant
regression, 5 when a point's repeats failed, 4 when a baseline point is missing from CURRENT
(docs/compare.md)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from hwbench.errors import UsageError
from hwbench.metrics import METRICS

if TYPE_CHECKING:
    from hwbench.result.store import ResultFiles

DESCRIPTION = ("Compare two sets of results point by point; exit 3 when a point regressed by more than the "
               "threshold and significantly, 5 when a point has fewer ok repeats than asked or than its baseline "
               "had, 4 when a baseline point has no result in CURRENT (docs/compare.md).")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", metavar="BASELINE", help="result file or folder (searched recursively)")
    parser.add_argument("current", metavar="CURRENT", help="result file or folder (searched recursively)")
    parser.add_argument("--threshold", default="5%", help="smallest change that counts: 5%% or 0.05 (default: 5%%)")
    parser.add_argument("--metric", default="tokens_per_s", choices=tuple(METRICS),
                        help="figure to compare (default: tokens_per_s)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="a baseline point with no result in CURRENT does not fail the gate (exit 4)")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text: a table (default); json: every point's figures, test and verdict, for CI")
    parser.add_argument("--junit", metavar="FILE", help="also write the verdicts as JUnit XML (a regression is a "
                        "failed test case, an inconclusive change a skipped one) for CI test reports")


def main(args: argparse.Namespace) -> int:
    from hwbench.judge.ci_output import as_json, compare_cases, junit_xml, write_output
    from hwbench.judge.compare import (
        MISSING_EXIT,
        REPEATS_EXIT,
        compare,
        exit_status,
        format_report,
        load_side,
        nearest_mismatch,
        parse_threshold,
        report_data,
    )
    from hwbench.paths import check_output_file
    from hwbench.result.store import read_input_files

    threshold = parse_threshold(args.threshold)
    if args.junit is not None:  # "" is refused, not taken as no --junit
        check_output_file(args.junit, "--junit", [args.baseline, args.current])
    base_files = read_input_files([args.baseline], "BASELINE")  # each file read once, runs and collectives
    cur_files = read_input_files([args.current], "CURRENT")
    for side, files in (("BASELINE", base_files), ("CURRENT", cur_files)):
        for _path, reason in files.skipped_collectives:
            print(f"hwbench compare: warning: {side} file left out: {reason}", file=sys.stderr)
    collectives = _compare_collectives(args, threshold, base_files, cur_files)
    try:
        baseline, base_unreadable = load_side("BASELINE", args.baseline, base_files)
        current, cur_unreadable = load_side("CURRENT", args.current, cur_files)
    except UsageError:
        if collectives is None or base_files.runs or cur_files.runs:
            raise  # runs on one side only: as without collectives
        return _finish_collectives_only(args, *collectives)
    unreadable = [("BASELINE", p, r) for p, r in base_unreadable] + [("CURRENT", p, r) for p, r in cur_unreadable]
    for side, _path, reason in unreadable:
        print(f"hwbench compare: warning: {side} file left out: {reason}", file=sys.stderr)
    report = compare(baseline, current, threshold, args.metric, unreadable)
    if not report["points"]:
        nearest = nearest_mismatch(baseline, current)
        differ = f"; the closest pair differs in {', '.join(nearest)}" if nearest else ""
        raise UsageError(f"no point in common between BASELINE {args.baseline!r} ({len(report['only_baseline'])} "
                         f"points) and CURRENT {args.current!r} ({len(report['only_current'])} points){differ}; "
                         "points match on model, device, precision, batch, sequence, layout, engine, data and steps")
    for line in report["warnings"]:
        print(f"hwbench compare: warning: {line}", file=sys.stderr)
    if args.junit is not None:
        write_output(args.junit, "--junit", junit_xml("hwbench compare", compare_cases(report, args.allow_missing)))
    data = report_data(report, args.allow_missing)
    if collectives is not None:
        data["collectives"] = collectives[1]
        if args.format == "text":
            print(collectives[2] + "\n")
    print(as_json(data) if args.format == "json" else format_report(report),
          end="\n" if args.format == "text" else "")
    status = exit_status(report, args.allow_missing)
    if collectives is not None:
        status = _worse(status, collectives[0])
    if status == REPEATS_EXIT:
        failed = sum(p.repeats_failed for p in report["points"])
        print(f"hwbench compare: {failed} point(s) have fewer ok repeats than asked or than the baseline had; "
              "the gate fails", file=sys.stderr)
    if status == MISSING_EXIT:
        print(f"hwbench compare: {len(report['only_baseline'])} baseline point(s) have no result in CURRENT; "
              "the gate fails (give --allow-missing to accept that)", file=sys.stderr)
    return status


def _compare_collectives(args: argparse.Namespace, threshold: float, base: ResultFiles,
                         cur: ResultFiles) -> tuple[int, dict, str] | None:
    """Collectives results on both sides compared by busbw; (their exit status, their data for --format
    json, their table), or None when neither side has any."""
    from hwbench.judge.collectives import as_data, collectives_exit, compare_collectives, format_collectives

    if not base.collectives and not cur.collectives:
        return None
    report = compare_collectives([r for r, _ in base.collectives], [r for r, _ in cur.collectives], threshold)
    return collectives_exit(report, args.allow_missing), as_data(report), format_collectives(report)


def _finish_collectives_only(args: argparse.Namespace, status: int, data: dict, table: str) -> int:
    """Only collectives results (no run on one side or both): their verdict is the exit status."""
    from hwbench.judge.ci_output import as_json

    if args.junit is not None:
        raise UsageError("--junit: the JUnit output covers runs; these inputs hold collectives results only")
    if not data["points"]:
        raise UsageError(f"no collectives point in common between BASELINE {args.baseline!r} and CURRENT "
                         f"{args.current!r}; points match on device, backend, ranks, hosts, type, collective and size")
    print(as_json({"collectives": data}) if args.format == "json" else table, end="" if args.format == "json" else "\n")
    return status


def _worse(first: int, second: int) -> int:
    """The exit status that fails the gate harder: a regression, then failed repeats, then missing points."""
    from hwbench.judge.compare import MISSING_EXIT, REGRESSION_EXIT, REPEATS_EXIT

    order = (REGRESSION_EXIT, REPEATS_EXIT, MISSING_EXIT)
    return min((first, second), key=lambda code: order.index(code) if code in order else len(order))

