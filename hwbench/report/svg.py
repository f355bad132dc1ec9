"""Charts as inline SVG text for the HTML report: no library, no network, one file.

Every mark carries a <title> (the browser shows it on hover: the exact figures), and every
series a `data-series` name: the report's small inline script hides or shows a series when its
legend entry is clicked (html.py, TOGGLE_SCRIPT)."""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Sequence

WIDTH, HEIGHT = 960, 400
LEFT, RIGHT, TOP, BOTTOM = 78, 300, 40, 84  # the legend sits in the right margin
COLORS = ("#3b75af", "#ef8636", "#519e3e", "#c53a32", "#8d69b8", "#84584e", "#d57dbf", "#7f7f7f", "#bcbc35",
          "#42b4c6")


@dataclasses.dataclass
class Series:
    name: str
    points: list[tuple[float, float, str]]  # (x, y, hover text)
    dashed: bool = False
    markers: bool = True
    color: str | None = None


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + 1
    step = 10 ** math.floor(math.log10((high - low) / count))
    for factor in (1, 2, 2.5, 5, 10):
        if (high - low) / (step * factor) <= count:
            step *= factor
            break
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 2) if first + i * step <= high + step / 2]


def _label(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _frame(title: str, x_label: str, y_label: str, ticks_y: list[float], y_of) -> list[str]:
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{_e(title)}">',
             f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{_e(title)}</text>']
    for tick in ticks_y:
        y = y_of(tick)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e7"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{_label(tick)}</text>')
    parts.append(f'<text x="16" y="{TOP + (HEIGHT - TOP - BOTTOM) / 2:.0f}" font-size="12" text-anchor="middle" '
                 f'transform="rotate(-90 16 {TOP + (HEIGHT - TOP - BOTTOM) / 2:.0f})">{_e(y_label)}</text>')
    parts.append(f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2:.0f}" y="{HEIGHT - 10}" font-size="12" '
                 f'text-anchor="middle">{_e(x_label)}</text>')
    return parts


def _legend(names: list[tuple[str, str, bool]]) -> list[str]:
    parts = []
    for index, (name, color, dashed) in enumerate(names):
        y = TOP + 8 + index * 20
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        parts.append(f'<g class="legend" data-series="{_e(name)}" style="cursor:pointer">'
                     f'<title>click to hide or show: {_e(name)}</title>'
                     f'<line x1="{WIDTH - RIGHT + 12}" x2="{WIDTH - RIGHT + 32}" y1="{y}" y2="{y}" stroke="{color}" '
                     f'stroke-width="3"{dash}/><text x="{WIDTH - RIGHT + 38}" y="{y + 4}" font-size="11">'
                     f'{_e(name[:46] + ("…" if len(name) > 46 else ""))}</text></g>')
    return parts


def line_chart(title: str, x_label: str, y_label: str, series: Sequence[Series], log2_x: bool = False) -> str:
    """Lines with point markers; x on a log2 axis when ``log2_x`` (device counts)."""
    xs = [p[0] for s in series for p in s.points]
    ys = [p[1] for s in series for p in s.points]
    fx = (lambda v: math.log2(v)) if log2_x else (lambda v: v)
    x_low, x_high = fx(min(xs)), fx(max(xs))
    x_high = x_high if x_high > x_low else x_low + 1
    ticks_y = _ticks(min(0.0, min(ys)) if not log2_x else 0.0, max(ys) * 1.05)
    y_low, y_high = ticks_y[0], ticks_y[-1]

    def x_of(v: float) -> float:
        return LEFT + (fx(v) - x_low) / (x_high - x_low) * (WIDTH - LEFT - RIGHT)

    def y_of(v: float) -> float:
        return HEIGHT - BOTTOM - (v - y_low) / (y_high - y_low) * (HEIGHT - TOP - BOTTOM)

    parts = _frame(title, x_label, y_label, ticks_y, y_of)
    x_ticks = sorted(set(xs)) if log2_x else _ticks(min(xs), max(xs))
    for tick in x_ticks:
        parts.append(f'<text x="{x_of(tick):.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="11" text-anchor="middle">'
                     f'{_label(tick)}</text>')
    legend = []
    for index, s in enumerate(series):
        color = s.color or COLORS[index % len(COLORS)]
        legend.append((s.name, color, s.dashed))
        path = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y, _ in s.points)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        parts.append(f'<g data-series="{_e(s.name)}"><polyline points="{path}" fill="none" stroke="{color}" '
                     f'stroke-width="2"{dash}/>')
        if s.markers:
            parts += [f'<circle cx="{x_of(x):.1f}" cy="{y_of(y):.1f}" r="4" fill="{color}">'
                      f"<title>{_e(text)}</title></circle>" for x, y, text in s.points]
        parts.append("</g>")
    return "\n".join(parts + _legend(legend) + ["</svg>"])


def bar_chart(title: str, y_label: str, categories: Sequence[str],
              series: Sequence[tuple[str, list, list[str]]]) -> str:
    """Grouped bars: each series is (name, values (None: no bar), hover texts), one value per category."""
    values = [v for _, vs, _ in series for v in vs if v is not None]
    ticks_y = _ticks(0.0, max(values or [1.0]) * 1.08)

    def y_of(v: float) -> float:
        return HEIGHT - BOTTOM - v / ticks_y[-1] * (HEIGHT - TOP - BOTTOM)

    parts = _frame(title, "", y_label, ticks_y, y_of)
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(categories))
    width = slot * 0.8 / max(1, len(series))
    for index, category in enumerate(categories):
        for line, text in enumerate(category.split("\n")[:4]):  # device, layout, count, a mark
            parts.append(f'<text x="{LEFT + slot * (index + 0.5):.1f}" y="{HEIGHT - BOTTOM + 14 + 12 * line}" '
                         f'font-size="10" text-anchor="middle">{_e(text)}</text>')
    legend = []
    for number, (name, bars, texts) in enumerate(series):
        color = COLORS[number % len(COLORS)]
        legend.append((name, color, False))
        parts.append(f'<g data-series="{_e(name)}">')
        for index, (value, text) in enumerate(zip(bars, texts)):
            if value is None:
                continue
            x = LEFT + slot * index + slot * 0.1 + width * number
            parts.append(f'<rect x="{x:.1f}" y="{y_of(value):.1f}" width="{width:.1f}" '
                         f'height="{HEIGHT - BOTTOM - y_of(value):.1f}" fill="{color}">'
                         f'<title>{_e(text)}</title></rect>')
            if width >= 26:  # a value label only where it fits above its bar; the hover title always has it
                parts.append(f'<text x="{x + width / 2:.1f}" y="{y_of(value) - 3:.1f}" font-size="10" '
                             f'text-anchor="middle">{_label(value)}</text>')
        parts.append("</g>")
    return "\n".join(parts + _legend(legend) + ["</svg>"])
