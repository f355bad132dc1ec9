"""Injected faults and the per-rank heartbeat, for testing what a run does when
a rank fails, and for saying where each rank was when one did.

HWBENCH_FAULT (hidden: for tests and for drills) names one fault:
``RANK:STEP:KIND`` with KIND one of raise, oom, signal (SIGKILL itself), hang,
or slow (the rank sleeps SLOW_STEP_S at the start of that step and of every later
one: a device whose clock fell, for the steady-state drift check). The rank meets
it at the start of that step (1-based, warm-up included), in the first attempt of a
torchrun job only (a restart, --max-restarts, runs clean). In `hwbench collectives`
(hwbench/fabric/rank.py) a step is one measurement (a collective, form and size; then
each pair of the --slow-link ring), and a slow rank sleeps inside its timed sends of
the ring, so that its own link is the slow one.

HWBENCH_RUN_DIR, set by the launcher, is where each rank writes its heartbeat:
``rank<R>.json`` with its pid, host and last completed step, replaced after
every step (a few hundred bytes; no device sync). The launcher reads them after
a failure or a timeout.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from hwbench.errors import UsageError
from hwbench.files import write_json_atomic

FAULT_ENV = "HWBENCH_FAULT"
RUN_DIR_ENV = "HWBENCH_RUN_DIR"
# the sweep's record of the point (JSON), set for every process of a point; the result carries it
SWEEP_ENV = "HWBENCH_SWEEP"
# files in that run folder: rank 0's merged result, the torchrun agent's outcome
RESULT_FILE = "result.json"
AGENT_FILE = "agent.json"
FAULT_KINDS = ("raise", "oom", "signal", "hang", "slow")
SLOW_STEP_S = 2.0  # kind slow: far above the step-time noise of a tiny model on a shared CPU


class InjectedFault(RuntimeError):
    """The failure HWBENCH_FAULT asked for."""


@dataclasses.dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str

    @classmethod
    def from_environ(cls, world_size: int | None = None, total_steps: int | None = None) -> Fault | None:
        """The fault HWBENCH_FAULT names, checked against the run when its world size and
        step count are given: a fault the run can never meet is refused, not ignored."""
        text = os.environ.get(FAULT_ENV)
        if not text:
            return None
        try:
            rank, step, kind = text.split(":")
            fault = cls(int(rank), int(step), kind)
        except ValueError:
            raise UsageError(f"{FAULT_ENV}={text!r} is not accepted; give RANK:STEP:KIND, "
                             f"KIND one of {', '.join(FAULT_KINDS)}") from None
        if kind not in FAULT_KINDS:
            raise UsageError(f"{FAULT_ENV}={text!r}: KIND {kind!r} is not accepted; give one of "
                             f"{', '.join(FAULT_KINDS)}")
        if world_size is not None and not 0 <= fault.rank < world_size:
            raise UsageError(f"{FAULT_ENV}={text!r}: RANK {fault.rank} is not a rank of this run; accepted: 0 to "
                             f"{world_size - 1}")
        if total_steps is not None and not 1 <= fault.step <= total_steps:
            raise UsageError(f"{FAULT_ENV}={text!r}: STEP {fault.step} is not a step of this run; accepted: 1 to "
                             f"{total_steps} (warm-up included)")
        return fault

    def maybe_trigger(self, rank: int, step: int) -> None:
        if self.kind == "slow":
            if rank == self.rank and step >= self.step:
                time.sleep(SLOW_STEP_S)
            return
        if rank != self.rank or step != self.step:
            return
        if self.kind == "raise":
            raise InjectedFault(f"injected fault: rank {rank} raised at step {step}")
        if self.kind == "oom":
            # worded as the CUDA allocator words it, so the figures it carries are read as a real one's
            raise MemoryError(f"injected fault: rank {rank} out of memory at step {step}. "
                              "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which "
                              "512.00 MiB is free.")
        if self.kind == "signal":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang: never return, as a rank stuck in a collective would
            time.sleep(3600)


class Heartbeat:
    """Writes this rank's last completed step where the launcher can read it."""

    def __init__(self, rank: int, run_dir: str | None) -> None:
        self.rank = rank
        self.path = Path(run_dir) / f"rank{rank}.json" if run_dir else None
        self.record: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
                                       "step": 0, "phase": "setup"}  # JSON, read back by the launcher
        self._write()

    def step(self, step: int, phase: str, iteration: int | None = None) -> None:
        """``step`` of this run (1-based, warm-up included); ``iteration`` of the training
        (past the checkpoint it resumed from)."""
        self.record.update(step=step, phase=phase, iteration=step if iteration is None else iteration)
        self._write()

    def fail(self, status: str, message: str) -> None:
        """Note the moment this rank failed: of several failed ranks, the one that
        failed first is the root cause (the others lose their peer in a collective)."""
        self.record.update(failed_at=time.time(), status=status, message=message)
        self._write()

    def _write(self) -> None:
        if self.path is not None:  # no fsync: rewritten every step, read only after a failure
            write_json_atomic(self.path, self.record, durable=False)


def read_heartbeats(run_dir: str | Path) -> dict[int, dict]:
    """Every heartbeat in ``run_dir``, by rank (what a node's launcher can see:
    the ranks of its own node)."""
    beats = {}
    for path in sorted(Path(run_dir).glob("rank*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        beats[int(record["rank"])] = record
    return beats
