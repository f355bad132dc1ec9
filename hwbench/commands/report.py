"""`hwbench report`: result files as Markdown, HTML, CSV or JSON beside the published
tables (docs/reports.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hwbench.errors import UsageError

DESCRIPTION = ("Report result files (files or folders) against the published tables: throughput, per-device "
               "normalisation, memory, cost and energy per token, convergence and environment.")
FORMATS = ("md", "html", "csv", "json")
DEFAULT_TOKENS = "300e9"
DEFAULT_PROJECTION_DEVICES = 8


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS", help="result files or folders (searched recursively)")
    parser.add_argument("--against", metavar="PATH", default=None,
                        help="published table (.csv) or folder of them (default: results/published of this checkout)")
    parser.add_argument("--format", choices=FORMATS, default="md", help="md (default), html, csv or json")
    parser.add_argument("--out", metavar="FILE", help="write the report here (default: standard output)")
    parser.add_argument("--price", action="append", default=[], metavar="DEVICE=USD/h",
                        help="price of one device per hour, by catalog entry name or device model; repeatable "
                             "(overrides the price in the result and the catalog)")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS, metavar="N",
                        help=f"tokens for the training projection (default: {DEFAULT_TOKENS})")
    parser.add_argument("--projection-devices", "--devices", dest="projection_devices", type=int,
                        default=DEFAULT_PROJECTION_DEVICES, metavar="N",
                        help=f"devices of the projected training job (default: {DEFAULT_PROJECTION_DEVICES}; "
                             "--devices is the old name)")


def main(args: argparse.Namespace) -> int:
    from hwbench.report.published import DEFAULT_DIR, load_published
    from hwbench.report.build import build_report
    from hwbench.report.cost import parse_prices, parse_tokens
    from hwbench.report.render import render_csv, render_json, render_markdown
    from hwbench.report.runs import load_inputs
    from hwbench.results import write_text_atomic

    if args.projection_devices < 1:
        raise UsageError(f"--projection-devices {args.projection_devices} is not accepted; give a number of "
                         "devices >= 1")
    tokens = parse_tokens(args.tokens)
    prices = parse_prices(args.price)
    loaded, skipped = load_inputs(args.results)
    for _file, reason in skipped:  # also listed in the report, but a CI log should show them too
        print(f"hwbench report: warning: left out {reason}", file=sys.stderr)
    if not loaded:
        raise UsageError(f"RESULTS {' '.join(args.results)}: no readable result file "
                         f"({len(skipped)} skipped: {skipped[0][1] if skipped else 'none found'})")
    published, note = None, None
    if args.against is not None:
        published = load_published(args.against)
    elif DEFAULT_DIR.is_dir():
        published = load_published(DEFAULT_DIR)
    elif Path("results/published").is_dir():
        published = load_published("results/published")
    else:
        note = "No published tables found (results/published); give --against PATH."
    report = build_report(loaded, skipped, published, note, prices, tokens, args.projection_devices,
                          with_plots=args.format == "html")
    if args.format == "html":
        from hwbench.report.html import render_html

        text = render_html(report)
    else:
        text = {"md": render_markdown, "csv": render_csv, "json": render_json}[args.format](report)
    if args.out:
        try:
            write_text_atomic(args.out, text)  # never a half-written report
        except OSError as error:
            raise UsageError(f"--out {args.out}: cannot be written: {error.strerror}") from None
        print(f"report written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
