"""The CPU backend: training on the host processor, with the tuning small-model
training on CPUs needs (docs/performance.md, "CPU").

Two things make small-model training slow on a CPU out of the box:

* glibc serves every allocation above its mmap threshold (128 KiB to 32 MiB) with
  a fresh mmap and returns it with munmap on free. Activations, gradients and the
  logits are reallocated every step, so each step faults in and zeroes gigabytes
  of new pages (measured: 460k minor faults, about half of a 2.2 s step of the
  `small` workload). Turning mmap and trimming off keeps freed memory in the
  heap for the next step: the faults vanish and the step time halves, at the
  price of a higher resident peak. Left alone, that heap fragments and grows
  without end (measured on `small`: 2.5 GiB after 2 steps, 7.4 GiB after 45,
  about one logits tensor every few steps), so the heap is bounded: when the
  resident set after a step passes HEAP_BOUND_FACTOR x what it was after the
  first step, ``malloc_trim`` hands the free pages back (HeapBound).
* A process that does not bound its threads to the cores it may use
  (affinity and cgroup quota, shared among the ranks on the host)
  oversubscribes them; intra-op threads are set from what is really available.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import re
from typing import Any

import torch

from hwbench.device.base import Backend, HostSyncCount, HostTimer, MemoryStats, StepTimer
from hwbench.device.host import allowed_cpus, cpu_packages, share_of_cores, usable_cores
from hwbench.device.kinds import KINDS
from hwbench.device.rapl import RaplSampler
from hwbench.device.telemetry import TelemetrySampler

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


# Set to 0 to leave glibc's allocator as it is (lower resident peak, slower steps).
ALLOCATOR_TUNING_ENV = "HWBENCH_CPU_ALLOCATOR_TUNING"


# The tuned heap may grow to this many times its resident size after the first step
# before its free pages are handed back (docs/performance.md, "CPU").
HEAP_BOUND_FACTOR = 1.5


def keep_freed_memory_in_heap() -> tuple[str, HeapBound | None]:
    """Stop glibc from unmapping large freed blocks (see the module docstring).
    Returns what was done, for the result's record, and the bound to keep the
    heap in (None when the allocator was left alone)."""
    if os.environ.get(ALLOCATOR_TUNING_ENV, "1") == "0":
        return f"unchanged ({ALLOCATOR_TUNING_ENV}=0)", None
    libc_name = ctypes.util.find_library("c")
    if platform.system() != "Linux" or not libc_name or "musl" in (libc_name or ""):
        return "unchanged (not glibc)", None
    libc = ctypes.CDLL(libc_name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return "unchanged (no mallopt or malloc_trim)", None
    if _resident_bytes() is None:  # no way to bound the heap: do not let it grow unbounded
        return "unchanged (/proc/self/statm unreadable: the heap could not be bounded)", None
    mmap_ok = libc.mallopt(_M_MMAP_MAX, 0)
    trim_ok = libc.mallopt(_M_TRIM_THRESHOLD, -1)  # -1: never trim (mallopt(3))
    if mmap_ok and trim_ok:
        return (f"glibc: mmap off, trimming off (freed tensors reused without page faults); free pages handed "
                f"back when the resident set passes {HEAP_BOUND_FACTOR}x its size after the first step"), \
            HeapBound(libc.malloc_trim)
    return "unchanged (mallopt refused)", None


class HeapBound:
    """Keeps the tuned heap within HEAP_BOUND_FACTOR x the resident set after the
    first step. glibc's heap with mmap and trimming off reuses freed memory but
    fragments: a logits-sized request that fits no free hole grows the heap, for
    ever. After each step the resident set is read (/proc/self/statm); past the
    bound, ``malloc_trim(0)`` returns every free page (MADV_DONTNEED) and the next
    step faults back in what it needs: a slower step now and then instead of a
    process that grows until it is killed. Memory that is really in use and grew
    after the first step (optimizer state made late, say) stays resident through a
    trim: then the bound moves up to HEAP_BOUND_FACTOR x what is left, so the run
    does not trim at every step."""

    def __init__(self, malloc_trim: Any, factor: float = HEAP_BOUND_FACTOR) -> None:
        self._malloc_trim = malloc_trim
        self.factor = factor
        self.bound_bytes: int | None = None
        self.trims = 0

    def step_done(self) -> None:
        resident = _resident_bytes()
        if resident is None:
            return
        if self.bound_bytes is None:
            self.bound_bytes = int(resident * self.factor)
        elif resident > self.bound_bytes:
            self._malloc_trim(0)
            self.trims += 1
            left = _resident_bytes()
            if left is not None and left * self.factor > self.bound_bytes:
                self.bound_bytes = int(left * self.factor)


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _cpuinfo(*fields: str) -> str | None:
    """The first processor's value of the first of ``fields`` /proc/cpuinfo lists, else None."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(fields):
                return line.split(":", 1)[1]
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    model = _cpuinfo("model name")
    return model.strip() if model is not None else platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    """The first processor's feature flags (x86 "flags", Arm "Features")."""
    return set((_cpuinfo("flags", "Features") or "").split())


