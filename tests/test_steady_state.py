"""Steady state: how many timed steps the step time took to settle, and a timed window whose step
time drifts from its first to its last quarter flagged with the device's throttle reasons beside it
(docs/methodology.md, "Steady state")."""

from __future__ import annotations

import pytest

from hwbench.cli import main
from hwbench.harness.faults import FAULT_ENV
from hwbench.result.store import load_result
from hwbench.stats import steady_state


def test_steps_to_settle_count_the_slow_start_and_a_steady_window_does_not_drift():
    figures = steady_state([3.0, 2.0, 1.5] + [1.0, 1.01, 0.99, 1.0] * 4)
    assert figures.settled_after_steps == 3 and figures.settle_window == 3
    assert steady_state([3.0, 2.0, 1.5, 1.4] + [1.0, 1.01, 0.99, 1.0] * 4).settled_after_steps == 4
    steady = steady_state([1.0, 1.02, 0.98, 1.01] * 4)
    assert steady.settled_after_steps == 0 and not steady.drifting and abs(steady.drift) < 0.05


def test_a_window_that_slows_drifts_and_one_that_never_settles_says_so():
    falling_clock = steady_state([1.0] * 8 + [1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8])
    assert falling_clock.drifting and falling_clock.drift == pytest.approx(1.65 / 1.0 - 1)
    assert falling_clock.settled_after_steps is None
    assert "never stayed within 5%" in falling_clock.why("settled_after_steps")
    few = steady_state([1.0] * 7)
    assert few.drift is None and "needs 8 or more" in few.why("drift")


@pytest.mark.slow
def test_a_run_whose_device_slows_midway_is_flagged_as_drifting_with_the_throttle_reasons(tmp_path, monkeypatch,
                                                                                          capsys):
    # from the 7th of 8 timed steps on, each step sleeps 2 s: the last quarter (the drift's end) slowed,
    # for 4 s of sleeping; one sample a step, the drift being the sleeps'
    monkeypatch.setenv(FAULT_ENV, "0:8:slow")
    assert main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--steps", "8", "--warmup", "1",
                 "--micro-batch-size", "1", "--global-batch-size", "1", "--eval-iters", "0", "--no-telemetry",
                 "--out", str(tmp_path)]) == 0
    result = load_result(next(tmp_path.glob("*.json")))
    steady = result.metrics.steady_state
    assert steady.drifting and steady.drift > 0.5 and steady.last_quarter_median_s > 2.0
    assert steady.throttle_reasons is None and "--no-telemetry" in steady.why("throttle_reasons")
    warning = next(w for w in result.warnings if w.startswith("step time drifted"))
    assert "threshold 5%" in warning and "--no-telemetry" in warning
    assert "DRIFTING" in capsys.readouterr().out


def test_a_step_time_a_timer_gave_as_inf_is_null_not_a_lost_result():
    import math

    steady = steady_state([1.0] * 7 + [math.inf])  # a result holds no inf: the figure is null, the rest kept
    assert steady.last_quarter_median_s is None and steady.drift is None and steady.drifting is False
    assert steady.first_quarter_median_s == 1.0
