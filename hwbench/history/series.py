"""Series: the nights of one benchmark point and one metric, cut into segments where the
environment changed.

A series is identified by the point (hwbench.point.PointKey: workload, device model,
layout, precision, batch, sequence, engine, ...) and the metric. Its observations are
nights: the ok runs of the point that started on the same UTC date under the same commit
and environment (a sweep's repeats), summarised by their median. A segment ends where
the environment fingerprint changes in a field that moves figures by itself (driver,
CUDA/CANN, NCCL/HCCL, torch, torch_npu, DeepSpeed, the backend's tuning): such a change
is named, and change points are looked for inside segments only.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from hwbench.history.store import StoredRun, utc_instant
from hwbench.metrics import metric_named
from hwbench.point import PointKey
from hwbench.result.collectives import CollectiveKey
from hwbench.result.environment import SAMPLE_ENVIRONMENT_FIELDS, environment_differences


@dataclasses.dataclass
class Night:
    """One observation of a series: the ok runs of one night, commit and environment."""

    night: str
    commit: str | None
    started_at: str  # of its first run
    values: list[float]
    run_ids: list[str]
    fingerprint: dict[str, str | None]

    @property
    def value(self) -> float:
        return scaled_statistic(statistics.median, self.values)


@dataclasses.dataclass
class Segment:
    nights: list[Night]
    # (field, values before, values from here on) where this segment's environment differs
    # from the previous segment's; empty for the first
    environment_change: list[tuple[str, list[Any], list[Any]]]


@dataclasses.dataclass
class Series:
    metric: str
    point: PointKey | CollectiveKey  # a run's point, or a collectives result's busbw figure
    label: str
    segments: list[Segment]

    @property
    def nights(self) -> list[Night]:
        return [night for segment in self.segments for night in segment.nights]


def series_of(runs: list[StoredRun], metric: str) -> list[Series]:
    """Every series with at least one ok value of ``metric`` (compare's name), in label order."""
    by_point: dict[PointKey | CollectiveKey, list[StoredRun]] = defaultdict(list)
    for run in runs:
        if run.status == "ok" and run.value is not None:
            by_point[run.point].append(run)
    runs_points = [point for point in by_point if isinstance(point, PointKey)]
    found = [Series(metric, point, f"{metric_named(metric).label} of "
                                   f"{point.label(runs_points) if isinstance(point, PointKey) else point.label()}",
                    segments_of(nights_of(point_runs)))
             for point, point_runs in by_point.items()]
    return sorted(found, key=lambda series: series.label)


def nights_of(runs: list[StoredRun]) -> list[Night]:
    """Runs (oldest first) grouped into nights: same UTC date, commit and fingerprint."""
    grouped: dict[tuple, Night] = {}
    for run in runs:
        if run.value is None:  # the run has no such figure: no observation
            continue
        group = (run.night, run.commit, tuple(sorted(run.fingerprint.items())))
        if group not in grouped:
            grouped[group] = Night(run.night, run.commit, run.started_at, [], [], run.fingerprint)
        grouped[group].values.append(run.value)
        grouped[group].run_ids.append(run.run_id)
    return sorted(grouped.values(), key=lambda night: utc_instant(night.started_at))



def segments_of(nights: list[Night]) -> list[Segment]:
    """Nights cut where the environment changes in a SAMPLE_ENVIRONMENT_FIELDS field (a field one of two
    fingerprints does not know is not compared: hwbench.result.environment.environment_differences)."""
    segments: list[Segment] = []
    for night in nights:
        change = []
        if segments:
            before = segments[-1].nights[-1].fingerprint
            groups = [("before", [before]), ("after", [night.fingerprint])]
            change = [(field, held[0][1], held[1][1])
                      for field, held in environment_differences(groups, SAMPLE_ENVIRONMENT_FIELDS)]
        if not segments or change:
            segments.append(Segment([night], change))
        else:
            segments[-1].nights.append(night)
    return segments


def power_of_two_scale(values: Iterable[float]) -> float:
    """The power of two at or below the largest magnitude of ``values`` (1.0 for none or zeros):
    dividing by it is exact, and brings figures near the float limit (1.7e308) down to [1, 2),
    where sums and squares do not overflow."""
    largest = max((abs(value) for value in values), default=0.0)
    return math.ldexp(1.0, math.frexp(largest)[1] - 1) if largest and math.isfinite(largest) else 1.0


def scaled_statistic(statistic: Callable[[list[float]], float], values: list[float]) -> float:
    """``statistic`` (a median, a mean) of ``values`` computed in power_of_two_scale units, so two
    figures near the float limit do not sum to infinity on the way."""
    scale = power_of_two_scale(values)
    return statistic([value / scale for value in values]) * scale


def short_commit(commit: str | None) -> str:
    return commit[:7] if commit else "unknown commit"
