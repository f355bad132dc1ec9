"""`hwbench report`: result files as Markdown, HTML, CSV or JSON beside the published
tables (docs/reports.md)."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = ("Report result files (files or folders) against the published tables: first a decision (the faster "
               "and the cheaper device per workload, with the confidence the repeats give, time and cost to train), "
               "then throughput, per-device normalisation, memory, cost and energy per token, convergence and "
               "environment. No RESULTS: the published tables alone.")
DEFAULT_PROJECTION_DEVICES = 8


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="*", metavar="RESULTS",
                        help="result files or folders (searched recursively); none: the published tables alone")
    parser.add_argument("--against", metavar="PATH", default=None,
                        help="published table (.csv) or folder of them (default: results/published of this checkout)")
    parser.add_argument("--format", default="md", help="md (default), html, csv or json")
    parser.add_argument("--out", metavar="FILE", help="write the report here (default: standard output)")
    parser.add_argument("--price", action="append", default=[], metavar="DEVICE=USD/h",
                        help="price of one device per hour, by catalog entry name or device model; repeatable "
                             "(overrides --prices, the price in the result and the catalog)")
    parser.add_argument("--prices", metavar="FILE.yaml",
                        help="your own prices: a YAML mapping of catalog entry or device model to USD per device-hour "
                             "or to {usd_per_hour, source, date} (overrides the result's and the catalog's)")
    parser.add_argument("--tokens", default=None, metavar="N",
                        help="tokens of the training projection (default: 20 per parameter of each model, the "
                             "compute-optimal budget of Hoffmann et al. 2022)")
    parser.add_argument("--also-formula", metavar="NAME",
                        help="a FLOPs formula whose MFU the per-model tables show beside each run's own, e.g. "
                             "megatron-core-v0.7 to compare with a Megatron-LM log before core_v0.12 (names: "
                             "hwbench run --flops-formula)")
    parser.add_argument("--reference", action="append", default=[], metavar="RESULT.json",
                        help="a run you trust; every result of its workload, precision, seed, global batch, sequence "
                             "length and data is checked against it (docs/parity.md) and, when numerically "
                             "different, marked and left out of the comparisons; repeatable")
    parser.add_argument("--keep-different", action="store_true",
                        help="keep a numerically different result in the comparisons (still marked)")
    parser.add_argument("--projection-devices", "--devices", dest="projection_devices", type=int,
                        default=DEFAULT_PROJECTION_DEVICES, metavar="N",
                        help=f"devices of the projected training job (default: {DEFAULT_PROJECTION_DEVICES}; "
                             "--devices is the old name)")


def main(args: argparse.Namespace) -> int:
    from hwbench.report import write_report
    from hwbench.report.cost import parse_tokens
    from hwbench.report.prices import load_price_file, parse_price_options

    prices = {**(load_price_file(args.prices) if args.prices else {}), **parse_price_options(args.price)}
    tokens = None if args.tokens is None else parse_tokens(args.tokens)
    text, skipped = write_report(args.results, args.format, args.against, prices, tokens, args.projection_devices,
                                 args.out, args.also_formula, args.reference, args.keep_different)
    for _file, reason in skipped:  # also listed in the report, but a CI log should show them too
        print(f"hwbench report: warning: left out {reason}", file=sys.stderr)
    if args.out:
        print(f"report written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
