"""The one point loop, run_points: every point of a suite and every repeat, wherever
it runs (`hwbench sweep` here or on Slurm, `hwbench tune`'s trials). It owns each run's
options (the sweep's --device/--nproc-per-node where a point sets none, a seed per
repeat), the resume key, the suite folder's lock, kept results, progress lines,
SIGINT/SIGTERM/SIGHUP and repeat statistics; where a point runs is its Executor's
(suites/sweep.py: a local process tree; suites/slurm.py: a Slurm job). Results land
in OUT/<suite>/<point>/ and carry ``sweep`` (suite, point, repeat, key).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.errors import UsageError
from hwbench.files import write_json_atomic
from hwbench.lifeline import stop_signals
from hwbench.options import RunOptions
from hwbench.paths import AGGREGATE_FILE, check_output_folder, result_files
from hwbench.point import resume_key
from hwbench.result.model import RunError, RunResult, SweepRecord
from hwbench.result.store import ResultFormatError, load_result, new_run_id, utc_now, write_result
from hwbench.stats import olympic_score, throughput_statistics
from hwbench.suites.suite import Point, Suite

TIMEOUT_MARGIN_S = 120.0  # beyond a point's own --timeout, before the sweep ends it itself
LOCK_SUFFIX = ".hwbench-sweep.lock"  # OUT/.<suite>.hwbench-sweep.lock: one sweep writes a suite's folder at a time
# Every repeat is a whole run of the point and all are listed before the first starts: --repeats
# 10**9 spent hours and gigabytes listing them. A thousand is far more than any spread needs.
MAX_REPEATS = 1000
SEED_BASE = 1234  # repeats of a point that sets no seed run with seeds 1234, 1235, ...

Say = Callable[[str], None]


def progress_lines(enabled: bool) -> Say:
    """How a sweep says what it does: a line on stderr per event, or nothing."""
    return (lambda text: print(text, file=sys.stderr, flush=True)) if enabled else (lambda _text: None)


class SweepInterrupted(Exception):
    def __init__(self, signal_number: int, jobs: list[str]) -> None:
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number, self.jobs = signal_number, jobs  # jobs still out (Slurm) keep running unless cancelled


@dataclasses.dataclass(frozen=True)
class SweepOptions:  # `hwbench sweep`'s options, checked as the command checks them
    out_dir: Path
    device: str | None = None  # for every point that does not set its own
    nproc_per_node: int | None = None  # likewise
    repeats: int = 1
    force: bool = False
    plan: bool = True  # skip points the memory planner predicts will not fit (local sweeps)
    wait: bool = False  # for another sweep's lock on the folder, instead of refusing
    preflight: bool = True  # each point's run checks the machine first (--no-preflight: none does)

    def __post_init__(self) -> None:
        if not isinstance(self.out_dir, (str, os.PathLike)) or not os.fspath(self.out_dir).strip():
            raise UsageError(f"--out {self.out_dir!r} is not accepted; give a directory (it is created when missing)")
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if self.device is not None and self.device not in DEVICE_CHOICES:
            raise UsageError(f"--device {self.device!r} is not known; accepted: {', '.join(DEVICE_CHOICES)}")
        for option, value in (("--nproc-per-node", self.nproc_per_node), ("--repeats", self.repeats)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UsageError(f"{option} {value!r} is not accepted; give an integer >= 1")
        if self.repeats > MAX_REPEATS:
            raise UsageError(f"--repeats {self.repeats} is not accepted; give an integer from 1 to {MAX_REPEATS}")


@dataclasses.dataclass
class PointRecord:  # what the sweep knows of one point after running (or not running) it
    point: Point
    results: list[RunResult | None]  # None: a job still out, or a run that left no result
    aggregate: dict[str, Any] | None = None
    jobs: list[str] = dataclasses.field(default_factory=list)  # jobs still out (a detached Slurm sweep)
    kept_ids: list[str] = dataclasses.field(default_factory=list)  # run ids of the results found from an earlier sweep
    # the host seconds this sweep spent running the point's runs in its own process tree; None once
    # one ran as a job elsewhere (Slurm), whose time this host does not see
    wall_s: float | None = 0.0

    @property
    def reused(self) -> int:
        """How many results were found from an earlier sweep."""
        return len(self.kept_ids)

    @property
    def fresh(self) -> list[RunResult]:
        """The results this sweep made (not kept from an earlier one)."""
        return [result for result in self.results if result is not None and result.run_id not in self.kept_ids]


@dataclasses.dataclass(frozen=True)
class PointRun:  # one point and repeat, as the loop hands it to an executor
    point: Point
    repeat: int
    options: RunOptions  # the point's, with the sweep's defaults and the repeat's seed
    folder: Path  # OUT/<suite>/<point>
    label: str  # "[3/8] dp2 repeat 2/3", for progress lines
    left: int  # runs from this one to the end of the sweep
    sweep: dict[str, Any] = dataclasses.field(default_factory=dict)  # result.sweep, key included

    @property
    def argv(self) -> list[str]:  # the child's `hwbench run` arguments, less --out
        return self.options.to_argv()

    @property
    def env(self) -> dict[str, str]:
        return dict(self.point.env)

    @property
    def key(self) -> str:
        return self.sweep["key"]


@dataclasses.dataclass
class Job:  # a point run an executor started and has not finished: the loop waits for it
    run: PointRun
    job_id: str
    state: str = "SUBMITTED"
    submitted_at: str = ""  # results that started before are an earlier job's (with --force)
    index: int = -1  # where its result goes in its PointRecord


class Executor:
    """Where a point runs (LocalExecutor, SlurmExecutor). A point that cannot run is a
    result the executor records (`invalid`, ...), never an exception."""

    defaults: dict[str, Any] = {}  # options for every point that sets none of its own (Slurm: --nnodes)
    detach = False  # return once everything is submitted, without waiting for it

    def check(self, runs: list[PointRun], out_dir: Path) -> None:
        """Refuse the sweep (UsageError, SetupError) before anything is written."""

    def machine(self) -> dict[str, Any]:  # what a key names besides the options
        import torch

        return {"host": socket.gethostname(), "torch": torch.__version__}

    def again(self, kept: RunResult) -> bool:  # run a kept result again (a cancelled job)?
        return False

    def submit(self, run: PointRun, kept: Path | None) -> RunResult | Job | None:
        """Its result, a Job still out, or None (not submitted); ``kept``: the result it replaces."""
        raise NotImplementedError

    def wait(self, jobs: list[Job]) -> list[tuple[Job, RunResult]]:  # block until jobs ended: their results
        raise NotImplementedError


def point_options(point: Point, defaults: dict[str, Any]) -> RunOptions:
    """The point's options, with each of ``defaults`` the point does not set itself."""
    return point.run_options().merged(**{name: value for name, value in defaults.items()
                                         if value is not None and point.option(name) is None})


