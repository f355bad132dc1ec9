"""Summary statistics of step times."""

from __future__ import annotations

import math
import statistics


def finite_or_none(value: float | None) -> float | None:
    """A figure as results hold it: a finite number, or None (JSON has no NaN)."""
    return value if value is not None and math.isfinite(value) else None


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        raise ValueError("no values")
    position = fraction * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def summarize(values: list[float]) -> dict[str, float | int]:
    """n, mean, median, p10, p90, min, max, stdev and CV (stdev / mean)."""
    ordered = sorted(values)
    mean = statistics.fmean(ordered)
    stdev = statistics.stdev(ordered) if len(ordered) > 1 else 0.0
    return {
        "n": len(ordered),
        "mean": mean,
        "median": statistics.median(ordered),
        "p10": percentile(ordered, 0.10),
        "p90": percentile(ordered, 0.90),
        "min": ordered[0],
        "max": ordered[-1],
        "stdev": stdev,
        "cv": stdev / mean if mean > 0 else 0.0,
    }
