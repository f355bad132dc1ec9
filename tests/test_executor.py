"""The point loop (hwbench.suites.executor) with a stand-in executor whose points are
jobs that end when it says so: what every executor gets from the loop (keys, kept
results, results in point order, detach, a stop that names the jobs still out).
The real executors: tests/test_sweep.py (local process trees) and
tests/test_slurm_local.py (Slurm jobs)."""

from __future__ import annotations

import pytest

from hwbench.errors import UsageError
from hwbench.result.model import RunResult
from hwbench.result.store import utc_now, write_result
from hwbench.suites.executor import Job, PointRun, SweepInterrupted, SweepOptions, recorded, run_points
from hwbench.suites.suite import Point, Suite


class Jobs:
    """Every point a job; each wait() ends the oldest job still out (or stops, as Ctrl-C)."""

    def __init__(self, detach: bool = False, stop_after: int | None = None) -> None:
        self.defaults = {"nnodes": 1}
        self.detach = detach
        self.submitted: list[PointRun] = []
        self.waits, self.stop_after = 0, stop_after

    def check(self, runs, out_dir) -> None:
        if any(run.options.device is None for run in runs):
            raise UsageError("--device is needed")

    def machine(self) -> dict:
        return {"cluster": "stand-in"}

    def again(self, kept: RunResult) -> bool:
        return False

    def submit(self, run: PointRun, kept) -> RunResult | Job:
        if run.point.name == "bad":
            return recorded(run, "invalid", "refused without a job")
        self.submitted.append(run)
        return Job(run, str(len(self.submitted)))

    def wait(self, jobs: list[Job]) -> list[tuple[Job, RunResult]]:
        self.waits += 1
        if self.stop_after is not None and self.waits > self.stop_after:
            raise KeyboardInterrupt
        job = jobs[0]
        result = RunResult(run_id=f"run-{job.job_id}", status="ok", spec={"seed": job.run.options.seed},
                           started_at=utc_now(), sweep=dict(job.run.sweep),
                           metrics={"samples_per_s": 1.0, "tokens_per_s": 32.0, "tflops_per_device": 0.1})
        write_result(result, job.run.folder)
        return [(job, result)]


SUITE = Suite("s", "", "s.yaml", (Point("a", (("model", "tiny"),)), Point("bad", (("model", "tiny"),)),
                                  Point("b", (("model", "tiny"), ("seed", 7)))))


def test_jobs_are_waited_for_and_their_results_land_in_point_order(tmp_path):
    executor, said = Jobs(), []
    records = run_points(SUITE, SweepOptions(tmp_path, device="cpu", repeats=2), executor, said.append)
    assert [r.point.name for r in records] == ["a", "bad", "b"]
    assert [[x.run_id for x in r.results] for r in records if r.point.name != "bad"] == [["run-1", "run-2"],
                                                                                         ["run-3", "run-4"]]
    assert [x.status for x in records[1].results] == ["invalid", "invalid"]
    runs = executor.submitted
    assert [run.options.seed for run in runs] == [1234, 1235, 7, 8]  # distinct seeds per repeat
    assert all(run.options.device == "cpu" and run.options.nnodes == 1 for run in runs)  # the sweep's, the executor's
    assert len({run.key for run in runs}) == 4 and records[2].aggregate["seeds"] == [7, 8]
    assert (tmp_path / "s" / "b" / "aggregate.json").exists()
    assert said[:2] == ["[3/6] bad repeat 1/2: invalid (refused without a job)",
                        "[4/6] bad repeat 2/2: invalid (refused without a job)"]  # said at once, jobs when they end

    again = Jobs()
    kept = run_points(SUITE, SweepOptions(tmp_path, device="cpu", repeats=2), again, said.append)
    assert again.submitted == [] and [r.reused for r in kept] == [2, 2, 2]  # the same options: kept, not run again


def test_detach_returns_with_the_jobs_out_and_a_stop_names_them(tmp_path):
    [first, _bad, last] = run_points(SUITE, SweepOptions(tmp_path, device="cpu"), Jobs(detach=True), print)
    assert first.results == [] and first.jobs == ["1"] and last.jobs == ["2"]
    with pytest.raises(SweepInterrupted) as stop:
        run_points(SUITE, SweepOptions(tmp_path / "o", device="cpu"), Jobs(stop_after=1), print)
    assert stop.value.signal_number == 2 and stop.value.jobs == ["2"]  # job 1 ended before the stop


def test_the_executor_refuses_the_sweep_before_anything_is_written(tmp_path):
    with pytest.raises(UsageError, match="--device is needed"):
        run_points(SUITE, SweepOptions(tmp_path / "out"), Jobs(), print)
    assert not (tmp_path / "out").exists()
