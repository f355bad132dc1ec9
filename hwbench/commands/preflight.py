"""`hwbench preflight`: the machine checked before it is measured, as a table; exit 1 when a
check fails. `hwbench run` and `hwbench sweep` run the same checks first (print_findings)."""

from __future__ import annotations

import argparse
import json

from hwbench.device.kinds import DEVICE_CHOICES

DESCRIPTION = ("Check what would make a figure wrong or not comparable, before measuring: other processes on "
               "the device, free device memory, ECC errors, clocks and throttle reasons, persistence mode, the CPU "
               "frequency governor, NUMA balancing, transparent huge pages, swap, the cgroup CPU quota against the "
               "ranks' threads, NCCL_*/HCCL_* settings, free disk in --out. Each check is ok, warning or failure with "
               "its reading, or n/a with why it is not read here. Exit 1 when a check fails. `hwbench run` and "
               "`hwbench sweep` run it first (--no-preflight: not) and store the readings in each result.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                        help="the device kind to check (default: auto, the one the management tools find)")
    parser.add_argument("--out", default="results/runs", help="the results folder whose free disk is checked "
                                                              "(default: results/runs)")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="ranks the run will start on this node "
                                                                      "(default: 1)")
    parser.add_argument("--threads-per-rank", type=int, help="threads of each rank (default: its share of the usable "
                                                             "cores)")
    parser.add_argument("--json", action="store_true", help="the report as JSON, as results hold it")


def main(args: argparse.Namespace) -> int:
    from hwbench.harness.preflight import check_request, preflight

    check_request(args.device, args.nproc_per_node, args.threads_per_rank)
    report = preflight(args.device, args.out, args.nproc_per_node, args.threads_per_rank)
    print(json.dumps(report.to_dict(), indent=2) if args.json else preflight_table(report))
    return 1 if report.of("failure") else 0


def preflight_table(report) -> str:
    from hwbench.report.terminal import text_table

    rows = [(check.name, check.status or "n/a", check.reading or "-", check.reason or "") for check in report.checks]
    return (text_table(rows, headers=("check", "status", "reading", "why"), tablefmt="simple")
            + f"\n\n{report.device} via {report.source}, checked in {report.duration_s:.2f} s: {summary(report)}")


def summary(report) -> str:
    counts = {status: len(report.of(status)) for status in ("ok", "warning", "failure")}
    unread = sum(1 for check in report.checks if check.status is None)
    return (f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['failure']} failure(s), "
            f"{unread} not read here")


def print_findings(report) -> None:
    """What a run or sweep says of the check before it starts: each warning and failure, then one line."""
    from hwbench.cli import note
    from hwbench.harness.preflight import findings

    for finding in findings(report.checks):
        note(f"hwbench: preflight {finding}")
    note(f"hwbench: preflight: {summary(report)}; `hwbench preflight` shows every check")
