"""`hwbench accept --suite S --baseline B --out DIR`: is a delivered system what it should be?
Each device probed alone and named when it falls behind its peers, then every point of a suite
against a baseline; one page, PASS or FAIL first (docs/accept.md). Exit 0 PASS, 3 FAIL, 4 when
the baseline lacks points of the run, 2 on bad input."""

from __future__ import annotations

import argparse
import sys

from hwbench.arguments import argument
from hwbench.commands.sweep import add_slurm_options, slurm_settings
from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.suites.suite import shipped_suite_names

DESCRIPTION = ("Acceptance of a delivered system: each device's health read first from its vendor library "
               "(uncorrected ECC errors, a pending or failed retirement or row remap, a link down, a PCIe link "
               "narrower than it allows: FAIL before anything is measured), then each device probed alone (GEMM "
               "rate, copy bandwidth, a short "
               "training point; under --executor slurm each device of every node of the partition, a job a node), "
               "a device or node more than --outlier below its peers named; then every point of a suite against a "
               "baseline (hwbench baseline save), PASS when each is at or above --min-ratio of it; when the baseline "
               "holds collectives, they and a ring of send/recv pairs are measured on this node and judged alike, a "
               "slow link named. Writes "
               "OUT/accept.md (or .html), PASS or FAIL first. Exit 0 PASS, 3 FAIL, 4 points missing from the "
               "baseline (docs/accept.md).")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", required=True, help=f"a suite file, or a shipped suite: "
                        f"{', '.join(shipped_suite_names())}")
    parser.add_argument("--baseline", required=True, metavar="FILE|FOLDER|CSV",
                        help="a baseline file (hwbench baseline save), a folder of results, or a CSV with model, "
                             "device_model, tokens_per_s and any point field")
    parser.add_argument("--min-ratio", default="0.95", type=argument("--min-ratio", float, minimum=0,
                        above_minimum=True), help="each point's tokens/s against its baseline: PASS at or "
                        "above this (default 0.95)")
    parser.add_argument("--outlier", default="5%", help="a device or node more than this below the median of its "
                        "peers is named and fails: 5%% or 0.05 (default 5%%)")
    parser.add_argument("--repeats", type=argument("--repeats", int, minimum=1), default=1,
                        help="runs of each suite point (default 1)")
    parser.add_argument("--device", choices=DEVICE_CHOICES, help="for every point that does not set its own, and "
                        "the devices probed")
    parser.add_argument("--devices-per-node", type=argument("--devices-per-node", int),
                        help="devices of this host (under Slurm: of each node) to "
                        "probe (default: every one the backend sees; the CPU is one; at most those, on the CPU the "
                        "usable cores)")
    parser.add_argument("--probe-time", default="0.5", metavar="SECONDS",
                        type=argument("--probe-time", float, minimum=0, above_minimum=True, accepts="seconds"),
                        help="each probe measurement's timed repetitions together (default 0.5)")
    parser.add_argument("--out", required=True, help="OUT/accept.md (or .html), the suite's results in "
                        "OUT/<suite>/, the probes in OUT/probes.jsonl (one device a line; under Slurm each node's job "
                        "in OUT/probes/)")
    parser.add_argument("--fabric-min-bytes", default="4KiB", help="with a baseline that holds collectives "
                        "(hwbench baseline save of hwbench collectives results): the smallest message measured, "
                        "e.g. 8 or 4KiB (default 4KiB)")
    parser.add_argument("--fabric-max-bytes", default="1MiB", help="with such a baseline: the largest message, "
                        "doubling from --fabric-min-bytes (default 1MiB)")
    parser.add_argument("--ring-bytes", default="1MiB", help="with such a baseline: the message each pair of the "
                        "slow-link ring exchanges (default 1MiB)")
    parser.add_argument("--slow-threshold", default="25%", help="with such a baseline: a pair of the ring this much "
                        "slower than the median of the others is a slow link and fails: 25%% or 0.25, below 1000%% "
                        "(default 25%%)")
    parser.add_argument("--format", choices=("md", "html"), default="md", help="the page (default md)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--no-preflight", dest="preflight", action="store_false",
                        help="check nothing first (hwbench preflight)")
    add_slurm_options(parser)


def main(args: argparse.Namespace) -> int:
    from hwbench.acceptance.accept import AcceptOptions, accept
    from hwbench.acceptance.fabric import FabricOptions
    from hwbench.fabric.collectives import MAX_SLOW_THRESHOLD
    from hwbench.judge.compare import parse_threshold
    from hwbench.units import parse_size

    fabric = FabricOptions(parse_size(args.fabric_min_bytes, "--fabric-min-bytes"),
                           parse_size(args.fabric_max_bytes, "--fabric-max-bytes"),
                           parse_size(args.ring_bytes, "--ring-bytes"),
                           parse_threshold(args.slow_threshold, "--slow-threshold", below=MAX_SLOW_THRESHOLD))
    options = AcceptOptions(suite=args.suite, baseline=args.baseline, out_dir=args.out,
                            min_ratio=args.min_ratio,
                            outlier=parse_threshold(args.outlier, "--outlier"), repeats=args.repeats,
                            device=args.device, devices_per_node=args.devices_per_node,
                            probe_time_s=args.probe_time,
                            page_format=args.format, preflight=args.preflight, fabric=fabric)
    settings = slurm_settings(args)
    from hwbench.suites.executor import SweepInterrupted

    try:
        acceptance, page = accept(options, slurm=settings, progress=not args.quiet,
                                  before=_preflight(args, settings))
    except SweepInterrupted as stop:  # no verdict: what was measured stays in OUT, the same command resumes
        print(f"hwbench: accept stopped by {stop} before a verdict; finished points are kept in {args.out}, the same "
              "command resumes" + (f" (Slurm jobs {', '.join(stop.jobs)} keep running)" if stop.jobs else ""),
              file=sys.stderr)
        return 128 + stop.signal_number
    print(f"{'PASS' if acceptance.passed else 'FAIL'}: {page}")
    for line in acceptance.failures:
        print(f"  {line}")
    for line in acceptance.preflight:  # a PASS on a machine that warned says so, as its page does
        print(f"  preflight {line}")
    for line in acceptance.notes:
        print(f"  note: {line}")
    if acceptance.missing:
        print(f"hwbench accept: {len(acceptance.missing)} point(s) of the run have no baseline figure: "
              f"{'; '.join(acceptance.missing)}", file=sys.stderr)
    return acceptance.exit_status


def _preflight(args: argparse.Namespace, settings):
    """The machine checked before anything is measured (as `hwbench sweep` does); Slurm nodes check their own."""
    def check():
        if not args.preflight or settings is not None:
            return None
        from hwbench.commands.preflight import print_findings
        from hwbench.harness.run import machine_checked

        checked = machine_checked(args.device or "auto", args.out, 1)
        if checked is not None:
            print_findings(checked)
        return checked  # its warnings go on the page too
    return check
