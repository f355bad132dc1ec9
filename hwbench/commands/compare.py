"""`hwbench compare BASELINE CURRENT`: did performance change? Exit 3 on a significant
regression, 5 when a point's repeats failed, 4 when a baseline point is missing from CURRENT
(docs/compare.md)."""

from __future__ import annotations

import argparse
import sys

from hwbench.errors import UsageError
from hwbench.metrics import METRICS

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

    threshold = parse_threshold(args.threshold)
    if args.junit is not None:  # "" is refused, not taken as no --junit
        check_output_file(args.junit, "--junit", [args.baseline, args.current])
    baseline, base_unreadable = load_side("BASELINE", args.baseline)
    current, cur_unreadable = load_side("CURRENT", args.current)
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
    print(as_json(report_data(report, args.allow_missing)) if args.format == "json" else format_report(report),
          end="\n" if args.format == "text" else "")
    status = exit_status(report, args.allow_missing)
    if status == REPEATS_EXIT:
        failed = sum(p.repeats_failed for p in report["points"])
        print(f"hwbench compare: {failed} point(s) have fewer ok repeats than asked or than the baseline had; "
              "the gate fails", file=sys.stderr)
    if status == MISSING_EXIT:
        print(f"hwbench compare: {len(report['only_baseline'])} baseline point(s) have no result in CURRENT; "
              "the gate fails (give --allow-missing to accept that)", file=sys.stderr)
    return status
