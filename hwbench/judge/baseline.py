"""Baseline files (`hwbench baseline save`, `hwbench accept --baseline`): the figures a delivered
system must reach, per benchmark point (hwbench.point.PointKey).

A baseline file is JSON: ``schema`` "hwbench-baseline", ``schema_version``, ``created_at``, the
``machine`` and ``software`` the results came from (hosts, device models, drivers, torch,
hwbench, Python: every value seen), and ``points``: each point's key, label and tokens/s
(median, min, max, n of its ok results, run ids). `--baseline` also takes a folder of result
files (made into a baseline on the fly) or a CSV of per-device-model figures: a header with
``model``, ``device_model`` and ``tokens_per_s``, and any other PointKey field (precision,
seq_length, tp, pp, dp, nnodes, ...) a row's figure is for; an empty cell matches any value.
Each is checked whole when it is read (BaselineFile), before anything is measured.

Both kinds of baseline, the file and the folder of results `hwbench baseline copy` makes for
`hwbench compare`, are made from ok runs only: a run that is not ok is left out, with a line
saying which and why (``left_out``), and a point with no ok run is no baseline point.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import statistics
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)
from pydantic_core import PydanticCustomError

from hwbench.errors import UsageError
from hwbench.fields import Positive, Text, problem_text
from hwbench.files import write_json_atomic
from hwbench.judge.collectives_baseline import CollectivesBaselinePoint, build_points
from hwbench.metrics import METRICS
from hwbench.point import PointKey
from hwbench.result.collectives import CollectivesResult
from hwbench.result.model import RunResult
from hwbench.result.store import utc_now

SCHEMA = "hwbench-baseline"
SCHEMA_VERSION = 1
METRIC = "tokens_per_s"
CSV_REQUIRED = ("model", "device_model", METRIC)

Rate = Annotated[float, Strict(), Field(gt=0)]  # a baseline's tokens/s: a ratio is taken against it


class _Figures(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    median: Rate
    min: Rate | None = None
    max: Rate | None = None
    n: Positive | None = None


def _key_model() -> type[BaseModel]:
    """PointKey's fields, each of its type, strictly (a tp of "2" would never match a run)."""
    hints = typing.get_type_hints(PointKey)
    fields: dict[str, Any] = {
        field.name: (Annotated[hints[field.name], Strict()],
                     ... if field.default is dataclasses.MISSING else field.default)
        for field in dataclasses.fields(PointKey)
    }
    return create_model("BaselineKey", __config__=ConfigDict(extra="forbid", allow_inf_nan=False), **fields)


BaselineKey = _key_model()


class _Point(BaseModel):
    model_config = ConfigDict(extra="allow")
    key: BaselineKey  # type: ignore[valid-type]  # a model made from PointKey's fields
    label: Text | None = None
    tokens_per_s: _Figures
    run_ids: list[Text] = []

    def point_key(self) -> PointKey:
        return PointKey(**typing.cast(BaseModel, self.key).model_dump())


class BaselineFile(BaseModel):
    """A baseline file as `hwbench baseline save` writes it, every field checked when it is read,
    before anything is measured: a zero, negative or non-finite median would be divided by
    only once the suite had run, a malformed machine met only when the page is written."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    schema_: Literal["hwbench-baseline"] = Field(alias="schema")
    schema_version: Literal[1]
    created_at: Text | None = None
    metric: Literal["tokens_per_s"] = "tokens_per_s"  # METRIC, the one figure a baseline holds
    machine: dict[Text, list[Text]] = {}  # hosts, device_models, drivers: every value seen
    software: dict[Text, list[Text]] = {}
    collectives: list[CollectivesBaselinePoint] = []  # busbw of `hwbench collectives` results
    points: list[_Point] = Field(default=[], validate_default=True)  # after collectives: its check reads them

    @field_validator("points")
    @classmethod
    def _not_empty(cls, points: list[_Point], info: ValidationInfo) -> list[_Point]:
        if not points and not info.data.get("collectives"):  # a baseline of collectives alone holds no point
            raise PydanticCustomError("empty_baseline", "must hold at least 1, not 0 (or give collectives)")
        return points


@dataclasses.dataclass
class BaselinePoint:
    """One point's baseline figure: its key (a CSV row: only the fields the row gives) and tokens/s."""

    fields: dict[str, Any]  # PointKey fields; a CSV row's may be a subset
    label: str
    median: float
    min: float | None = None
    max: float | None = None
    n: int | None = None

    def matches(self, key: PointKey) -> bool:
        # a row that names no stand-in is the device's own figure: a stand-in's run never matches it
        wanted = {"stand_in": None, **self.fields}
        return all(_same(getattr(key, name), value) for name, value in wanted.items())


