"""Change points in a series of nights: E-divisive means, judged by a Student t test.

The method (docs/history.md has it in full, with the simulation that chose its settings):

1. Inside each environment segment, E-divisive (Matteson & James 2014, "A nonparametric
   approach for multiple change point analysis of multivariate data", JASA 109) proposes
   the split tau, with an end kappa, that maximises the energy divergence between the
   nights [start, tau) and [tau, kappa) (hwbench.stats.energy_divisive_split), as
   Hunter/Apache Otava do (Daly et al., ICPE 2020; Fleming et al., ICPE 2023).
2. The split is kept when a two-sample Student t test of those two stretches has
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
from collections.abc import Sequence

from hwbench.history.series import Night, Segment, Series, power_of_two_scale, short_commit
from hwbench.metrics import metric_named
from hwbench.stats import energy_divisive_split, pooled_t_test

# Significance of a change point. Otava's default is 0.001; the nightly job tests every
# series again each night, so the false alarms add up over the nights: the simulation in
# docs/history.md found 9% of noise-only series raising a false regression on some night
# at 0.001, 2% at 1e-4 and none at 1e-5, which still finds a 5% step within 3 nights in
# 95% of series at 2% run-to-run noise.
ALPHA = 1e-5
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
    best = energy_divisive_split(values[low:high], min_nights)
    if best is None:
        return
    split, end = low + best[0], low + best[1]
    if _p(values[low:split], values[split:end]) < alpha:
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


def level_changes(values: Sequence[float], points: Sequence[int]) -> list[dict[str, float]]:
    """For each change point, the t test (hwbench.stats.pooled_t_test) of the nights since
    the previous change point against the nights up to the next one."""
    bounds = [0] + list(points) + [len(values)]
    return [pooled_t_test(values[bounds[i - 1]:bounds[i]], values[bounds[i]:bounds[i + 1]])
            for i in range(1, len(bounds) - 1)]


def open_regression(tests: Sequence[dict[str, float]], threshold: float,
                    higher_is_better: bool) -> tuple[int | None, float | None]:
    """(which change point is an open regression or None, the final level against the level
    before the latest regression). Open: the nights since the last change point are still
    worse than the nights before the latest regression by more than ``threshold``."""
    regressions = [i for i, test in enumerate(tests) if _worse(test, higher_is_better)]
    if not regressions:
        return None, None
    latest = regressions[-1]
    before = tests[latest]["mean_before"]
    relative = _relative(tests[-1]["mean_after"] - before, before)
    worse_by = -relative if higher_is_better else relative
    return (latest if worse_by > threshold else None), relative


def _relative(difference: float, level: float) -> float:
    """``difference`` as a fraction of ``level``; 0 for a level of 0, which has no relative change."""
    return difference / abs(level) if level else 0.0


def _worse(test: dict[str, float], higher_is_better: bool) -> bool:
    return (test["difference"] < 0) == higher_is_better


def series_changes(series: Series, threshold: float) -> SeriesChanges:
    """The change points of every segment of ``series`` and the open regression of its
    last segment, if any (an earlier segment ran in another environment)."""
    higher_is_better = metric_named(series.metric).higher_is_better
    changes: list[Change] = []
    offset = 0
    open_index = open_change = None
    for segment in series.segments:
        # judged in units of a power of two near the largest night, so figures near the float
        # limit (1.7e308) neither overflow nor lose a bit: t, p and every ratio are unchanged
        scale = power_of_two_scale(night.value for night in segment.nights)
        values = [night.value / scale for night in segment.nights]
        points = change_points(values)
        tests = level_changes(values, points)
        latest, open_change = open_regression(tests, threshold, higher_is_better)
        open_index = None if latest is None else len(changes) + latest
        changes += _segment_changes(series, segment.nights, offset, points, tests, higher_is_better, scale)
        offset += len(values)
    return SeriesChanges(series, changes, None if open_index is None else changes[open_index], open_change)


def _segment_changes(series: Series, nights: list[Night], offset: int, points: list[int],
                     tests: list[dict[str, float]], higher_is_better: bool, scale: float) -> list[Change]:
    ends = points[1:] + [len(nights)]
    return [Change(series=series, index=offset + split, night=nights[split], previous=nights[split - 1],
                   before=test["mean_before"] * scale, after=test["mean_after"] * scale,
                   change=_relative(test["difference"], test["mean_before"]),
                   ci95_low=_relative(test["ci95_low"], test["mean_before"]),
                   ci95_high=_relative(test["ci95_high"], test["mean_before"]), p=test["p"],
                   later_nights=end - split - 1, worse=_worse(test, higher_is_better))
            for split, end, test in zip(points, ends, tests)]


def describe_change(change: Change) -> str:
    """'tokens/s of 1.3b on H100 TP2 PP2 bf16 fell 6.1% (95% CI -7.9% to -4.3%) at 2026-12-03,
    commit abc1234, confirmed by 4 later nights'."""
    verb = "fell" if change.change < 0 else "rose"
    later = f"confirmed by {change.later_nights} later night{'s' if change.later_nights != 1 else ''}"
    commits = short_commit(change.night.commit)
    if change.previous.commit != change.night.commit:
        commits += f" (the night before: {short_commit(change.previous.commit)})"
    write = metric_named(change.series.metric).text
    return (f"{change.series.label} {verb} {abs(change.change) * 100:.1f}% (95% CI {change.ci95_low * 100:+.1f}% to "
            f"{change.ci95_high * 100:+.1f}%, p={change.p:.2g}) at {change.night.night}, commit {commits}, {later}: "
            f"{write(change.before)} -> {write(change.after)}"
            f" ({change.kind})")


def describe_environment_change(series: Series, segment: Segment) -> str:
    """'tokens/s of ... : new environment from 2026-12-05 (torch_version 2.13.0 -> 2.14.0)'."""
    fields = "; ".join(f"{field} {', '.join(map(str, old))} -> {', '.join(map(str, new))}"
                       for field, old, new in segment.environment_change)
    return (f"{series.label}: new environment from {segment.nights[0].night} ({fields}); a new segment, "
            "not judged as a change")
