"""The most bytes the CPU allocator held at once: what the tests hold the memory planner's
prediction (and the chunked loss) to. The torch profiler records every allocation and free of
the CPU allocator made on the profiled thread; their running sum, in order, is the bytes held,
and its maximum the peak.

A collective on gloo runs on gloo's own threads, which the profiler does not watch: when a
tensor's last reference is dropped there (a temporary handed to an all-to-all, whose work object
outlives the Python call by a moment), its free is never recorded and the running sum would keep
it to the end (up to a fifth of an expert-parallel rank's peak, varying from run to run). Such a
free shows itself when the allocator hands out the same address again with no free recorded in
between; it is put at the end of the first collective that ended after the block was made (the
earliest moment a gloo thread can have dropped it), or at the new allocation if none did. A block
whose address is never used again stays unseen: tests/step_peak_ranks.py keeps each blocking
collective's tensors a moment after it returns, so that the last reference goes on this thread."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterator

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from hwbench.device.base import Backend
from hwbench.engine.distributed import DistContext
from hwbench.planner import MemoryPlan, plan_stage
from hwbench.spec import RunSpec
from hwbench.workload.config import GPTConfig


def peak_allocated_bytes(work: Callable[[], object]) -> int:
    """The most bytes the CPU allocator held at once while ``work`` ran, beyond what was
    held before: the running sum of the profiler's allocation and free records, with the frees
    made on gloo's threads put back (module doc)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        work()
    records: list[tuple[int, int, int]] = []  # (time, address, bytes: negative for a free)
    collectives_end: list[int] = []
    for node in _walk(profiler.profiler.kineto_results.experimental_event_tree()):
        kind, fields = node.typed
        if kind == _EventType.Allocation and fields.device.type == "cpu":
            records.append((node.start_time_ns, fields.ptr, fields.alloc_size))
        elif kind == _EventType.TorchOp and node.name.startswith("c10d::"):
            collectives_end.append(node.end_time_ns)
    records.sort()
    collectives_end.sort()
    changes = [(time, size) for time, _, size in records] + _unrecorded_frees(records, collectives_end)
    live = peak = 0
    for _, size in sorted(changes):
        live += size
        peak = max(peak, live)
    return peak


def _unrecorded_frees(records: list[tuple[int, int, int]], collectives_end: list[int]) -> list[tuple[int, int]]:
    """(time, -bytes) for each block whose address was allocated again with no free recorded."""
    held: dict[int, tuple[int, int]] = {}  # address -> (bytes, when allocated)
    frees = []
    for time, address, size in records:
        if size < 0:
            held.pop(address, None)
            continue
        if address in held:
            old_size, made = held[address]
            after = bisect.bisect_right(collectives_end, made)
            ended = collectives_end[after] if after < len(collectives_end) else time
            frees.append((min(ended, time), -old_size))
        held[address] = (size, time)
    return frees


def _walk(nodes: list) -> Iterator:
    for node in nodes:
        yield node
        yield from _walk(node.children)


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
