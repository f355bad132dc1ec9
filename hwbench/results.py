"""RunResult: one JSON file per run, its atomic store and its loader.

Every field is documented in docs/results.md. A figure that was not measured
is null and its reason is kept in the ``unmeasured`` map beside it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable

from hwbench import RESULT_SCHEMA_VERSION, __version__
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


def write_result(result: RunResult, out_dir: str | os.PathLike) -> Path:
    """Write ``<out_dir>/<run_id>.json`` atomically (write_json_atomic)."""
    if result.status not in STATUSES:
        raise ValueError(f"unknown status {result.status!r}")
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(folder / f"{result.run_id}.json", result.to_dict())


def write_json_atomic(path: str | os.PathLike, value: Any, durable: bool = True) -> Path:
    """Every JSON file hwbench writes, through write_text_atomic. ``durable``: flushed
    to disk before the rename (results); False for files that are rewritten every step
    (heartbeats)."""
    return write_text_atomic(path, json.dumps(value, indent=2, allow_nan=False, default=str) + "\n", durable)


def write_text_atomic(path: str | os.PathLike, text: str, durable: bool = True) -> Path:
    """A temporary file in the same folder, then renamed over the final name, so a
    reader sees the old file or the whole new one, never half (results, reports)."""
    final = Path(path)
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


def load_result(path: str | os.PathLike) -> RunResult:
    """Read one result file; ResultFormatError names the file and the problem: not
    readable, not UTF-8, not complete JSON, nested too deeply, of an unknown schema
    version, or a field of the wrong type (hwbench.result_shape)."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except json.JSONDecodeError as error:
        raise ResultFormatError(f"{path}: not a complete JSON document (truncated?): {error}") from None
    except UnicodeDecodeError as error:
        raise ResultFormatError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    except RecursionError:
        raise ResultFormatError(f"{path}: JSON nested too deeply to be a result") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise ResultFormatError(f"{path}: not a result: {str(error)[:200]}") from None
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
    return found


def load_results(paths: Iterable[str | os.PathLike]) -> tuple[list[RunResult], list[tuple[Path, str]]]:
    """Load every result under ``paths``. Files that cannot be read are skipped
    with a warning naming them, and returned as (path, reason) pairs."""
    results, skipped = [], []
    for path in result_files(paths):
        try:
            results.append(load_result(path))
        except ResultFormatError as error:
            warnings.warn(f"skipping {error}", stacklevel=2)
            skipped.append((path, str(error)))
    return results, skipped
