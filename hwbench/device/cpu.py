"""The CPU backend: training on the host processor, with the tuning small-model
training on CPUs needs (docs/performance.md, "CPU").

Two things make small-model training slow on a CPU out of the box:

* glibc serves every allocation above its mmap threshold (128 KiB to 32 MiB) with
  a fresh mmap and returns it with munmap on free. Activations, gradients and the
  logits are reallocated every step, so each step faults in and zeroes gigabytes
  of new pages (measured: 460k minor faults, about half of a 2.2 s step of the
  `small` workload). Turning mmap and trimming off keeps freed memory in the
  heap for the next step: the faults vanish and the step time halves, at the
  price of a higher resident peak (the heap keeps what it grew to).
* A process that does not bound its threads to the cores it may use
  (affinity and cgroup quota, shared among the ranks on the host)
  oversubscribes them; intra-op threads are set from what is really available.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import re
from typing import Any

import torch

from hwbench.device.base import Backend, HostTimer, MemoryStats, StepTimer
from hwbench.device.telemetry import NoTelemetry, TelemetrySampler

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def usable_cores() -> int:
    """Cores this process may really use: its affinity mask, capped by a cgroup
    v2 CPU quota when one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


# Set to 0 to leave glibc's allocator as it is (lower resident peak, slower steps).
ALLOCATOR_TUNING_ENV = "HWBENCH_CPU_ALLOCATOR_TUNING"


def keep_freed_memory_in_heap() -> str:
    """Stop glibc from unmapping large freed blocks (see the module docstring).
    Returns what was done, for the result's record."""
    if os.environ.get(ALLOCATOR_TUNING_ENV, "1") == "0":
        return f"unchanged ({ALLOCATOR_TUNING_ENV}=0)"
    libc_name = ctypes.util.find_library("c")
    if platform.system() != "Linux" or not libc_name or "musl" in (libc_name or ""):
        return "unchanged (not glibc)"
    libc = ctypes.CDLL(libc_name)
    if not hasattr(libc, "mallopt"):
        return "unchanged (no mallopt)"
    mmap_ok = libc.mallopt(_M_MMAP_MAX, 0)
    trim_ok = libc.mallopt(_M_TRIM_THRESHOLD, -1)  # -1: never trim (mallopt(3))
    if mmap_ok and trim_ok:
        return "glibc: mmap off, trimming off (freed tensors reused without page faults)"
    return "unchanged (mallopt refused)"


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _read_status_kib(field: str) -> int | None:
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(re.findall(r"\d+", line)[0]) * 1024
    except OSError:
        pass
    return None


def _memory_capacity_bytes() -> int | None:
    capacity = None
    try:
        capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        if limit != "max":
            capacity = min(capacity or int(limit), int(limit))
    except (OSError, ValueError):
        pass
    return capacity


class CpuBackend(Backend):
    name = "cpu"
    dist_backend = "gloo"
    deepspeed_accelerator = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self._peak_reset_works = False

    def device_count(self) -> int:
        return 1

    def device_names(self) -> list[str]:
        return [_cpu_model()]

    def prepare_process(self, local_rank: int = 0, local_world_size: int = 1) -> torch.device:
        threads = max(1, usable_cores() // max(1, local_world_size))
        torch.set_num_threads(threads)
        self.tuning = {
            "intra_op_threads": threads,
            "usable_cores": usable_cores(),
            "allocator": keep_freed_memory_in_heap(),
        }
        return super().prepare_process(local_rank, local_world_size)

    def _set_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        pass  # CPU work is done when the call returns

    def step_timer(self) -> StepTimer:
        return HostTimer()

    def precision_problem(self, precision: str) -> str | None:
        return None  # autocast runs bf16 and fp16 on any CPU, slowly without bf16/fp16 units

    def optimizer_options(self) -> dict[str, Any]:
        return {"fused": True}  # fused CPU AdamW (torch >= 2.4)

    def reset_peak_memory(self) -> None:
        # Writing 5 to clear_refs resets VmHWM (peak resident set) on Linux.
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            self._peak_reset_works = True
        except OSError:
            self._peak_reset_works = False

    def memory_stats(self) -> MemoryStats:
        peak = _read_status_kib("VmHWM")
        unmeasured = {
            "peak_allocated_bytes": "the CPU allocator keeps no statistics; peak_reserved is the peak resident set",
            "alloc_retries": "no caching allocator on CPU",
            "ooms": "no caching allocator on CPU",
        }
        if peak is None:
            unmeasured["peak_reserved_bytes"] = "/proc/self/status is not readable"
        source = "VmHWM (peak resident set of the process"
        source += ", reset before the timed steps)" if self._peak_reset_works else ", since process start)"
        return MemoryStats(
            peak_allocated_bytes=None,
            peak_reserved_bytes=peak,
            capacity_bytes=_memory_capacity_bytes(),
            alloc_retries=None,
            ooms=None,
            source=source,
            unmeasured=unmeasured,
        )

    def telemetry_sampler(self, interval_s: float) -> TelemetrySampler:
        return NoTelemetry("no power or thermal sensors are read on the CPU backend", interval_s)

    def fingerprint(self) -> dict[str, Any]:
        flags = _cpu_flags()
        return {
            "device_models": self.device_names(),
            "device_count": 1,
            "cpu_cores_usable": usable_cores(),
            "cpu_matrix_units": sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "avx512f"}),
            "mkldnn": torch.backends.mkldnn.is_available(),
        }
