"""RunResult: one JSON file per run, its atomic store and its loader.

Every field is documented in docs/results.md. A figure that was not measured
is null and its reason is kept in the ``unmeasured`` map beside it.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import math
import os
import secrets
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hwbench import RESULT_SCHEMA_VERSION, __version__
from hwbench.errors import UsageError
from hwbench.result_shape import STATUSES, shape_problem
# Fields of `environment` that can change the figures by themselves: `hwbench report` and
# `hwbench compare` warn when the runs they put side by side differ in one of them.
# `tuning` is what the backend changed in the process (allocator, threads, TF32).
PERFORMANCE_ENVIRONMENT_FIELDS = ("torch_version", "driver_version", "cuda_version", "cann_version",
                                  "torch_npu_version", "nccl_version", "hccl_version", "deepspeed_version",
                                  "hwbench_version", "tuning")
# Of those, the ones that belong to a device kind: compared among runs of the same backend only.
PER_BACKEND_ENVIRONMENT_FIELDS = ("driver_version", "cuda_version", "cann_version", "torch_npu_version",
                                  "nccl_version", "hccl_version", "tuning")


def environment_value(environment: dict[str, Any], field: str) -> str | None:
    """One environment field as comparable text (a mapping as sorted key=value pairs)."""
    value = environment.get(field)
    if isinstance(value, dict):
        return ", ".join(f"{key}={value[key]}" for key in sorted(value))
    return None if value is None else str(value)


def environment_differences(groups: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
                            fields: Sequence[str]) -> list[tuple[str, list[tuple[str, list[Any]]]]]:
    """Where groups of runs differ in the fields that change the figures: the one rule of
    `hwbench report` (each ok run a group) and `hwbench compare` (baseline and current).

    A group is (label, the fingerprints of its runs: field -> comparable value); a field a
    fingerprint leaves out is unknown for that run and not compared, and a group that knows
    no value of a field is left out of it. A field differs when the remaining groups do not
    all hold the same set of values; for each such field, in ``fields`` order, the result
    gives (label, the group's distinct values in first-seen order) for every remaining group."""
    found = []
    for field in fields:
        held = []
        for label, fingerprints in groups:
            values = list(dict.fromkeys(fingerprint[field] for fingerprint in fingerprints if field in fingerprint))
            if values:
                held.append((label, values))
        if any(set(values) != set(held[0][1]) for _, values in held[1:]):
            found.append((field, held))
    return found


class ResultFormatError(ValueError):
    """A result file that cannot be read: truncated, not JSON, or of a schema
    version this hwbench does not know."""


@dataclasses.dataclass
class RunResult:
    run_id: str
    status: str
    spec: dict[str, Any]
    workload: dict[str, Any] = dataclasses.field(default_factory=dict)
    device: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    ranks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)
    launch: dict[str, Any] = dataclasses.field(default_factory=dict)
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    nodes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sweep: dict[str, Any] | None = None  # suite, point, repeat and resume key when a sweep ran it
    error: dict[str, Any] | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""
    hwbench_version: str = __version__
    schema_version: int = RESULT_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        # schema_version first, so `head` on a file shows what it is
        return {"schema_version": data.pop("schema_version"), **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def new_run_id(model: str, device: str) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{model}-{device}-{secrets.token_hex(3)}"


def check_output_folder(folder: str | os.PathLike, option: str = "--out") -> Path:
    """Refuse, before anything runs, an output folder hwbench could not write: empty,
    a file, under a file, or not writable (a read-only file system, no permission).
    Probed by creating and removing a file in the folder, or in its nearest existing
    ancestor when it does not exist yet, so nothing is left behind either way."""
    text = os.fspath(folder)
    if not text.strip():
        raise UsageError(f"{option} {text!r} is not accepted; give a directory (it is created when missing)")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {text!r} is a file; give a directory (it is created when missing)")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{option} {text!r} lies under the file {str(existing)!r}; give a directory")
    try:
        handle, probe = tempfile.mkstemp(prefix=".hwbench-probe-", dir=existing)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise UsageError(f"{option} {text!r} cannot be written ({error.strerror} in {str(existing)!r}); give a "
                         "writable directory") from None
    return path