def _same(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, str) and not isinstance(value, str):  # a CSV cell: compared as its text
        return str(value).lower() == wanted.lower()
    return value == wanted


@dataclasses.dataclass
class Baseline:
    source: str  # what --baseline named
    points: list[BaselinePoint]
    machine: dict[str, Any]
    software: dict[str, Any]
    created_at: str | None
    collectives: list[CollectivesBaselinePoint] = dataclasses.field(default_factory=list)

    def figure(self, key: PointKey) -> BaselinePoint | None:
        """The baseline figure of ``key``: the most specific matching entry (a result's key matches whole)."""
        found = [point for point in self.points if point.matches(key)]
        return max(found, key=lambda point: len(point.fields)) if found else None


def _seen(values) -> list[str]:
    return sorted({str(v) for v in values if v not in (None, "")})


def _figure(result: RunResult) -> float | None:
    """A run's baseline figure: its tokens/s when it is ok and has one."""
    return METRICS[METRIC].read(result) if result.status == "ok" else None


def _why_not(result: RunResult) -> str:
    if result.status != "ok":
        message = (result.error.message or "") if result.error is not None else ""
        return f"status {result.status}" + (f" ({message.splitlines()[0][:200]})" if message.strip() else "")
    return f"no {METRIC} figure"


def left_out(found: list[tuple[RunResult, Path]]) -> list[str]:
    """What a baseline made of ``found`` (result, file) leaves out, a line each: every run that is not ok,
    with its status and error, then every point with no ok run ("not a baseline point")."""
    from hwbench.judge.compare import group, point_label

    lines = [f"run {result.run_id} ({path}): {_why_not(result)}; not in the baseline"
             for result, path in found if _figure(result) is None]
    by_key, names, _ = group([result for result, _ in found])
    keys = list(by_key)
    lines += [f"point {point_label(key, names[key], keys)}: no ok run ({len(runs)} not ok); not a baseline point"
              for key, runs in by_key.items() if all(_figure(r) is None for r in runs)]
    return lines


def build_baseline(results: list[RunResult], collectives: Sequence[CollectivesResult] = ()) -> dict[str, Any]:
    """The baseline file's content from ``results``: every point with an ok tokens/s figure, and
    every collective of an ok ``collectives`` result with its busbw."""
    from hwbench.judge.compare import group, point_label

    by_key, names, _ = group(results)
    keys = list(by_key)
    points = []
    for key, runs in by_key.items():
        ok = [(r, v) for r in runs if (v := _figure(r)) is not None]
        if not ok:
            continue
        values = [v for _, v in ok]
        points.append({"key": dataclasses.asdict(key), "label": point_label(key, names[key], keys),
                       METRIC: {"median": statistics.median(values), "min": min(values), "max": max(values),
                                "n": len(values)}, "run_ids": [r.run_id for r, _ in ok]})
    fabric = build_points(list(collectives))
    if not points and not fabric:
        raise UsageError("RESULTS: no ok result with a tokens/s figure and no ok collectives result; a baseline "
                         "needs at least one")
    environments = [r.environment for r in results if r.status == "ok"]
    environments += [c.environment for c in collectives if c.status == "ok" and c.environment is not None]
    device_models = [r.device_model for r in results if r.status == "ok"]
    device_models += [c.device_model for c in collectives if c.status == "ok"]
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "created_at": utc_now(), "metric": METRIC,
        "machine": {"hosts": _seen(e.host for e in environments),
                    "device_models": _seen(device_models),
                    "drivers": _seen(e.driver_version for e in environments)},
        "software": {"torch": _seen(e.torch_version for e in environments),
                     "hwbench": _seen(e.hwbench_version for e in environments),
                     "python": _seen(e.python for e in environments)},
        "points": sorted(points, key=lambda p: p["label"]),
        "collectives": fabric,
    }


