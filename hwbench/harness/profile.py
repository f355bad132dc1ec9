"""--profile: torch.profiler over extra training steps after the timed window.

The profiled steps come after the timed steps, their validation and their checkpoint save, so
no figure of the timed window (step times, throughput, memory, telemetry, losses) includes a
profiled step or the profiler's overhead. Each rank writes its own trace (Chrome/Perfetto JSON,
gzip'd) into ``<out>/<run id>.profile/rank-<N>.json.gz``, beside the result, and reads it back
into its TimeBreakdown (hwbench.result.breakdown); rank 0 merges them (hwbench.harness.merge).
The reading lives in hwbench/result (torch-free, for readers of stored traces); the running here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from torch.profiler import ProfilerActivity, profile, record_function, schedule, supported_activities

from hwbench.result.breakdown import DATA_ANNOTATION, TraceError, breakdown, read_trace
from hwbench.result.model import TimeBreakdown

PROFILER_WARMUP_STEPS = 1  # run under the profiler and discarded: its start-up costs stay out of the trace
TRACE_FOLDER_SUFFIX = ".profile"
Fetched = TypeVar("Fetched")


@dataclasses.dataclass(frozen=True)
class ProfilePlan:
    """Where this rank's trace goes and how many steps it covers."""

    out_dir: str  # the result's folder
    folder: str  # the traces' folder, relative to out_dir
    steps: int  # profiled (active) steps
    rank: int

    @property
    def trace(self) -> str:
        """This rank's trace, relative to out_dir."""
        return os.path.join(self.folder, f"rank-{self.rank}.json.gz")


def trace_folder(run_id: str) -> str:
    """The traces' folder beside ``<run id>.json``."""
    return f"{run_id}{TRACE_FOLDER_SUFFIX}"


def activities(device_kind: str) -> list[ProfilerActivity]:
    """The CPU's ops, and on a device the activities this torch build records there (kernels and
    copies on CUDA and ROCm); no vendor API is named here: torch says what it supports."""
    if device_kind == "cpu":
        return [ProfilerActivity.CPU]
    return [ProfilerActivity.CPU, *(a for a in supported_activities() if a != ProfilerActivity.CPU)]


def with_data_annotation(next_batch: Callable[[], Fetched]) -> Callable[[], Fetched]:
    """``next_batch`` marked in the trace, so the breakdown charges fetching a batch to data loading."""

    def fetch() -> Fetched:
        with record_function(DATA_ANNOTATION):
            return next_batch()

    return fetch


def profile_steps(plan: ProfilePlan, device_kind: str, first_step: int, train: Callable[[int], None]) -> TimeBreakdown:
    """Run PROFILER_WARMUP_STEPS + plan.steps training steps (``train(step)``, numbered from
    ``first_step``) under torch.profiler, write the trace and read it back. A failure of training
    is raised as any step's; one of writing or reading the trace is the breakdown's unmeasured reason."""
    path = Path(plan.out_dir) / plan.trace
    problems: list[str] = []

    def export(profiler: profile) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(path))  # gzip'd: the name ends in .gz
        except (OSError, RuntimeError) as error:  # a folder that is a file, a full disk, no permission
            problems.append(f"the trace could not be written to {path}: {error}")

    wait = schedule(wait=0, warmup=PROFILER_WARMUP_STEPS, active=plan.steps, repeat=1)
    with profile(activities=activities(device_kind), schedule=wait, on_trace_ready=export) as profiler:
        for index in range(PROFILER_WARMUP_STEPS + plan.steps):
            train(first_step + index)
            profiler.step()
    if problems:
        return TimeBreakdown(rank=plan.rank, trace=None, unmeasured={"breakdown": problems[0]})
    try:
        return breakdown(read_trace(path), plan.rank, plan.trace)
    except TraceError as error:
        return TimeBreakdown(rank=plan.rank, trace=plan.trace, unmeasured={"breakdown": str(error)})


def profile_or_reason(plan: ProfilePlan, device_kind: str, first_step: int, distributed: bool,
                      train: Callable[[int], None]) -> TimeBreakdown:
    """profile_steps; alone, a step that fails under the profiler (the profiler's own memory can run a
    device out) is the breakdown's reason, and the timed figures already taken are kept. As a rank
    it is raised: the other ranks would wait for this one in the step's collectives."""
    try:
        return profile_steps(plan, device_kind, first_step, train)
    except Exception as error:
        if distributed:
            raise
        message = (str(error).strip().splitlines() or [""])[0]
        return TimeBreakdown(rank=plan.rank, trace=None,
                             unmeasured={"breakdown": f"a profiled step failed: {type(error).__name__}: {message}"})
