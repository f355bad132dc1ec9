"""Result files written and read (whole or not at all: hwbench.files): the store that never loses a measurement,
and the loader that brings every file an earlier hwbench wrote to the current schema
(hwbench.result.upgrade) and validates it (hwbench.result.model), or names it with one line.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import secrets
import stat
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import ValidationError

from hwbench.errors import UsageError
from hwbench.files import json_text, write_json_atomic
from hwbench.paths import result_files
from hwbench.result import collectives as collectives_file
from hwbench.result.model import RunResult, problem_text
from hwbench.result.upgrade import UpgradeError


class ResultFormatError(ValueError):
    """A result file that cannot be read: not a regular file, truncated, not JSON, not a
    mapping, of a schema version this hwbench does not read, or a field that does not fit."""


class OtherKindOfResult(ResultFormatError):
    """A readable hwbench file of another kind than a run's (``kind``: collectives): read_files
    sorts it to its kind; load_result refuses it."""


R = TypeVar("R", RunResult, collectives_file.CollectivesResult)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def new_run_id(model: str, device: str) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{model}-{device}-{secrets.token_hex(3)}"


# --- writing -------------------------------------------------------------------------------------


def write_result(result: RunResult, out_dir: str | os.PathLike) -> Path:
    """Write ``<out_dir>/<run_id>.json`` atomically (write_json_atomic); the model has checked its status, and
    that its run id is one file name (hwbench.fields.RunId, on assignment too)."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(folder / f"{result.run_id}.json", result.to_dict())


@dataclasses.dataclass(frozen=True)
class StoredResult:
    """Where a finished result went. ``path`` None: no file could take it, and ``text``
    holds the JSON for the caller to print; ``problem`` says why it is not in --out."""

    path: Path | None
    problem: str | None = None
    text: str | None = None


def store_result(result: RunResult, out_dir: str | os.PathLike) -> StoredResult:
    """write_result, never losing a measurement: when --out cannot take the file (full
    disk, folder removed or made read-only during the run), it goes to the system temp
    folder; when that fails too, its JSON is returned for stdout."""
    try:
        return StoredResult(write_result(result, out_dir))
    except OSError as error:
        problem = f"the result could not be written to {os.fspath(out_dir)!r}: {error.strerror or error}"
    fallback = Path(tempfile.gettempdir())
    try:
        kept = write_result(result, fallback)
        return StoredResult(kept, f"{problem}; it was kept as {kept}")
    except OSError as error:
        text = json_text(result.to_dict())
        return StoredResult(None, f"{problem}, nor to {fallback} ({error.strerror or error}); the result follows "
                                  "on stdout", text)


# --- reading -------------------------------------------------------------------------------------


class _NotRegularFile(Exception):
    """A result path that is a FIFO, a socket or a device: reading it could wait forever."""


def _read_regular_file(path: Path) -> bytes:
    """The bytes of ``path``, refused without reading when it is not a regular file (opened
    non-blocking, so a FIFO without a writer does not hang the open)."""
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(handle).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
            raise _NotRegularFile(kind)
        os.set_blocking(handle, True)
        with os.fdopen(handle, "rb", closefd=False) as stream:
            return stream.read()
    finally:
        os.close(handle)


def _read_json(path: Path) -> object:
    """The JSON of one result file; ResultFormatError names the file and why it is none: not
    readable, not UTF-8, not complete JSON, nested too deeply."""
    try:
        return json.loads(_read_regular_file(path).decode("utf-8"))
    except json.JSONDecodeError as error:
        raise ResultFormatError(f"{path}: not a complete JSON document (truncated?): {error}") from None
    except UnicodeDecodeError as error:
        raise ResultFormatError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    except RecursionError:
        raise ResultFormatError(f"{path}: JSON nested too deeply to be a result") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise ResultFormatError(f"{path}: not a result: {str(error)[:200]}") from None
    except _NotRegularFile as error:
        raise ResultFormatError(f"{path}: not a regular file ({error})") from None
    except (OSError, MemoryError) as error:
        raise ResultFormatError(f"{path}: cannot be read: {getattr(error, 'strerror', None) or error}") from None


def _run_from(path: Path, data: object) -> RunResult:
    """A run's result of a file's JSON, brought to the current schema and validated."""
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ResultFormatError(f"{path}: not an hwbench result (no schema_version)")
    if collectives_file.is_collectives_file(data):
        raise OtherKindOfResult(f"{path}: a {data['kind']} result, not a run's")
    try:
        return RunResult.from_dict(data)
    except UpgradeError as error:
        raise ResultFormatError(f"{path}: {error}") from None
    except ValidationError as error:
        raise ResultFormatError(f"{path}: field {problem_text(error)}") from None
    except RecursionError:
        raise ResultFormatError(f"{path}: JSON nested too deeply to be a result") from None


