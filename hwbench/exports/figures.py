"""The figures the CI and monitoring formats carry: the ok runs grouped by benchmark point
(hwbench.point.PointKey: repeats of one point are one series), each figure of
hwbench.metrics.METRICS as the median of the repeats with their lowest and highest value.
TFLOP/s and MFU are read under the default FLOPs formula, so that a series stays under one
formula whichever formula a run was asked for. A simulated run (a stand-in ran the vendor's code
path on this host) is never a repeat of a real one: its point is apart and its name says so.
`hwbench collectives` results give busbw (hwbench.metrics.BUSBW) per collective, form, size and
scope, by CollectiveKey, as the median of the results that share it."""

from __future__ import annotations

import dataclasses
import datetime
import statistics

from hwbench.metrics import Metric
from hwbench.point import EMULATED, SIMULATED, PointKey
from hwbench.result.collectives import CollectiveKey, CollectivesResult, busbw_figures
from hwbench.result.model import RunResult


@dataclasses.dataclass(frozen=True)
class Figure:
    value: float  # the median of the repeats
    lower: float  # their lowest
    upper: float  # their highest
    runs: int


# the note beside a stand-in's point (PointKey.stand_in), by kind
STAND_IN_NOTES = {
    SIMULATED: "simulated: a stand-in ran the device's code path on the host; not a hardware figure",
    EMULATED: "emulated: FP8 computed without FP8 matrix units; not an FP8 device's figure",
}


@dataclasses.dataclass
class PointFigures:
    key: PointKey
    name: str  # the report's label of the point, distinct among the points exported together ('[simulated]',
    #            '[emulated]' in it)
    runs: list[RunResult]

    @property
    def stand_in_note(self) -> str | None:
        """What ran in place of the device's own path, where something did (its key says so; the device
        reports the real name all the same), else None."""
        return STAND_IN_NOTES[self.key.stand_in] if self.key.stand_in else None

    def figure(self, metric: Metric) -> Figure | None:
        """``metric`` over the repeats, or None when no run has it."""
        from hwbench.workload.flops import DEFAULT_FLOPS_FORMULA

        values = [value for run in self.runs if (value := metric.read(run, DEFAULT_FLOPS_FORMULA)) is not None]
        if not values:
            return None
        return Figure(statistics.median(values), min(values), max(values), len(values))

    @property
    def run_ids(self) -> list[str]:
        return [run.run_id for run in self.runs]


@dataclasses.dataclass
class CollectiveFigure:
    """One busbw series of the collectives results exported (hwbench.result.collectives.CollectiveKey):
    the median of the results' busbw in GB/s, their lowest and highest."""

    key: CollectiveKey
    figure: Figure
    run_ids: list[str]


def collective_figures(results: list[CollectivesResult]) -> list[CollectiveFigure]:
    """Every busbw of the ok collectives results (a row with wrong values is none), by key, in the
    order first seen; the repeats of a key are the results that share it."""
    grouped: dict[CollectiveKey, list[tuple[float, str]]] = {}
    for result in results:
        for key, value in busbw_figures(result):
            grouped.setdefault(key, []).append((value, result.run_id))
    return [CollectiveFigure(key, Figure(statistics.median(v for v, _ in found), min(v for v, _ in found),
                                         max(v for v, _ in found), len(found)), [run_id for _, run_id in found])
            for key, found in grouped.items()]


def point_figures(runs: list[RunResult]) -> list[PointFigures]:
    """The runs by point, in the order first seen (a run without a resolved spec has no point; a
    stand-in's run is a point of its own, PointKey.stand_in)."""
    grouped: dict[PointKey, list[RunResult]] = {}
    for run in runs:
        if run.point_key is not None:
            grouped.setdefault(run.point_key, []).append(run)
    return [PointFigures(key, key.label(grouped), runs) for key, runs in grouped.items()]


def unix_time(text: str | None) -> float | None:
    """An ISO 8601 time (a result's started_at, finished_at) as seconds since the epoch; None when it is none."""
    try:
        return datetime.datetime.fromisoformat(text).timestamp() if text else None
    except ValueError:
        return None


def flops_formula() -> str:
    from hwbench.workload.flops import DEFAULT_FLOPS_FORMULA

    return DEFAULT_FLOPS_FORMULA


__all__ = ["STAND_IN_NOTES", "CollectiveFigure", "Figure", "PointFigures", "collective_figures", "flops_formula",
           "point_figures", "unix_time"]