def point_runs(suite: Suite, options: SweepOptions, defaults: dict[str, Any]) -> list[PointRun]:
    """Every point and repeat of ``suite``, in order; UsageError when a name would put
    results outside --out (a Suite built in code; suite files check names on load)."""
    defaults = {"device": options.device, "nproc_per_node": options.nproc_per_node, **defaults}
    total, runs = len(suite.points) * options.repeats, list[PointRun]()
    for point in suite.points:
        folder = options.out_dir / suite.name / point.name
        if folder.resolve().parent.parent != options.out_dir.resolve():
            raise UsageError(f"suite {suite.name!r} point {point.name!r}: the names would put results outside "
                             f"--out {str(options.out_dir)!r}; give plain folder names")
        for repeat in range(options.repeats):
            run_options, label = point_options(point, defaults), f"[{len(runs) + 1}/{total}] {point.name}"
            if not options.preflight:
                run_options = run_options.merged(preflight=False)
            if options.repeats > 1:  # distinct seeds, logged in each result's spec.seed
                run_options = run_options.merged(seed=int(point.option("seed", SEED_BASE)) + repeat)
                label += f" repeat {repeat + 1}/{options.repeats}"
            runs.append(PointRun(point, repeat, run_options, folder, label, total - len(runs)))
    return runs


def run_points(suite: Suite, options: SweepOptions, executor: Executor, say: Say,
               keep_going: Callable[[list[PointRecord]], bool] | None = None,
               before_start: Callable[[], None] | None = None) -> list[PointRecord]:
    """Every point of ``suite`` and every repeat through ``executor``, holding the suite
    folder's lock; ``keep_going`` (tune's stopping rule) is asked before each run. A
    refusal comes before the folder exists. ``before_start`` runs once every input is
    checked and the lock is held (what a command says before the first point: an
    estimate, the preflight's findings). SweepInterrupted on SIGINT/SIGTERM/SIGHUP."""
    from hwbench.harness.launcher import recover_stranded_runs

    check_output_folder(options.out_dir)
    runs = point_runs(suite, options, executor.defaults)
    executor.check(runs, options.out_dir)
    machine = executor.machine()
    runs = [dataclasses.replace(run, sweep={"suite": suite.name, "suite_path": suite.path, "point": run.point.name,
                                            "repeat": run.repeat, "repeats": options.repeats,
                                            "key": resume_key(run.options.merged(preflight=None).to_argv(),
                                                              run.repeat, run.env, machine)})
            for run in runs]
    for note in recover_stranded_runs():  # a killed run's result goes to its point folder, where resume finds it
        say(f"note: {note}")
    with folder_lock(options.out_dir / suite.name, options.wait):
        if before_start is not None:
            before_start()
        records = _loop(runs, options.force, executor, say, keep_going)
    for record in records:
        finished = [result for result in record.results if result is not None]
        record.results[:] = finished
        record.aggregate = aggregate(record.point, finished) if options.repeats > 1 else None
        if record.aggregate:
            write_json_atomic(options.out_dir / suite.name / record.point.name / AGGREGATE_FILE, record.aggregate)
    return records


