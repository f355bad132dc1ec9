"""One self-contained HTML file: inline CSS, the plots as inline SVG (hover a mark for its
figures) and one small inline script that hides or shows a series when its legend entry is
clicked; no external resources (no scripts, fonts or stylesheets fetched)."""

from __future__ import annotations

import html
import re

from hwbench.report.document import Report

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1.5em; color: #1d1d1f; line-height: 1.45; }
h1 { border-bottom: 2px solid #3b75af; padding-bottom: .2em; }
h2 { margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: .15em; }
h3 { margin-top: 1.4em; }
nav ul { columns: 2; list-style: none; padding-left: 0; }
.scroll { overflow-x: auto; margin: .6em 0 1em; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d4d4d8; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eef2f7; position: sticky; top: 0; }
tr:nth-child(even) td { background: #fafafa; }
tr.measured td { background: #f2f8ef; }
td:first-child { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; border: 1px solid #eee; background: #fff; }
svg .hidden { display: none; }
svg g.legend.off { opacity: .35; }
figcaption { font-size: 13px; color: #555; }
ul.warn li { color: #8a4b00; }
code { background: #f4f4f5; padding: 0 3px; }
"""

# Clicking a legend entry hides or shows the marks of its series in the same chart.
TOGGLE_SCRIPT = """
document.querySelectorAll("svg.chart g.legend").forEach(function (entry) {
  entry.addEventListener("click", function () {
    var name = entry.getAttribute("data-series");
    entry.classList.toggle("off");
    entry.ownerSVGElement.querySelectorAll("g[data-series]:not(.legend)").forEach(function (group) {
      if (group.getAttribute("data-series") === name) { group.classList.toggle("hidden"); }
    });
  });
});
"""

_NUMBER = re.compile(r"^[-+$]?[\d,]*\.?\d+(e[-+]?\d+)?( \w+| J| W| GiB)?$")


def _code(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _cell(value: object, header: bool = False) -> str:
    text = html.escape(str(value))
    text = _code(text)
    if header:
        return f"<th>{text}</th>"
    css = ' class="num"' if _NUMBER.match(str(value).strip()) else ""
    return f"<td{css}>{text}</td>"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    out = ['<div class="scroll"><table>', "<thead><tr>" + "".join(_cell(h, True) for h in headers) + "</tr></thead>",
           "<tbody>"]
    for row in rows:
        css = ' class="measured"' if str(row[0]).startswith("↳") else ""
        out.append(f"<tr{css}>" + "".join(_cell(c) for c in row) + "</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def render_html(report: Report) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{html.escape(report.title)}</title>", f"<style>{CSS}</style></head><body>",
             f"<h1>{html.escape(report.title)}</h1>", "<nav><ul>"]
    parts += [f'<li><a href="#{_anchor(s.title)}">{html.escape(s.title)}</a></li>' for s in report.sections]
    parts.append("</ul></nav>")
    for section in report.sections:
        parts.append(f'<section id="{_anchor(section.title)}"><h2>{html.escape(section.title)}</h2>')
        for block in section.blocks:
            kind = block[0]
            if kind == "p":
                parts.append("<p>" + _code(html.escape(block[1])) + "</p>")
            elif kind == "h":
                parts.append(f"<h3>{html.escape(block[1])}</h3>")
            elif kind == "table":
                parts.append(_table(block[1].headers, block[1].rows))
            elif kind == "list":
                css = ' class="warn"' if section.title == "Environment" else ""  # noqa: E501
                parts.append(f"<ul{css}>" + "".join(f"<li>{html.escape(i)}</li>" for i in block[1]) + "</ul>")
            elif kind == "img":
                parts.append(f"<figure>{report.images[block[1]]}"
                             f"<figcaption>{html.escape(block[2])}</figcaption></figure>")
        parts.append("</section>")
    parts.append(f"<script>{TOGGLE_SCRIPT}</script></body></html>")
    return "\n".join(parts) + "\n"
