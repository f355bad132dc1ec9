"""The HTML layer of `hwbench report --format html` and `hwbench history report`: Jinja2
templates shipped in hwbench/report/templates (autoescaped), one stylesheet (style.css), one
inline script (charts.js: a click on a legend entry hides or shows its series) and the SVG
charts of svg.py. A page is one self-contained file: nothing is fetched (no script, font or
stylesheet from elsewhere)."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hwbench.report.document import Report


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2
    from markupsafe import Markup, escape

    environment = jinja2.Environment(loader=jinja2.PackageLoader("hwbench.report", "templates"), autoescape=True,
                                     trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    # `text` in backticks as <code>, the rest escaped
    environment.filters["code"] = lambda text: Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))
    environment.filters["anchor"] = lambda title: re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return environment


def render_template(name: str, **context: Any) -> str:
    return _environment().get_template(name).render(**context)


def render_html(report: Report) -> str:
    return render_template("report.html.j2", report=report)
