"""How well the change-point method does on simulated nights (docs/history.md; the figures
come from benchmarks/history_simulation.py, a smaller seeded run is tests/test_history.py).

A simulated night is what the nightly workflow measures: REPEATS runs of a point, each
the level times (1 + noise), and their median. The noise is drawn either from a normal
distribution with the coefficient of variation of real repeated runs, or by resampling
their relative deviations from their median (the empirical distribution, with its
outliers). Every night, the nightly job runs the method on all nights so far; so does
the simulation, on every prefix of the series.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Sequence

from hwbench.history.changes import ALPHA, MIN_NIGHTS, change_points, level_changes, open_regression

REPEATS = 3  # runs per point and night in the nightly workflow (hwbench sweep --repeats 3)
NIGHTS = 60
DETECT_WITHIN = 3  # nights after the step night (the step night is night 0)
FIRST_STEP, LAST_STEP = 20, NIGHTS - 1 - DETECT_WITHIN  # where a simulated step may fall


@dataclasses.dataclass(frozen=True)
class NoiseModel:
    """Run-to-run noise of one benchmark: a CV, or the relative deviations of real runs."""

    cv: float
    deviations: tuple[float, ...] = ()  # resampled when given, else normal with ``cv``

    @classmethod
    def from_runs(cls, values: Sequence[float], resample: bool = False) -> NoiseModel:
        median = statistics.median(values)
        cv = statistics.stdev(values) / statistics.fmean(values)
        return cls(cv, tuple(v / median - 1 for v in values) if resample else ())

    def draw(self, rng: random.Random) -> float:
        return rng.choice(self.deviations) if self.deviations else rng.gauss(0.0, self.cv)


def simulated_nights(rng: random.Random, noise: NoiseModel, step_night: int | None, step: float) -> list[float]:
    """Night values of a throughput figure at level 1, times (1 + step) from ``step_night`` on."""
    values = []
    for night in range(NIGHTS):
        level = 1.0 + (step if step_night is not None and night >= step_night else 0.0)
        values.append(statistics.median(level * (1.0 + noise.draw(rng)) for _ in range(REPEATS)))
    return values


def regression_points(values: Sequence[float], alpha: float, min_nights: int) -> list[int]:
    """Every change point where the figure fell."""
    points = change_points(values, alpha, min_nights)
    return [point for point, test in zip(points, level_changes(values, points)) if test["difference"] < 0]


def gate_fails(values: Sequence[float], threshold: float, alpha: float, min_nights: int) -> bool:
    """What fails `hwbench history changes` on this one segment of a throughput figure."""
    points = change_points(values, alpha, min_nights)
    return open_regression(level_changes(values, points), threshold, True)[0] is not None


@dataclasses.dataclass
class Outcome:
    series: int
    detected: int = 0  # a regression change point within one night of the step, by DETECT_WITHIN nights
    located: int = 0  # on the whole series, a regression change point within one night of the step
    gate_failed: int = 0  # an open regression beyond the threshold by DETECT_WITHIN nights
    false_change: int = 0  # noise only: some night's run reported a regression change point
    false_gate: int = 0  # noise only: some night's run failed the gate

    def rate(self, field: str) -> float:
        return getattr(self, field) / self.series


def simulate_steps(noise: NoiseModel, series: int, seed: int, step: float = -0.05, threshold: float = 0.05,
                   alpha: float = ALPHA, min_nights: int = MIN_NIGHTS) -> Outcome:
    """Series of NIGHTS nights with one step at a random night; each judged as the nightly
    job would be on the nights up to the step night + 0, 1, ..., DETECT_WITHIN."""
    rng = random.Random(seed)
    outcome = Outcome(series)
    for _ in range(series):
        step_night = rng.randint(FIRST_STEP, LAST_STEP)
        values = simulated_nights(rng, noise, step_night, step)
        near = range(step_night - 1, step_night + 2)
        prefixes = [values[:step_night + late + 1] for late in range(DETECT_WITHIN + 1)]
        outcome.detected += any(any(index in near for index in regression_points(prefix, alpha, min_nights))
                                for prefix in prefixes)
        outcome.gate_failed += any(gate_fails(prefix, threshold, alpha, min_nights) for prefix in prefixes)
        outcome.located += any(index in near for index in regression_points(values, alpha, min_nights))
    return outcome


def simulate_noise_only(noise: NoiseModel, series: int, seed: int, threshold: float = 0.05, alpha: float = ALPHA,
                        min_nights: int = MIN_NIGHTS) -> Outcome:
    """Series of NIGHTS nights without any change, judged on every night as the nightly job
    would be: a false alarm is any night that reports a regression (or fails the gate)."""
    rng = random.Random(seed)
    outcome = Outcome(series)
    for _ in range(series):
        values = simulated_nights(rng, noise, None, 0.0)
        prefixes = [values[:end] for end in range(2 * min_nights, NIGHTS + 1)]
        outcome.false_change += any(regression_points(prefix, alpha, min_nights) for prefix in prefixes)
        outcome.false_gate += any(gate_fails(prefix, threshold, alpha, min_nights) for prefix in prefixes)
    return outcome