def check_output_file(path: str | os.PathLike, option: str, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse, before anything is read, an output file that would destroy something: one
    of the command's own input files, or an existing path that is not a regular file
    (a folder, a device such as /dev/full)."""
    final = Path(path)
    if final.exists() and not final.is_file():
        raise UsageError(f"{option} {os.fspath(path)!r} exists and is not a regular file; give a file path")
    for source in result_files(inputs):
        if final.exists() and source.exists() and os.path.samefile(final, source):
            raise UsageError(f"{option} {os.fspath(path)!r} is one of the input files; give another path, or the "
                             "input would be overwritten")
    return final


def write_result(result: RunResult, out_dir: str | os.PathLike) -> Path:
    """Write ``<out_dir>/<run_id>.json`` atomically (write_json_atomic)."""
    if result.status not in STATUSES:
        raise ValueError(f"unknown status {result.status!r}")
    if os.sep in result.run_id or result.run_id in ("", ".", ".."):
        raise ValueError(f"run id {result.run_id!r} is not a file name")
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
        return StoredResult(write_result(result, fallback), f"{problem}; it was kept in {fallback}")
    except OSError as error:
        text = json.dumps(_finite(result.to_dict()), indent=2, allow_nan=False, default=str)
        return StoredResult(None, f"{problem}, nor to {fallback} ({error.strerror or error}); the result follows "
                                  "on stdout", text)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as null: JSON has no NaN, and a figure that
    is not a number was not measured."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def write_json_atomic(path: str | os.PathLike, value: Any, durable: bool = True) -> Path:
    """Every JSON file hwbench writes, through write_text_atomic. ``durable``: flushed
    to disk before the rename (results); False for files that are rewritten every step
    (heartbeats)."""
    return write_text_atomic(path, json.dumps(_finite(value), indent=2, allow_nan=False, default=str) + "\n", durable)


def write_text_atomic(path: str | os.PathLike, text: str, durable: bool = True) -> Path:
    """A temporary file in the same folder, then renamed over the final name, so a
    reader sees the old file or the whole new one, never half (results, reports)."""
    final = Path(path)
    if final.exists() and not final.is_file():  # a rename would replace a device or a folder with this file
        raise OSError(errno.EEXIST, "it exists and is not a regular file", str(final))
    handle, temporary = tempfile.mkstemp(prefix=f".{final.stem}.", suffix=".tmp", dir=final.parent)
    try:
        os.fchmod(handle, 0o666 & ~_umask())  # mkstemp makes 0600; results are shared files
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(temporary, final)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return final


def _umask() -> int:
    """The process umask, read without changing it (os.umask would, for a moment,
    for every thread)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


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


def load_result(path: str | os.PathLike) -> RunResult:
    """Read one result file; ResultFormatError names the file and the problem: not
    readable, not UTF-8, not complete JSON, nested too deeply, of an unknown schema
    version, or a field of the wrong type (hwbench.result_shape)."""
    path = Path(path)
    try:
        data = json.loads(_read_regular_file(path).decode("utf-8"))
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
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ResultFormatError(f"{path}: not an hwbench result (no schema_version)")
    version = data["schema_version"]
    if version != RESULT_SCHEMA_VERSION or isinstance(version, bool):
        raise ResultFormatError(
            f"{path}: schema_version {version!r} is not known to hwbench {__version__} "
            f"(it reads version {RESULT_SCHEMA_VERSION})"[:300]
        )
    for key in ("run_id", "status", "spec"):
        if key not in data:
            raise ResultFormatError(f"{path}: field {key!r} is missing")
    problem = shape_problem(data)
    if problem:
        raise ResultFormatError(f"{path}: field {problem}")
    return RunResult.from_dict(data)


# hwbench's own summaries that live beside results: a sweep point's repeat statistics,
# `hwbench tune`'s ranking. Folders are searched for results without them.
AGGREGATE_FILE = "aggregate.json"
RANKING_FILE = "ranking.json"


def result_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Result files named directly or found (recursively) in folders (hidden files and
    hwbench's own summaries left out)."""
    found: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            found += sorted(p for p in entry.rglob("*.json")
                            if not p.name.startswith(".") and p.name not in (AGGREGATE_FILE, RANKING_FILE))
        else:
            found.append(entry)
    unique = {path.resolve(): path for path in reversed(found)}  # a file named twice is read once
    return [path for path in found if unique.get(path.resolve()) is path]


def load_results(paths: Iterable[str | os.PathLike]) -> tuple[list[RunResult], list[tuple[Path, str]]]:
    """Load every result under ``paths``, each run once. Files that cannot be read,
    and second copies of a run already read (a folder given twice, a result copied
    beside its original), are skipped with a warning naming them, and returned as
    (path, reason) pairs: a copy counted twice would pass for a repeat in a comparison."""
    results, skipped, read_from = [], [], {}
    for path in result_files(paths):
        try:
            result = load_result(path)
        except ResultFormatError as error:
            warnings.warn(f"skipping {error}", stacklevel=2)
            skipped.append((path, str(error)))
            continue
        if result.run_id in read_from:
            reason = f"{path}: run {result.run_id} was already read from {read_from[result.run_id]}"
            warnings.warn(f"skipping {reason}", stacklevel=2)
            skipped.append((path, reason))
            continue
        read_from[result.run_id] = path
        results.append(result)
    return results, skipped
