"""The trend page: one offline HTML file with an inline SVG chart per series
(hwbench.report.html's templates and stylesheet, hwbench.report.svg's trend chart).

Each night is a dot whose tooltip gives the night, commit, figure and runs, with a whisker
over its runs' range; each change point is a dashed line, red for a regression and green
for an improvement, its tooltip the sentence `hwbench history changes` prints; a grey band
starts each new environment segment; a level line shows the mean between change points.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
import math
import statistics
from collections.abc import Callable

from hwbench.history.changes import ALPHA, SeriesChanges, describe_change
from hwbench.history.series import Night, short_commit
from hwbench.metrics import COLLECTIVE_METRICS, METRICS, metric_named
from hwbench.report.html import render_template
from hwbench.report.svg import Band, Point, Rule, Series, trend_chart

REGRESSION, IMPROVEMENT, DOT, LEVEL = "#c62828", "#2e7d32", "#3b75af", "#f2a33a"


@dataclasses.dataclass
class _Section:
    label: str
    badge: str
    badge_kind: str  # open, moved or quiet
    items: list[tuple[str, str]]  # (kind: environment, regression or improvement; text)
    chart: str


def trend_page(analyses: list[SeriesChanges], threshold: float) -> str:
    """The whole page: series with an open regression first, then the headline figure's (tokens/s,
    then the others in METRICS' order), those with change points before those without."""
    order = [*METRICS, *COLLECTIVE_METRICS]
    ordered = sorted(analyses, key=lambda a: (a.open_regression is None, order.index(a.series.metric),
                                              not a.changes, a.series.label))
    return render_template(
        "trends.html.j2", title="hwbench trends", page="trends", sections=[_section(a) for a in ordered],
        series=len(analyses), changes=sum(len(a.changes) for a in analyses),
        opened=sum(a.open_regression is not None for a in analyses), threshold=f"{threshold * 100:g}%",
        alpha=f"{ALPHA:g}", written=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def _section(analysis: SeriesChanges) -> _Section:
    series = analysis.series
    if analysis.open_regression:
        assert analysis.open_change is not None, "series_changes gives an open regression its change"
        badge, kind = f"open regression {analysis.open_change * 100:+.1f}%", "open"
    elif analysis.changes:
        badge, kind = f"{len(analysis.changes)} change point(s)", "moved"
    else:
        badge, kind = "no change point", "quiet"
    items = [("environment", f"new environment from {segment.nights[0].night}: "
              + "; ".join(f"{field} {', '.join(map(str, old))} -> {', '.join(map(str, new))}"
                          for field, old, new in segment.environment_change))
             for segment in series.segments[1:]]
    items += [(change.kind, describe_change(change)) for change in analysis.changes]
    return _Section(series.label, badge, kind, items, _chart(analysis))


def _chart(analysis: SeriesChanges) -> str:
    """The chart is drawn in the unit its axis shows (ms or s, GiB, %: the metric's unit.axis), so that its
    ticks fall on round numbers of it; times a power of ten for figures of 1e15 or more, so that
    none near the float limit overflows. Its tooltips give the figures."""
    series = analysis.series
    write = metric_named(series.metric).text
    scale, tick_text = _axis(series.metric, [value for night in series.nights for value in night.values])
    nights = [Point(i, night.value / scale, f"{night.night}, commit {short_commit(night.commit)}: "
                                            f"{write(night.value)} (median of {len(night.values)} run(s): "
                                            f"{', '.join(map(write, night.values))})",
                    *((min(night.values) / scale, max(night.values) / scale) if len(night.values) > 1
                      else (None, None)))
              for i, night in enumerate(series.nights)]
    rules = [Rule(change.index - 0.5, f"{change.change * 100:+.1f}%", describe_change(change),
                  REGRESSION if change.worse else IMPROVEMENT) for change in analysis.changes]
    return trend_chart(night_labels(series.nights),
                       _levels(analysis, scale) + [Series("nights", nights, line=False, color=DOT, radius=3.6)],
                       _segment_bands(analysis), rules, tick_text)


def _axis(metric: str, values: list[float]) -> tuple[float, Callable[[float], str]]:
    """(scale, tick text): a figure / scale is its height on the chart, and a tick at that
    height reads as the number the unit shows, with as many decimals as it has (1.04 GiB and
    1.06 GiB, never 1.1 GiB twice)."""
    factor, unit = metric_named(metric).unit.axis(values)
    largest = max((abs(value) for value in values if math.isfinite(value)), default=0.0)
    magnitude = math.log10(largest) + math.log10(factor) if largest else 0.0  # no product: it may overflow
    exponent = math.floor(magnitude) if magnitude >= 15 else 0
    scale = 10.0 ** (exponent - math.log10(factor)) if exponent else 1 / factor  # at most the largest figure

    def text(tick: float) -> str:
        if exponent:  # no real figure: a damaged or hand-made one, written as the metric's text writes it
            return f"{tick:.4g}e+{exponent}{unit}"
        return f"{tick:,.6f}".rstrip("0").rstrip(".") + unit

    return scale, text


def night_labels(nights: list[Night]) -> list[str]:
    """Each night's label under the axis, no two alike: its date, and where two nights share a
    date (two commits, or a new environment that day) its commit, then its number that day."""
    dates = collections.Counter(night.night for night in nights)
    labels = [night.night + (f" {short_commit(night.commit)}" if dates[night.night] > 1 else "") for night in nights]
    alike, seen = collections.Counter(labels), collections.Counter[str]()
    for index, label in enumerate(labels):
        seen[label] += 1
        if alike[label] > 1:
            labels[index] = f"{label} #{seen[label]}"
    return labels


def _segment_bands(analysis: SeriesChanges) -> list[Band]:
    bands, start = [], 0
    for number, segment in enumerate(analysis.series.segments):
        end = start + len(segment.nights)
        if number:
            fields = ", ".join(field for field, _, _ in segment.environment_change)
            bands.append(Band(start - 0.5, end - 0.5, f"new {fields}",
                              f"new environment from {segment.nights[0].night}: {fields}"))
        start = end
    return bands


def _levels(analysis: SeriesChanges, scale: float) -> list[Series]:
    """The mean of each stretch between change points and environment changes, in units of ``scale``."""
    bounds, start = set(), 0
    for segment in analysis.series.segments:
        bounds.add(start)
        start += len(segment.nights)
    bounds |= {change.index for change in analysis.changes}
    edges = sorted(bounds) + [start]
    nights = analysis.series.nights
    levels = []
    for begin, end in itertools.pairwise(edges):
        level = statistics.fmean(night.value / scale for night in nights[begin:end])
        levels.append(Series("level", [Point(begin - 0.4, level, ""), Point(end - 0.6, level, "")], markers=False,
                             color=LEVEL))
    return levels