# The CPU features with which torch's oneDNN/ACL kernels compute bf16 and fp16 matrix products at
# speed; without them each is converted to and from fp32 around every operation. Measured on this
# project's 2-vCPU AMD EPYC (AVX2, none of these), `hwbench run --model tiny --steps 3`, 2026-11-25:
# 252 tokens/s in fp32, 20 in fp16, 19 in bf16.
_FAST_UNITS = {"bf16": ("avx512_bf16", "amx_bf16", "bf16"), "fp16": ("avx512_fp16", "amx_fp16", "asimdhp")}


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
    dist_backend = KINDS["cpu"].dist_backend
    deepspeed_accelerator = KINDS["cpu"].deepspeed_accelerator
    # torch's fp32 L2-norm kernel on the CPU sums into one float: the norm of a tiny
    # model's 6.4M-element embedding gradient came out 2.4e-4 low, 7.5e-4 by step 3
    # (pytorch/pytorch#169237). Reduced in fp64, as DeepSpeed's ZeRO does on the CPU.
    grad_norm_dtype = torch.float64
    exclusive_devices = False  # ranks share the CPU; oversubscription is judged by threads and cores

    def __init__(self) -> None:
        super().__init__()
        self._peak_reset_works = False
        self._heap: HeapBound | None = None

    def device_count(self) -> int:
        return 1

    def device_names(self) -> list[str]:
        return [_cpu_model()]

    def prepare_process(self, local_rank: int = 0, local_world_size: int = 1,
                        threads: int | None = None) -> torch.device:
        """``threads`` None: the usable cores shared among the ranks on this host."""
        chosen = threads if threads is not None else share_of_cores(local_world_size)
        allocator, self._heap = keep_freed_memory_in_heap()
        self.tuning = {
            "intra_op_threads": chosen,
            "usable_cores": usable_cores(),
            "allocator": allocator,
        }
        return super().prepare_process(local_rank, local_world_size, chosen)

    def _set_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    def devices_in_use(self) -> tuple[list[str], str]:
        """One device per CPU package (socket) the process may run on: ranks on one
        socket share one CPU, and the energy and price are the socket's."""
        packages, problem = cpu_packages(allowed_cpus())
        if packages is None:
            return ["cpu"], f"one CPU per node: {problem}"
        return [f"package-{p}" for p in packages], "CPU packages (sockets) of the cores the ranks may run on"

    def synchronize(self) -> None:
        pass  # CPU work is done when the call returns

    def step_timer(self) -> StepTimer:
        return HostTimer()

    def precision_problem(self, precision: str) -> str | None:
        return None  # autocast runs bf16 and fp16 on any CPU, slowly without bf16/fp16 units

    def slow_precision(self, precision: str) -> str | None:
        if precision == "fp8":
            return self.fp8_emulation()
        units = _FAST_UNITS.get(precision)
        if units is None or set(units) & _cpu_flags():
            return None
        return (f"this CPU ({_cpu_model()}) has no {precision} matrix units ({', '.join(units)}), so torch emulates "
                f"{precision}, many times slower than fp32 (docs/performance.md, 'CPU precisions')")

    def fp8_units(self, block_scaled: bool) -> tuple[bool | None, str]:
        return False, f"this CPU ({_cpu_model()}) has no FP8 matrix units"

    def fp8_emulation(self) -> str | None:
        # torch._scaled_mm has a CPU kernel taking float8_e4m3fn/e5m2 tensors: torchao's float8 training
        # runs its own code path to the GEMM, which the CPU then computes in software
        return (f"FP8 emulated on the CPU ({_cpu_model()}): no FP8 matrix units, torch computes the FP8 GEMMs in "
                "software, so the loss is FP8's and the speed no FP8 device's")

    def step_done(self) -> None:
        if self._heap is not None:
            self._heap.step_done()

    def reset_peak_memory(self) -> None:
        if self._heap is not None:
            self._heap.trims = 0  # counted over the timed steps, as the peak
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
        if self._heap is not None and self._heap.bound_bytes is not None:
            source += f"; tuned heap bounded at {self._heap.bound_bytes / 2**30:.2f} GiB resident"
        return MemoryStats(
            peak_allocated_bytes=None,
            peak_reserved_bytes=peak,
            capacity_bytes=_memory_capacity_bytes(),
            alloc_retries=None,
            ooms=None,
            source=source,
            unmeasured=unmeasured,
            heap_trims=self._heap.trims if self._heap is not None else None,
        )

    def driver(self) -> tuple[str | None, str | None]:
        """A CPU has no driver: the GEMM library torch was built with (its version) and the
        intra-op threads decide what it reaches, so they stand in for one."""
        threads = torch.get_num_threads()
        return f"torch {torch.__version__}, {threads} thread{'s' if threads != 1 else ''}", None

    def counting_host_syncs(self) -> contextlib.AbstractContextManager[HostSyncCount]:
        return contextlib.nullcontext(HostSyncCount(
            reason="the CPU runs each operation when it is called: there is no device for the host to wait for"))

    def telemetry_sampler(self, interval_s: float) -> TelemetrySampler:
        """RAPL package energy of the sockets this process may run on (all, when the
        topology is unknown); unavailable with the reason where RAPL is absent or unreadable."""
        packages, _ = cpu_packages(allowed_cpus())
        return RaplSampler(interval_s, packages=packages)

    def fingerprint(self) -> dict[str, Any]:
        flags = _cpu_flags()
        return {
            "device_models": self.device_names(),
            "device_count": 1,
            "cpu_cores_usable": usable_cores(),
            "cpu_matrix_units": sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "avx512f"}),
            "mkldnn": torch.backends.mkldnn.is_available(),
        }