def save_baseline(results: list[RunResult], out: Path, collectives: Sequence[CollectivesResult] = ()
                  ) -> dict[str, Any]:
    content = build_baseline(results, collectives)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # as archive and export: its folder is made
        write_json_atomic(out, content)
    except OSError as error:
        raise UsageError(f"--out {os.fspath(out)}: cannot be written: {error.strerror or error}") from None
    return content


def copy_ok_results(found: list[tuple[RunResult, Path]], inputs: list[str], out_dir: str | os.PathLike) -> list[Path]:
    """The files of the ok runs with a figure in ``found`` copied under the folder ``out_dir`` (a baseline for
    `hwbench compare`), each at its path below the input folder it was found in (a file given by name: at
    its name); the files written. ``out_dir`` may exist but must hold no result file: nothing is
    overwritten. Each file is written whole or not at all; when one cannot be, those already
    written are removed (this call made them) and nothing is left."""
    from hwbench.files import write_text_atomic
    from hwbench.paths import check_output_folder, result_files

    out = check_output_folder(out_dir)  # as given: "" is refused, not taken for "."
    if out.is_dir() and result_files([out]):
        raise UsageError(f"--out {os.fspath(out)!r} holds result files already; give a new or empty folder (a "
                         "baseline is never written over another)")
    kept = [path for result, path in found if _figure(result) is not None]
    if not kept:
        raise UsageError("RESULTS: no ok result with a tokens/s figure; a baseline needs at least one")
    targets = [out / _below(path, inputs) for path in kept]
    if len(set(targets)) < len(targets):
        raise UsageError(f"RESULTS: two result files would be copied to the same name under --out {os.fspath(out)!r}; "
                         "give the folders that hold them")
    written: list[Path] = []
    try:
        for source, target in zip(kept, targets):
            target.parent.mkdir(parents=True, exist_ok=True)
            written.append(write_text_atomic(target, source.read_text(encoding="utf-8")))
    except OSError as error:
        for path in written:
            path.unlink(missing_ok=True)
        raise UsageError(f"--out {os.fspath(out)!r}: cannot be written: {error.strerror or error}") from None
    return written


def _below(path: Path, inputs: list[str]) -> Path:
    """``path`` relative to the input folder it was found in; its name when it was given itself."""
    for entry in map(Path, inputs):
        if entry.is_dir() and path.is_relative_to(entry):
            return path.relative_to(entry)
    return Path(path.name)


def load_baseline(path: str) -> Baseline:
    """A baseline file, a folder of results or a CSV; UsageError (one line) when it is none of them."""
    where = Path(path)
    if where.is_dir():
        from hwbench.result.store import read_input_files

        files = read_input_files([path], "--baseline")
        found, fabric = files.runs, files.collectives
        if not found and not fabric:
            raise UsageError(f"--baseline {path!r}: the folder holds no hwbench result files; give a baseline file, "
                             "a folder of results or a CSV")
        return _from_content(build_baseline([r for r, _ in found], [c for c, _ in fabric]), path)
    if not where.is_file():  # a FIFO would block the read; it exists, so it is no "no such file"
        what = "not a regular file" if where.exists() else "no such file or folder"
        raise UsageError(f"--baseline {path!r}: {what}; give a baseline file (JSON), a folder of results or a CSV")
    try:
        text = where.read_text(encoding="utf-8-sig")  # a spreadsheet's CSV starts with a BOM: not a column name
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--baseline {path!r} cannot be read ({error}); give a baseline file (JSON), a folder of "
                         "results or a CSV") from None
    if where.suffix.lower() == ".csv":
        return _from_csv(text, path)
    try:
        content = json.loads(text)
    except (ValueError, RecursionError):
        raise UsageError(f"--baseline {path!r}: not JSON; give a baseline file (hwbench baseline save), a folder of "
                         "results or a CSV") from None
    if not isinstance(content, dict) or content.get("schema") != SCHEMA:
        raise UsageError(f"--baseline {path!r}: not a baseline file (no \"schema\": \"{SCHEMA}\"); make one with "
                         "`hwbench baseline save`")
    if content.get("schema_version") != SCHEMA_VERSION or isinstance(content.get("schema_version"), bool):
        raise UsageError(f"--baseline {path!r}: schema_version {content.get('schema_version')!r} is not read by "
                         f"this hwbench; accepted: {SCHEMA_VERSION}")
    return _from_content(content, path)


