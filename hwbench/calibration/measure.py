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

Before the first measurement the device runs the largest GEMM for a while (the device
warm-up), so it is measured at the clocks and temperature of sustained work. Each size's
repetitions together last at least ``min_time_s`` (each one at least TARGET_REPETITION_S,
several calls when one call is shorter), as a training step does, not a burst of a few
milliseconds. The device's SM clock during each size's timed repetitions comes from the
Backend's telemetry (NVML on CUDA), or null with the reason where it reports none (the CPU).
"""

from __future__ import annotations

import dataclasses
import math
import socket
import time
from collections.abc import Callable
from typing import Any

import torch

import hwbench
from hwbench.calibration import DEFAULT_DEVICE_WARMUP_S, DEFAULT_MIN_TIME_S, DEFAULT_REPEATS, DEFAULT_WARMUP
from hwbench.calibration.load import HostLoad
from hwbench.calibration.store import not_a_ceiling
from hwbench.device.base import PRECISION_DTYPES, Backend
from hwbench.errors import SetupError, UsageError
from hwbench.result.store import utc_now
from hwbench.stats import summarize
from hwbench.units import human_bytes
from hwbench.workload.flops import matmul_flops

TARGET_REPETITION_S = 0.01
MAX_CALLS_PER_REPETITION = 1_000_000  # a bound against a mis-sized repetition, far above any real need
# repetitions measured again, longer, when they fell short of min_time_s: a device that sped up
# after the sizing (a GPU's clock rising, a CPU whose other load went away) can make one retry
# fall short too; each retry aims 25 % beyond, and six of them are still only seconds
MAX_TIMING_ATTEMPTS = 6
RETRY_MARGIN = 1.25
CLOCK_SAMPLE_INTERVAL_S = 0.1  # telemetry during a size's timed repetitions: about 10 samples a second
SIXTEEN_BIT_FIRST = ("bf16", "fp16", "fp32")  # the device warm-up's precision: training's, the most power
ROTATION_BYTES = 256 * 2**20  # beyond the L2 of any GPU today (H100: 50 MiB)
MAX_INPUT_SETS = 16
MEMORY_SHARE = 0.8  # of the device's memory a measurement may take (fewer input sets first, then skipped)


@dataclasses.dataclass(frozen=True)
class CalibrationSettings:
    precisions: tuple[str, ...]
    sizes: tuple[int, ...]  # square GEMM sizes (n for n x n x n)
    copy_bytes: int  # the copied buffer; the bandwidth counts twice this per copy
    repeats: int = DEFAULT_REPEATS  # timed repetitions of each measurement
    warmup: int = DEFAULT_WARMUP  # untimed calls first (at least 1)
    min_time_s: float = DEFAULT_MIN_TIME_S  # each measurement's repetitions together last at least this
    device_warmup_s: float = DEFAULT_DEVICE_WARMUP_S  # the largest GEMM before the first measurement; 0: none
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
    timed_s: float | None = None  # the timed repetitions together (at least settings.min_time_s)
    # the device's SM clock during the timed repetitions: mean, min, max (MHz) and samples
    sm_clock_mhz: dict[str, Any] | None = None
    sm_clock_unmeasured: str | None = None  # why sm_clock_mhz is null

    @property
    def measured(self) -> dict[str, Any]:
        """``rate`` of a measurement that has one (callers keep only those)."""
        assert self.rate is not None, f"{self.kind} {self.precision or ''} {self.size}: not measured"
        return self.rate


@dataclasses.dataclass
class Calibration:
    device_kind: str
    device_model: str
    driver: str
    settings: CalibrationSettings
    measurements: list[Measurement]
    measured_at: str
    # the device warm-up: precision, size, seconds (None with the reason when none ran)
    device_warmup: dict[str, Any] | None = None
    device_warmup_skipped: str | None = None
    # how busy the machine was while measuring (hwbench.calibration.load, measured_conditions)
    conditions: dict[str, Any] = dataclasses.field(default_factory=dict)

    def ceiling(self, precision: str) -> Measurement | None:
        """The size with the best median rate of ``precision``; None when none was measured."""
        measured = [m for m in self.measurements if m.kind == "gemm" and m.precision == precision and m.rate]
        return max(measured, key=lambda m: m.measured["median"]) if measured else None

    def copy(self) -> Measurement | None:
        return next((m for m in self.measurements if m.kind == "copy" and m.rate), None)

    def not_a_ceiling(self, precision: str) -> list[str]:
        """Why the best rate of ``precision`` is not the device's ceiling (hwbench.calibration.store.
        not_a_ceiling: implausible, spread, the machine busy); empty when it is one or none was measured."""
        best = self.ceiling(precision)
        if best is None:
            return []
        return not_a_ceiling(self.device_kind, best.measured["median"], best.measured["cv"], self.conditions)

    def store_update(self) -> dict[str, Any]:
        """This calibration as the calibration store keeps it (hwbench/calibration/store.py); a
        precision whose rate is not a ceiling is marked ``unreliable`` with why."""
        software = {"measured_at": self.measured_at, "torch_version": torch.__version__,
                    "hwbench_version": hwbench.__version__, "repeats": self.settings.repeats,
                    "warmup": self.settings.warmup, "min_time_s": self.settings.min_time_s,
                    "device_warmup": self.device_warmup, "conditions": self.conditions}
        gemm = {}
        for precision in self.settings.precisions:
            best = self.ceiling(precision)
            if best is None:
                continue  # nothing measured: an older measurement stays
            gemm[precision] = {"ceiling_flops": best.measured["median"], "best_size": best.size,
                               "best_cv": best.measured["cv"], "unreliable": "; ".join(self.not_a_ceiling(precision))
                               or None, **software,
                               "sizes": [dataclasses.asdict(m) for m in self.measurements
                                         if m.kind == "gemm" and m.precision == precision]}
        copy = self.copy()
        return {
            "device_kind": self.device_kind, "device_model": self.device_model, "driver": self.driver,
            "host": socket.gethostname(), "updated_at": self.measured_at, "gemm": gemm,
            "copy": {"bytes_per_s": copy.measured["median"], "cv": copy.measured["cv"], "buffer_bytes": copy.size,
                     "bytes_per_copy": 2 * copy.size, "rate": copy.measured,
                     "calls_per_repetition": copy.calls_per_repetition, **software} if copy else None,
        }


def calibrate(backend: Backend, device_model: str, driver: str, settings: CalibrationSettings,
              on_measured: Callable[[Measurement], None] = lambda measurement: None) -> Calibration:
    """The device warm-up, then every GEMM (each precision x size) and the copy on ``backend``
    (already prepared). ``on_measured`` is told of each measurement as it finishes (the command
    prints it)."""
    backend.seed(settings.seed)
    measured_at = utc_now()
    warmed, not_warmed = warm_up_device(backend, settings)
    measurements = []
    host = HostLoad()
    host.start()
    before, _ = backend.other_processes()
    for precision in settings.precisions:
        for size in settings.sizes:
            measurements.append(measure_gemm(backend, precision, size, settings))
            on_measured(measurements[-1])
    measurements.append(measure_copy(backend, settings.copy_bytes, settings))
    on_measured(measurements[-1])
    conditions = measured_conditions(host.stop(), before, *backend.other_processes())
    return Calibration(backend.name, device_model, driver, settings, measurements, measured_at, warmed, not_warmed,
                       conditions)


def measured_conditions(host: dict[str, Any], before: list[dict[str, Any]] | None,
                        after: list[dict[str, Any]] | None, unlisted: str | None) -> dict[str, Any]:
    """What the calibration stores of the machine's load: the host's figures over the measurements
    and the other processes on the device at their start or end (each once; null with the reason
    where the backend cannot list them)."""
    processes = None
    if after is not None:
        seen: dict[Any, dict[str, Any]] = {}
        for process in (before or []) + after:
            seen.setdefault(process.get("pid"), process)
        processes = list(seen.values())
    return {"host": host, "device_processes": processes, "device_processes_unmeasured": unlisted}


def warm_up_device(backend: Backend, settings: CalibrationSettings) -> tuple[dict[str, Any] | None, str | None]:
    """Run the largest GEMM that fits, in the 16-bit precision measured if any (training's, which
    draws the most power), for settings.device_warmup_s: (what ran, None) or (None, why not)."""
    if settings.device_warmup_s <= 0:
        return None, "--device-warmup 0"
    precision = next(p for p in (*SIXTEEN_BIT_FIRST, *settings.precisions) if p in settings.precisions)
    budget = memory_budget_bytes(backend)
    dtype = PRECISION_DTYPES[precision]
    for size in sorted(settings.sizes, reverse=True):
        if budget is not None and 3 * size * size * dtype.itemsize > budget:
            continue
        try:
            a, b = (torch.randn(size, size, dtype=dtype, device=backend.torch_device) for _ in range(2))
            product = torch.empty(size, size, dtype=dtype, device=backend.torch_device)
            calls, started = 0, time.perf_counter()
            while time.perf_counter() - started < settings.device_warmup_s:
                torch.matmul(a, b, out=product)
                backend.synchronize()  # the host clock then measures the device's work
                calls += 1
            seconds = time.perf_counter() - started
            return {"precision": precision, "size": size, "seconds": seconds, "calls": calls}, None
        except Exception as error:
            if not backend.is_out_of_memory(error):
                raise
            continue  # a smaller size
    return None, f"no size of {precision} fits the device's memory"


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
    matrix_bytes = size * size * dtype.itemsize
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

        timing = timed_rates(backend, call, matmul_flops(size, size, size), settings)
        if not bool(torch.isfinite(product).all()):
            raise RuntimeError(f"the {precision} {size}x{size} product is not finite: the GEMM went wrong")
    except Exception as error:
        if not backend.is_out_of_memory(error):
            raise
        return Measurement("gemm", precision, size, None, input_sets=sets,
                           skipped=f"out of memory ({sets} input sets of 2 x {size}x{size} {precision})")
    finally:
        operands.clear()
    return Measurement("gemm", precision, size, input_sets=sets, **dataclasses.asdict(timing))


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
        timing = timed_rates(backend, lambda index: target.copy_(source), 2 * buffer_bytes, settings)
        if not torch.equal(source, target):
            raise RuntimeError("the copied buffer differs from its source: the copy went wrong")
    except Exception as error:
        if not backend.is_out_of_memory(error):
            raise
        return Measurement("copy", None, buffer_bytes, None, skipped="out of memory (2 buffers)")
    return Measurement("copy", None, buffer_bytes, **dataclasses.asdict(timing))


@dataclasses.dataclass
class Timing:  # a measurement's timed figures, named as Measurement's fields
    rate: dict[str, Any]  # stats.summarize() of work per second over the timed repetitions
    calls_per_repetition: int
    timed_s: float  # the timed repetitions together
    sm_clock_mhz: dict[str, Any] | None
    sm_clock_unmeasured: str | None


def timed_rates(backend: Backend, call: Callable[[int], Any], work_per_call: float,
                settings: CalibrationSettings) -> Timing:
    """``settings.repeats`` timed repetitions of ``call``, together at least ``settings.min_time_s``.
    The warm-up calls and a sizing run (calls doubled until they last TARGET_REPETITION_S,
    synchronised and timed on the host) size a repetition; the timed ones are marked by the
    backend's step timer with no host synchronisation between them, inside backend.measuring(),
    with the backend's telemetry sampling the clock. Repetitions that fell short of min_time_s
    (the device sped up after the sizing) are measured again, longer."""
    for index in range(max(1, settings.warmup)):
        call(index)
    backend.synchronize()
    per_call = _seconds_per_call(backend, call)
    target = max(TARGET_REPETITION_S, settings.min_time_s / settings.repeats)
    calls = _calls_for(target, per_call)
    for _ in range(MAX_TIMING_ATTEMPTS):
        intervals, clock, unmeasured = _timed_repetitions(backend, call, calls, settings.repeats)
        timed = sum(intervals)
        if timed >= settings.min_time_s or timed <= 0 or calls >= MAX_CALLS_PER_REPETITION:
            break  # (no time at all: the check below names the timer's fault)
        # the whole shortfall at once, RETRY_MARGIN beyond, so as not to fall just short again
        calls = max(calls + 1, _calls_for(target, timed / (calls * settings.repeats) / RETRY_MARGIN))
    rates = [work_per_call * calls / interval for interval in intervals if interval > 0]
    if len(rates) != settings.repeats or not all(math.isfinite(rate) for rate in rates):
        raise RuntimeError(f"the timer gave {intervals[:5]}...: not {settings.repeats} positive intervals")
    return Timing(summarize(rates), calls, timed, clock, unmeasured)


def _calls_for(seconds: float, per_call: float) -> int:
    if per_call <= 0:
        return MAX_CALLS_PER_REPETITION
    return min(MAX_CALLS_PER_REPETITION, max(1, math.ceil(seconds / per_call)))


def _seconds_per_call(backend: Backend, call: Callable[[int], Any]) -> float:
    """A call's time on the host clock, from back-to-back calls (doubled until they last
    TARGET_REPETITION_S), so one call's launch and synchronisation do not dominate it."""
    count = 1
    while True:
        backend.synchronize()
        started = time.perf_counter()
        for index in range(count):
            call(index)
        backend.synchronize()
        elapsed = time.perf_counter() - started
        if elapsed >= TARGET_REPETITION_S or count >= MAX_CALLS_PER_REPETITION:
            return elapsed / count
        count *= 2


