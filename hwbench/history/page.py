"""The trend page: one offline HTML file with an inline SVG chart per series.

Nothing is fetched (no script, font or stylesheet): each night is a dot whose tooltip
(an SVG <title>) gives the night, commit, figure and runs; each change point is a
dashed line, red for a regression and green for an improvement, its tooltip the
sentence `hwbench history changes` prints; a grey band starts each new environment
segment; a level line shows the mean between change points.
"""

from __future__ import annotations

import datetime
import html

from hwbench.history.changes import ALPHA, SeriesChanges, describe_change
from hwbench.history.series import format_value, short_commit

WIDTH, HEIGHT = 1100, 240
LEFT, RIGHT, TOP, BOTTOM = 90, 20, 24, 36
REGRESSION, IMPROVEMENT, DOT, LEVEL = "#c62828", "#2e7d32", "#3b75af", "#f2a33a"

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Arial, sans-serif; margin: 2em auto; max-width: 1160px;
       padding: 0 1.5em; color: #1d1d1f; }
h1 { border-bottom: 2px solid #3b75af; padding-bottom: .2em; }
section { margin: 1.6em 0; }
h2 { font-size: 17px; margin: 0 0 .3em; }
.badge { font-size: 12px; padding: 2px 7px; border-radius: 9px; color: white; margin-left: .5em; }
.open { background: #c62828; } .quiet { background: #8a8a8e; } .moved { background: #f2a33a; }
ul { margin: .3em 0; font-size: 13px; } li.regression { color: #c62828; } li.improvement { color: #2e7d32; }
li.environment { color: #555; }
svg { border: 1px solid #e4e4e7; background: #fff; }
svg text { font-size: 11px; fill: #555; }
p.note { color: #555; font-size: 13px; }
"""


def trend_page(analyses: list[SeriesChanges], threshold: float) -> str:
    """The whole page: series with an open regression first, then those with change points."""
    ordered = sorted(analyses, key=lambda a: (a.open_regression is None, not a.changes, a.series.label))
    opened = sum(a.open_regression is not None for a in analyses)
    moments = sum(len(a.changes) for a in analyses)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>hwbench trends</title>"
             f"<style>{CSS}</style></head><body><h1>hwbench trends</h1>",
             f"<p>{len(analyses)} series, {moments} change point(s), {opened} open regression(s) beyond "
             f"{threshold * 100:g}%. Written {now}.</p>",
             "<p class=note>Each dot is one night (the median of its runs); hover for night, commit and figure. "
             f"Dashed lines: change points (E-divisive means, Student t p &lt; {ALPHA:g}; docs/history.md), red a "
             "regression, green an improvement. Grey bands: a new environment (driver, torch, ...), where a series "
             "starts a new segment. Orange: the level between change points.</p>"]
    parts += [_section(analysis) for analysis in ordered]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _section(analysis: SeriesChanges) -> str:
    series = analysis.series
    if analysis.open_regression:
        badge = f"<span class='badge open'>open regression {analysis.open_change * 100:+.1f}%</span>"
    elif analysis.changes:
        badge = f"<span class='badge moved'>{len(analysis.changes)} change point(s)</span>"
    else:
        badge = "<span class='badge quiet'>no change point</span>"
    items = [f"<li class=environment>new environment from {html.escape(segment.nights[0].night)}: "
             + html.escape("; ".join(f"{field} {', '.join(map(str, old))} -> {', '.join(map(str, new))}"
                                     for field, old, new in segment.environment_change)) + "</li>"
             for segment in series.segments[1:]]
    items += [f"<li class={change.kind}>{html.escape(describe_change(change))}</li>" for change in analysis.changes]
    listing = f"<ul>{''.join(items)}</ul>" if items else ""
    return (f"<section><h2>{html.escape(series.label)}{badge}</h2>{listing}{_chart(analysis)}</section>")


def _chart(analysis: SeriesChanges) -> str:
    series = analysis.series
    nights = series.nights
    values = [value for night in nights for value in night.values]
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
    low, high = low - pad, high + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: float) -> float:
        return LEFT + (plot_w * (i + 0.5) / len(nights))

    def y(v: float) -> float:
        return TOP + plot_h * (high - v) / (high - low)

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
           f"viewBox='0 0 {WIDTH} {HEIGHT}' role='img'>"]
    out += _segment_bands(analysis, x, plot_h)
    out += _axes(series.metric, low, high, y, nights, x)
    out += _levels(analysis, x, y)
    for i, night in enumerate(nights):
        for value in night.values if len(night.values) > 1 else ():
            out.append(f"<circle cx='{x(i):.1f}' cy='{y(value):.1f}' r='1.6' fill='#9bb7d4'/>")
        tip = (f"{night.night}, commit {short_commit(night.commit)}: {format_value(series.metric, night.value)} "
               f"(median of {len(night.values)} run(s): "
               f"{', '.join(format_value(series.metric, v) for v in night.values)})")
        out.append(f"<circle cx='{x(i):.1f}' cy='{y(night.value):.1f}' r='3.6' fill='{DOT}'>"
                   f"<title>{html.escape(tip)}</title></circle>")
    for change in analysis.changes:
        colour = REGRESSION if change.worse else IMPROVEMENT
        at = x(change.index - 0.5)
        out.append(f"<g><line x1='{at:.1f}' x2='{at:.1f}' y1='{TOP}' y2='{TOP + plot_h}' stroke='{colour}' "
                   f"stroke-width='2' stroke-dasharray='6 4'/><text x='{at + 4:.1f}' y='{TOP + 12}' "
                   f"style='fill:{colour};font-weight:bold'>{change.change * 100:+.1f}%</text>"
                   f"<title>{html.escape(describe_change(change))}</title></g>")
    out.append("</svg>")
    return "".join(out)


def _segment_bands(analysis: SeriesChanges, x, plot_h: float) -> list[str]:
    out, start = [], 0
    for number, segment in enumerate(analysis.series.segments):
        end = start + len(segment.nights)
        if number:
            fields = ", ".join(field for field, _, _ in segment.environment_change)
            out.append(f"<g><rect x='{x(start - 0.5):.1f}' y='{TOP}' width='{x(end - 0.5) - x(start - 0.5):.1f}' "
                       f"height='{plot_h}' fill='#f0f0f3'/><text x='{x(start - 0.5) + 4:.1f}' y='{TOP + plot_h - 6}'>"
                       f"new {html.escape(fields)}</text><title>new environment from "
                       f"{html.escape(segment.nights[0].night)}: {html.escape(fields)}</title></g>")
        start = end
    return out


def _levels(analysis: SeriesChanges, x, y) -> list[str]:
    """The mean of each stretch between change points and environment changes."""
    bounds, start = set(), 0
    for segment in analysis.series.segments:
        bounds.add(start)
        start += len(segment.nights)
    bounds |= {change.index for change in analysis.changes}
    edges = sorted(bounds) + [start]
    nights = analysis.series.nights
    out = []
    for begin, end in zip(edges, edges[1:]):
        level = sum(night.value for night in nights[begin:end]) / (end - begin)
        out.append(f"<line x1='{x(begin - 0.4):.1f}' x2='{x(end - 0.6):.1f}' y1='{y(level):.1f}' y2='{y(level):.1f}' "
                   f"stroke='{LEVEL}' stroke-width='2'/>")
    return out


def _axes(metric: str, low: float, high: float, y, nights, x) -> list[str]:
    out = [f"<line x1='{LEFT}' x2='{LEFT}' y1='{TOP}' y2='{HEIGHT - BOTTOM}' stroke='#bbb'/>"]
    for step in range(5):
        value = low + (high - low) * step / 4
        out.append(f"<line x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{y(value):.1f}' y2='{y(value):.1f}' stroke='#f0f0f0'/>"
                   f"<text x='{LEFT - 6}' y='{y(value) + 4:.1f}' text-anchor='end'>"
                   f"{html.escape(format_value(metric, value))}</text>")
    every = max(1, len(nights) // 8)
    for i in range(0, len(nights), every):
        out.append(f"<text x='{x(i):.1f}' y='{HEIGHT - BOTTOM + 16}' text-anchor='middle'>"
                   f"{html.escape(nights[i].night)}</text>")
    return out
