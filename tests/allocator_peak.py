"""The most bytes the CPU allocator held at once: what the tests hold the memory planner's
prediction (and the chunked loss) to. The torch profiler records every allocation and free of
the CPU allocator; their running sum, in order, is the bytes held, and its maximum the peak."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from hwbench.device.base import Backend
from hwbench.engine.distributed import DistContext
from hwbench.planner import MemoryPlan, plan_stage
from hwbench.spec import RunSpec
from hwbench.workload.config import GPTConfig


def peak_allocated_bytes(work: Callable[[], object]) -> int:
    """The most bytes the CPU allocator held at once while ``work`` ran, beyond what was
    held before: the running sum of the profiler's allocation and free records."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        work()
    records = sorted((e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"),
                     key=lambda e: e.start_ns())
    live = peak = 0
    for record in records:
        live += record.nbytes()
        peak = max(peak, live)
    return peak


@dataclasses.dataclass(frozen=True)
class StepPeak:
    measured: int  # bytes
    planned: int  # the planner's total less its per-device overhead (no tensor of the run's)
    plan: MemoryPlan

    @property
    def error(self) -> float:
        """(planned - measured) / measured: positive when the planner predicts more."""
        return (self.planned - self.measured) / self.measured


def measured_step_peak(spec: RunSpec, config: GPTConfig, steps: int = 2, ctx: DistContext | None = None,
                       backend: Backend | None = None) -> StepPeak:
    """hwbench's native engine built and run for ``steps`` training steps in this process on
    the CPU (the first makes the optimizer's state, the second starts with it), from an empty
    allocator: the peak of the whole, against the planner's prediction for ``spec`` (for this
    rank's pipeline stage when ``ctx`` is one rank of a torchrun job, with its prepared backend)."""
    from hwbench.device.cpu import CpuBackend
    from hwbench.engine.native import NativeEngine

    if backend is None:
        backend = CpuBackend()
        backend.prepare_process()
    generator = torch.Generator().manual_seed(ctx.rank if ctx else 0)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, config.vocab_size, (spec.micro_batch_size, spec.seq_length + 1),
                               generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def train() -> None:
        engine = NativeEngine(config, spec, backend, ctx)
        for _ in range(steps):
            engine.train_step(next_batch)

    measured = peak_allocated_bytes(train)
    plan = plan_stage(spec, config, "cpu", ctx.pp_rank if ctx else 0)
    return StepPeak(measured=measured, planned=plan.total_bytes - plan.overhead_bytes, plan=plan)
