"""`hwbench parity RUN_A RUN_B`: do two runs converge alike? Exit 1 when they diverge
(docs/parity.md)."""

from __future__ import annotations

import argparse

from hwbench.errors import UsageError

DESCRIPTION = ("Compare the loss curves of two runs step by step, and check RUN_A's convergence against RUN_B as the "
               "reference (tiered tolerances, correlation, final PPL); exit 1 when they diverge (docs/parity.md).")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="result file")
    parser.add_argument("run_b", metavar="RUN_B", help="result file: the reference (a run you trust)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest relative loss difference allowed at any step (default: 0.02)")


def main(args: argparse.Namespace) -> int:
    from hwbench.judge.parity import (
        DEFAULT_TOLERANCE,
        compare_runs,
        convergence_check,
        format_convergence_check,
        format_report,
    )
    from hwbench.result.store import ResultFormatError, load_result

    try:
        a, b = load_result(args.run_a), load_result(args.run_b)
    except ResultFormatError as error:
        raise UsageError(str(error)) from None
    report = compare_runs(a, b, DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance)
    check = convergence_check(a, b)
    print(format_report(report, a, b))
    print()
    print(format_convergence_check(check))
    return 0 if report.within_tolerance and check.passed else 1
