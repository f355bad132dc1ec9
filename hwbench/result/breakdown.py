"""Where a profiled step's time went: a torch.profiler trace (Chrome/Perfetto JSON) read into a
TimeBreakdown, and the rank the others wait for.

torch-free, so that a report or a test reads a stored trace without torch. The rules, in order
(docs/methodology.md, "Where the time goes"):

- The timeline is the device's: its kernels, copies and sets where the trace has them (CUDA, ROCm);
  else (the CPU) the CPU ops of the thread that ran the steps, each instant charged to the
  innermost op covering it (an op's self time), and the collectives other threads ran meanwhile
  (gloo runs DDP's all-reduces on its own threads: the training thread's wait is no op of its own).
- An instant's category comes first from what the op or kernel ran inside (its enclosing ops, and
  for a kernel the CPU op that launched it, by the trace's "External id"): communication (gloo,
  NCCL, c10d, the functional collectives and their waits), data loading, the optimizer step,
  attention (SDPA, flash); else from its own name: matrix multiplies (aten::mm/addmm/bmm, *gemm*,
  cutlass, cublas), memory copies (aten::copy_, Memcpy/Memset), other compute.
- Where kernels overlap (streams), compute wins over copies and copies over communication, so
  that exposed communication is communication nothing else hid; communication_s is all of it.
- An instant no op or kernel covers is host/idle: Python, launch gaps, a rank's sleep.
- The steps are the profiler's ``ProfilerStep#N`` windows; figures are means per step.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hwbench.result.model import BREAKDOWN_CATEGORIES, TimeBreakdown, WaitStraggler

SUM_TOLERANCE = 0.01  # the categories sum to the step within 1% (a partition: only rounding of µs times)
# A rank is named as the one the others wait for when their median wait in collectives exceeds its
# own by more than this share of the (median) profiled step. Measured on a 2-core machine shared with
# other work, tiny model, --dp 2: with no fault the ranks' waits differed by 28% of a step (one rank's
# GEMMs got less CPU); with HWBENCH_FAULT=1:1:slow (rank 1 sleeps 2 s a step) by 89%. Half a step
# names a rank that costs its peers that much, not a busy machine's noise; the figures of every rank
# are in the result for smaller lags.
STRAGGLER_WAIT_SHARE = 0.50

STEP_ANNOTATION = re.compile(r"^ProfilerStep#(\d+)$")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "user_annotation")
DATA_ANNOTATION = "hwbench::data"  # the worker's record_function around a profiled step's batches

# Context rules: an op or kernel inside one of these is charged to it, in this order of precedence.
CONTEXT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("exposed_communication", re.compile(
        r"^(gloo:|nccl:|c10d::|_?c10d_functional::|record_param_comms|hccl|rccl)|nccl|"
        r"^(?!aten::).*(allreduce|all_reduce|allgather|all_gather|reduce_scatter|reducescatter|all_to_all|alltoall|"
        r"broadcast|barrier|sendrecv)",
        re.IGNORECASE)),
    ("data_loading", re.compile(rf"^({re.escape(DATA_ANNOTATION)}|enumerate\(DataLoader\))")),
    ("optimizer", re.compile(r"^Optimizer\.(step|zero_grad)|multi_tensor_apply|fused_adam|adam", re.IGNORECASE)),
    ("attention", re.compile(r"scaled_dot_product|attention|flash|fmha|sdpa", re.IGNORECASE)),
)
MATMUL = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|_scaled_mm|mv|dot)$|gemm|cutlass|cublas|wgmma|"
                    r"^ampere_|^sm\d+_xmma|hipblaslt|rocblas", re.IGNORECASE)
MEMORY_COPY = re.compile(r"^aten::copy_$|^Memcpy|^Memset|memcpy|memset", re.IGNORECASE)
# where kernels overlap, the first of these that runs is the instant's category
PRECEDENCE = ("matmul", "attention", "optimizer", "other_compute", "data_loading", "memory_copy",
              "exposed_communication")


class TraceError(ValueError):
    """A trace this module cannot read (not JSON, no traceEvents, no profiled step)."""


@dataclasses.dataclass(frozen=True)
class TraceEvent:
    """A complete ("X") event of the trace, times in microseconds."""

    name: str
    cat: str
    start: float
    end: float
    tid: Any = 0
    pid: Any = 0
    external_id: int | None = None


@dataclasses.dataclass(frozen=True)
class Interval:
    start: float
    end: float
    category: str


def read_trace(path: str | Path) -> list[TraceEvent]:
    """The complete events of a Chrome/Perfetto JSON trace (gzip'd or not) that torch.profiler wrote."""
    path = Path(path)
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError) as error:
        raise TraceError(f"{path}: not a readable JSON trace ({error})") from error
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents")
    return list(complete_events(events))


