"""Goodput: where a run's wall time went, phase by phase, on the host clock."""

import json
import time

import pytest

from hwbench.cli import main
from hwbench.harness.goodput import PHASES, PhaseClock, goodput_figures, restart_time_before

SHARE_TOLERANCE = 1e-9  # the phases partition one clock: only float rounding may separate their sum from 1


def test_the_clock_charges_each_moment_to_one_phase_and_returns_to_the_interrupted_one():
    clock = PhaseClock()
    clock.switch("warmup")
    with clock.within("eval"):
        time.sleep(0.02)
    assert clock.phase == "warmup"
    time.sleep(0.01)
    seconds = clock.stop()
    assert seconds["eval"] >= 0.02 and seconds["warmup"] >= 0.01
    assert sum(seconds.values()) == pytest.approx(clock.ended - clock.started, abs=1e-9)
    with pytest.raises(ValueError, match="unknown phase 'compile'"):
        PhaseClock().switch("compile")


def test_restart_time_leaves_out_what_this_attempt_already_counts():
    earlier = [{"time_lost_s": 5.0}, {"time_lost_s": None}]
    assert restart_time_before({"time_lost_s": 3.0}, earlier, attempt_s=1.0) == pytest.approx(7.0)
    assert restart_time_before({"time_lost_s": 0.5}, [], attempt_s=1.0) == 0.0  # never below zero
    figures = goodput_figures(dict.fromkeys(PHASES, 1.0), restarts_s=1.0)
    assert figures["total_s"] == pytest.approx(8.0) and figures["goodput"] == pytest.approx(2 / 8)


@pytest.mark.heavy  # about 5 s on 2 idle cores; test_save_interval_saves_in_the_timed_window_... takes the path
def test_a_run_with_saves_and_validations_shows_them_apart_from_training(tmp_path):
    """A save and a validation between timed steps and after them: each takes time of its own, out of
    the training phases, and the shares sum to 1."""
    assert main(["run", "--quiet", "--model", "tiny", "--seq-length", "16", "--micro-batch-size", "1",
                 "--global-batch-size", "1", "--steps", "2", "--warmup", "1", "--eval-iters", "1",
                 "--eval-interval", "2", "--save", str(tmp_path / "ckpt"), "--save-interval", "2",
                 "--out", str(tmp_path / "runs")]) == 0
    result = json.loads(next((tmp_path / "runs").glob("*.json")).read_text())
    goodput = result["metrics"]["goodput"]
    for phase in ("init", "warmup", "timed_steps", "eval", "checkpoint_save"):
        assert goodput[f"{phase}_s"] > 0, phase
    assert goodput["restarts_s"] == 0.0
    assert goodput["checkpoint_load_s"] < 0.05  # nothing to load: only the check that there is none
    assert sum(goodput["shares"].values()) == pytest.approx(1.0, abs=SHARE_TOLERANCE)
    assert goodput["goodput"] == pytest.approx(goodput["shares"]["warmup"] + goodput["shares"]["timed_steps"])
    # the timed phase is the timed window less the saves and validations between its steps
    assert goodput["timed_steps_s"] < result["metrics"]["timed_wall_time_s"]
    assert goodput["timed_steps_s"] >= sum(step["time_s"] for step in result["steps"] if step["time_s"]) * 0.9
