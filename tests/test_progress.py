"""The progress line's estimate of the time left (hwbench/harness/progress.py)."""

from __future__ import annotations

import io

from hwbench.harness import progress


def test_the_eta_leaves_the_first_steps_one_off_costs_out(monkeypatch):
    """Start at 0 s; the first step (allocations, kernel choices) ends at 10 s, the next ones take
    1 s each. At step 3 of 10 the time left is 7 steps x 1 s, not 12 s / 3 x 7 = 28 s."""
    clock = iter([0.0, 10.0, 11.0, 12.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    shown = progress.Progress("tiny on cpu", 10, 2, stream=out, log_interval_s=0.0)
    for done in (1, 2, 3):
        shown.step(done)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("step 1/10 (warm-up)  elapsed  10.0s  eta     ?")
    assert lines[1].endswith("step 2/10 (warm-up)  elapsed  11.0s  eta   8.0s")
    assert lines[2].endswith("step 3/10 (timed)  elapsed  12.0s  eta   7.0s")
