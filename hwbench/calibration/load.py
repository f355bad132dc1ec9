"""How busy the machine was while a calibration measured: a ceiling measured beside other
work is not a ceiling.

Host: the load average (1 minute, at the start and the end), and the share of the CPU time
of the CPUs this process may run on that went to anything else while it measured (other
processes, the kernel's work for them, and time a hypervisor gave to other guests, "steal"):
the busy time of those CPUs in /proc/stat, less this process's own CPU time, over their whole
time. The load average is kept for the record, but it lags (a one-minute average) and counts
the calibration's own threads; the share is what the judgement reads.

Device: the other processes computing on it, where the backend can list them (NVML on CUDA);
null with the reason elsewhere.

Imports no torch.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

PROC_STAT = Path("/proc/stat")


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    wall_s: float
    own_cpu_s: float  # this process, every thread
    busy_s: float | None  # the allowed CPUs' busy time, every process (None: /proc/stat unreadable)
    total_s: float | None
    load_average: float | None


def _cpu_times(cpus: set[int], stat: Path) -> tuple[float | None, float | None]:
    """(busy, total) seconds of ``cpus`` since boot from /proc/stat's per-CPU lines: busy is user,
    nice, system, irq, softirq and steal (guest time is inside user); idle and iowait are not."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None, None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (int(value) for value in (fields + ["0"] * 8)[:8])
        busy += user + nice + system + irq + softirq + steal
        total += user + nice + system + idle + iowait + irq + softirq + steal
    return (busy / ticks, total / ticks) if total else (None, None)


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


class HostLoad:
    """The host's load over a window: ``start()``, then ``stop()`` for the figures."""

    def __init__(self, stat: Path = PROC_STAT) -> None:
        from hwbench.device.host import allowed_cpus, usable_cores

        self._stat = stat
        self._cpus = set(allowed_cpus())
        self._usable = usable_cores()
        self._start: _Snapshot | None = None

    def _snapshot(self) -> _Snapshot:
        busy, total = _cpu_times(self._cpus, self._stat)
        return _Snapshot(time.monotonic(), time.process_time(), busy, total, _load_average())

    def start(self) -> None:
        self._start = self._snapshot()

    def stop(self) -> dict[str, Any]:
        """load_average_1m at the start and the end, usable_cores, seconds, and others_cpu_share:
        the share of the allowed CPUs' time that went to anything but this process (null with
        others_cpu_share_unmeasured where /proc/stat could not be read)."""
        if self._start is None:
            raise RuntimeError("HostLoad.stop() before start()")
        start, end = self._start, self._snapshot()
        figures: dict[str, Any] = {
            "seconds": end.wall_s - start.wall_s, "usable_cores": self._usable, "cpus": len(self._cpus),
            "load_average_1m_start": start.load_average, "load_average_1m_end": end.load_average,
            "others_cpu_share": None, "others_cpu_share_unmeasured": None}
        if (start.busy_s is None or end.busy_s is None or start.total_s is None or end.total_s is None
                or end.total_s <= start.total_s):
            figures["others_cpu_share_unmeasured"] = f"{self._stat} gave no CPU times for this process's CPUs"
            return figures
        others = (end.busy_s - start.busy_s) - (end.own_cpu_s - start.own_cpu_s)
        figures["others_cpu_share"] = min(1.0, max(0.0, others / (end.total_s - start.total_s)))
        return figures
