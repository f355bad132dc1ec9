"""`hwbench export FORMAT RESULTS...`: results in the formats CI actions, dashboards and
notebooks read (docs/exports.md)."""

from __future__ import annotations

import argparse
import sys

from hwbench.exports import DIVISIONS, FORMATS, SUBMISSION_STATUSES, ExportOutcome

DESCRIPTION = ("Write result files in another tool's format: " + "; ".join(f"{name}: {fmt.summary}"
                                                                          for name, fmt in FORMATS.items())
               + ". Unreadable files are named and left out; a run that did not end ok is named and left out "
                 "of the figures, and the command exits 5 unless --allow-failed. docs/exports.md has a CI example "
                 "of each.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", metavar="FORMAT", help=", ".join(FORMATS))
    parser.add_argument("results", nargs="+", metavar="RESULTS", help="result files or folders (searched recursively)")
    parser.add_argument("--out", metavar="FILE",
                        help="write here, whole or not at all (tensorboard: the log folder; default for the text "
                             "formats: standard output)")
    parser.add_argument("--allow-failed", action="store_true",
                        help="runs that did not end ok (failed, oom, timeout, ...) are still named and left out of "
                             "the figures, but do not fail the command (exit 5 without this)")
    prometheus = parser.add_argument_group("prometheus, openmetrics")
    prometheus.add_argument("--push", metavar="URL", help="also push the metrics to this Pushgateway, e.g. "
                                                          "http://pushgateway:9091 (exit 1 when it cannot take them)")
    prometheus.add_argument("--job", default="hwbench", help="the Pushgateway job the metrics replace (default: "
                                                             "hwbench)")
    mlperf = parser.add_argument_group("mllog, mlperf-system: MLPerf's submission fields (default: null)")
    mlperf.add_argument("--submitter", metavar="ORG", help="submission_org / submitter")
    mlperf.add_argument("--division", help=" or ".join(DIVISIONS))
    mlperf.add_argument("--status", help=", ".join(SUBMISSION_STATUSES) + " (the system's availability)")
    mlperf.add_argument("--platform", help="submission_platform (default: the system name from the result)")


def main(args: argparse.Namespace) -> int:
    from hwbench.exports import ExportRequest, PushError, export
    from hwbench.judge.compare import REPEATS_EXIT

    request = ExportRequest(submitter=args.submitter, division=args.division, status=args.status,
                            platform=args.platform, push=args.push, job=args.job)
    try:
        outcome = export(args.format, args.results, args.out, request)
    except PushError as error:
        if error.outcome is not None:  # what was read and left out is said whether or not the push went
            say_left_out(error.outcome, args.allow_failed)
        print(f"hwbench: error: {error}" + (f"; {args.out} was written" if args.out else ""), file=sys.stderr)
        return 1
    say_left_out(outcome, args.allow_failed)
    for path in outcome.written:
        print(f"{args.format} written to {path}", file=sys.stderr)
    if outcome.pushed:
        print(f"metrics pushed to {outcome.pushed} (job {args.job})", file=sys.stderr)
    if args.out is None and outcome.text is not None:
        sys.stdout.write(outcome.text)
    if outcome.left_out and not args.allow_failed:
        # as compare's failed repeats: the gate cannot vouch for a point whose runs failed
        print(f"hwbench export: {len(outcome.left_out)} run(s) did not end ok and are not in the figures; the gate "
              f"fails (exit {REPEATS_EXIT}; give --allow-failed to accept that)", file=sys.stderr)
        return REPEATS_EXIT
    return 0


def say_left_out(outcome: ExportOutcome, allow_failed: bool) -> None:
    """A line for each file that could not be read and each run that did not end ok."""
    for _path, reason in outcome.skipped:
        print(f"hwbench export: warning: left out {reason}", file=sys.stderr)
    for line in outcome.left_out:
        print(f"hwbench export: {'note' if allow_failed else 'error'}: left out {line}", file=sys.stderr)