def complete_events(raw: Iterable[Any]) -> Iterable[TraceEvent]:
    for event in raw:
        if not isinstance(event, dict) or event.get("ph") != "X" or "dur" not in event or "ts" not in event:
            continue
        start, duration = float(event["ts"]), float(event["dur"])
        args = event.get("args")
        external = args.get("External id") if isinstance(args, dict) else None
        yield TraceEvent(name=str(event.get("name", "")), cat=str(event.get("cat", "")), start=start,
                         end=start + max(duration, 0.0), tid=event.get("tid", 0), pid=event.get("pid", 0),
                         external_id=external if isinstance(external, int) else None)


def context_category(name: str) -> str | None:
    """The category an op's or annotation's name gives to everything inside it, or None."""
    return next((category for category, rule in CONTEXT_RULES if rule.search(name)), None)


def own_category(name: str) -> str:
    """The category of an op or kernel by its own name (no context)."""
    if MATMUL.search(name):
        return "matmul"
    if MEMORY_COPY.search(name):
        return "memory_copy"
    return "other_compute"


def classify(name: str, enclosing: Sequence[str] = ()) -> str:
    """An op's or kernel's category: the first context rule any enclosing name or its own meets
    (in CONTEXT_RULES' order), else its own name's."""
    names = [*enclosing, name]
    for category, rule in CONTEXT_RULES:
        if any(rule.search(n) for n in names):
            return category
    return own_category(name)


