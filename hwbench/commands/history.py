"""`hwbench history add|changes|show|report`: every result kept in one database, change
points found in the series of nights, a trend page (docs/history.md)."""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from hwbench.errors import UsageError
from hwbench.history.store import DEFAULT_DB
from hwbench.judge.compare import DEFAULT_THRESHOLD
from hwbench.metrics import COLLECTIVE_METRICS, METRICS

DESCRIPTION = ("Keep every result in a history database and find where performance changed: `add` ingests "
               "result files, `changes` reports change points (exit 3 on an open regression beyond the "
               "threshold), `show` lists the series, `report` writes the trend page (docs/history.md).")
# tokens/s stands for samples/s, TFLOP/s and MFU too: they are fixed multiples of it for a
# point, so they would repeat its change points.
# the MoE figures have series only where mixture-of-experts (or expert-parallel) runs were added, busbw
# (one series per collective, form, size and scope) where `hwbench collectives` results were
DEFAULT_METRICS = ("tokens_per_s", "step_time_median", "peak_memory", "all_to_all_share", "moe_imbalance", "busbw")
THRESHOLD = f"{DEFAULT_THRESHOLD * 100:g}%"  # hwbench compare's


def configure(parser: argparse.ArgumentParser) -> None:
    from hwbench.cli import Parser

    actions = parser.add_subparsers(dest="action", required=True, metavar="{add,changes,show,report}",
                                    parser_class=Parser)
    add = actions.add_parser("add", help="add result files or folders (sweep folders included, `hwbench collectives` "
                                         "results too) to the database")
    add.add_argument("results", nargs="+", metavar="RESULTS", help="result files or folders (searched recursively)")
    changes = actions.add_parser("changes", help="change points of every series; exit 3 on an open regression")
    changes.add_argument("--since", metavar="DATE", help="only changes from this UTC date on (YYYY-MM-DD) are listed "
                                                         "and can fail the gate")
    changes.add_argument("--threshold", default=THRESHOLD, help="an open regression fails the gate when worse than "
                                                                 f"this: 5%% or 0.05 (default: {THRESHOLD}%)")
    changes.add_argument("--format", choices=("text", "json"), default="text",
                         help="text: a line per change (default); json: every series, its changes and open "
                              "regression, for CI")
    changes.add_argument("--junit", metavar="FILE", help="also write a JUnit XML file: a test case per series, "
                         "failed while it has an open regression")
    show = actions.add_parser("show", help="a table of the series: nights, latest figure, change points")
    report = actions.add_parser("report", help="the trend page: one offline HTML file, a chart per series")
    report.add_argument("--format", choices=("html",), default="html", help="html (the only format)")
    report.add_argument("--out", metavar="FILE", required=True, help="the page to write (e.g. trends.html)")
    report.add_argument("--threshold", default=THRESHOLD,
                        help=f"threshold for open regressions (default: {THRESHOLD}%)")
    for sub in (add, changes, show, report):
        sub.add_argument("--db", default=DEFAULT_DB, metavar="PATH",
                         help=f"the history database, an SQLite file (default: {DEFAULT_DB})")
    for sub in (changes, show, report):
        sub.add_argument("--metric", choices=(*METRICS, *COLLECTIVE_METRICS), default=None,
                         help=f"one metric (default: {', '.join(DEFAULT_METRICS)})")


def main(args: argparse.Namespace) -> int:
    return {"add": add, "changes": changes, "show": show, "report": report}[args.action](args)


def add(args: argparse.Namespace) -> int:
    from hwbench.history.store import Stored, add_to_history, metrics_problem, printable, start_problem
    from hwbench.result.model import RunResult
    from hwbench.result.store import read_input_files

    files = read_input_files(args.results, "RESULTS")
    found: list[tuple[Stored, Path]] = [*files.runs, *files.collectives]
    reasons, loaded = [reason for _path, reason in files.skipped], []
    for result, path in found:
        problem = start_problem(result.started_at)
        if problem:
            problem = f"field 'started_at' {problem}"
        elif isinstance(result, RunResult):  # a collectives result's figures were checked when it was read
            problem = metrics_problem(result.metrics.dump())
        if problem:
            reasons.append(f"{path}: {problem}")
        else:
            loaded.append((result, path))
    unreadable = len(reasons)
    if loaded or unreadable > 1:  # one file refused is said once, in the error
        for reason in reasons:
            print(f"hwbench history: warning: left out {reason}", file=sys.stderr)
    if not loaded:
        why = f": {reasons[0]}" if unreadable == 1 else ""
        raise UsageError(f"RESULTS {' '.join(args.results)[:200]!r}: no readable hwbench result files ({unreadable} "
                         f"unreadable{why}); give result files or folders of them")
    outcome, total = add_to_history(args.db, loaded)
    if outcome.stale_removed:
        print(f"hwbench history: removed {', '.join(outcome.stale_removed)} from {Path(args.db).parent}: the "
              "temporaries of an earlier `hwbench history add` that was killed before it could remove them",
              file=sys.stderr)
    for run_id in outcome.without_start:
        print(f"hwbench history: warning: left out run {run_id}: it has no start time", file=sys.stderr)
    for conflict in outcome.conflicting:
        # a run id names one measurement: the nights already judged keep the figures they were judged on
        print(f"hwbench history: warning: left out {conflict}; the database keeps the run it has: give this "
              "result its own run id to add it", file=sys.stderr)
    conflicting = f" ({len(outcome.conflicting)} with other figures, left out)" if outcome.conflicting else ""
    print(f"{printable(args.db)}: added {outcome.added} run(s), {outcome.already_present} already there{conflicting}, "
          f"{unreadable} unreadable file(s) left out; {total} run(s) in all")
    if outcome.collectives:
        print(f"{outcome.collectives} of the results added are `hwbench collectives` results: a busbw series per "
              "collective, form, size and scope (all ranks, within each node, between nodes)")
    if outcome.simulated:
        print(f"{outcome.simulated} of the runs added are simulated (a stand-in ran the device's code path on the "
              "host): they form their own series, marked [simulated], apart from the device's")
    if outcome.emulated:
        print(f"{outcome.emulated} of the runs added ran FP8 emulated (computed without FP8 matrix units): they form "
              "their own series, marked [emulated], apart from the device's")
    return 0


