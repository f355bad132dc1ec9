"""Every statistic hwbench computes, in one place: step-time summaries, the
repeat statistics of a sweep point (a Student t confidence interval), and the
Mann-Whitney U test `hwbench compare` uses, and the Student t test and E-divisive
statistic of `hwbench history changes`."""

from __future__ import annotations

import functools
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
    half = student_t_quantile(0.05, n - 1) * stdev / math.sqrt(n) if n > 1 else None
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


# --- Student t distribution and the two-sample t test (history's change points) ---


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical
    Recipes, 3rd ed., section 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                          -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 3e-15:
            break
    return h


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return regularized_beta(df / (df + t * t), df / 2.0, 0.5)


@functools.lru_cache(maxsize=512)
def student_t_quantile(two_sided_p: float, df: float) -> float:
    """The t with P(|T| >= t) = ``two_sided_p`` (bisection on student_t_two_sided_p; cached,
    as the change-point search asks for the same few degrees of freedom again and again)."""
    low, high = 0.0, 1.0
    while student_t_two_sided_p(high, df) > two_sided_p:
        high *= 2.0
    for _ in range(60):
        middle = (low + high) / 2.0
        if student_t_two_sided_p(middle, df) > two_sided_p:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


def pooled_t_test(before: Sequence[float], after: Sequence[float]) -> dict[str, float]:
    """Student's two-sample t test with pooled variance (both samples from one noise,
    as nights of one benchmark on one machine are): the difference of the means
    (after - before), its 95% confidence interval, t, degrees of freedom and the
    two-sided p. Needs 2 or more values in all."""
    n1, n2 = len(before), len(after)
    if n1 < 1 or n2 < 1 or n1 + n2 < 3:
        raise ValueError("the t test needs a value on each side and 3 in all")
    mean1, mean2 = statistics.fmean(before), statistics.fmean(after)
    squares = sum((v - mean1) ** 2 for v in before) + sum((v - mean2) ** 2 for v in after)
    df = n1 + n2 - 2
    standard_error = math.sqrt(squares / df * (1.0 / n1 + 1.0 / n2))
    difference = mean2 - mean1
    if standard_error == 0.0:
        t = 0.0 if difference == 0.0 else math.copysign(math.inf, difference)
        half = 0.0
    else:
        t = difference / standard_error
        half = student_t_quantile(0.05, df) * standard_error
    return {"difference": difference, "ci95_low": difference - half, "ci95_high": difference + half, "t": t,
            "df": float(df), "p": student_t_two_sided_p(t, df), "mean_before": mean1, "mean_after": mean2}


def energy_divisive_split(values: Sequence[float], min_size: int) -> tuple[int, int, float] | None:
    """E-divisive's best split of ``values`` (Matteson & James 2014, alpha = 1): the (tau, kappa)
    that maximise the scaled energy divergence between X = values[:tau] (m values) and
    Y = values[tau:kappa] (r values),
        Q = m r / (m + r) x (2/(m r) sum|X - Y| - 1/C(m,2) sum|X - X'| - 1/C(r,2) sum|Y - Y'|),
    over min_size <= m, r; returns (tau, kappa, Q), or None when ``values`` is too short.
    Searching kappa too (not only the end) finds a dip that recovers. All (tau, kappa) at
    once in O(n^2) from a 2-D cumulative sum of the pairwise distances."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2 * min_size:
        return None
    upper = np.triu(np.abs(x[:, None] - x[None, :]), 1)
    cumulative = np.zeros((n + 1, n + 1))
    cumulative[1:, 1:] = upper.cumsum(axis=0).cumsum(axis=1)

    def block(r0, r1, c0, c1):  # sum of upper[r0:r1, c0:c1]
        return cumulative[r1, c1] - cumulative[r0, c1] - cumulative[r1, c0] + cumulative[r0, c0]

    tau, kappa = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    valid = (tau >= min_size) & (kappa - tau >= min_size)
    tau, kappa = tau[valid], kappa[valid]
    m, r = tau.astype(float), (kappa - tau).astype(float)
    zero = np.zeros_like(tau)
    cross = block(zero, tau, tau, kappa)
    within_x = np.divide(block(zero, tau, zero, tau), m * (m - 1) / 2, out=np.zeros_like(m), where=m > 1)
    within_y = np.divide(block(tau, kappa, tau, kappa), r * (r - 1) / 2, out=np.zeros_like(r), where=r > 1)
    divergence = m * r / (m + r) * (2 * cross / (m * r) - within_x - within_y)
    best = int(np.argmax(divergence))
    return int(tau[best]), int(kappa[best]), float(divergence[best])
