"""What a device really reaches: the dense GEMM rate per precision and the device-memory
copy bandwidth, measured through the Backend (its step timer: device events on CUDA/NPU,
the host clock on the CPU; its synchronize around the timed region).

GEMM: square matrix products C = A @ B of each size, inputs drawn from a normal
distribution (never zeros: zeros would let a device skip work and draw less power) and
several input sets rotated through, together at least ROTATION_BYTES, so no repetition
finds its operands in a cache the last one filled. The rate of a size is the median over
the timed repetitions; the ceiling of a precision is the best median over the sizes.

Copy: one device-to-device copy of a buffer of random bytes; the bandwidth counts the
bytes read plus the bytes written (2 x the buffer), as STREAM's copy does.

Each repetition lasts at least TARGET_REPETITION_S (several calls when one call is
shorter), so the timer's resolution and the launch overhead stay small beside it.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import time
from typing import Any, Callable

import torch

import hwbench
from hwbench.calibration import DEFAULT_REPEATS, DEFAULT_WARMUP
from hwbench.device.base import PRECISION_DTYPES, Backend
from hwbench.result.store import utc_now
from hwbench.stats import summarize
from hwbench.units import human_bytes
from hwbench.workload.flops import matmul_flops

TARGET_REPETITION_S = 0.01
MAX_CALLS_PER_REPETITION = 1000
ROTATION_BYTES = 256 * 2**20  # beyond the L2 of any GPU today (H100: 50 MiB)
MAX_INPUT_SETS = 16
MEMORY_SHARE = 0.8  # of the device's memory a measurement may take (fewer input sets first, then skipped)


@dataclasses.dataclass(frozen=True)
class CalibrationSettings:
    precisions: tuple[str, ...]
    sizes: tuple[int, ...]  # square GEMM sizes (n for n x n x n)
    copy_bytes: int  # the copied buffer; the bandwidth counts twice this per copy
    repeats: int = DEFAULT_REPEATS  # timed repetitions of each measurement
    warmup: int = DEFAULT_WARMUP  # untimed calls first (at least 1: they also size a repetition)
    seed: int = 1234


@dataclasses.dataclass
class Measurement:
    """One measured rate: a GEMM of one precision and size (FLOP/s), or the copy (bytes/s)."""

    kind: str  # "gemm" or "copy"
    precision: str | None  # GEMM only
    size: int  # GEMM: the matrix side n; copy: the buffer's bytes
    rate: dict[str, Any] | None  # stats.summarize() of the rate of every timed repetition
    calls_per_repetition: int = 0
    input_sets: int = 1
    skipped: str | None = None  # why it was not measured (out of memory)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Calibration:
    device_kind: str
    device_model: str
    driver: str
    settings: CalibrationSettings
    measurements: list[Measurement]
    measured_at: str

    def ceiling(self, precision: str) -> Measurement | None:
        """The size with the best median rate of ``precision``; None when none was measured."""
        measured = [m for m in self.measurements if m.kind == "gemm" and m.precision == precision and m.rate]
        return max(measured, key=lambda m: m.rate["median"]) if measured else None

    def copy(self) -> Measurement | None:
        return next((m for m in self.measurements if m.kind == "copy" and m.rate), None)

    def store_update(self) -> dict[str, Any]:
        """This calibration as the calibration store keeps it (hwbench/calibration/store.py)."""
        software = {"measured_at": self.measured_at, "torch_version": torch.__version__,
                    "hwbench_version": hwbench.__version__, "repeats": self.settings.repeats,
                    "warmup": self.settings.warmup}
        gemm = {}
        for precision in self.settings.precisions:
            best = self.ceiling(precision)
            if best is None:
                continue  # nothing measured: an older measurement stays
            gemm[precision] = {"ceiling_flops": best.rate["median"], "best_size": best.size,
                               "best_cv": best.rate["cv"], **software,
                               "sizes": [m.to_dict() for m in self.measurements
                                         if m.kind == "gemm" and m.precision == precision]}
        copy = self.copy()
        return {
            "device_kind": self.device_kind, "device_model": self.device_model, "driver": self.driver,
            "host": socket.gethostname(), "updated_at": self.measured_at, "gemm": gemm,
            "copy": {"bytes_per_s": copy.rate["median"], "cv": copy.rate["cv"], "buffer_bytes": copy.size,
                     "bytes_per_copy": 2 * copy.size, "rate": copy.rate,
                     "calls_per_repetition": copy.calls_per_repetition, **software} if copy else None,
        }


def calibrate(backend: Backend, device_model: str, driver: str, settings: CalibrationSettings,
              on_measured: Callable[[Measurement], None] = lambda measurement: None) -> Calibration:
    """Every GEMM (each precision x size) and the copy on ``backend`` (already prepared).
    ``on_measured`` is told of each measurement as it finishes (the command prints it)."""
    backend.seed(settings.seed)
    measured_at = utc_now()
    measurements = []
    for precision in settings.precisions:
        for size in settings.sizes:
            measurements.append(measure_gemm(backend, precision, size, settings))
            on_measured(measurements[-1])
    measurements.append(measure_copy(backend, settings.copy_bytes, settings))
    on_measured(measurements[-1])
    return Calibration(backend.name, device_model, driver, settings, measurements, measured_at)


def input_sets(set_bytes: int) -> int:
    """How many input sets to rotate through: together at least ROTATION_BYTES, 2 to MAX_INPUT_SETS."""
    return min(MAX_INPUT_SETS, max(2, math.ceil(ROTATION_BYTES / set_bytes)))


def memory_budget_bytes(backend: Backend) -> int | None:
    """What a measurement may allocate: MEMORY_SHARE of the device's memory (None: unknown)."""
    capacity = backend.memory_stats().capacity_bytes
    return int(capacity * MEMORY_SHARE) if capacity else None


