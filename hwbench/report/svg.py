"""Charts as inline SVG for the HTML pages (the report and the trend page): line, bar and trend
charts, drawn by one template (templates/chart.svg.j2); no library, no network.

Every mark carries a <title> (the browser shows it on hover: the exact figures), a mark may
carry a range (min-max of repeats, or an interval) drawn as a whisker, and every series a
`data-series` name: the pages' inline script (templates/charts.js) hides or shows a series when
its legend entry is clicked."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from markupsafe import Markup

from hwbench.report.html import render_template

COLORS = ("#3b75af", "#ef8636", "#519e3e", "#c53a32", "#8d69b8", "#84584e", "#d57dbf", "#7f7f7f", "#bcbc35",
          "#42b4c6")


class Point(NamedTuple):
    x: float  # in a bar or trend chart, the index of its category or night
    y: float
    title: str  # the hover text
    low: float | None = None  # a range, drawn as a whisker from low to high
    high: float | None = None


@dataclasses.dataclass
class Series:
    name: str
    points: list[Point]
    dashed: bool = False
    markers: bool = True
    line: bool = True  # the points joined
    color: str | None = None
    radius: float = 4.0


class Band(NamedTuple):  # a shaded stretch of x (a new environment), labelled at its foot
    start: float
    end: float
    label: str
    title: str


class Rule(NamedTuple):  # a dashed vertical line at x (a change point), labelled at its head
    x: float
    label: str
    title: str
    color: str


class Frame(NamedTuple):  # the chart's size and margins; a legend sits in the right margin
    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int


REPORT, TREND = Frame(960, 400, 78, 300, 40, 84), Frame(1100, 240, 90, 20, 24, 36)


def line_chart(title: str, x_label: str, y_label: str, series: Sequence[Series], log2_x: bool = False) -> Markup:
    """Lines with point markers; x on a log2 axis when ``log2_x`` (device counts)."""
    xs = [p.x for s in series for p in s.points]
    scale = math.log2 if log2_x else float
    low, high = scale(min(xs)), scale(max(xs))
    width = REPORT.width - REPORT.left - REPORT.right
    chart = _Chart(REPORT, title, x_label, y_label, _y_range(series, from_zero=True),
                   lambda v: REPORT.left + (scale(v) - low) / ((high - low) or 1) * width)
    for tick in (sorted(set(xs)) if log2_x else _ticks(min(xs), max(xs))):
        chart.x_tick(tick, [_label(tick)])
    return chart.draw(series)


def bar_chart(title: str, y_label: str, categories: Sequence[str], series: Sequence[Series]) -> Markup:
    """Grouped bars: a point of each series per category (its x the category's index; a
    category without one has no bar); a bar may carry a range, drawn as a whisker."""
    chart = _Chart(REPORT, title, "", y_label, _y_range(series, from_zero=True), _slots(len(categories), REPORT))
    for index, category in enumerate(categories):
        chart.x_tick(index, category.split("\n")[:4], size=10)  # device, layout, count, a mark
    return chart.draw(series, slot=(REPORT.width - REPORT.left - REPORT.right) / max(1, len(categories)))


def trend_chart(labels: Sequence[str], series: Sequence[Series], bands: Sequence[Band], rules: Sequence[Rule],
                y_format: Callable[[float], str]) -> Markup:
    """Observations in order (a point's x is its index in ``labels``, every few labelled under
    the axis), shaded bands and dashed rules, y zoomed to the figures; no legend."""
    low, high = _y_range(series, from_zero=False)
    pad = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
    chart = _Chart(TREND, "", "", "", (low - pad, high + pad), _slots(len(labels), TREND), y_format, legend=False)
    for index in range(0, len(labels), max(1, len(labels) // 8)):
        chart.x_tick(index, [labels[index]])
    chart.bands = [b._replace(start=chart.x_of(b.start), end=chart.x_of(b.end)) for b in bands]
    chart.rules = [r._replace(x=chart.x_of(r.x)) for r in rules]
    return chart.draw(series)


def _label(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round steps (1, 2, 2.5, 5 x 10^k), about ``count`` of them, from at or below ``low`` to at
    or above ``high``."""
    high = high if high > low else low + 1
    step = 10 ** math.floor(math.log10((high - low) / count))
    step *= next(f for f in (1, 2, 2.5, 5, 10) if (high - low) / (step * f) <= count)
    return [i * step for i in range(math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9) + 1)]


