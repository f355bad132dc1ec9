"""`hwbench archive RESULTS... --out FILE.tar.gz` and `hwbench archive --verify FILE`: every
result with its logs, the report, the machines' descriptions and a SHA-256 manifest, and the
check of an archive against its manifest (docs/reports.md, "Archive")."""

from __future__ import annotations

import argparse
import sys

from hwbench.errors import UsageError

DESCRIPTION = ("Pack result files (files or folders) into one .tar.gz a buyer can hand on: every readable result "
               "with the logs beside it, report.html, each machine's MLPerf-style description, archive.json and a "
               "SHA-256 manifest (sha256sum -c MANIFEST.sha256 checks it too). `hwbench report results --format "
               "html` in the unpacked folder gives report.html again. --verify FILE checks an archive: exit 1 "
               "naming each file whose hash differs, is missing or was added.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="*", metavar="RESULTS", help="result files or folders (searched recursively)")
    parser.add_argument("--out", metavar="FILE.tar.gz", help="the archive to write")
    parser.add_argument("--verify", metavar="FILE", help="check this archive against its manifest instead")


def main(args: argparse.Namespace) -> int:
    from hwbench.archives import ArchiveProblem, make_archive, verify_archive

    if args.verify is not None:
        if args.results or args.out:
            raise UsageError("--verify FILE takes no RESULTS and no --out; give one or the other")
        try:
            files = verify_archive(args.verify)
        except ArchiveProblem as problem:
            for line in problem.problems:
                print(f"hwbench archive: {line}", file=sys.stderr)
            return 1
        print(f"{args.verify}: all {files} files match the manifest")
        return 0
    if not args.results:
        raise UsageError("RESULTS: give result files or folders of them (or --verify FILE)")
    if not args.out:
        raise UsageError("--out FILE.tar.gz is needed: where the archive goes")
    outcome = make_archive(args.results, args.out)
    for _path, reason in outcome.skipped:
        print(f"hwbench archive: warning: left out {reason}", file=sys.stderr)
    print(f"{outcome.path}: {outcome.results} results, {outcome.files} files in the manifest"
          + (f", {len(outcome.skipped)} file(s) left out (archive.json names them)" if outcome.skipped else ""))
    return 0
