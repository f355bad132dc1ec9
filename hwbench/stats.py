"""Every statistic hwbench computes, in one place: step-time summaries, the
repeat statistics of a sweep point (a Student t confidence interval), and the
Mann-Whitney U test `hwbench compare` uses."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from typing import Any, Sequence


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


# Two-sided 95% Student t quantiles by degrees of freedom (1-30); 1.96 beyond.
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
       2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
       2.045, 2.042]
NOISY_CV = 0.05  # repeats whose throughput CV exceeds this are flagged noisy
EXACT_LIMIT = 20000  # enumerate the exact U distribution when C(n1 + n2, n1) is at most this


def throughput_statistics(values: list[float]) -> dict[str, Any]:
    """Median, olympic mean (fastest and slowest dropped, from 3 values), CV and
    a 95% confidence interval of the mean (Student t)."""
    n = len(values)
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if n > 1 else 0.0
    ordered = sorted(values)
    olympic = statistics.fmean(ordered[1:-1]) if n >= 3 else None
    half = (T95[n - 2] if n - 2 < len(T95) else 1.96) * stdev / math.sqrt(n) if n > 1 else None
    cv = stdev / mean if mean > 0 else 0.0
    return {"n": n, "median": statistics.median(values), "mean": mean, "olympic_mean": olympic, "stdev": stdev,
            "cv": cv, "ci95_low": mean - half if half is not None else None,
            "ci95_high": mean + half if half is not None else None, "noisy": cv > NOISY_CV}


def _midranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, str]:
    """(U of x, two-sided p, method). U counts the pairs where x beats y (a tie counts
    1/2): 0 when every x is below every y, n1 x n2 when every x is above. Exact (all
    C(n1 + n2, n1) assignments of the pooled midranks, so ties are handled) when that
    number is at most EXACT_LIMIT; else the normal approximation with tie and
    continuity correction."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples need at least one value")
    pooled = list(x) + list(y)
    ranks = _midranks(pooled)
    offset = n1 * (n1 + 1) / 2
    u = sum(ranks[:n1]) - offset
    mean = n1 * n2 / 2
    distance = abs(u - mean)
    if math.comb(n1 + n2, n1) <= EXACT_LIMIT:
        total = extreme = 0
        for chosen in itertools.combinations(ranks, n1):
            total += 1
            if abs(sum(chosen) - offset - mean) >= distance - 1e-9:
                extreme += 1
        return u, min(1.0, extreme / total), "exact"
    n = n1 + n2
    ties = defaultdict(int)
    for value in pooled:
        ties[value] += 1
    tie_term = sum(t ** 3 - t for t in ties.values()) / (n * (n - 1))
    variance = n1 * n2 / 12 * ((n + 1) - tie_term)
    if variance <= 0:
        return u, 1.0, "normal"
    z = max(0.0, distance - 0.5) / math.sqrt(variance)
    return u, min(1.0, math.erfc(z / math.sqrt(2))), "normal"