def measure_gemm(backend: Backend, precision: str, size: int, settings: CalibrationSettings) -> Measurement:
    """The FLOP/s of size x size x size products in ``precision``; skipped with the reason when
    the inputs would not fit the device's memory, or the device runs out of it."""
    dtype = PRECISION_DTYPES[precision]
    element_bytes = torch.empty((), dtype=dtype).element_size()
    matrix_bytes = size * size * element_bytes
    sets = input_sets(2 * matrix_bytes)
    budget = memory_budget_bytes(backend)
    if budget is not None and (2 * sets + 1) * matrix_bytes > budget:  # fewer sets, down to 2
        sets = max(2, (budget // matrix_bytes - 1) // 2)
        if (2 * sets + 1) * matrix_bytes > budget:
            return Measurement("gemm", precision, size, None, input_sets=sets,
                               skipped=f"{human_bytes((2 * sets + 1) * matrix_bytes)} of inputs and output do not "
                                       f"fit {human_bytes(budget)} ({MEMORY_SHARE:.0%} of the device's memory)")
    device = backend.torch_device
    operands: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        operands = [(torch.randn(size, size, dtype=dtype, device=device),
                     torch.randn(size, size, dtype=dtype, device=device)) for _ in range(sets)]
        product = torch.empty(size, size, dtype=dtype, device=device)

        def call(index: int) -> None:
            a, b = operands[index % sets]
            torch.matmul(a, b, out=product)

        rate, calls = timed_rates(backend, call, matmul_flops(size, size, size), settings)
        if not bool(torch.isfinite(product).all()):
            raise RuntimeError(f"the {precision} {size}x{size} product is not finite: the GEMM went wrong")
    except Exception as error:
        if not backend.is_out_of_memory(error):
            raise
        return Measurement("gemm", precision, size, None, input_sets=sets,
                           skipped=f"out of memory ({sets} input sets of 2 x {size}x{size} {precision})")
    finally:
        operands.clear()
    return Measurement("gemm", precision, size, rate, calls, sets)


def measure_copy(backend: Backend, buffer_bytes: int, settings: CalibrationSettings) -> Measurement:
    """The bytes/s of copying a buffer of ``buffer_bytes`` random bytes to another on the
    device, counting what is read and what is written."""
    budget = memory_budget_bytes(backend)
    if budget is not None and 2 * buffer_bytes > budget:
        return Measurement("copy", None, buffer_bytes, None, skipped=f"two buffers of {human_bytes(buffer_bytes)} do "
                                                                     f"not fit {human_bytes(budget)}")
    device = backend.torch_device
    try:
        source = torch.randint(0, 256, (buffer_bytes,), dtype=torch.uint8, device=device)
        target = torch.empty_like(source)
        rate, calls = timed_rates(backend, lambda index: target.copy_(source), 2 * buffer_bytes, settings)
        if not torch.equal(source, target):
            raise RuntimeError("the copied buffer differs from its source: the copy went wrong")
    except Exception as error:
        if not backend.is_out_of_memory(error):
            raise
        return Measurement("copy", None, buffer_bytes, None, skipped="out of memory (2 buffers)")
    return Measurement("copy", None, buffer_bytes, rate, calls)


def timed_rates(backend: Backend, call: Callable[[int], Any], work_per_call: float,
                settings: CalibrationSettings) -> tuple[dict[str, Any], int]:
    """(stats.summarize() of work per second over ``settings.repeats`` timed repetitions,
    calls per repetition). The warm-up calls, each synchronised and timed on the host, size
    a repetition; the timed ones are marked by the backend's step timer with no host
    synchronisation between them, inside backend.measuring()."""
    fastest = math.inf
    for index in range(max(1, settings.warmup)):
        backend.synchronize()
        started = time.perf_counter()
        call(index)
        backend.synchronize()
        fastest = min(fastest, time.perf_counter() - started)
    calls = MAX_CALLS_PER_REPETITION if fastest <= 0 else \
        min(MAX_CALLS_PER_REPETITION, max(1, math.ceil(TARGET_REPETITION_S / fastest)))
    timer = backend.step_timer()
    with backend.measuring():
        timer.mark()
        for repetition in range(settings.repeats):
            for index in range(calls):
                call(repetition * calls + index)
            timer.mark()
    intervals = timer.intervals_s()
    rates = [work_per_call * calls / interval for interval in intervals if interval > 0]
    if len(rates) != settings.repeats or not all(math.isfinite(rate) for rate in rates):
        raise RuntimeError(f"the timer gave {intervals[:5]}...: not {settings.repeats} positive intervals")
    return summarize(rates), calls
