"""Where a run's wall time went on one rank: training steps against everything else.

One host clock (perf_counter) is switched from phase to phase at boundaries the worker
already has (the start of the run, a checkpoint load, the warm-up, the timed window, each
validation and save). Every moment from the start to the end belongs to exactly one phase,
so the phases sum to the total by construction; reading perf_counter never waits for the
device, so the timed loop gains no host sync. A phase's end is the host's view: work the
device still runs when the host switches (a step launched but not finished) counts in the
phase after it, until the next wait for the device (a validation's loss, a save, the
synchronisation that closes the warm-up and the timed window).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator

from hwbench.result.model import GOODPUT_PHASES, Goodput, Restart
from hwbench.stats import finite_or_none

# The phases a rank's clock charges (restarts happen before it starts). "other" is what no
# boundary names: the telemetry sampler's start and stop, the memory reading, the loss curve's reduction.
PHASES = tuple(phase for phase in GOODPUT_PHASES if phase != "restarts")
TRAINING = ("warmup", "timed_steps")  # the goodput: time that trains the model


@dataclasses.dataclass
class PhaseClock:
    """The host wall time of each phase on this rank, from ``started`` (perf_counter)."""

    started: float = dataclasses.field(default_factory=time.perf_counter)
    phase: str = "init"
    seconds: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    _since: float = 0.0
    ended: float | None = None

    def __post_init__(self) -> None:
        self._since = self.started

    def switch(self, phase: str) -> str:
        """Charge the time since the last switch to the current phase and enter ``phase``;
        returns the phase left."""
        if phase not in self.seconds:
            raise ValueError(f"unknown phase {phase!r} (one of {', '.join(PHASES)})")
        now = time.perf_counter()
        self.seconds[self.phase] += now - self._since
        left, self.phase, self._since = self.phase, phase, now
        return left

    @contextlib.contextmanager
    def within(self, phase: str) -> Iterator[None]:
        """``phase`` for the block, then back to the phase it interrupted."""
        left = self.switch(phase)
        try:
            yield
        finally:
            self.switch(left)

    def stop(self) -> dict[str, float]:
        """Close the clock (the current phase charged up to now); the seconds of every phase."""
        if self.ended is None:
            self.switch(self.phase)
            self.ended = self._since
        return dict(self.seconds)


def goodput_figures(seconds: dict[str, float], restarts_s: float, rank: int | None = None) -> Goodput:
    """The result's ``metrics.goodput`` from one rank's phase seconds and the time restarts lost
    before this attempt started: each phase's seconds and share of the total, and the goodput
    (the share of the total spent in training steps, warm-up and timed)."""
    figures = {f"{phase}_s": seconds.get(phase, 0.0) for phase in PHASES}
    figures["restarts_s"] = restarts_s
    total = sum(figures.values())
    counted = math.isfinite(total) and total > 0  # a clock that read inf or NaN leaves every share null
    shares = {name[:-2]: (value / total if counted else None) for name, value in figures.items()}
    training = sum(seconds.get(phase, 0.0) for phase in TRAINING)
    return Goodput(**{name: finite_or_none(value) for name, value in figures.items()}, rank=rank,
                   total_s=finite_or_none(total), shares=shares, goodput=training / total if counted else None)


def restart_time_before(restart: Restart | None, earlier: list[Restart], attempt_s: float) -> float:
    """The wall time restarts lost before this attempt's clock started. An earlier restart's
    ``time_lost_s`` is all before it; this attempt's own runs from the last committed checkpoint
    to the end of its load, so the part of it this attempt's clock already holds (``attempt_s``:
    from its start to the end of the load) is taken off, never below zero."""
    lost = sum(r.time_lost_s or 0.0 for r in earlier)
    if restart is not None and restart.time_lost_s is not None:
        lost += max(0.0, restart.time_lost_s - attempt_s)
    return lost


@dataclasses.dataclass(frozen=True)
class SweepGoodput:
    """The runs of a sweep as one clock: each phase summed over the runs' own clocks (rank 0's),
    and the host time the sweep spent on its runs outside those clocks (``outside_s``: each
    run's process start and imports, its preflight, the writing of its result, and the whole of
    a run that kept no clock, as a failed one), which is time no run trained in. ``outside_s``
    is None where the runs did not run in the sweep's own process tree (Slurm jobs)."""

    runs: int  # the runs that kept a clock
    phases_s: dict[str, float]
    outside_s: float | None

    @property
    def total_s(self) -> float:
        return sum(self.phases_s.values()) + (self.outside_s or 0.0)

    @property
    def goodput(self) -> float | None:
        training = sum(self.phases_s[phase] for phase in TRAINING)
        return training / self.total_s if self.total_s > 0 else None

    def share(self, seconds: float) -> float | None:
        return seconds / self.total_s if self.total_s > 0 else None


def summed_goodput(clocks: list[Goodput], runs_wall_s: float | None) -> SweepGoodput | None:
    """The sweep's goodput from its runs' ``metrics.goodput`` and ``runs_wall_s``, the host time
    the sweep spent running them (None: not measured); None when no run kept a clock."""
    if not clocks:
        return None
    phases = {phase: sum(getattr(clock, f"{phase}_s") or 0.0 for clock in clocks) for phase in GOODPUT_PHASES}
    outside = None if runs_wall_s is None else max(0.0, runs_wall_s - sum(clock.total_s or 0.0 for clock in clocks))
    return SweepGoodput(len(clocks), phases, outside)
