"""Tables printed for a person to read: no wider than the terminal (else than ``WIDEST``), long
cells wrapped, so that no reason or path of 300 characters draws a separator line of 400."""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

WIDEST = 160  # the width when the output is no terminal (a file, a pipe, a CI log): wide tables stay whole
NARROWEST = 60  # below this a table's columns wrap more than they are read
COLUMN_GAP = 2  # tabulate's space between columns (tablefmt "simple" and "plain")
HEADER_PADDING = 2  # tabulate widens a column with a header by this much
MIN_COLUMN = 10  # a wrapped column keeps at least this many characters a line


def text_table(rows: Sequence[Sequence[Any]], headers: Sequence[str] = (), width: int | None = None,
               **options: Any) -> str:
    """tabulate's table of ``rows`` (tabulate's ``options``: tablefmt, disable_numparse, ...),
    its widest columns wrapped so that it fits ``width`` (default: the terminal's)."""
    width = width or terminal_width()
    widths = fitted_widths(rows, headers, width)
    if any(widths):  # wrapped here: tabulate's own maxcolwidths reads a cell such as "1,024" as an int and fails
        rows = [[_wrapped(cell, most) for cell, most in zip(row, widths)] for row in rows]
        headers = [_wrapped(header, most) for header, most in zip(headers, widths)]
    return tabulate(rows, headers=headers, **options)


def _wrapped(cell: Any, most: int | None) -> Any:
    """The cell's lines of at most ``most`` characters (a cell left whole: as it is)."""
    if most is None or len(_text(cell)) <= most and "\n" not in _text(cell):
        return cell
    return "\n".join(line for part in _text(cell).splitlines()
                     for line in textwrap.wrap(part, most, break_long_words=False, break_on_hyphens=False) or [""])


def terminal_width() -> int:
    """The terminal's columns when the output is one (at least NARROWEST), else WIDEST: the same
    table in a file, a pipe or a test whatever terminal the command was started from."""
    if sys.stdout is None or not sys.stdout.isatty():
        return WIDEST
    return max(shutil.get_terminal_size((WIDEST, 24)).columns, NARROWEST)


def fitted_widths(rows: Sequence[Sequence[Any]], headers: Sequence[str], width: int) -> list[int | None]:
    """Each column's most characters a line (None: as wide as its widest cell) for the columns
    together to fit ``width``: the narrow columns keep their width, the wide ones share the rest,
    each at least as wide as its longest word (a figure, a name or a path is never cut: it is
    copied from the terminal whole)."""
    columns = max((len(row) for row in [headers, *rows]), default=0)
    cells = [[_text(row[index]) for row in [headers, *rows] if index < len(row)] for index in range(columns)]
    natural = [max((len(line) + (HEADER_PADDING if headers and number == 0 else 0)
                    for number, cell in enumerate(column) for line in cell.splitlines()), default=0)
               for column in cells]
    least = [max([MIN_COLUMN, *(len(word) for cell in column for word in cell.split())]) for column in cells]
    room = width - COLUMN_GAP * max(columns - 1, 0)
    if sum(natural) <= room:
        return [None] * columns
    fitted: list[int | None] = [None] * columns
    for done, index in enumerate(sorted(range(columns), key=natural.__getitem__)):
        share = max(room // (columns - done), least[index])
        if natural[index] > share:
            fitted[index] = share
        room -= min(natural[index], share)
    return fitted


def _text(cell: Any) -> str:
    return "" if cell is None else str(cell)
