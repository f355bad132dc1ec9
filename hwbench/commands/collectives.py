"""`hwbench collectives`: all-reduce, all-gather, reduce-scatter, all-to-all, broadcast and
send/recv between N ranks of this node, measured and reported as nccl-tests does
(docs/collectives.md)."""

from __future__ import annotations

import argparse
import sys

from hwbench.arguments import argument
from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.fabric.collectives import DEFAULT_MAX_BYTES, DEFAULT_MIN_BYTES

DESCRIPTION = ("Measure collectives between the ranks of this node (or of several: srun one task per node) on the "
               "device's collective backend (gloo on the CPU, NCCL, RCCL, HCCL): for each message size from "
               "--min-bytes doubling to --max-bytes, in and out of place, the time per call, algbw and busbw as "
               "nccl-tests reports them, and a check of every value; on several nodes, again within each node and "
               "between one rank per node; with --slow-link, "
               "a ring of send/recv pairs that names every link slower than the others (docs/collectives.md). "
               "Writes one result file to --out.")
DEFAULT_RING_BYTES = "1MiB"
DEFAULT_MAX_TEXT = f"{DEFAULT_MAX_BYTES // 2 ** 20}MiB"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", type=argument("--device", choices=DEVICE_CHOICES),
                        help=f"one of {', '.join(DEVICE_CHOICES)} (default auto)")
    parser.add_argument("--nproc-per-node", default="2", type=argument("--nproc-per-node", int, minimum=1),
                        help="ranks on this node, one per device (default 2; the ranks of every node together at "
                             "least 2)")
    parser.add_argument("--collectives", default="all",
                        help="all (default), or comma-separated of all_reduce, all_gather, reduce_scatter, "
                             "all_to_all, broadcast, send_recv")
    parser.add_argument("--min-bytes", default=str(DEFAULT_MIN_BYTES),
                        help=f"smallest message, e.g. 8 or 1KiB (default {DEFAULT_MIN_BYTES})")
    parser.add_argument("--max-bytes", default=DEFAULT_MAX_TEXT,
                        help=f"largest message, e.g. 64MiB (default {DEFAULT_MAX_TEXT})")
    parser.add_argument("--warmup", default="5", type=argument("--warmup", int, minimum=0, maximum=100_000),
                        help="untimed calls before each size (default 5)")
    parser.add_argument("--iters", default="20", type=argument("--iters", int, minimum=1, maximum=100_000),
                        help="timed calls of each size; the time is their mean (default 20)")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="leave out the check of the values (nccl-tests' -c 0)")
    parser.add_argument("--slow-link", action="store_true",
                        help="also measure a ring of send/recv pairs (rank i to i+1) and name the slowest pair "
                             "when it is slower than the median of the others by more than --slow-threshold")
    parser.add_argument("--ring-bytes", default=DEFAULT_RING_BYTES,
                        help=f"the message each pair of the ring exchanges (default {DEFAULT_RING_BYTES})")
    parser.add_argument("--slow-threshold", default="25%",
                        help="how much slower than the median of the other pairs a pair is named: 25%% or 0.25, "
                             "below 1000%% (default 25%%)")
    parser.add_argument("--timeout", default="600", type=argument("--timeout", float, minimum=0, above_minimum=True,
                                                                  accepts="seconds"),
                        help="seconds before the ranks are ended and the result says which rank was behind "
                             "(default 600)")
    parser.add_argument("--out", default="results/collectives", help="folder of the result file "
                                                                      "(default results/collectives)")


def main(args: argparse.Namespace) -> int:
    from hwbench.fabric.collectives import (
        CollectiveSettings,
        check_message_bytes,
        check_sizes,
        check_world_size,
        parse_collectives,
    )
    from hwbench.judge.compare import parse_threshold
    from hwbench.units import parse_size

    names = parse_collectives(args.collectives)
    min_bytes, max_bytes = parse_size(args.min_bytes, "--min-bytes"), parse_size(args.max_bytes, "--max-bytes")
    check_sizes(min_bytes, max_bytes, "--min-bytes", "--max-bytes")
    from hwbench.fabric.launch import nodes_from_slurm

    nodes = nodes_from_slurm()
    check_world_size(args.nproc_per_node * (nodes.nnodes if nodes else 1))
    settings = CollectiveSettings(names, min_bytes, max_bytes, args.warmup, args.iters, args.check, args.timeout)
    # checked whether or not --slow-link is given: a wrong value is refused, never silently unused
    from hwbench.fabric.collectives import MAX_SLOW_THRESHOLD
    from hwbench.fabric.ring import RingSettings

    ring_bytes = parse_size(args.ring_bytes, "--ring-bytes")
    check_message_bytes(ring_bytes, "--ring-bytes")
    slow_threshold = parse_threshold(args.slow_threshold, "--slow-threshold", below=MAX_SLOW_THRESHOLD)
    ring = RingSettings(ring_bytes, args.warmup, args.iters, slow_threshold) if args.slow_link else None
    from hwbench.fabric.launch import CollectivesJob, NodeDone, run_on_node
    from hwbench.fabric.table import collectives_table
    from hwbench.result.collectives import write_collectives

    outcome = run_on_node(CollectivesJob(args.device, args.nproc_per_node, settings, ring, nodes))
    if isinstance(outcome, NodeDone):
        ended = "its ranks finished" if outcome.returncode == 0 else f"its ranks ended with status {outcome.returncode}"
        print(f"hwbench collectives: node {outcome.node_rank}: {ended}; node 0 writes the result", file=sys.stderr)
        return 0 if outcome.returncode == 0 else 1
    result = outcome
    path = write_collectives(result, args.out)
    if result.status != "ok":
        print(f"hwbench collectives: {result.status}: {result.error.message if result.error else ''}", file=sys.stderr)
        print(f"result written to {path}", file=sys.stderr)
        return 1
    sys.stdout.write(collectives_table(result))
    print(f"result written to {path}", file=sys.stderr)
    return 0 if result.check_passed is not False else 1
