"""Every statistic hwbench computes, in one place: step-time summaries, the
repeat statistics of a sweep point (a Student t confidence interval), and the
Mann-Whitney U test `hwbench compare` uses, and the Student t test and E-divisive
statistic of `hwbench history changes`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from hwbench.result.model import SteadyState


def finite_or_none(value: float | None) -> float | None:
    """A figure as results hold it: a finite number, or None (JSON has no NaN)."""
    return value if value is not None and math.isfinite(value) else None


def summarize(values: list[float]) -> dict[str, float | int]:
    """n, mean, median, p10, p90 (numpy's linear interpolation), min, max, stdev and CV (stdev / mean)."""
    import numpy as np

    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if len(values) > 1 else 0.0
    p10, p90 = np.percentile(values, [10, 90])
    return {"n": len(values), "mean": mean, "median": statistics.median(values), "p10": float(p10), "p90": float(p90),
            "min": min(values), "max": max(values), "stdev": stdev, "cv": stdev / mean if mean > 0 else 0.0}


NOISY_CV = 0.05  # repeats whose throughput CV exceeds this are flagged noisy
EXACT_LIMIT = 20000  # the exact U distribution when C(n1 + n2, n1) is at most this; else the normal approximation


def throughput_statistics(values: list[float]) -> dict[str, Any]:
    """Median, olympic mean (fastest and slowest dropped, from 3 values), CV and
    a 95% confidence interval of the mean (Student t)."""
    n = len(values)
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if n > 1 else 0.0
    olympic = olympic_score(values)["score"]  # None below OLYMPIC_MIN_RUNS values
    half = student_t_quantile(0.05, n - 1) * stdev / math.sqrt(n) if n > 1 else None
    cv = stdev / mean if mean > 0 else 0.0
    return {"n": n, "median": statistics.median(values), "mean": mean, "olympic_mean": olympic, "stdev": stdev,
            "cv": cv, "ci95_low": mean - half if half is not None else None,
            "ci95_high": mean + half if half is not None else None, "noisy": cv > NOISY_CV}


OLYMPIC_MIN_RUNS = 3  # one run left once the fastest and the slowest are dropped


def olympic_score(times: Sequence[float], not_converged: int = 0) -> dict[str, Any]:
    """MLPerf Training's benchmark result from the times of a point's runs ("Benchmark Results"):
    the fastest and the slowest dropped, the mean of the rest. A single run that did not converge
    counts as the slowest and is dropped; with more than one the result is invalid. ``score`` is
    None, with ``why``, when it cannot be given (fewer than OLYMPIC_MIN_RUNS runs, or invalid)."""
    runs = len(times) + not_converged
    figures: dict[str, Any] = {"runs": runs, "converged": len(times), "not_converged": not_converged,
                               "score": None, "kept": [], "dropped": [], "why": None}
    if not_converged > 1:
        figures["why"] = f"{not_converged} of {runs} runs did not converge: more than one makes the result invalid"
        return figures
    if runs < OLYMPIC_MIN_RUNS:
        figures["why"] = f"{runs} run(s): the olympic score drops the fastest and the slowest, so it needs 3 or more"
        return figures
    ordered = sorted(times)
    kept = ordered[1:] if not_converged else ordered[1:-1]  # a non-converging run is the slowest dropped
    figures.update(score=statistics.fmean(kept), kept=kept,
                   dropped=[ordered[0]] + ([] if not_converged else [ordered[-1]]))
    return figures


# Steady state (docs/methodology.md, "Steady state"): hwbench's own thresholds, stated with the figures.
SETTLE_TOLERANCE = 0.05  # a rolling median within 5% of the last half's median is settled
DRIFT_THRESHOLD = 0.05  # the last quarter's median step time more than 5% off the first quarter's
MIN_STEADY_STEPS = 8  # two quarters of two steps each


def steady_state(times: Sequence[float]) -> SteadyState:
    """How the step time of a timed window settled and whether it drifted.

    ``settled_after_steps``: the leading steps up to the middle of the last rolling window (of
    ``settle_window`` steps: a tenth of them, at least 3) whose median is more than SETTLE_TOLERANCE
    off the median of the timed window's last half; None when the last rolling window is off.
    ``drift``: the last quarter's median step time over the first quarter's, minus 1 (positive:
    slower at the end, as a throttled or down-clocked device is); ``drifting`` when its size is
    above DRIFT_THRESHOLD. Fewer than MIN_STEADY_STEPS steps: every figure None. A None
    figure has its reason in ``unmeasured``."""
    n = len(times)
    thresholds = {"settle_tolerance": SETTLE_TOLERANCE, "drift_threshold": DRIFT_THRESHOLD}
    if n < MIN_STEADY_STEPS:
        names = ("settled_after_steps", "settle_window", "drift", "drifting", "first_quarter_median_s",
                 "last_quarter_median_s")
        why = f"{n} timed steps: steady state needs {MIN_STEADY_STEPS} or more"
        return SteadyState(**dict.fromkeys(names), **thresholds, unmeasured=dict.fromkeys(names, why))
    window = max(3, n // 10)
    reference = statistics.median(times[n // 2:])
    rolling = [statistics.median(times[i:i + window]) for i in range(n - window + 1)]
    off = [i for i, median in enumerate(rolling) if abs(median / reference - 1) > SETTLE_TOLERANCE]
    quarter = n // 4
    # step times a device timer gave as inf or NaN are null here, as everywhere in a result (JSON has no NaN)
    first, last = (finite_or_none(statistics.median(part)) for part in (times[:quarter], times[-quarter:]))
    drift = finite_or_none(last / first - 1) if first and last is not None else None
    settled = not off or off[-1] < len(rolling) - 1  # the last rolling median off: it never settled
    unsettled = f"the step time never stayed within {SETTLE_TOLERANCE:.0%} of its last half's median"
    return SteadyState(
        # a window whose median is off has its middle step off: the settled part starts after it
        settled_after_steps=(off[-1] + window // 2 + 1 if off else 0) if settled else None,
        settle_window=window, drift=drift, drifting=drift is not None and abs(drift) > DRIFT_THRESHOLD,
        first_quarter_median_s=first, last_quarter_median_s=last, **thresholds,
        unmeasured={} if settled else {"settled_after_steps": unsettled})


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, str]:
    """(U of x, two-sided p, method) for two samples of 2 or more values each. U counts the pairs
    where x beats y (a tie counts 1/2): 0 when every x is below every y, n1 x n2 when every x is
    above. p = P(|U - n1 n2 / 2| >= the observed distance) under the null, "exact" when
    C(n1 + n2, n1) is at most EXACT_LIMIT (without ties scipy's exact distribution; with ties every
    assignment of the pooled midranks, a permutation test: scipy's method="exact" assumes no ties),
    else the normal approximation with tie and continuity correction."""
    import numpy as np
    from scipy import stats

    n1, n2 = len(x), len(y)
    if n1 < 2 or n2 < 2:
        raise ValueError("both samples need at least two values")
    pooled = np.asarray([*x, *y], dtype=float)
    if math.comb(n1 + n2, n1) > EXACT_LIMIT:
        if np.all(pooled == pooled[0]):  # no variance: scipy would divide by zero
            return n1 * n2 / 2, 1.0, "normal"
        test = stats.mannwhitneyu(x, y, method="asymptotic", use_continuity=True)
        return float(test.statistic), float(test.pvalue), "normal"
    if len(np.unique(pooled)) == len(pooled):
        test = stats.mannwhitneyu(x, y, method="exact")
        return float(test.statistic), float(test.pvalue), "exact"
    ranks = stats.rankdata(pooled)
    offset, centre = n1 * (n1 + 1) / 2, n1 * n2 / 2

    def distance(ranks_x, _ranks_y, axis):  # |U - n1 n2 / 2| of each assignment
        return np.abs(np.sum(ranks_x, axis=axis) - offset - centre)

    test = stats.permutation_test((ranks[:n1], ranks[n1:]), distance, permutation_type="independent",
                                  n_resamples=np.inf, alternative="greater", vectorized=True)
    return float(ranks[:n1].sum() - offset), float(test.pvalue), "exact"


# --- Student t distribution and the two-sample t test (history's change points) ---


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom: scipy.special's t distribution,
    which scipy.stats.t calls, without scipy.stats' overhead per call (the change-point search
    tests many splits)."""
    from scipy.special import stdtr

    return float(2.0 * stdtr(df, -abs(t)))


def student_t_quantile(two_sided_p: float, df: float) -> float:
    """The t with P(|T| >= t) = ``two_sided_p``."""
    from scipy.special import stdtrit

    return float(stdtrit(df, 1.0 - two_sided_p / 2.0))


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
