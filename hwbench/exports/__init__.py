"""Results in the formats the tools teams already use read: `hwbench export FORMAT RESULTS...`
and hwbench.export() (docs/exports.md). One format per module: MLPerf's logs and system
description (mlperf.py), github-action-benchmark's and Bencher's JSON (ci.py), Prometheus and
OpenMetrics text and the Pushgateway (prometheus.py), TensorBoard scalars (tensorboard.py),
the results table as Parquet or CSV (table.py). This module checks the request, reads the
results (a file that cannot be read is named and left out, as the report does), picks the
runs a format takes and writes the file whole or not at all.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from hwbench.errors import UsageError

# MLPerf's submission status values: mllog's constants (mlperf_logging.mllog.constants) and the
# system description checker's availability options (mlperf_logging.system_desc_checker).
SUBMISSION_STATUSES = {"onprem": "Available on-premise", "cloud": "Available cloud",
                       "research": "Research, Development, or Internal (RDI)", "preview": "Preview"}
DIVISIONS = ("closed", "open")


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    name: str
    summary: str
    module: str  # hwbench.exports.<module> writes it
    runs: str = "ok"  # which runs it takes: "ok" (their figures, by point), "one" (a log of one run), "all"
    folder: bool = False  # --out is a folder (TensorBoard's log folder)
    binary: bool = False  # nothing for standard output: --out is needed
    needs: tuple[str, str] | None = None  # (module it imports, the extra that installs it)
    collectives: bool = False  # it takes `hwbench collectives` results' busbw too (its writer's ``collectives``)


FORMATS = {fmt.name: fmt for fmt in (
    ExportFormat("mllog", "MLPerf logging: one run as :::MLLOG lines", "mlperf", runs="one"),
    ExportFormat("mlperf-system", "MLPerf's system description JSON of the machine one run ran on", "mlperf",
                 runs="one"),
    ExportFormat("customBiggerIsBetter", "github-action-benchmark's JSON of the higher-is-better figures", "ci",
                 collectives=True),
    ExportFormat("customSmallerIsBetter", "github-action-benchmark's JSON of the lower-is-better figures", "ci"),
    ExportFormat("bencher", "Bencher Metric Format JSON: each figure with the repeats' lower and upper values", "ci",
                 collectives=True),
    ExportFormat("prometheus", "Prometheus text format (node_exporter's textfile collector, a Pushgateway)",
                 "prometheus", collectives=True),
    ExportFormat("openmetrics", "OpenMetrics text format", "prometheus", collectives=True),
    ExportFormat("tensorboard", "TensorBoard scalars per step, a folder per run", "tensorboard", runs="all",
                 folder=True, binary=True, needs=("tensorboard", "tensorboard")),
    ExportFormat("parquet", "the results table (hwbench.load_results) as Parquet", "table", runs="all", binary=True,
                 needs=("pyarrow", "parquet")),
    ExportFormat("csv", "the results table (hwbench.load_results) as CSV", "table", runs="all"),
)}


@dataclasses.dataclass(frozen=True)
class ExportRequest:
    """What the exporters are given beyond the runs: MLPerf's submission fields, the
    Pushgateway's URL and job."""

    submitter: str | None = None
    division: str | None = None
    status: str | None = None  # a key of SUBMISSION_STATUSES
    platform: str | None = None
    push: str | None = None
    job: str = "hwbench"


@dataclasses.dataclass
class ExportOutcome:
    text: str | None  # a text format's content (what the command prints when there is no --out)
    written: list[Path]  # files or folders written
    skipped: list[tuple[Path, str]]  # files that could not be read, with the reason
    left_out: list[str]  # runs that did not end ok, which the formats of figures leave out, and why
    pushed: str | None = None  # the Pushgateway URL the metrics went to (its credentials as ***)


class PushError(RuntimeError):
    """The Pushgateway could not take the metrics (unreachable, refused): one line; any
    --out file was written before the push, and ``outcome`` says what was (export sets it)."""

    outcome: ExportOutcome | None = None


def redacted(url: str) -> str:
    """``url`` as messages show it: a user part (``user:password@``) as ``***@``."""
    return re.sub(r"(?<=//)[^/?#]*@", "***@", url, count=1)


def without_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without its user part, and the user name and password it held (percent-decoded):
    they go as HTTP basic auth, never to the resolver as part of the host."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return bare, urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")


def _parses(url: str) -> bool:
    """The URL's host and port as urllib reads them: an unclosed IPv6 bracket or a port
    outside 0..65535 passes the pattern but raises ValueError when the push is made; a host
    name with a label over 63 characters or an empty one ('a..b') raised UnicodeError in the
    resolver's IDNA encoding."""
    try:
        parts = urllib.parse.urlsplit(url)
        if not parts.hostname:
            return False
        parts.hostname.encode("idna")
        return parts.port is None or parts.port > 0
    except ValueError:  # UnicodeError is one
        return False


