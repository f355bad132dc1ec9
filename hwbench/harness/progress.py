"""The progress display on stderr: one rewritten line on a terminal, a line
every few seconds otherwise (CI logs)."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from hwbench.harness.estimate import FIRST_WAIT_S, PACE_FROM_S, duration_text


class Progress:
    def __init__(self, title: str, total_steps: int, warmup_steps: int, *, stream: TextIO | None = None,
                 enabled: bool = True, log_interval_s: float = 10.0) -> None:
        self.title = title
        self.total = total_steps
        self.warmup = warmup_steps
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.interactive = enabled and self.stream.isatty()
        self.log_interval_s = log_interval_s
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._first_step_done: float | None = None  # the first step carries the warm-up's one-off costs
        self._training_started: float | None = None
        self._paced = False  # the measured projection was said
        self._waiting: threading.Timer | None = None  # says the floor while the first micro-batch runs
        self._first_done = False  # the first micro-batch (or step): the floor is no longer said

    def note(self, message: str) -> None:
        if self.enabled:
            self._finish_line()
            print(f"{self.title}: {message}", file=self.stream, flush=True)

    def training_started(self, micro_batches: int = 1, first_wait_s: float = FIRST_WAIT_S) -> None:
        """The first step, of ``micro_batches`` micro-batches, begins now: the clock of the measured
        projection, and of the floor said while the first micro-batch runs."""
        self._training_started = time.monotonic()
        if self.enabled:
            self._wait_for_first(first_wait_s, micro_batches)

    def _wait_for_first(self, seconds: float, micro_batches: int) -> None:
        self._waiting = threading.Timer(seconds, self._still_waiting, (seconds, micro_batches))
        self._waiting.daemon = True  # never keeps a finished run's process alive
        self._waiting.start()

    def _still_waiting(self, waited: float, micro_batches: int) -> None:
        """On the timer's thread: the first micro-batch is not done after ``waited``."""
        if self._first_done:
            return
        count = self.total * micro_batches
        what, each = (("micro-batch", f"{count} micro-batches ({micro_batches} a step)") if micro_batches > 1
                      else ("step", f"{count} steps"))
        if waited * count >= PACE_FROM_S:
            self.note(f"the first {what} is not done after {duration_text(waited)}: if each of the {each} takes as "
                      f"long, the run takes more than {duration_text(waited * count)}")
        if not self._first_done:
            self._wait_for_first(waited * 2, micro_batches)

    def _stop_waiting(self) -> None:
        self._first_done = True  # before the cancel: a timer that fires meanwhile says nothing
        if self._waiting is not None:
            self._waiting.cancel()

    def first_work_done(self, fraction: float, what: str) -> None:
        """``what``, the first ``fraction`` of a step (a micro-batch: 1 / the accumulation
        steps), is done: the run's length at that pace, said when it is long."""
        if self.enabled and self._training_started is not None:
            self._project(time.monotonic() - self._training_started, fraction, what)

    def _project(self, seconds: float, fraction: float, what: str) -> None:
        self._stop_waiting()
        total = seconds / fraction * self.total
        if self._paced or total < PACE_FROM_S:
            return
        self._paced = True
        self.note(f"{what} took {duration_text(seconds)}: at that pace the {self.total} steps (warm-up included) "
                  f"take about {duration_text(total)}; the first carries one-off costs, the eta refines it")

    def step(self, done: int, loss: float | None = None) -> None:
        """``done`` steps of ``total`` finished (warm-up included)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if done == 1 or self._first_step_done is None:
            self._first_step_done = now
        if done == 1 and self._training_started is not None:
            self._project(now - self._training_started, 1.0, "step 1")
        due = 0.2 if self.interactive else self.log_interval_s
        if done < self.total and now - self._last_draw < due:
            return
        self._last_draw = now
        phase = "warm-up" if done <= self.warmup else "timed"
        elapsed = now - self.started
        text = f"{self.title}: step {done}/{self.total} ({phase})  elapsed {elapsed:5.1f}s  eta {self._eta(done, now)}"
        if loss is not None:
            text += f"  loss {loss:.4f}"
        if self.interactive:
            print("\r" + text.ljust(100), end="", file=self.stream, flush=True)
        else:
            print(text, file=self.stream, flush=True)

    def _eta(self, done: int, now: float) -> str:
        """The time left at the pace of the steps after the first (whose allocations, kernel choices
        and compilation make it far slower: counted in, it doubled the first estimates); unknown
        until a second step is done."""
        if done >= self.total:
            return "  0.0s"
        steps_since_first = done - 1
        if steps_since_first < 1 or self._first_step_done is None:
            return "    ?"
        per_step = (now - self._first_step_done) / steps_since_first
        return f"{per_step * (self.total - done):5.1f}s"

    def _finish_line(self) -> None:
        if self.interactive and self._last_draw:
            print(file=self.stream, flush=True)
            self._last_draw = 0.0

    def close(self) -> None:
        self._stop_waiting()
        if self.enabled:
            self._finish_line()