def load_result(path: str | os.PathLike) -> RunResult:
    """Read one result file of any schema version this hwbench reads; ResultFormatError names
    the file and the problem: not readable, not UTF-8, not complete JSON, nested too deeply,
    not a mapping, of a newer schema version, or a field that does not fit (with its path)."""
    path = Path(path)
    return _run_from(path, _read_json(path))


Paths = str | os.PathLike | Iterable[str | os.PathLike]


@dataclasses.dataclass
class ResultFiles:
    """The results under some paths by ``kind``, each run of a kind once (read_files); ``skipped_runs``:
    files that are no readable result, ``skipped_collectives``: collectives files that cannot be read."""

    runs: list[tuple[RunResult, Path]] = dataclasses.field(default_factory=list)
    collectives: list[tuple[collectives_file.CollectivesResult, Path]] = dataclasses.field(default_factory=list)
    skipped_runs: list[tuple[Path, str]] = dataclasses.field(default_factory=list)
    skipped_collectives: list[tuple[Path, str]] = dataclasses.field(default_factory=list)

    @property
    def skipped(self) -> list[tuple[Path, str]]:
        return self.skipped_runs + self.skipped_collectives


def read_files(paths: Paths) -> ResultFiles:
    """Every result file under ``paths`` read once, the one reader of both kinds. A second copy of
    a run already read (a folder given twice, a result copied beside its original) is left out
    naming the first: it would pass for a repeat in a comparison, a baseline's n, an export's median."""
    files = ResultFiles()
    runs = _KindRead(files.runs, files.skipped_runs)
    collectives = _KindRead(files.collectives, files.skipped_collectives)
    for path in result_files(paths):
        try:
            data = _read_json(path)
            if collectives_file.is_collectives_file(data):
                collectives.add(collectives_file.from_data(data, str(path)), path)
            else:
                runs.add(_run_from(path, data), path)
        except collectives_file.CollectivesFormatError as error:
            files.skipped_collectives.append((path, str(error)))
        except ResultFormatError as error:
            files.skipped_runs.append((path, str(error)))
    return files


@dataclasses.dataclass
class _KindRead(Generic[R]):
    """The files of one kind read so far: each run kept from the first file read (``found``), a
    later copy left out naming it (``skipped``). A run id is one run within its kind only."""

    found: list[tuple[R, Path]]
    skipped: list[tuple[Path, str]]
    first: dict[str, tuple[R, Path]] = dataclasses.field(default_factory=dict)  # run id -> the first read, its file

    def add(self, result: R, path: Path) -> None:
        if result.run_id not in self.first:
            self.first[result.run_id] = (result, path)
            self.found.append((result, path))
            return
        earlier, earlier_path = self.first[result.run_id]
        other = ", with other figures (the first file read is kept)" if _other_figures(earlier, result) else ""
        self.skipped.append((path, f"{path}: run {result.run_id} was already read from {earlier_path}{other}"))


def _other_figures(earlier: RunResult | collectives_file.CollectivesResult,
                   result: RunResult | collectives_file.CollectivesResult) -> bool:
    """Whether a second copy of a run differs from the first in its figures: a run's metrics (a
    collectives result's rows are not compared)."""
    return isinstance(earlier, RunResult) and isinstance(result, RunResult) and earlier.metrics != result.metrics


def read_results(paths: Paths) -> tuple[list[tuple[RunResult, Path]], list[tuple[Path, str]]]:
    """The runs of read_files, and the files it left out but collectives files."""
    files = read_files(paths)
    return files.runs, files.skipped_runs


def read_input_files(paths: Iterable[str | os.PathLike], option: str) -> ResultFiles:
    """read_files of a command's inputs, once each is known to exist (else a UsageError naming ``option``)."""
    paths = list(paths)
    missing = next((path for path in paths if not Path(path).exists()), None)
    if missing is not None:
        raise UsageError(f"{option} {os.fspath(missing)!r}: no such file or folder; "
                         "give result files or folders of them")
    return read_files(paths)


def read_inputs(paths: Iterable[str | os.PathLike], option: str
                ) -> tuple[list[tuple[RunResult, Path]], list[tuple[Path, str]]]:
    """The runs of read_input_files, and the files left out but collectives files."""
    files = read_input_files(paths, option)
    return files.runs, files.skipped_runs


def load_results(paths: Paths) -> tuple[list[RunResult], list[tuple[Path, str]]]:
    """read_results without the files, each file left out also named in a Python warning
    (``skipping <reason>``)."""
    found, skipped = read_results(paths)
    for _path, reason in skipped:
        warnings.warn(f"skipping {reason}", stacklevel=2)
    return [result for result, _path in found], skipped
