"""The report's table cells, typed: a cell holds its value (a number, text or None) and how to
write it (format, unit, a range beside it, the text of a null). Markdown and HTML write
`Cell.text` (HTML right-aligns number cells), JSON carries `Cell.data()`: the number and its
unit, never the formatted string. A missing or non-finite figure is written "-"."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from hwbench.units import gib


def number(value: Any) -> float | None:
    """A figure as a finite float, or None (missing, a bool, text, NaN or infinite)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        parsed = float(value)
    except (TypeError, ValueError):
        return None
    return parsed if math.isfinite(parsed) else None


def is_number(value: Any) -> bool:
    return number(value) is not None


def tokens_text(tokens: float) -> str:
    """300e9 -> "300e9": the way --tokens is usually written."""
    for power in (12, 9, 6):
        if 10 ** power <= tokens < 10 ** (power + 3):
            return f"{tokens / 10 ** power:g}e{power}"
    return f"{tokens:g}"  # beyond 1e15 as Python writes it: 1e+18


# How a number of a unit is written; any other unit follows the number after a space ("12 W").
_WRITERS = {"USD": lambda value, spec: "$" + format(value, spec),
            "bytes": lambda value, spec: gib(value, unit=True, thousands=True),
            "fraction": format,  # with a "%" spec: 0.412 -> 41.2%
            "tokens": lambda value, spec: tokens_text(value)}


@dataclasses.dataclass(frozen=True)
class Cell:
    value: float | int | str | None  # a number is a finite int or float (the constructors see to it)
    spec: str = ""  # format() spec of a number: ",.2f", ",.4g", ".1%"
    unit: str = ""  # what the number counts: "USD", "bytes", "fraction", "tokens", "J", "W" or none
    low: float | None = None  # a range written beside the value: "1,000.0 (990.0-1,010.0)"
    high: float | None = None
    missing: str | None = None  # the text of a null, saying why ("no price"); else "-"
    note: str | None = None  # a longer explanation, written as a numbered footnote under the table
    marker: int | None = None  # that footnote's number (Table.footnoted sets it)

    @property
    def is_number(self) -> bool:
        return isinstance(self.value, (int, float))

    @property
    def text(self) -> str:
        if self.marker is None:
            return self._text()
        return " ".join(filter(None, [self._text(), f"[{self.marker}]"]))

    def _text(self) -> str:
        if not isinstance(self.value, (int, float)):
            return (self.missing if self.missing is not None else "-") if self.value is None else self.value
        ranged = f" ({self._write(self.low)}-{self._write(self.high)})" if self.low is not None else ""
        return self._write(self.value) + ranged

    def _write(self, value: float | None) -> str:
        if self.unit in _WRITERS:
            return _WRITERS[self.unit](value, self.spec)
        return f"{format(value, self.spec)} {self.unit}".rstrip()

    def data(self) -> Any:
        """The cell as JSON holds it: text as text, a number bare or, with a unit or range, as
        {"value", "unit", "min", "max"}; a null with its reason as {"value": null, "reason"}."""
        if self.value is None:
            reason = self.note or self.missing  # the note says it in full
            return {"value": None, "reason": reason} if reason else None
        if not self.is_number or not (self.unit or self.low is not None or self.note):
            return self.value if not self.note else {"value": self.value, "note": self.note}
        return {"value": self.value, **({"unit": self.unit} if self.unit else {}),
                **({"min": self.low, "max": self.high} if self.low is not None else {}),
                **({"note": self.note} if self.note else {})}

    def __str__(self) -> str:
        return self.text

    def __add__(self, other: str) -> str:  # joined with text, a cell becomes text
        return self.text + other

    def __radd__(self, other: str) -> str:
        return other + self.text


def as_cell(value: Any) -> Cell:
    """Whatever a table row holds, as a cell: a Cell as it is, a whole number as written
    ("1024"), another number as fmt writes it, None as "-", anything else as text."""
    if isinstance(value, Cell):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return Cell(int(value), "d")
    return fmt(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else Cell(
        None if value is None else str(value))


def figure(value: Any, spec: str, unit: str = "", missing: str | None = None, low: Any = None,
           high: Any = None, note: str | None = None) -> Cell:
    """A number cell written with the format() ``spec`` and its ``unit``, and a range ``low``-``high``
    beside it; a value that is not a finite figure gives a null cell, written ``missing`` or "-"
    (text stays text). ``note``: an explanation written as a footnote under the table."""
    parsed = number(value)
    if parsed is None:
        return Cell(value if isinstance(value, str) else None, missing=missing, note=note)
    low, high = number(low), number(high)
    if low is None or high is None:
        low = high = None
    whole = isinstance(value, numbers.Integral)  # a count stays a whole number in JSON
    return Cell(int(value) if whole else parsed, spec, unit, low, high, missing, note)


def noted(text: str | None, note: str | None) -> Cell:
    """Short text (or none) with its explanation as a footnote: "not measured [1]"."""
    return Cell(None, missing=text or "", note=note)


def fmt(value: Any, digits: int = 2, suffix: str = "", *, low: Any = None, high: Any = None,
        missing: str | None = None, note: str | None = None) -> Cell:
    """A figure with ``digits`` decimals and thousands (digits + 1 significant ones below 1),
    its unit ``suffix`` (" W")."""
    parsed = number(value)
    small = parsed is not None and 0 < abs(parsed) < 1 and digits
    return figure(value, f".{digits + 1}g" if small else f",.{digits}f", suffix.strip(), missing, low, high, note)


def fmt_ratio(value: Any) -> Cell:
    return figure(value, ".3f")


def fmt_g(value: Any) -> Cell:
    """A published figure as the table gave it (no added digits)."""
    return figure(value, ",.10g" if (number(value) or 0) < 1e6 else ",.0f")


def gib_cell(value: Any, missing: str | None = None, note: str | None = None) -> Cell:
    """Bytes, written "1,234.56 GiB"."""
    return figure(value, "", "bytes", missing, note=note)


def percent(value: Any, digits: int = 1, missing: str | None = None, note: str | None = None) -> Cell:
    """A fraction written as a percentage: 0.412 -> "41.2%"."""
    return figure(value, f".{digits}%", "fraction", missing, note=note)


def usd(value: Any, spec: str = ",.2f", missing: str | None = None, note: str | None = None) -> Cell:
    """US dollars: "$1,234.50" (``spec``: ",.4g" for a price, ",.0f" for a projected cost)."""
    return figure(value, spec, "USD", missing, note=note)


def tokens_cell(value: Any) -> Cell:
    """A token count as --tokens is written: "300e9"."""
    return figure(value, "", "tokens")


def device_text(run: Any) -> str:
    charged = run.get("devices_charged", run["world_size"])
    text = f"{run['device_model']} x{charged}"
    if charged != run["world_size"]:  # ranks sharing one device (a CPU socket): the devices are what is charged
        text += f" ({run['world_size']} ranks)"
    if run["stand_in"]:
        text += f" [{run['stand_in']}]"
    elif run["backend"] == "cpu":
        text += " [CPU]"
    return text
