"""`hwbench sweep SUITE` (docs/sweeps.md): run_sweep, what the command and hwbench.sweep
call, is the point loop (hwbench.suites.executor) with LocalExecutor here or the Slurm
executor. Locally each point and repeat is its own `hwbench run` process tree under a
time limit; what a point cannot do is data, never the end of the sweep: a bad layout is
`invalid`, one the planner predicts will not fit `skipped`, a crash `failed`, a hang `timeout`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hwbench.errors import UsageError
from hwbench.harness.faults import SWEEP_ENV
from hwbench.lifeline import child_environment
from hwbench.paths import result_files
from hwbench.result.model import RunResult
from hwbench.result.store import load_results
from hwbench.suites.executor import (
    TIMEOUT_MARGIN_S,
    Executor,
    PointRecord,
    PointRun,
    Say,
    SweepOptions,
    duration,
    progress_lines,
    recorded,
    run_points,
)
from hwbench.suites.suite import Suite, find_suite, load_suite
from hwbench.units import gib

STOP_GRACE_S = 30.0


def run_sweep(suite: Suite | str | os.PathLike, options: SweepOptions, slurm=None,
              progress: bool = True, before_start: Callable[[], None] | None = None) -> list[PointRecord]:
    """Every point of ``suite`` (a Suite, a suite file or a shipped suite's name) and every
    repeat: here, one after another, or each a Slurm job when ``slurm`` (SlurmSettings)
    is given; a line on stderr per event with ``progress``. Raises SweepInterrupted on
    SIGINT/SIGTERM/SIGHUP. ``before_start``: hwbench.suites.executor.run_points."""
    if not isinstance(suite, Suite):
        suite = load_suite(find_suite(os.fspath(suite)))
    say = progress_lines(progress)
    if slurm is None:
        return run_points(suite, options, LocalExecutor(options.plan, say), say, before_start=before_start)
    from hwbench.suites.slurm import SlurmExecutor

    return run_points(suite, options, SlurmExecutor(slurm, options.force, say), say, before_start=before_start)


class LocalExecutor(Executor):
    """Each point as its own `hwbench run` process tree on this machine, one at a time,
    under the point's --timeout (plus TIMEOUT_MARGIN_S where its launcher enforces the
    timeout first); the memory planner asked first (``plan``)."""

    def __init__(self, plan: bool, say: Say) -> None:
        from hwbench.catalog import load_catalog

        self.plan, self.say = plan, say
        self.catalog = load_catalog()
        self.devices: dict[str, tuple[str, int | None]] = {}  # --device -> (backend, capacity): asked once
        self.spent, self.ran = 0.0, 0  # for the time left

    def submit(self, run: PointRun, kept: Path | None) -> RunResult:
        from hwbench.spec import build_run_spec

        try:
            spec = build_run_spec(run.options.merged(out=str(run.folder)), self.catalog)
        except UsageError as error:
            return recorded(run, "invalid", str(error))
        skipped = self._skipped(run, spec) if self.plan else None
        if skipped:
            return skipped
        eta = f", about {duration(self.spent / self.ran * run.left)} left" if self.ran else ""
        self.say(f"{run.label} running{eta}")
        started = time.monotonic()
        margin = TIMEOUT_MARGIN_S if spec.launch.world_size > 1 else 0.0  # the launcher enforces its own first
        result = run_one(run, spec.launch.timeout_s + margin)
        self.spent += time.monotonic() - started
        self.ran += 1
        return result

    def _skipped(self, run: PointRun, spec) -> RunResult | None:
        """The point `skipped` when the planner predicts it will not fit, with the prediction."""
        from hwbench.device import select_backend
        from hwbench.device_check import device_capacity_bytes
        from hwbench.planner import plan_memory

        if spec.device not in self.devices:
            backend = select_backend(spec.device)
            self.devices[spec.device] = (backend.name, device_capacity_bytes(backend, self.catalog))
        backend_name, capacity = self.devices[spec.device]
        if not capacity:
            return None
        plan = plan_memory(spec, self.catalog.workloads[spec.model].model, backend_name)
        if plan.fits(capacity):
            return None
        return recorded(run, "skipped", f"predicted peak {gib(plan.total_bytes, 1, unit=True)} per rank (stage "
                        f"{plan.stage}) does not fit {gib(capacity, 1, unit=True)}; run with --no-plan to try anyway",
                        spec=spec.to_dict(), extra={"predicted_peak_bytes": plan.total_bytes,
                                                    "capacity_bytes": capacity, "plan": dataclasses.asdict(plan)})


def run_one(run: PointRun, timeout_s: float) -> RunResult:
    """One `hwbench run` in its own process tree; a result whatever happens."""
    run.folder.mkdir(parents=True, exist_ok=True)
    log = run.folder / f"repeat{run.repeat}.log"
    before = set(result_files([run.folder]))  # names only: earlier repeats are not read again
    with open(log, "w") as log_file:
        child = subprocess.Popen([sys.executable, "-m", "hwbench", "run", "--quiet", *run.argv, "--out",
                                  str(run.folder)], stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                 env=child_environment({**os.environ, **run.env, SWEEP_ENV: json.dumps(run.sweep)}))
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end(child, grace_s=0)
            return recorded(run, "timeout", f"the point ran past {timeout_s:g}s and was ended by the sweep")
        except BaseException:
            _end(child, grace_s=STOP_GRACE_S)
            raise
    new = load_results(sorted(set(result_files([run.folder])) - before))[0]
    if new:
        return new[-1]
    last_line = next((line for line in reversed(log.read_text(errors="replace").splitlines()) if line.strip()), "")
    if child.returncode == 2:  # bad input or a missing device, found by `hwbench run` itself
        return recorded(run, "invalid", last_line.removeprefix("hwbench: error: "))
    return recorded(run, "failed", f"`hwbench run` exited with status {child.returncode} and wrote no result: "
                                   f"{last_line}")


def _end(child: subprocess.Popen, grace_s: float) -> None:
    """Ask the point to stop for ``grace_s`` (its launcher ends its ranks on SIGTERM), then end its tree."""
    from hwbench.harness.launcher import kill_tree

    if grace_s:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace_s)
    kill_tree([child.pid])
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=10)


def before_sweep(suite, options, estimate: bool = True) -> list[str]:
    """The lines `hwbench sweep` says before a local sweep starts: each device's slow precisions and
    the estimate of every point and repeat (points `hwbench run` would refuse are left out: the
    sweep records them as invalid)."""
    from hwbench.catalog import load_catalog
    from hwbench.device import select_backend
    from hwbench.harness.estimate import estimate_text, run_work, size_notes, slow_precision_warning
    from hwbench.spec import build_run_spec
    from hwbench.suites.executor import point_runs

    catalog = load_catalog()
    by_device: dict[str, list] = {}
    notes: list[str] = []
    for run in point_runs(suite, options, {}):
        try:
            spec = build_run_spec(run.options, catalog, check_paths=False)
        except UsageError:
            continue
        by_device.setdefault(spec.device, []).append(spec)
        notes += size_notes(run.options)
    lines = list(dict.fromkeys(notes))  # each point's --device-memory, each reading once
    for device, specs in by_device.items():
        backend = select_backend(device)
        for precision in sorted({spec.precision for spec in specs}):
            warning = slow_precision_warning(backend, precision)
            if warning:
                lines.append(f"warning: {warning}")
        what = f"{len(specs)} run(s) of suite {suite.name}" + (f" on --device {device}" if len(by_device) > 1 else "")
        note = (estimate_text(backend, [run_work(spec, catalog, backend) for spec in specs], what, once=True)
                if estimate else "")
        if note:
            lines.append(f"note: {note}")
    return lines