def _y_range(series: Sequence[Series], from_zero: bool) -> tuple[float, float]:
    values = [v for s in series for p in s.points for v in (p.y, p.low, p.high) if v is not None] or [0.0, 1.0]
    return min([*values, 0.0] if from_zero else values), max(values)


def _slots(count: int, frame: Frame) -> Callable[[float], float]:
    """Categories side by side: index i at the middle of the i-th of ``count`` equal slots."""
    return lambda i: frame.left + (frame.width - frame.left - frame.right) * (i + 0.5) / max(1, count)


@dataclasses.dataclass
class _Mark:
    """A point or bar as drawn: its position, hover text and what goes with it."""

    x: float
    y: float
    title: str
    radius: float = 0.0  # a point's marker; 0: none
    bar: dict | None = None  # a bar's rectangle: x, width, height
    label: str | None = None  # the value written above a bar
    whisker: dict | None = None  # top, bottom, cap


class _Chart:
    """One chart's geometry, in the shape templates/chart.svg.j2 draws."""

    def __init__(self, frame: Frame, title: str, x_label: str, y_label: str, y_range: tuple[float, float],
                 x_of: Callable[[float], float], y_format: Callable[[float], str] = _label, legend: bool = True):
        self.frame, self.title, self.x_label, self.y_label, self.x_of = frame, title, x_label, y_label, x_of
        self.legend_shown, self.bottom = legend, frame.height - frame.bottom
        ticks = _ticks(*y_range)
        scale = (frame.height - frame.top - frame.bottom) / (ticks[-1] - ticks[0])
        self.y_of = lambda v: self.bottom - (v - ticks[0]) * scale
        self.grid = [{"y": self.y_of(tick), "label": y_format(tick)} for tick in ticks]
        self.x_ticks: list[dict] = []
        self.bands: list[Band] = []
        self.rules: list[Rule] = []
        self.series: list[dict] = []

    def x_tick(self, x: float, lines: list[str], size: int = 11) -> None:
        self.x_ticks.append({"x": self.x_of(x), "lines": lines, "size": size})

    def draw(self, series: Sequence[Series], slot: float | None = None) -> Markup:
        """The series as lines and markers, or, given the width of a category's ``slot``, as bars
        side by side in the middle 80% of it."""
        for number, s in enumerate(series):
            if slot is None:
                marks = [self._point(p, s.radius if s.markers else 0.0) for p in s.points]
            else:
                width = slot * 0.8 / len(series)
                marks = [self._bar(p, self.x_of(p.x) - slot * 0.4 + width * number, width) for p in s.points]
            self.series.append({"name": s.name, "color": s.color or COLORS[number % len(COLORS)], "dashed": s.dashed,
                                "line": " ".join(f"{m.x:.1f},{m.y:.1f}" for m in marks) if s.line and not slot else "",
                                "marks": marks, "short": s.name[:46] + ("…" if len(s.name) > 46 else "")})
        return Markup(render_template("chart.svg.j2", chart=self, frame=self.frame))

    def _point(self, point: Point, radius: float) -> _Mark:
        return _Mark(self.x_of(point.x), self.y_of(point.y), point.title, radius, whisker=self._whisker(point, 4.0))

    def _bar(self, point: Point, left: float, width: float) -> _Mark:
        y = self.y_of(point.y)
        return _Mark(left + width / 2, y, point.title, whisker=self._whisker(point, min(6.0, width / 4)),
                     bar={"x": left, "width": width, "height": self.bottom - y},
                     label=_label(point.y) if width >= 26 else None)  # a value label only where it fits

    def _whisker(self, point: Point, cap: float) -> dict | None:
        if point.low is None or point.high is None or point.low == point.high:
            return None
        return {"top": self.y_of(point.high), "bottom": self.y_of(point.low), "cap": cap}
