"""Scaling measured, not assumed: for one workload on one device model, the best tokens/s
measured at each device count, a least-squares fit of log2(tokens/s) against log2(devices),
and the projection of throughput to another device count with it (docs/reports.md, "Scaling").

Efficiency per doubling = 2^(slope - 1): 1.0 is linear scaling (twice the devices, twice the
tokens/s), 0.9 means each doubling of devices gives 1.8x. A fit is made only from two or more
device counts; with one count the projection is linear, and says so. Runs marked
oversubscribed are left out by the caller."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class ScalingPoint:
    devices: int
    tokens_per_s: float  # the median over repeats of the best point at this device count
    runs: int
    layout: str


@dataclasses.dataclass(frozen=True)
class ScalingFit:
    points: tuple[ScalingPoint, ...]
    slope: float | None  # d log2(tokens/s) / d log2(devices); None with one device count
    intercept: float | None

    @property
    def fitted(self) -> bool:
        return self.slope is not None

    @property
    def efficiency_per_doubling(self) -> float | None:
        return None if self.slope is None else 2 ** (self.slope - 1)

    def fitted_tokens_per_s(self, devices: int) -> float | None:
        if self.slope is None or self.intercept is None:
            return None
        return 2 ** (self.intercept + self.slope * math.log2(devices))

    def ideal_tokens_per_s(self, devices: int) -> float:
        """Linear scaling from the smallest device count measured."""
        first = self.points[0]
        return first.tokens_per_s * devices / first.devices

    def projection_exponent(self) -> float:
        """The exponent projections use: the fitted slope, never above 1 (a superlinear fit from
        a few noisy points is not a promise), or 1 (linear) without a fit."""
        return 1.0 if self.slope is None else min(self.slope, 1.0)

    def project(self, tokens_per_s: float, from_devices: int, to_devices: int) -> float:
        """tokens/s at ``to_devices`` from a run of ``tokens_per_s`` on ``from_devices``."""
        return tokens_per_s * (to_devices / from_devices) ** self.projection_exponent()

    def assumption(self, to_devices: int) -> str:
        """The scaling assumption of a projection to ``to_devices``, as a clause of a sentence."""
        counts = ", ".join(str(p.devices) for p in self.points)
        if self.slope is None:
            return (f"projected linearly from {counts} device(s): measured at one device count only, so linear "
                    "scaling is assumed (no loss to communication or stragglers)")
        text = (f"projected to {to_devices} devices with the scaling fitted to {counts} devices "
                f"({self.efficiency_per_doubling:.0%} efficiency per doubling)")
        if self.slope > 1:
            text += ", capped at linear (the fit is superlinear)"
        return text


def best_per_count(samples: Sequence[tuple[int, str, float]]) -> list[ScalingPoint]:
    """(devices, point label, tokens/s) of each run -> at each device count, the point with the
    highest median tokens/s (its repeats' median)."""
    by_point: dict[tuple[int, str], list[float]] = {}
    for devices, label, tokens_per_s in samples:
        by_point.setdefault((devices, label), []).append(tokens_per_s)
    best: dict[int, ScalingPoint] = {}
    for (devices, label), values in by_point.items():
        point = ScalingPoint(devices, statistics.median(values), len(values), label)
        if devices not in best or point.tokens_per_s > best[devices].tokens_per_s:
            best[devices] = point
    return [best[d] for d in sorted(best)]


def fit_scaling(points: Sequence[ScalingPoint]) -> ScalingFit:
    """Least squares of log2(tokens/s) on log2(devices) over the points (one per device count)."""
    points = tuple(sorted(points, key=lambda p: p.devices))
    if len({p.devices for p in points}) < 2:
        return ScalingFit(points, None, None)
    xs = [math.log2(p.devices) for p in points]
    ys = [math.log2(p.tokens_per_s) for p in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return ScalingFit(points, slope, mean_y - slope * mean_x)