def check_request(fmt: str, out: str | os.PathLike | None, request: ExportRequest) -> ExportFormat:
    """The format, the output and the options checked before anything is read (UsageError)."""
    chosen = FORMATS.get(fmt)
    if chosen is None:
        raise UsageError(f"FORMAT {fmt!r} is not known; accepted: {', '.join(FORMATS)}")
    if chosen.binary and out is None:
        raise UsageError(f"{fmt} needs --out {'FOLDER' if chosen.folder else 'FILE'}: it is not text for the terminal")
    if request.push is not None:
        if chosen.module != "prometheus":
            raise UsageError(f"--push is for the prometheus and openmetrics formats, not {fmt}")
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", request.push) or not _parses(request.push):
            raise UsageError(f"--push {redacted(request.push)!r} is not accepted; give the Pushgateway's URL, e.g. "
                             "http://pushgateway.example.com:9091 (a user:password@ before the host is sent as "
                             "HTTP basic auth)")
        if not re.fullmatch(r"[^/\s]+", request.job or ""):
            raise UsageError(f"--job {request.job!r} is not accepted; give a name without '/' or spaces")
    if request.division is not None and request.division not in DIVISIONS:
        raise UsageError(f"--division {request.division!r} is not accepted; give {' or '.join(DIVISIONS)}")
    if request.status is not None and request.status not in SUBMISSION_STATUSES:
        raise UsageError(f"--status {request.status!r} is not accepted; give one of {', '.join(SUBMISSION_STATUSES)}")
    if chosen.needs is not None:
        module, extra = chosen.needs
        if importlib.util.find_spec(module) is None:
            raise UsageError(f"{fmt} needs {module}, which is not installed: pip install 'hwbench[{extra}]'")
    return chosen


def export(fmt: str, paths: Iterable[str | os.PathLike], out: str | os.PathLike | None = None,
           request: ExportRequest = ExportRequest()) -> ExportOutcome:
    """``paths``' results in ``fmt``, written to ``out`` (a file, or TensorBoard's log folder)
    whole or not at all; without ``out``, a text format's content is returned. A Pushgateway
    in ``request.push`` gets the metrics after the file is written (PushError when it cannot).
    UsageError, before anything is written, for bad input: an unknown format, a missing path,
    no run the format can take, an output that would overwrite an input."""
    from hwbench.paths import check_output_file, check_output_folder
    from hwbench.result.store import read_input_files

    chosen = check_request(fmt, out, request)
    paths = [os.fspath(path) for path in paths]
    if not paths:
        raise UsageError("RESULTS: give result files or folders of them")
    if out is not None and not chosen.folder:
        check_output_file(out, "--out", paths)
    if out is not None and chosen.folder:  # '' was the working folder; a file, or under one, is refused
        check_output_folder(out, "--out")
    inputs = read_input_files(paths, "RESULTS")
    skipped = inputs.skipped if chosen.collectives else inputs.skipped_runs
    collectives, left_out_collectives = _collectives_taken(chosen, inputs.collectives)
    taken, left_out = _runs_taken(chosen, inputs.runs, skipped, bool(collectives))
    left_out += left_out_collectives
    runs, files = [result for result, _path in taken], [path for _result, path in taken]
    writer = importlib.import_module(f"hwbench.exports.{chosen.module}")
    given = {"collectives": collectives} if chosen.collectives else {}
    outcome = ExportOutcome(None, [], skipped, left_out)
    try:
        if chosen.folder:
            assert out is not None, "check_request refuses a folder format without --out"
            outcome.written = writer.write_folder(runs, Path(out))
        else:
            content = writer.render(chosen.name, runs, files, request, **given)
            outcome.text = content if isinstance(content, str) else None
            if out is not None:
                outcome.written = [_write_file(Path(out), content)]
    except OSError as error:
        raise UsageError(f"--out {out}: cannot be written: {error.strerror or error}") from None
    if request.push is not None:
        try:
            writer.push(chosen.name, runs, request, **given)
        except PushError as error:
            error.outcome = outcome  # the runs left out are named all the same
            raise
        outcome.pushed = redacted(request.push)
    return outcome


def _collectives_taken(chosen: ExportFormat, found: list) -> tuple[list, list[str]]:
    """The ok `hwbench collectives` results of ``found`` (result, file) for a format that takes them,
    and a line for each one that is not ok (its figures missing, as a failed run's)."""
    if not chosen.collectives:
        return [], []
    left_out = [f"collectives result {result.run_id} ({path}): status {result.status}"
                f"{_error_text(result)}, no figures" for result, path in found if result.status != "ok"]
    return [result for result, _path in found if result.status == "ok"], left_out


def _runs_taken(chosen: ExportFormat, found: list, skipped: list, collectives: bool = False) -> tuple[list, list[str]]:
    """The (run, file) pairs ``chosen`` takes, and a line for each run it leaves out; UsageError
    when none is left (naming why the first unreadable file was left out), unless ``collectives``:
    ok collectives results are there for the format to take."""
    results = [result for result, _path in found]
    if not results and collectives:
        return [], []
    if not results:
        why = f" ({skipped[0][1]}{f'; {len(skipped) - 1} more left out' if len(skipped) > 1 else ''})" if skipped \
            else ""
        raise UsageError(f"RESULTS hold no readable hwbench result{why}; nothing to export")
    if chosen.runs == "one":
        if len(results) > 1:
            raise UsageError(f"{chosen.name} writes one run (an MLPerf log or system description is of one run); "
                             f"RESULTS hold {len(results)}: give one result file")
        return found, []
    if chosen.runs == "all":
        return found, []
    ok = [(result, path) for result, path in found if result.status == "ok"]
    # a point the planner skipped (it would not fit) was never run: no failure, as compare counts it
    left_out = [f"run {result.run_id} ({path}): status {result.status}{_error_text(result)}, no figures"
                for result, path in found if result.status not in ("ok", "skipped")]
    if not ok and not collectives:
        raise UsageError(f"RESULTS hold no run with status ok ({len(results)} with another status); {chosen.name} "
                         "exports measured figures")
    return ok, left_out


def _error_text(result) -> str:
    """What went wrong in a run, as its result says it: a short first line, or nothing."""
    message = result.error.message if result.error else None
    first = " ".join((message or "").split())
    return f" ({first[:120]}{'...' if len(first) > 120 else ''})" if first else ""


def _write_file(path: Path, content: str | bytes) -> Path:
    from hwbench.files import atomic_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as stream:
        stream.write(content.encode("utf-8") if isinstance(content, str) else content)
    return path
