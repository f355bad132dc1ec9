"""Goodput: where a run's wall time went, phase by phase, on the host clock."""

import io
import json
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from hwbench.cli import main
from hwbench.harness.goodput import PHASES, PhaseClock, goodput_figures, restart_time_before
from hwbench.report.summary import run_summary_rows
from hwbench.result.model import Restart
from hwbench.result.store import load_result

REPORT_DATA = Path(__file__).resolve().parent / "data" / "report" / "good"

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
    earlier = [Restart(time_lost_s=5.0), Restart(time_lost_s=None)]
    assert restart_time_before(Restart(time_lost_s=3.0), earlier, attempt_s=1.0) == pytest.approx(7.0)
    assert restart_time_before(Restart(time_lost_s=0.5), [], attempt_s=1.0) == 0.0  # never below zero
    figures = goodput_figures(dict.fromkeys(PHASES, 1.0), restarts_s=1.0)
    assert figures.total_s == pytest.approx(8.0) and figures.goodput == pytest.approx(2 / 8)


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


GOODPUT = {"init_s": 2.0, "checkpoint_load_s": 0.0, "warmup_s": 1.0, "timed_steps_s": 5.0,
           "eval_s": 0.5, "checkpoint_save_s": 1.0, "restarts_s": 0.0, "other_s": 0.5}


def _with_goodput(tmp_path: Path) -> Path:
    """A recorded result of a tiny CPU run, with the goodput that goodput_figures makes of GOODPUT's phases."""
    result = json.loads((REPORT_DATA / "b-tiny-cpu.json").read_text())
    phases = {name.removesuffix("_s"): value for name, value in GOODPUT.items() if name.endswith("_s")}
    figures = goodput_figures({k: v for k, v in phases.items() if k != "restarts"}, restarts_s=0.0, rank=0)
    result["metrics"]["goodput"] = figures.dump()
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "b-tiny-cpu.json").write_text(json.dumps(result))
    return folder


def test_the_summary_and_the_report_show_where_the_time_went(tmp_path):
    folder = _with_goodput(tmp_path)
    result = load_result(next(folder.glob("*.json")))
    row = dict(run_summary_rows(result))["goodput"]
    # 6 of 10 s in training steps; init 2 s, saves 1 s, validation and the rest 0.5 s each; nothing loaded
    assert row == "60.0% of 10.0 s in training steps; init 20.0%, warm-up 10.0%, timed steps 50.0%, validation 5.0%, " \
                  "saves 10.0%, rest 5.0%"
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(folder)]) == 0
    section = out.getvalue().split("## Goodput", 1)[1].split("\n## ", 1)[0]
    assert "| 60.0% " in section and "| 20.0% " in section and "| 10.0 " in section


def test_a_sweep_sums_the_runs_it_made_and_charges_the_rest_of_their_time_outside_their_clocks(tmp_path):
    """Two runs of 10 s on their clocks that took 14 s of the sweep's host time, and one kept from an
    earlier sweep (its time was that sweep's): 12 of 24 s trained; 4 s outside the clocks. A point
    run as a job elsewhere leaves the time outside unmeasured."""
    from hwbench.report.summary import sweep_goodput, sweep_goodput_text
    from hwbench.suites.executor import PointRecord
    from hwbench.suites.suite import Point

    result = load_result(next(_with_goodput(tmp_path).glob("*.json")))
    kept = result.model_copy(update={"run_id": "earlier"})
    record = PointRecord(Point("p", ()), [result, result.model_copy(update={"run_id": "again"}), kept],
                         kept_ids=["earlier"], wall_s=24.0)
    summed = sweep_goodput([record])
    assert summed is not None and summed.runs == 2
    assert summed.outside_s == pytest.approx(4.0) and summed.total_s == pytest.approx(24.0)
    assert summed.goodput == pytest.approx(12 / 24)
    text = sweep_goodput_text(summed)
    assert text.startswith("goodput over the sweep's 2 runs: 50.0% of 24.0 s in training steps; init 16.7%, ")
    assert "; outside the runs' clocks 16.7% (" in text
    record.wall_s = None
    elsewhere = sweep_goodput([record])
    assert elsewhere is not None and elsewhere.outside_s is None and elsewhere.goodput == pytest.approx(12 / 20)
    assert "outside the runs' clocks not measured" in sweep_goodput_text(elsewhere)
    assert sweep_goodput([PointRecord(Point("p", ()), [kept], kept_ids=["earlier"])]) is None


def test_the_report_sums_a_sweeps_runs_into_one_row(tmp_path):
    """Two runs of one sweep, 10 s and 22 s on their clocks (the second's init 4 s, not 2, and its timed
    steps 15 s, not 5): the sweep's row has 32 s, training (1 + 5) + (1 + 15) = 22 s of it, init 2 + 4 s."""
    folder = _with_goodput(tmp_path)
    first = json.loads(next(folder.glob("*.json")).read_text())
    second = json.loads(json.dumps(first))
    phases = {name.removesuffix("_s"): value for name, value in GOODPUT.items() if name.endswith("_s")}
    phases.update(init=4.0, timed_steps=15.0)
    second["metrics"]["goodput"] = goodput_figures({k: v for k, v in phases.items() if k != "restarts"}, 0.0, 0).dump()
    second["run_id"] += "-2"
    for index, result in enumerate((first, second)):
        result["sweep"] = {"suite": "nightly", "point": "p", "repeat": index, "repeats": 2, "key": f"k{index}"}
        (folder / f"r{index}.json").write_text(json.dumps(result))
    next(folder.glob("b-*.json")).unlink()
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(folder)]) == 0
    section = out.getvalue().split("## Goodput", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if "sweep nightly (2 runs)" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[3:6] == ["32.0", f"{22 / 32:.1%}", f"{6 / 32:.1%}"]  # wall s, goodput, init


def test_a_phase_clock_that_read_inf_leaves_the_goodput_null_not_the_result_lost():
    import math

    from hwbench.harness.goodput import goodput_figures

    figures = goodput_figures({"timed_steps": math.inf, "init": 1.0}, 0.0, rank=0)
    assert figures.timed_steps_s is None and figures.total_s is None and figures.goodput is None
    assert figures.init_s == 1.0 and figures.shares is not None and set(figures.shares.values()) == {None}