def _loop(runs: list[PointRun], force: bool, executor: Executor, say: Say,
          keep_going: Callable[[list[PointRecord]], bool] | None) -> list[PointRecord]:
    records: dict[str, PointRecord] = {}
    jobs: list[Job] = []

    def place(record: PointRecord, index: int, result: RunResult, label: str) -> None:
        record.results[index] = result
        say(f"{label}: {result.status}" + (f" ({result.error.message})" if result.error else ""))

    try:
        with stop_signals():
            for run in runs:
                if keep_going is not None and not keep_going(list(records.values())):
                    break
                record = records.setdefault(run.point.name, PointRecord(run.point, []))
                kept = None if force else keyed_results(run.folder).get(run.key)
                if kept and not executor.again(kept[1]):
                    record.results.append(kept[1])
                    record.kept_ids.append(kept[1].run_id)
                    say(f"{run.label}: {kept[1].status} (kept from an earlier sweep; --force runs it again)")
                    continue
                started = time.perf_counter()
                outcome = executor.submit(run, kept[0] if kept else None)
                _charge_wall(record, outcome, time.perf_counter() - started)
                if outcome is None:
                    continue
                record.results.append(None)  # filled below, or by a job's result
                if isinstance(outcome, Job):
                    outcome.index = len(record.results) - 1
                    record.jobs.append(outcome.job_id)
                    jobs.append(outcome)
                else:
                    place(record, -1, outcome, run.label)
            while jobs and not executor.detach:
                for job, result in executor.wait(jobs):
                    jobs.remove(job)
                    records[job.run.point.name].jobs.remove(job.job_id)
                    place(records[job.run.point.name], job.index, result, job.run.label)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM/SIGHUP as stop_signals raises them
        raise SweepInterrupted(getattr(stop, "signal_number", signal.SIGINT), [job.job_id for job in jobs]) from None
    return list(records.values())


def _charge_wall(record: PointRecord, outcome: RunResult | Job | None, seconds: float) -> None:
    """Add a run's host time to its point's: a run that ran here (a result back from submit);
    a job submitted elsewhere makes the point's time unknown here."""
    if isinstance(outcome, Job):
        record.wall_s = None
    elif record.wall_s is not None:
        record.wall_s += seconds


def keyed_results(folder: Path) -> dict[str, tuple[Path, RunResult]]:
    """(file, result) in a point folder by sweep key; an unreadable file is named in a warning."""
    found: dict[str, tuple[Path, RunResult]] = {}
    for path in result_files([folder]) if folder.is_dir() else []:
        try:
            result = load_result(path)
        except ResultFormatError as error:
            warnings.warn(f"skipping {error}", stacklevel=2)
            continue
        key = result.sweep.key if result.sweep is not None else None
        if key:
            found[key] = (path, result)
    return found


def recorded(run: PointRun, status: str, message: str, spec: dict | None = None,
             extra: dict | None = None) -> RunResult:
    """A result the sweep writes itself for a point that did not (or could not) run."""
    result = RunResult(run_id=new_run_id(run.point.name, "sweep"), status=status,
                       spec=spec or {"run_args": run.argv}, started_at=utc_now())
    result.error = RunError.model_validate({"type": status.capitalize(), "message": message, "traceback": None,
                                            "rank": None, **(extra or {})})
    result.sweep = SweepRecord.model_validate(run.sweep)
    result.finished_at = utc_now()
    write_result(result, run.folder)
    return result


def aggregate(point: Point, results: list[RunResult]) -> dict[str, Any] | None:
    ok = [r for r in results if r.status == "ok"]
    if not ok:
        return None
    figures = {key: throughput_statistics([getattr(r.metrics, key) for r in ok])
               for key in ("samples_per_s", "tokens_per_s", "tflops_per_device")}
    targets = [r.metrics.time_to_target for r in results if r.status in ("ok", "not_converged")
               and r.metrics.time_to_target]
    if targets:  # MLPerf's score of the repeats: hwbench.stats.olympic_score
        figures["time_to_target_s"] = olympic_score([t.scored_time_s for t in targets
                                                     if t.reached and t.scored_time_s is not None],
                                                    sum(not t.reached for t in targets))
    return {"point": point.name, "repeats": len(results), "ok": len(ok),
            "seeds": [r.spec.seed for r in results], "run_ids": [r.run_id for r in results], **figures}


def lock_path(out_dir: Path, suite_name: str) -> Path:  # beside OUT/<suite>/, which holds only point folders
    return out_dir / f".{suite_name}{LOCK_SUFFIX}"


@contextlib.contextmanager
def folder_lock(folder: Path, wait: bool):
    """Hold OUT/<suite>/'s lock for the sweep: two sweeps writing one folder would run
    every point twice and mix their figures. A second sweep is refused naming the
    holder's pid (or waits, with ``wait``). The kernel drops a flock when its holder
    dies, so a lock left by a killed sweep never blocks."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(lock_path(folder.parent, folder.name), "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise UsageError(f"--out: another sweep (pid {holder}) is writing {folder}; let it finish, give --wait "
                             "to queue behind it, or give another --out") from None
        with contextlib.suppress(OSError):  # the pid only names the holder: a full disk must not stop the sweep
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
        yield


def duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
