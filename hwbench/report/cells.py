"""Figures as the report's table cells write them: a missing or non-finite figure is "-"."""

from __future__ import annotations

import math
from typing import Any

from hwbench.units import gib


def number(value: Any) -> float | None:
    """A figure as a finite float, or None (missing, a bool, text, NaN or infinite)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        figure = float(value)
    except (TypeError, ValueError):
        return None
    return figure if math.isfinite(figure) else None


def is_number(value: Any) -> bool:
    return number(value) is not None


def fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    figure = number(value)
    if figure is None:
        return "-" if value is None or isinstance(value, float) else str(value)
    if digits == 0:
        return f"{figure:,.0f}{suffix}"
    if abs(figure) >= 1 or figure == 0:
        return f"{figure:,.{digits}f}{suffix}"
    return f"{figure:.{digits + 1}g}{suffix}"


def tokens_text(tokens: float) -> str:
    """300e9 -> "300e9": the way --tokens is usually written."""
    for power in (12, 9, 6):
        if 10 ** power <= tokens < 10 ** (power + 3):
            return f"{tokens / 10 ** power:g}e{power}"
    return f"{tokens:g}"  # beyond 1e15 as Python writes it: 1e+18


def fmt_ratio(value: Any) -> str:
    figure = number(value)
    return "-" if figure is None else f"{figure:.3f}"


def fmt_g(value: Any) -> str:
    """A published figure as the table gave it (no added digits)."""
    figure = number(value)
    return "-" if figure is None else f"{figure:,.10g}" if figure < 1e6 else f"{figure:,.0f}"


def gib_cell(value: Any) -> str:
    """Bytes as "1,234.56 GiB"; "-" when not a figure."""
    return gib(number(value), unit=True, thousands=True)


def device_text(run: Any) -> str:
    charged = run.get("devices_charged", run["world_size"])
    text = f"{run['device_model']} x{charged}"
    if charged != run["world_size"]:  # ranks sharing one device (a CPU socket): the devices are what is charged
        text += f" ({run['world_size']} ranks)"
    if run["simulated"]:
        text += " [simulated]"
    elif run["backend"] == "cpu":
        text += " [CPU]"
    return text
