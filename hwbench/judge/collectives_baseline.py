"""The collectives part of a baseline file (`hwbench baseline save` of `hwbench collectives`
results, `hwbench accept --baseline`): per collective point (device, device model, collective
backend, ranks, hosts, element type; then collective, form and size) its busbw (median, min,
max, n of its ok results), and the judgement of a fabric against it: a busbw below
``min_ratio`` of the baseline's is a FAIL naming the collective, the size and the ranks.

A result that is not ok, or whose check found wrong values, gives no baseline figure (left out
with a line saying why) and, measured on the delivered system, is a FAIL whatever its bandwidth."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict

from hwbench.fields import Positive, Text
from hwbench.result.collectives import POINT_FIELDS, SCOPE_ALL, CollectiveKey, CollectivesResult

Bandwidth = Annotated[float, Strict(), Field(gt=0)]  # GB/s: a ratio is taken against it


class BusbwFigures(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    median: Bandwidth
    min: Bandwidth | None = None
    max: Bandwidth | None = None
    n: Positive | None = None


class CollectivesPointKey(BaseModel):
    """The fields of CollectivesResult.point_key, each of its type, strictly (a world_size of "2" never matches)."""

    model_config = ConfigDict(extra="forbid")
    device: Annotated[str, Strict()]
    device_model: Annotated[str | None, Strict()]
    dist_backend: Annotated[str, Strict()]
    world_size: Annotated[int, Strict(), Field(ge=1)]
    hosts: Annotated[int, Strict(), Field(ge=1)]
    dtype: Annotated[str, Strict()]


class CollectivesBaselinePoint(BaseModel):
    """One collective at one size and form on one point: its baseline busbw."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    key: CollectivesPointKey
    collective: Text
    in_place: Annotated[bool, Strict()]
    size_bytes: Annotated[int, Strict(), Field(ge=1)]
    busbw_gbs: BusbwFigures
    run_ids: list[Text] = []

    @property
    def collective_key(self) -> CollectiveKey:
        """The entry as the one key of a collectives row (a baseline holds a result's own rows: every rank)."""
        return CollectiveKey(**self.key.model_dump(), scope=SCOPE_ALL, collective=self.collective,
                             in_place=self.in_place, size_bytes=self.size_bytes)


def why_not(result: CollectivesResult) -> str | None:
    """Why a collectives result gives no baseline figure (and fails an acceptance); None when it is ok."""
    if result.status != "ok":
        message = result.error.message.strip().splitlines()[0][:200] if result.error and result.error.message.strip() \
            else ""
        return f"status {result.status}" + (f" ({message})" if message else "")
    wrong = [row for row in result.rows if row.wrong]
    if wrong:
        return (f"its check found wrong values ({sum(row.wrong or 0 for row in wrong)} element(s) in "
                f"{len(wrong)} row(s), first {CollectiveKey.of(result, wrong[0]).label()})")
    if not result.rows:
        return "no rows"
    return None


def left_out(found: list[tuple[CollectivesResult, Path]]) -> list[str]:
    """A line for each collectives result a baseline leaves out, with why."""
    return [f"collectives result {result.run_id} ({path}): {reason}; not in the baseline"
            for result, path in found if (reason := why_not(result)) is not None]


def build_points(results: list[CollectivesResult]) -> list[dict[str, Any]]:
    """The baseline file's ``collectives`` entries: every row of an ok result with a busbw, per row key."""
    figures: dict[CollectiveKey, list[tuple[float, str]]] = {}
    for result in results:
        if why_not(result) is not None:
            continue
        for row in result.rows:
            if row.busbw_gbs:  # None or 0 (a time below the clock's step): no ratio can be taken against it
                figures.setdefault(CollectiveKey.of(result, row), []).append((row.busbw_gbs, result.run_id))
    points = []
    for key, measured in figures.items():
        values = [value for value, _ in measured]
        points.append({"key": dict(zip(POINT_FIELDS, key.point_key, strict=True)), "collective": key.collective,
                       "in_place": key.in_place, "size_bytes": key.size_bytes, "label": key.label(),
                       "busbw_gbs": {"median": statistics.median(values), "min": min(values), "max": max(values),
                                     "n": len(values)},
                       "run_ids": list(dict.fromkeys(run_id for _, run_id in measured))})
    return sorted(points, key=lambda p: (p["label"], p["size_bytes"]))


@dataclasses.dataclass
class FabricOutcome:
    """A fabric judged against a baseline's collectives: one line per failure, per point missing from
    the baseline, and per row compared (for the page)."""

    failures: list[str]
    missing: list[str]
    compared: list[tuple[str, float, float, float]]  # (label, busbw, baseline busbw, ratio)


def judge_collectives(results: list[CollectivesResult], baseline: list[CollectivesBaselinePoint],
                      min_ratio: float) -> FabricOutcome:
    """Each row of ``results`` against the baseline's busbw of its row key: below ``min_ratio`` of it is a
    failure naming the collective, size and ranks; a result not ok or with wrong values fails whole;
    a row the baseline lacks is missing."""
    by_key = {point.collective_key: point for point in baseline}
    outcome = FabricOutcome([], [], [])
    for result in results:
        reason = why_not(result)
        if reason is not None:
            outcome.failures.append(f"collectives {result.run_id}: {reason}")
            continue
        measured: dict[CollectiveKey, list[float]] = {}
        for row in result.rows:
            measured.setdefault(CollectiveKey.of(result, row), []).append(row.busbw_gbs or 0.0)
        for key, values in measured.items():
            point = by_key.get(key)
            if point is None:
                outcome.missing.append(key.label())
                continue
            busbw, base = statistics.median(values), point.busbw_gbs.median
            ratio = busbw / base
            outcome.compared.append((key.label(), busbw, base, ratio))
            if ratio < min_ratio:
                outcome.failures.append(f"collective {key.label()}: busbw {busbw:,.3f} GB/s is {ratio:.1%} of its "
                                        f"baseline {base:,.3f} GB/s, below {min_ratio:.0%}")
    return outcome


def slow_link_failures(results: list[CollectivesResult]) -> list[str]:
    """Every slow link each result's ring named, with its figure: a FAIL each (a link slower than the
    others slows every collective that crosses it)."""
    from hwbench.fabric.table import slow_link_text

    rings = [result.slow_link for result in results if result.slow_link is not None]
    return [f"slow link: {slow_link_text(link)} (for {ring.size_bytes} B; threshold {ring.threshold:.0%})"
            for ring in rings for link in ring.slow]
