"""`hwbench sweep SUITE`: every point of a suite, each isolated, recorded
whatever happens, resumable.

Each point (and each repeat of it) runs as its own `hwbench run` process tree
under a time limit; its result lands in ``OUT/<suite>/<point>/``. What a point
cannot do is data, never the end of the sweep: a bad layout is `invalid`, a
point the planner predicts will not fit is `skipped` (with the prediction), a
crash `failed`, a hang `timeout`. A point whose result already exists for the
same options, hwbench version and machine is not run again unless --force, so
after Ctrl-C or SIGTERM (the running point is stopped and cleaned up, every
finished result kept) the same command carries on where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hwbench.errors import UsageError
from hwbench.harness.lifeline import child_environment
from hwbench.harness.suite import Point, Suite
from hwbench.stats import throughput_statistics
from hwbench.options import RunOptions
from hwbench.point import resume_key as result_key
from hwbench.result.files import AGGREGATE_FILE, result_files
from hwbench.result.model import RunResult
from hwbench.result.store import load_results, new_run_id, utc_now, write_json_atomic, write_result
from hwbench.units import gib

SWEEP_ENV = "HWBENCH_SWEEP"  # the child `hwbench run` copies it into result.sweep
TIMEOUT_MARGIN_S = 120.0  # beyond a point's own --timeout, before the sweep ends it itself
STOP_GRACE_S = 30.0
LOCK_SUFFIX = ".hwbench-sweep.lock"  # OUT/.<suite>.hwbench-sweep.lock: one sweep writes a suite's folder at a time


class SweepInterrupted(Exception):
    def __init__(self, signal_number: int, jobs: list[str] | None = None) -> None:
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number
        self.jobs = jobs or []  # Slurm jobs still pending or running (hwbench.harness.slurm)


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    out_dir: Path
    device: str | None = None
    nproc_per_node: int | None = None
    repeats: int = 1
    force: bool = False
    plan: bool = True
    wait: bool = False  # for another sweep's lock on the folder, instead of refusing


@dataclasses.dataclass
class PointRecord:
    """What the sweep knows of one point after running (or not running) it."""

    point: Point
    results: list[RunResult]
    reused: int = 0  # results found from an earlier sweep
    aggregate: dict[str, Any] | None = None
    jobs: list[str] = dataclasses.field(default_factory=list)  # Slurm jobs still out (hwbench.harness.slurm)


def point_options(point: Point, options: SweepOptions) -> RunOptions:
    """The point's options with the sweep's --device/--nproc-per-node where the point
    does not set its own (the typed twin of point_args)."""
    changes: dict[str, Any] = {}
    if options.device and point.option("device") is None:
        changes["device"] = options.device
    if options.nproc_per_node and point.option("nproc_per_node") is None:
        changes["nproc_per_node"] = options.nproc_per_node
    return point.run_options().merged(**changes)


def point_args(point: Point, options: SweepOptions) -> list[str]:
    """The point's `hwbench run` arguments with the sweep's --device/--nproc-per-node
    where the point does not set its own."""
    args = point.run_args()
    if options.device and point.option("device") is None:
        args += ["--device", options.device]
    if options.nproc_per_node and point.option("nproc_per_node") is None:
        args += ["--nproc-per-node", str(options.nproc_per_node)]
    return args


def _existing(point_dir: Path) -> dict[str, RunResult]:
    if not point_dir.is_dir():
        return {}
    found = {}
    results, _unreadable = load_results([point_dir])
    for result in results:
        key = (result.sweep or {}).get("key")
        if key:
            found[key] = result
    return found


def _recorded(status: str, args: list[str], message: str, point_dir: Path, sweep: dict, spec: dict | None = None,
              extra: dict | None = None) -> RunResult:
    """A result the sweep writes itself for a point that did not (or could not) run."""
    result = RunResult(run_id=new_run_id(sweep["point"], "sweep"), status=status,
                       spec=spec or {"run_args": args}, started_at=utc_now())
    result.error = {"type": status.capitalize(), "message": message, "traceback": None, "rank": None,
                    **(extra or {})}
    result.sweep = sweep
    result.finished_at = utc_now()
    write_result(result, point_dir)
    return result


def _plan_problem(spec, catalog, devices: dict) -> tuple[str, dict] | None:
    """Why the planner predicts the point will not fit, with the prediction.
    ``devices`` caches (backend name, capacity) per --device for the sweep, so
    the device is asked once, not once per point."""
    from hwbench.device import select_backend
    from hwbench.harness.device_check import device_capacity_bytes
    from hwbench.planner import fits, plan_memory

    if spec.device not in devices:
        backend = select_backend(spec.device)
        devices[spec.device] = (backend.name, device_capacity_bytes(backend, catalog))
    backend_name, capacity = devices[spec.device]
    if not capacity:
        return None
    plan = plan_memory(spec, catalog.workloads[spec.model].model, backend_name)
    if fits(plan, capacity):
        return None
    prediction = {"predicted_peak_bytes": plan.total_bytes, "capacity_bytes": capacity,
                  "plan": dataclasses.asdict(plan)}
    return (f"predicted peak {gib(plan.total_bytes, 1, unit=True)} per rank (stage {plan.stage}) does not fit "
            f"{gib(capacity, 1, unit=True)}; run with --no-plan to try anyway", prediction)


def run_one(args: list[str], point_dir: Path, sweep: dict, timeout_s: float,
            env: dict[str, str] | None = None) -> RunResult:
    """One `hwbench run` in its own process tree; a result whatever happens."""
    point_dir.mkdir(parents=True, exist_ok=True)
    log = point_dir / f"repeat{sweep['repeat']}.log"
    before = set(result_files([point_dir]))  # names only: earlier repeats are not read again
    with open(log, "w") as log_file:
        child = subprocess.Popen([sys.executable, "-m", "hwbench", "run", "--quiet", *args, "--out", str(point_dir)],
                                 stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                 env=child_environment({**os.environ, **(env or {}), SWEEP_ENV: json.dumps(sweep)}))
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end(child)
            return _recorded("timeout", args, f"the point ran past {timeout_s:g}s and was ended by the sweep",
                             point_dir, sweep)
        except BaseException:
            _stop(child)
            raise
    new = load_results(sorted(set(result_files([point_dir])) - before))[0]
    if new:
        return new[-1]
    last_line = next((line for line in reversed(log.read_text(errors="replace").splitlines()) if line.strip()), "")
    if child.returncode == 2:  # bad input or a missing device, found by `hwbench run` itself
        return _recorded("invalid", args, last_line.removeprefix("hwbench: error: "), point_dir, sweep)
    return _recorded("failed", args, f"`hwbench run` exited with status {child.returncode} and wrote no result: "
                                     f"{last_line}", point_dir, sweep)


def _stop(child: subprocess.Popen) -> None:
    """Ask the running point to stop (its launcher ends its ranks on SIGTERM),
    then make sure."""
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _end(child)


def _end(child: subprocess.Popen) -> None:
    from hwbench.harness.launcher import kill_tree

    kill_tree([child.pid])
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=10)


def aggregate(point: Point, results: list[RunResult]) -> dict[str, Any] | None:
    ok = [r for r in results if r.status == "ok"]
    if not ok:
        return None
    figures = {key: throughput_statistics([r.metrics[key] for r in ok])
               for key in ("samples_per_s", "tokens_per_s", "tflops_per_device")}
    return {"point": point.name, "repeats": len(results), "ok": len(ok),
            "seeds": [r.spec.get("seed") for r in results], "run_ids": [r.run_id for r in results], **figures}


def lock_path(out_dir: Path, suite_name: str) -> Path:
    """The lock of OUT/<suite>/, beside it (the suite folder holds only point folders)."""
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


def _point_dir(options: SweepOptions, suite: Suite, point: Point) -> Path:
    """OUT/<suite>/<point>, which must stay inside OUT whatever the names hold (suites
    check their names on load; a Suite built in code is checked here)."""
    root = options.out_dir.resolve()
    folder = options.out_dir / suite.name / point.name
    if folder.resolve().parent.parent != root:
        raise UsageError(f"suite {suite.name!r} point {point.name!r}: the names would put results outside --out "
                         f"{str(options.out_dir)!r}; give plain folder names")
    return folder


def run_sweep(suite: Suite, options: SweepOptions, show_progress: bool = True) -> list[PointRecord]:
    """Every point of ``suite`` (and every repeat), in order, holding the suite folder's
    lock. Raises SweepInterrupted after SIGINT/SIGTERM/SIGHUP, once the running point
    is cleaned up."""
    for point in suite.points:
        _point_dir(options, suite, point)
    with folder_lock(options.out_dir / suite.name, options.wait):
        return _run_points(suite, options, show_progress)


def _run_points(suite: Suite, options: SweepOptions, show_progress: bool) -> list[PointRecord]:
    from hwbench.catalog import load_catalog

    catalog = load_catalog()
    devices: dict = {}  # --device -> (backend name, capacity), for the planner
    records: list[PointRecord] = []
    total = len(suite.points) * options.repeats
    done, spent, ran = 0, 0.0, 0
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}

    def on_term(signal_number, _frame):
        raise SweepInterrupted(signal_number)

    for sig in previous:
        signal.signal(sig, on_term)
    try:
        for point in suite.points:
            point_dir = _point_dir(options, suite, point)
            record = PointRecord(point, [])
            records.append(record)
            existing = {} if options.force else _existing(point_dir)
            base_args, base_options = point_args(point, options), point_options(point, options)
            for repeat in range(options.repeats):
                args, run_options = list(base_args), base_options
                if options.repeats > 1:  # distinct seeds, logged in each result's spec.seed
                    seed = int(point.option("seed", 1234)) + repeat
                    args += ["--seed", str(seed)]
                    run_options = run_options.merged(seed=seed)
                key = result_key(args, repeat, dict(point.env))
                sweep = {"suite": suite.name, "suite_path": suite.path, "point": point.name, "repeat": repeat,
                         "repeats": options.repeats, "key": key}
                done += 1
                if key in existing:
                    record.results.append(existing[key])
                    record.reused += 1
                    _say(show_progress, f"[{done}/{total}] {point.name}: {existing[key].status} (kept from an "
                                        "earlier sweep; --force runs it again)")
                    continue
                eta = f", about {_duration(spent / ran * (total - done + 1))} left" if ran else ""
                _say(show_progress, f"[{done}/{total}] {point.name}" +
                     (f" repeat {repeat + 1}/{options.repeats}" if options.repeats > 1 else "") + f" running{eta}")
                started = time.monotonic()
                result = _run_point(point, args, run_options, point_dir, sweep, options, catalog, devices)
                if result.status not in ("skipped", "invalid"):
                    spent += time.monotonic() - started
                    ran += 1
                record.results.append(result)
                _say(show_progress, f"[{done}/{total}] {point.name}: {result.status}"
                     + (f" ({result.error['message']})" if result.error else ""))
            record.aggregate = aggregate(point, record.results) if options.repeats > 1 else None
            if record.aggregate:
                write_json_atomic(point_dir / AGGREGATE_FILE, record.aggregate)
    except KeyboardInterrupt:
        raise SweepInterrupted(signal.SIGINT) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return records


def _run_point(point, args, run_options, point_dir, sweep, options, catalog, devices) -> RunResult:
    from hwbench.spec import build_run_spec

    try:
        spec = build_run_spec(run_options.merged(out=str(point_dir)), catalog)
    except UsageError as error:
        return _recorded("invalid", args, str(error), point_dir, sweep)
    if options.plan:
        problem = _plan_problem(spec, catalog, devices)
        if problem:
            message, prediction = problem
            return _recorded("skipped", args, message, point_dir, sweep, spec=spec.to_dict(), extra=prediction)
    margin = TIMEOUT_MARGIN_S if spec.launch.world_size > 1 else 0.0  # the launcher enforces its own first
    return run_one(args, point_dir, sweep, spec.launch.timeout_s + margin, dict(point.env))


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(text, file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
