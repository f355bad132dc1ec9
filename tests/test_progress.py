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


def test_a_long_run_says_its_measured_pace_after_its_first_micro_batch(monkeypatch):
    """The floor said before a run counts GEMM FLOPs only; a run that will take long is told its
    measured length once the first micro-batch is done (here 75 s of 4 per step, 25 steps: 2.1 h),
    once, and not again at step 1."""
    clock = iter([0.0, 0.0, 75.0, 300.0])  # made, training started, the first micro-batch, step 1
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    shown = progress.Progress("345m on cpu", 25, 5, stream=out, log_interval_s=0.0)
    shown.training_started()
    shown.first_work_done(1 / 4, "the first micro-batch (1 of 4 in a step)")
    shown.step(1)
    lines = out.getvalue().splitlines()
    assert lines[0] == ("345m on cpu: the first micro-batch (1 of 4 in a step) took 1 min: at that pace the 25 steps "
                        "(warm-up included) take about 2.1 h; the first carries one-off costs, the eta refines it")
    assert len(lines) == 2 and "step 1/25" in lines[1]


def test_a_run_of_one_micro_batch_per_step_says_it_after_step_1_and_a_short_run_not_at_all(monkeypatch):
    clock = iter([0.0, 0.0, 40.0, 0.0, 0.0, 2.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    long = progress.Progress("1.3b on cpu", 30, 5, stream=out, log_interval_s=1e9)
    long.training_started()
    long.step(1)
    assert out.getvalue().splitlines()[0] == ("1.3b on cpu: step 1 took 40 s: at that pace the 30 steps (warm-up "
                                              "included) take about 20 min; the first carries one-off costs, the eta "
                                              "refines it")
    out = io.StringIO()
    short = progress.Progress("tiny on cpu", 30, 5, stream=out, log_interval_s=1e9)
    short.training_started()
    short.step(1)  # 2 s x 30 = 1 min: under PACE_FROM_S, the progress line is enough
    assert "at that pace" not in out.getvalue()


def test_a_run_says_its_pace_from_its_own_first_micro_batch(tmp_path, monkeypatch, capsys):
    """A real run (tiny, 4 micro-batches a step) with the threshold at 0 s: the worker times the first
    micro-batch of its first warm-up step and the line names it before step 1's progress line."""
    from hwbench.cli import main

    monkeypatch.setattr(progress, "PACE_FROM_S", 0.0)
    assert main(["run", "--model", "tiny", "--data", "synthetic", "--seq-length", "32", "--micro-batch-size", "1",
                 "--global-batch-size", "4", "--warmup", "1", "--steps", "1", "--no-preflight", "--no-telemetry",
                 "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "at that pace" in line]
    assert len(said) == 1
    assert said[0].startswith("tiny on cpu: the first micro-batch (1 of 4 in a step) took ")
    assert "at that pace the 2 steps (warm-up included) take about " in said[0]
    assert err.index("at that pace") < err.index("step 1/2")


def test_while_the_first_micro_batch_runs_a_rising_floor_is_said_and_stops_once_it_is_done():
    """A micro-batch that takes minutes: the time it has taken so far bounds the run from below (if
    every one takes as long), said after the first wait and again each time it doubles (here 0.02 s,
    0.04 s, ...: under 5 min for 500 micro-batches until 0.64 s, so only that one is said); nothing
    after the first micro-batch is done. Real timers, as in a run (short ones: the test sleeps through
    them, 3 s in all)."""
    import time

    out = io.StringIO()
    shown = progress.Progress("345m on cpu", 125, 5, stream=out, log_interval_s=1e9)
    waits = [0.02 * 2 ** i for i in range(6)]  # 0.02 ... 0.64 s; floors 10 s ... 320 s for 500 micro-batches
    shown.training_started(4, first_wait_s=waits[0])
    time.sleep(sum(waits) + 0.6)  # the 1.28 s wait (armed at about 1.26 s) has not passed
    shown.first_work_done(1 / 4, "the first micro-batch (1 of 4 in a step)")
    said = out.getvalue().splitlines()
    floors = [line for line in said if "is not done" in line]
    assert floors == ["345m on cpu: the first micro-batch is not done after 1 s: if each of the 500 micro-batches "
                      "(4 a step) takes as long, the run takes more than 5 min"]  # 0.64 s x 500 = 320 s
    time.sleep(1.4)  # the next wait (1.28 s) has passed: cancelled, nothing more is said
    assert out.getvalue().splitlines() == said
    shown.close()