def _analyses(args: argparse.Namespace, threshold: float):
    from hwbench.history.changes import series_changes
    from hwbench.history.series import series_of
    from hwbench.history.store import collectives_with_busbw, open_history, runs_with_metric

    connection = open_history(args.db)
    try:
        return [series_changes(series, threshold)
                for metric in ((args.metric,) if args.metric else DEFAULT_METRICS)
                for series in series_of(collectives_with_busbw(connection) if metric in COLLECTIVE_METRICS
                                        else runs_with_metric(connection, METRICS[metric].stored_name), metric)]
    finally:
        connection.close()


def _since(text: str | None) -> str:
    if text is None:
        return ""
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise UsageError(f"--since {text!r}: not a date; give a UTC date as YYYY-MM-DD") from None


def changes(args: argparse.Namespace) -> int:
    from hwbench.history.changes import describe_change, describe_environment_change
    from hwbench.history.store import printable
    from hwbench.judge.compare import REGRESSION_EXIT, parse_threshold

    threshold, since = parse_threshold(args.threshold), _since(args.since)
    if args.junit is not None:  # before the database is read: --junit naming the database would replace it
        from hwbench.paths import check_output_file

        check_output_file(args.junit, "--junit", [args.db])
    analyses = _analyses(args, threshold)
    if args.junit is not None:
        from hwbench.judge.ci_output import history_junit, write_output

        write_output(args.junit, "--junit", history_junit(analyses, since, describe_change))
    if args.format == "json":
        from hwbench.judge.ci_output import as_json, history_data

        data = history_data(analyses, since, threshold, describe_change, describe_environment_change)
        print(as_json(data), end="")
        return data["exit_status"]
    listed = environment = 0
    for analysis in analyses:
        for segment in analysis.series.segments[1:]:
            if segment.nights[0].night >= since:
                environment += 1
                print(describe_environment_change(analysis.series, segment))
        for change in analysis.changes:
            if change.night.night >= since:
                listed += 1
                print(describe_change(change))
    open_regressions = [a for a in analyses if a.open_regression and a.open_regression.night.night >= since]
    for analysis in open_regressions:
        print(f"OPEN REGRESSION: {analysis.series.label} is {abs(analysis.open_change) * 100:.1f}% worse than before "
              f"{analysis.open_regression.night.night} (commit {analysis.open_regression.night.commit or 'unknown'})")
    if not analyses:
        print(f"hwbench history: warning: {printable(args.db)} holds no ok result with "
              f"{args.metric or ', '.join(DEFAULT_METRICS)}", file=sys.stderr)
    print(f"{len(analyses)} series: {listed} change point(s), {environment} environment change(s)"
          f"{' since ' + since if since else ''}; {len(open_regressions)} open regression(s) beyond "
          f"{threshold * 100:g}%")
    return REGRESSION_EXIT if open_regressions else 0


def show(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from hwbench.history.series import short_commit
    from hwbench.metrics import metric_named

    rows = []
    for analysis in _analyses(args, DEFAULT_THRESHOLD):
        series, last = analysis.series, analysis.series.nights[-1]
        latest = analysis.changes[-1] if analysis.changes else None
        rows.append([series.label, len(series.nights), len(series.segments), last.night, short_commit(last.commit),
                     metric_named(series.metric).text(last.value), len(analysis.changes),
                     f"{latest.kind} {latest.change * 100:+.1f}% at {latest.night.night}" if latest else "-",
                     f"{analysis.open_change * 100:+.1f}%" if analysis.open_regression else "-"])
    print(tabulate(rows, headers=["series", "nights", "segments", "last night", "commit", "last value",
                                  "change points", "latest change", "open regression"]))
    return 0


def report(args: argparse.Namespace) -> int:
    from hwbench.history.page import trend_page
    from hwbench.judge.ci_output import write_output
    from hwbench.judge.compare import parse_threshold
    from hwbench.paths import check_output_file

    check_output_file(args.out, "--out", [args.db])
    threshold = parse_threshold(args.threshold)
    text = trend_page(_analyses(args, threshold), threshold)
    write_output(args.out, "--out", text)
    print(f"trend page written to {args.out}", file=sys.stderr)
    return 0
