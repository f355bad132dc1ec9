"""The report as a document: titled sections of blocks (paragraphs, headings, tables,
lists, plots) and the data behind them. Built by build.py, written out by render.py
(Markdown, CSV, JSON) and html.py; it knows nothing of either side."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pandas as pd

from hwbench.report.cells import Cell, as_cell


@dataclasses.dataclass
class Table:
    headers: list[str]
    rows: list[list[Any]]  # Cells (hwbench.report.cells); text, a number or None are made cells

    @classmethod
    def of(cls, columns: Sequence[tuple[str, Callable[[Any], Any]]], items: Iterable[Any]) -> Table:
        """A row per item; ``columns``: each column's header and its cell of an item, side by side."""
        return cls([header for header, _ in columns], [[cell(item) for _, cell in columns] for item in items])

    def cells(self) -> list[list[Cell]]:
        return [[as_cell(value) for value in row] for row in self.rows]

    def footnoted(self) -> tuple[list[list[Cell]], list[str]]:
        """The cells as written, each cell with a note marked with its number ("not measured [1]"),
        and the notes in that order (each said once), so that a long reason never widens a column."""
        notes: list[str] = []
        rows = []
        for row in self.cells():
            for index, cell in enumerate(row):
                if cell.note:
                    if cell.note not in notes:
                        notes.append(cell.note)
                    row[index] = dataclasses.replace(cell, marker=notes.index(cell.note) + 1)
            rows.append(row)
        return rows, notes


@dataclasses.dataclass
class Section:
    title: str
    # ("p", text), ("h", text), ("table", Table), ("img", key, alt) or ("list", [text])
    blocks: list[tuple] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Report:
    title: str
    sections: list[Section]
    runs: pd.DataFrame
    comparison: pd.DataFrame
    skipped: list[tuple[str, str]]
    warnings: list[str]
    notes: list[str]
    images: dict[str, str]  # inline SVG (markupsafe.Markup) by "kind:model"
