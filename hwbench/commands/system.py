"""`hwbench system RESULT_FILE`: an MLPerf-style system description of the machine a
result ran on, from what the result recorded."""

from __future__ import annotations

import argparse
from pathlib import Path

from hwbench.errors import UsageError

DESCRIPTION = ("Print an MLPerf-style system description of the machine a result ran on, built only from what "
               "the result recorded.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("result", metavar="RESULT_FILE", help="one result JSON file")
    parser.add_argument("--out", help="also write the JSON to this file")


def main(args: argparse.Namespace) -> int:
    import json

    from hwbench.files import write_text_atomic
    from hwbench.paths import check_output_file
    from hwbench.report.system import system_description
    from hwbench.result.store import ResultFormatError, load_result

    path = Path(args.result)
    if args.out:
        check_output_file(args.out, "--out", [path] if path.is_file() else [])
    if not path.is_file():
        raise UsageError(f"RESULT_FILE {args.result!r}: not a file; give one hwbench result JSON file")
    try:
        result = load_result(path)
    except ResultFormatError as error:
        raise UsageError(f"RESULT_FILE {error}") from None
    text = json.dumps(system_description(result), indent=2)
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(args.out, text + "\n")
        except OSError as error:
            raise UsageError(f"--out {args.out}: cannot be written: {error.strerror}") from None
    print(text)
    return 0
