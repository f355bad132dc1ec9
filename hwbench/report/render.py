"""The report document written out as Markdown, JSON or CSV (HTML: html.py)."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd
from tabulate import tabulate

from hwbench.report.against_published import NORMALISATION
from hwbench.report.cost import SCALING_ASSUMPTION
from hwbench.report.document import Report


def render_markdown(report: Report) -> str:
    lines = [f"# {report.title}", ""]
    for section in report.sections:
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            kind = block[0]
            if kind == "p":
                lines += [block[1], ""]
            elif kind == "h":
                lines += [f"### {block[1]}", ""]
            elif kind == "table":
                cells, notes = block[1].footnoted()
                rows = [[cell.text.replace("|", "\\|") for cell in row] for row in cells]
                lines += [tabulate(rows, headers=block[1].headers, tablefmt="github", disable_numparse=True), ""]
                for number, note in enumerate(notes, start=1):
                    lines += [f"[{number}] {note.rstrip('.')}.", ""]
            elif kind == "list":
                lines += [f"- {item}" for item in block[1]] + [""]
            elif kind == "img":
                lines += [f"_Plot: {block[2]} (in the HTML report: `--format html`)._", ""]
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def _decision(report: Report) -> list[dict[str, Any]]:
    """The decision section as data: its headings, sentences and tables in order (a table's
    cells as numbers with their units: hwbench.report.cells.Cell.data)."""
    section = next((s for s in report.sections if s.title == "Decision"), None)
    blocks = []
    for block in section.blocks if section else []:
        if block[0] == "table":
            blocks.append({"table": [dict(zip(block[1].headers, [cell.data() for cell in row]))
                                     for row in block[1].cells()]})
        elif block[0] in ("p", "h", "list"):
            blocks.append({{"p": "text", "h": "heading", "list": "items"}[block[0]]: block[1]})
    return blocks


def render_json(report: Report) -> str:
    data = {"runs": _records(report.runs), "comparison": _records(report.comparison),
            "skipped": [{"file": p, "reason": r} for p, r in report.skipped], "warnings": report.warnings,
            "notes": report.notes, "assumptions": {"normalisation": NORMALISATION, "scaling": SCALING_ASSUMPTION},
            "decision": _decision(report)}
    return json.dumps(data, indent=2, allow_nan=False, default=str) + "\n"


def render_csv(report: Report) -> str:
    return report.runs.to_csv(index=False)