def step_windows(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    """The profiler's step annotations, in step order."""
    steps = [e for e in events if STEP_ANNOTATION.match(e.name)]
    return sorted(steps, key=lambda e: int(STEP_ANNOTATION.match(e.name).group(1)))  # type: ignore[union-attr]


def host_intervals(events: Sequence[TraceEvent], tid: Any) -> list[Interval]:
    """The self time of every CPU op on thread ``tid`` (what its children leave), with its
    category from its own name and its enclosing ops'. Annotations' self time is no op: host/idle,
    unless a context (an optimizer step, a collective) names it."""
    ops = sorted((e for e in events if e.tid == tid and e.cat in HOST_CATEGORIES and not STEP_ANNOTATION.match(e.name)),
                 key=lambda e: (e.start, -e.end))
    intervals: list[Interval] = []
    stack: list[tuple[TraceEvent, str | None, float]] = []  # event, its context, where its self time resumes

    def close(until: float) -> None:
        """Pop the ops that ended by ``until``, each one's last self time with it."""
        while stack and stack[-1][0].end <= until:
            event, context, resume = stack.pop()
            _add_self(intervals, event, context, resume, event.end)
            if stack:
                parent, parent_context, _ = stack[-1]
                stack[-1] = (parent, parent_context, event.end)

    for op in ops:
        close(op.start)
        context = None
        if stack:
            parent, parent_context, resume = stack[-1]
            _add_self(intervals, parent, parent_context, resume, op.start)
            context = parent_context
        own = context_category(op.name)
        context = context if context is not None and _outranks(context, own) else own
        stack.append((op, context, op.start))
    close(float("inf"))
    return intervals


def _outranks(context: str, own: str | None) -> bool:
    order = [category for category, _ in CONTEXT_RULES]
    return own is None or order.index(context) <= order.index(own)


def _add_self(intervals: list[Interval], event: TraceEvent, context: str | None, start: float, end: float) -> None:
    end = min(end, event.end)
    if end <= start:
        return
    if context is not None:
        category = context
    elif event.cat == "user_annotation":
        return  # an annotation's own time runs no op: host/idle
    else:
        category = own_category(event.name)
    intervals.append(Interval(start, end, category))


def background_communication(events: Sequence[TraceEvent], tid: Any) -> list[Interval]:
    """Collectives that other threads ran while thread ``tid`` trained (gloo runs DDP's all-reduces on
    its own threads; the training thread's wait for them is no op of its own): communication, exposed
    where the training thread ran nothing meanwhile."""
    return [Interval(e.start, e.end, "exposed_communication") for e in events
            if e.tid != tid and e.cat in HOST_CATEGORIES and context_category(e.name) == "exposed_communication"]


def device_intervals(events: Sequence[TraceEvent]) -> list[Interval]:
    """Every kernel, copy and set, with its category from its own name and the context of the CPU
    op that launched it (the trace links them by External id)."""
    host_context: dict[int, str] = {}
    by_thread: dict[Any, list[TraceEvent]] = {}
    for event in events:
        if event.cat in HOST_CATEGORIES:
            by_thread.setdefault(event.tid, []).append(event)
    for thread_events in by_thread.values():
        for op, context in _contexts(thread_events):
            if op.external_id is not None and context is not None:
                host_context[op.external_id] = context
    intervals = []
    for event in events:
        if event.cat not in DEVICE_CATEGORIES:
            continue
        context = host_context.get(event.external_id) if event.external_id is not None else None
        own = "memory_copy" if event.cat != "kernel" else classify(event.name)
        intervals.append(Interval(event.start, event.end, context if context is not None and _outranks(
            context, context_category(event.name)) else own))
    return intervals


def _contexts(events: list[TraceEvent]) -> Iterable[tuple[TraceEvent, str | None]]:
    """Each op of one thread with the context its enclosing ops and its own name give it."""
    stack: list[tuple[TraceEvent, str | None]] = []
    for op in sorted(events, key=lambda e: (e.start, -e.end)):
        while stack and stack[-1][0].end <= op.start:
            stack.pop()
        parent = stack[-1][1] if stack else None
        own = context_category(op.name)
        context = parent if parent is not None and _outranks(parent, own) else own
        stack.append((op, context))
        yield op, context


def partition(window: tuple[float, float], intervals: Sequence[Interval]) -> dict[str, float]:
    """Seconds of each category in ``window`` (µs in), every instant charged once (PRECEDENCE where
    intervals overlap, host_idle where none is), plus "communication": all of it, hidden or not.
    One sweep over the intervals' ends: a count of the running intervals per category."""
    low, high = window
    edges: list[tuple[float, int, str]] = [(low, 0, "host_idle"), (high, 0, "host_idle")]
    for interval in intervals:
        if interval.end > low and interval.start < high:
            edges.append((max(interval.start, low), 1, interval.category))
            edges.append((min(interval.end, high), -1, interval.category))
    edges.sort(key=lambda edge: edge[0])
    running = dict.fromkeys(PRECEDENCE, 0)
    seconds = dict.fromkeys(BREAKDOWN_CATEGORIES, 0.0)
    communication, previous = 0.0, low
    for at, change, category in edges:
        if at > previous:
            charged = next((c for c in PRECEDENCE if running[c] > 0), "host_idle")
            seconds[charged] += at - previous
            communication += (at - previous) if running["exposed_communication"] > 0 else 0.0
            previous = at
        if change:
            running[category] += change
    return {**{c: s / 1e6 for c, s in seconds.items()}, "communication": communication / 1e6}


def breakdown(events: Sequence[TraceEvent], rank: int, trace: str | None = None) -> TimeBreakdown:
    """One rank's breakdown of its trace: the mean over its profiled steps."""
    steps = step_windows(events)
    if not steps:
        raise TraceError("the trace has no ProfilerStep# annotation: no profiled step")
    device = [e for e in events if e.cat in DEVICE_CATEGORIES]
    intervals = device_intervals(events) if device else [*host_intervals(events, steps[0].tid),
                                                         *background_communication(events, steps[0].tid)]
    per_step = [partition((step.start, step.end), intervals) for step in steps]
    step_s = statistics.fmean((step.end - step.start) / 1e6 for step in steps)
    mean = {key: statistics.fmean(figures[key] for figures in per_step) for key in per_step[0]}
    return TimeBreakdown(
        rank=rank, trace=trace, steps=len(steps), step_s=step_s,
        timeline="device kernels, copies and sets" if device else "CPU ops of the thread that ran the steps",
        **{f"{category}_s": mean[category] for category in BREAKDOWN_CATEGORIES},
        communication_s=mean["communication"],
        shares={category: mean[category] / step_s if step_s > 0 else 0.0 for category in BREAKDOWN_CATEGORIES},
    )


def waiting_straggler(ranks: Sequence[TimeBreakdown]) -> WaitStraggler | None:
    """The rank the others wait for: the one that waits least in collectives (exposed communication
    per step), named when the other ranks' median wait exceeds its own by more than STRAGGLER_WAIT_SHARE
    of the median step; None with one rank, or when nobody holds the others back."""
    known = [r for r in ranks if r.rank is not None and r.exposed_communication_s is not None and r.step_s]
    if len(known) < 2:
        return None
    least = min(known, key=lambda r: r.exposed_communication_s or 0.0)
    peers = statistics.median(r.exposed_communication_s or 0.0 for r in known if r is not least)
    step = statistics.median(r.step_s or 0.0 for r in known)
    lag = peers - (least.exposed_communication_s or 0.0)
    if step <= 0 or lag <= STRAGGLER_WAIT_SHARE * step:
        return None
    return WaitStraggler(rank=least.rank, wait_s=least.exposed_communication_s, peers_wait_s=peers, lag_s=lag,
                         lag_share=lag / step)