def _from_content(content: dict[str, Any], source: str) -> Baseline:
    try:
        read = BaselineFile.model_validate(content)
        points = [BaselinePoint(dataclasses.asdict(key), point.label or key.label(), point.tokens_per_s.median,
                                point.tokens_per_s.min, point.tokens_per_s.max, point.tokens_per_s.n)
                  for point in read.points for key in [point.point_key()]]
    except ValidationError as error:
        raise UsageError(f"--baseline {source!r}: {problem_text(error)}; give a baseline "
                         "file as `hwbench baseline save` writes it") from None
    return Baseline(source, points, read.machine, read.software, read.created_at, read.collectives)


def _from_csv(text: str, source: str) -> Baseline:
    reader = csv.DictReader(text.splitlines())
    try:
        rows = list(reader)
    except csv.Error as error:  # a cell beyond the csv module's field limit (131,072 characters)
        raise UsageError(f"--baseline {source!r}: not a CSV hwbench reads ({error}); accepted: a header with "
                         f"{', '.join(CSV_REQUIRED)} and a row per figure") from None
    header = set(reader.fieldnames or ())  # the header line itself: a header without rows has its columns
    missing = [name for name in CSV_REQUIRED if name not in header]
    if missing:
        raise UsageError(f"--baseline {source!r}: the CSV lacks column(s) {', '.join(missing)}; accepted: a header "
                         f"with {', '.join(CSV_REQUIRED)} and any of {', '.join(PointKey.fields())}")
    if not rows:  # as a baseline file with no points: every suite point would be missing after the run
        raise UsageError(f"--baseline {source!r}: the CSV has a header and no row; give a row per figure")
    known = set(PointKey.fields())
    points = []
    for number, row in enumerate(rows, start=2):
        try:
            median = float(row[METRIC])
        except (TypeError, ValueError):
            median = math.nan
        if not math.isfinite(median) or median <= 0:
            shown = "(no cell: the row is shorter than the header)" if row[METRIC] is None else repr(row[METRIC])
            raise UsageError(f"--baseline {source!r} line {number}: {METRIC} {shown} is not accepted; give a "
                             "positive number")
        fields: dict[str, Any] = {name: _cell(name, value, f"--baseline {source!r} line {number}")
                                  for name, value in row.items() if name in known and value not in (None, "")}
        label = " ".join(f"{name}={value}" for name, value in fields.items())
        points.append(BaselinePoint(fields, label, median))
    return Baseline(source, points, {}, {}, None)


# PointKey's integer fields (tp, seq_length, ...): a CSV cell of one is a whole number
_INTEGER_FIELDS = {name for name, hint in typing.get_type_hints(PointKey).items() if int in typing.get_args(hint)
                   or hint is int}


def _cell(name: str, text: str, where: str) -> Any:
    """A CSV cell as the PointKey field holds it: an integer field's as int (ASCII digits, at most
    18: '\u00b2' and 5,000 digits were int()'s ValueError), the rest as text (matched case-blind)."""
    text = text.strip()
    if name not in _INTEGER_FIELDS:
        return text
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise UsageError(f"{where}: {name} {shown!r} is not accepted; give a whole number, or an empty cell for "
                         "any value")
    return int(text)