def _timed_repetitions(backend: Backend, call: Callable[[int], Any], calls: int,
                       repeats: int) -> tuple[list[float], dict[str, Any] | None, str | None]:
    """(each repetition's seconds, the SM clock over them or None, and why None)."""
    sampler = backend.telemetry_sampler(CLOCK_SAMPLE_INTERVAL_S)
    timer = backend.step_timer()
    sampler.start()
    try:
        with backend.measuring():
            timer.mark()
            for repetition in range(repeats):
                for index in range(calls):
                    call(repetition * calls + index)
                timer.mark()
    finally:
        summary = sampler.stop()
    clock, unmeasured = sm_clock(sampler, summary)
    return timer.intervals_s(), clock, unmeasured


def sm_clock(sampler, summary: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The first device's SM clock while the repetitions ran (mean, min, max in MHz, samples):
    the samples inside the window only, since the first and last are taken at the
    synchronisations around it, with the device idle and its clock on the way down. None and
    the reason: telemetry unavailable, no sample inside the window, or no clock among them."""
    if not summary.get("available"):
        return None, f"{summary.get('source')} telemetry unavailable: {summary.get('reason')}"
    inside = sampler.inside_samples()
    if not inside:
        return None, (f"no {summary.get('source')} sample inside the timed repetitions (one every "
                      f"{sampler.interval_s:g} s; --min-time is shorter)")
    values = [readings[0]["sm_clock_mhz"] for _, readings in inside
              if readings and readings[0].get("sm_clock_mhz") is not None]
    if not values:
        return None, f"{summary.get('source')} telemetry reports no SM clock for this device"
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "samples": len(values)}, None


# What `hwbench calibrate` decides before measuring -------------------------------------

def open_backend(device: str, threads: int | None) -> Backend:
    """The device to calibrate, prepared for measuring (``threads``: the CPU's intra-op threads,
    None: its usable cores). UsageError or SetupError, with the reason, before anything is measured."""
    from hwbench.device import select_backend

    backend = select_backend(device)
    if threads is not None and backend.name != "cpu":
        raise UsageError(f"--threads {threads} is for --device cpu; this is {backend.name}: leave it out")
    if threads is not None:
        from hwbench.device.host import usable_cores

        # more threads than cores measures contention, not the CPU: the ceiling of an oversubscribed
        # configuration, which no run should be compared with (docs/methodology.md, 'Measured ceiling')
        cores = usable_cores()
        if threads > cores:
            raise UsageError(f"--threads {str(threads)!r} is not accepted; accepted: an integer from 1 to {cores} "
                             "(the cores this process may use)")
    if backend.simulated:
        raise SetupError(f"--device {backend.name}: the device is simulated (a stand-in runtime on the host CPU); "
                         "there is nothing to calibrate")
    backend.prepare_process(threads=threads)
    return backend


def device_key(backend: Backend) -> tuple[str, str]:
    """(device model, driver): what a calibration is stored under; SetupError without a driver."""
    from hwbench.device_check import device_model_name

    driver, problem = backend.driver()
    if driver is None:
        raise SetupError(f"--device {backend.name}: the driver could not be read ({problem}); a ceiling is kept per "
                         "device model and driver, so it could not be matched to a run")
    return device_model_name(backend), driver


def device_precisions(backend: Backend, requested: tuple[str, ...] | None) -> tuple[tuple[str, ...], list[str]]:
    """(the precisions to measure, each default one the device lacks with why). ``requested``
    None: the device kind's defaults; a requested precision the device lacks is bad input."""
    from hwbench.calibration import DEFAULT_PRECISIONS

    wanted = requested or DEFAULT_PRECISIONS[backend.name]
    problems = {p: backend.precision_problem(p) for p in wanted}
    if requested is not None:
        for precision, problem in problems.items():
            if problem:
                raise UsageError(f"--precisions {precision}: {problem}")
    return tuple(p for p in wanted if not problems[p]), [f"{p}: {problems[p]}" for p in wanted if problems[p]]
