"""Change points in a series of nights: E-divisive means, judged by a Student t test.

The method (docs/history.md has it in full, with the simulation that chose its settings):

1. Inside each environment segment, E-divisive (Matteson & James 2014, "A nonparametric
   approach for multiple change point analysis of multivariate data", JASA 109) proposes
   the split that maximises the energy divergence between the nights before and after it
   (hwbench.stats.energy_split_statistics), as Hunter/Apache Otava do (Daly et al.,
   ICPE 2020; Fleming et al., ICPE 2023).
2. The split is kept when a two-sample Student t test of the nights on either side has
   p < ALPHA (Otava's deterministic replacement for the permutation test); both sides
   are then split again, recursively, down to MIN_NIGHTS nights a side.
3. Each kept change point is tested again between its neighbouring change points, and
   the weakest that is no longer significant is dropped, until all are.

A change is a regression when the figure got worse (lower throughput, higher step time
or memory). A regression is *open* when the last segment of the series is still worse,
by more than the threshold of `hwbench compare`, than the nights before the latest
regression: that is what fails the gate (exit 3, compare's REGRESSION_EXIT).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hwbench.history.series import Night, Segment, Series, format_value, short_commit
from hwbench.report.compare import METRICS
from hwbench.stats import energy_split_statistics, pooled_t_test

ALPHA = 0.001  # significance of a change point (Otava's default p-value)
MIN_NIGHTS = 3  # nights on each side of a change point, so one odd night cannot make one


@dataclasses.dataclass
class Change:
    """A change point: the first night at the new level, and what changed."""

    series: Series
    index: int  # of the first night after the change, within the series' nights
    night: Night
    previous: Night  # the last night before it (the other end of the commit range)
    before: float  # mean of the nights since the previous change point
    after: float  # mean of the nights up to the next change point
    change: float  # (after - before) / before
    ci95_low: float  # of change
    ci95_high: float
    p: float
    later_nights: int  # nights at the new level after the change night
    worse: bool

    @property
    def kind(self) -> str:
        return "regression" if self.worse else "improvement"


@dataclasses.dataclass
class SeriesChanges:
    series: Series
    changes: list[Change]
    open_regression: Change | None  # the regression the series has not recovered from
    open_change: float | None  # the last segment against the nights before that regression


def change_points(values: Sequence[float], alpha: float = ALPHA, min_nights: int = MIN_NIGHTS) -> list[int]:
    """Indices where a new level starts (each the first value after a change), ascending."""
    found: list[int] = []
    _split(list(values), 0, len(values), alpha, min_nights, found)
    found.sort()
    return _prune(list(values), found, alpha)


def _split(values: list[float], low: int, high: int, alpha: float, min_nights: int, found: list[int]) -> None:
    if high - low < 2 * min_nights:
        return
    divergence = energy_split_statistics(values[low:high], min_nights)
    split = low + min_nights + max(range(len(divergence)), key=divergence.__getitem__)
    if _p(values[low:split], values[split:high]) < alpha:
        found.append(split)
        _split(values, low, split, alpha, min_nights, found)
        _split(values, split, high, alpha, min_nights, found)


def _prune(values: list[float], points: list[int], alpha: float) -> list[int]:
    """Drop, one at a time, the least significant change point whose neighbouring segments
    no longer differ (a split found early can lose its meaning once later ones are made)."""
    while points:
        bounds = [0] + points + [len(values)]
        p = [_p(values[bounds[i]:bounds[i + 1]], values[bounds[i + 1]:bounds[i + 2]]) for i in range(len(points))]
        weakest = max(range(len(points)), key=p.__getitem__)
        if p[weakest] < alpha:
            return points
        del points[weakest]
    return points


def _p(before: list[float], after: list[float]) -> float:
    return pooled_t_test(before, after)["p"]


def series_changes(series: Series, threshold: float, alpha: float = ALPHA,
                   min_nights: int = MIN_NIGHTS) -> SeriesChanges:
    """The change points of every segment of ``series`` and its open regression, if any."""
    higher_is_better = METRICS[series.metric][1]
    changes: list[Change] = []
    offset = 0
    last_segment: list[Change] = []
    for segment in series.segments:
        values = [night.value for night in segment.nights]
        points = change_points(values, alpha, min_nights)
        bounds = [0] + points + [len(values)]
        last_segment = [_change(series, segment.nights, values, bounds, i, offset, higher_is_better)
                        for i in range(1, len(bounds) - 1)]
        changes += last_segment
        offset += len(values)
    open_regression, open_change = _open_regression(series, last_segment, threshold, higher_is_better)
    return SeriesChanges(series, changes, open_regression, open_change)


def _change(series: Series, nights: list[Night], values: list[float], bounds: list[int], i: int, offset: int,
            higher_is_better: bool) -> Change:
    start, split, end = bounds[i - 1], bounds[i], bounds[i + 1]
    test = pooled_t_test(values[start:split], values[split:end])
    before = test["mean_before"]
    return Change(series=series, index=offset + split, night=nights[split], previous=nights[split - 1],
                  before=before, after=test["mean_after"], change=test["difference"] / before,
                  ci95_low=test["ci95_low"] / before, ci95_high=test["ci95_high"] / before, p=test["p"],
                  later_nights=end - split - 1, worse=(test["difference"] < 0) == higher_is_better)


def _open_regression(series: Series, changes: list[Change], threshold: float,
                     higher_is_better: bool) -> tuple[Change | None, float | None]:
    """The latest regression of the last segment, when the nights since the last change
    point are still worse than the nights before that regression by more than ``threshold``."""
    regressions = [change for change in changes if change.worse]
    if not regressions:
        return None, None
    latest = regressions[-1]
    final_level = changes[-1].after
    relative = (final_level - latest.before) / latest.before
    worse_by = -relative if higher_is_better else relative
    return (latest, relative) if worse_by > threshold else (None, relative)


def describe_change(change: Change) -> str:
    """'tokens/s of 1.3b on H100 TP2 PP2 bf16 fell 6.1% (95% CI -7.9% to -4.3%) at 2026-12-03,
    commit abc1234, confirmed by 4 later nights'."""
    verb = "fell" if change.change < 0 else "rose"
    later = f"confirmed by {change.later_nights} later night{'s' if change.later_nights != 1 else ''}"
    commits = short_commit(change.night.commit)
    if change.previous.commit != change.night.commit:
        commits += f" (the night before: {short_commit(change.previous.commit)})"
    return (f"{change.series.label} {verb} {abs(change.change) * 100:.1f}% (95% CI {change.ci95_low * 100:+.1f}% to "
            f"{change.ci95_high * 100:+.1f}%, p={change.p:.2g}) at {change.night.night}, commit {commits}, {later}: "
            f"{format_value(change.series.metric, change.before)} -> {format_value(change.series.metric, change.after)}"
            f" ({change.kind})")


def describe_environment_change(series: Series, segment: Segment) -> str:
    """'tokens/s of ... : new environment from 2026-12-05 (torch_version 2.13.0 -> 2.14.0)'."""
    fields = "; ".join(f"{field} {', '.join(map(str, old))} -> {', '.join(map(str, new))}"
                       for field, old, new in segment.environment_change)
    return (f"{series.label}: new environment from {segment.nights[0].night} ({fields}); a new segment, "
            "not judged as a change")
