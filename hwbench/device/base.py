"""The device protocol every vendor backend implements (docs/architecture.md, "The device layer").

Everything outside hwbench/device talks to hardware only through ``Backend``.
A query a device cannot answer gives None plus a reason, never an exception.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import re
import time
from collections.abc import Iterator
from typing import Any

import torch

from hwbench.device.host import allowed_cpus, share_of_cores, usable_cores
from hwbench.device.telemetry import TelemetrySampler

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# autocast's dtype of each --precision: fp8 (torchao's float8 GEMMs, hwbench.engine.float8) runs the
# rest of the step in bf16 autocast, as a bf16 run
AUTOCAST_DTYPES = {**PRECISION_DTYPES, "fp8": torch.bfloat16}


@dataclasses.dataclass
class MemoryStats:
    """Peak memory of this process's device since the last reset, in bytes, and the
    allocator's retries and out-of-memory errors since then (the timed window's).
    A None field comes with its reason in ``unmeasured``."""

    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    capacity_bytes: int | None
    alloc_retries: int | None
    ooms: int | None
    source: str
    unmeasured: dict[str, str] = dataclasses.field(default_factory=dict)
    # CPU: times the tuned heap was handed back to the system at its bound (CpuBackend.step_done)
    heap_trims: int | None = None


class StepTimer(abc.ABC):
    """Marks step boundaries without synchronising; ``intervals_s`` (called after
    the device is synchronised) gives the time between consecutive marks."""

    @abc.abstractmethod
    def mark(self) -> None: ...

    @abc.abstractmethod
    def intervals_s(self) -> list[float]: ...

    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether every mark has been reached, so intervals_s does not wait; asked without waiting."""


class HostTimer(StepTimer):
    """For devices whose work is done when the call returns (the CPU)."""

    def __init__(self) -> None:
        self._marks: list[float] = []

    def mark(self) -> None:
        self._marks.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        return [b - a for a, b in zip(self._marks, self._marks[1:])]

    def ready(self) -> bool:
        return True


class EventTimer(StepTimer):
    """Device events recorded in the stream: device time, no host sync per step."""

    def __init__(self, event_factory) -> None:
        self._event_factory = event_factory
        self._events: list[Any] = []

    def mark(self) -> None:
        event = self._event_factory(enable_timing=True)
        event.record()
        self._events.append(event)

    def intervals_s(self) -> list[float]:
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self._events, self._events[1:])]

    def ready(self) -> bool:
        # the stream runs the events in order: the last one done means all are (a query, no wait)
        return not self._events or bool(self._events[-1].query())


_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_REQUESTED = re.compile(r"Tried to allocate ([\d.]+) ?([KMGT]i?B|B)")
_FREE = re.compile(r"([\d.]+) ?([KMGT]i?B|B) (?:is )?free")


def oom_figures(message: str) -> dict[str, int]:
    """The bytes an out-of-memory error asked for and the bytes the device had
    free, from the allocator's message (CUDA: "Tried to allocate 2.00 GiB. GPU 0
    has a total capacity of 79.10 GiB of which 1.23 GiB is free"; torch_npu:
    "Tried to allocate 2.00 GiB (NPU 0; ...; 1.23 GiB free; ...)"). Only what
    the message says; an empty dict when it says neither."""
    figures = {}
    for key, pattern in (("requested_bytes", _REQUESTED), ("free_bytes", _FREE)):
        match = pattern.search(message)
        if match:
            figures[key] = int(float(match.group(1)) * _UNITS[match.group(2)])
    return figures


@dataclasses.dataclass
class HostSyncCount:
    """How often the host waited for the device in a region, and where (the first few
    call sites, "file:line"); count None with the reason where the backend cannot tell."""

    count: int | None = None
    where: list[str] = dataclasses.field(default_factory=list)
    reason: str | None = None


@dataclasses.dataclass
class Placement:
    """Where a process runs (Backend.placement): torch's intra-op threads, the CPUs it may run
    on, its usable cores, the devices it computes on and how they were found."""

    threads: int
    cpus: list[int]
    usable_cores: int
    devices: list[str]
    devices_basis: str
    exclusive_devices: bool  # each rank needs a device of its own (Backend.exclusive_devices)


class Backend(abc.ABC):
    """One vendor's way of doing the things a benchmark needs."""

    name: str  # "cpu", "cuda", "npu"
    dist_backend: str  # process-group backend: gloo, nccl, hccl
    deepspeed_accelerator: str  # the DS_ACCELERATOR value that matches
    simulated: bool = False  # True when a stand-in replaces the vendor runtime
    passed_over: tuple[str, ...] = ()  # set by --device auto: installed accelerators it could not use, and why
    # dtype the engines reduce each gradient's norm in (None: torch's get_total_norm as is)
    grad_norm_dtype: torch.dtype | None = None
    # Whether each rank needs a device of its own (GPUs, NPUs) or ranks share one (the
    # CPU): ranks sharing an exclusive device make a run oversubscribed.
    exclusive_devices: bool = True

    def __init__(self) -> None:
        # What the backend changed in this process to run well, recorded in results.
        self.tuning: dict[str, Any] = {}
        self.torch_device = torch.device("cpu")

    # identity -------------------------------------------------------------
    @abc.abstractmethod
    def device_count(self) -> int: ...

    @abc.abstractmethod
    def device_names(self) -> list[str]: ...

    # control --------------------------------------------------------------
    def prepare_process(self, local_rank: int = 0, local_world_size: int = 1,
                        threads: int | None = None) -> torch.device:
        """Bind this process to its device and apply the backend's tuning. ``threads``
        (--threads-per-rank) sets torch's intra-op threads; None: this rank's share of the usable
        cores (torch's own default counts the machine's cores, beyond a container's CPU quota)."""
        torch.set_num_threads(threads if threads is not None else share_of_cores(local_world_size))
        self.torch_device = self._set_device(local_rank)
        return self.torch_device

    @abc.abstractmethod
    def _set_device(self, local_rank: int) -> torch.device: ...

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    # placement --------------------------------------------------------------
    @abc.abstractmethod
    def devices_in_use(self) -> tuple[list[str], str]:
        """The devices this process computes on, named so that they are distinct on
        its node, and how they were found: for counting the devices a run used."""

    def placement(self) -> Placement:
        """Where this process runs (after prepare_process). Rank 0 judges oversubscription and
        counts the devices used from every rank's."""
        devices, basis = self.devices_in_use()
        return Placement(torch.get_num_threads(), allowed_cpus(), usable_cores(), devices, basis,
                         self.exclusive_devices)

    @abc.abstractmethod
    def step_timer(self) -> StepTimer: ...

    def to_device(self, host_tensor: torch.Tensor) -> torch.Tensor:
        """Move a freshly made host tensor (a data batch) to the device."""
        return host_tensor.to(self.torch_device, non_blocking=True)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)  # seeds every device torch knows, CPU included

    def rng_states(self) -> dict[str, torch.Tensor]:
        """This process's random-number generator states, by generator (a checkpoint keeps them)."""
        return {"cpu": torch.get_rng_state()}

    def set_rng_states(self, states: dict[str, torch.Tensor]) -> None:
        """Restore what ``rng_states`` returned."""
        torch.set_rng_state(states["cpu"])

    # precision ------------------------------------------------------------
    def precision_problem(self, precision: str) -> str | None:
        """Why this device cannot train in ``precision``, or None when it can."""
        return None

    def slow_precision(self, precision: str) -> str | None:
        """Why this device runs ``precision`` far slower than its fast precisions (it has no units
        for it, so torch emulates it), or None when it has fast ones. Accelerators run fp16 and bf16
        in their matrix units unless their backend says otherwise."""
        return None

    def fast_precisions(self) -> list[str]:
        """The precisions this device runs at speed: what to suggest in place of a slow one."""
        return [p for p in PRECISION_DTYPES if self.precision_problem(p) is None and self.slow_precision(p) is None]

    def autocast(self, precision: str) -> contextlib.AbstractContextManager:
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.torch_device.type, dtype=AUTOCAST_DTYPES[precision])

    # FP8 ------------------------------------------------------------------
    def fp8_units(self, block_scaled: bool) -> tuple[bool | None, str]:
        """Whether this device has the matrix units FP8 training needs (``block_scaled``: those of the
        MX formats, scales per block of 32 elements): (True, which), (False, why not), or (None, why
        this backend cannot tell: then the device's catalog entry decides, hwbench.device_check)."""
        return None, f"the {self.name} backend does not read FP8 support from the device"

    def fp8_emulation(self) -> str | None:
        """Why FP8 runs emulated here (a device without FP8 units whose FP8 GEMMs torch computes
        anyway: the CPU), else None. An emulated run's result is marked so and has no MFU."""
        return None

    def optimizer_options(self) -> dict[str, Any]:
        """Keyword arguments for torch.optim.AdamW that run fastest here (device/kinds.py): kwargs, open."""
        from hwbench.device.kinds import KINDS

        return {"fused": True} if KINDS[self.name].fused_adamw else {"foreach": True}

    # memory ---------------------------------------------------------------
    def step_done(self) -> None:
        """Called after every training step, inside its timed interval (so what it
        costs is in the step time). The CPU backend bounds its heap here; nothing to do elsewhere."""
        return None

    @abc.abstractmethod
    def reset_peak_memory(self) -> None: ...

    @abc.abstractmethod
    def memory_stats(self) -> MemoryStats: ...

    def is_out_of_memory(self, error: BaseException) -> bool:
        if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
            return True
        text = str(error).lower()
        return "out of memory" in text or "can't allocate memory" in text

    # telemetry and environment --------------------------------------------
    @abc.abstractmethod
    def telemetry_sampler(self, interval_s: float) -> TelemetrySampler: ...

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """Driver, runtime and library versions and device models (vendor part, open: recorded as is
        in the result's environment; hwbench.device.fingerprint adds what every backend shares)."""

    def power_limit_watts(self) -> tuple[float | None, str]:
        """(the power limit of this process's device in watts, what it is: the board's default
        limit, say), or (None, why not). Tells apart models that report the same name."""
        return None, f"the {self.name} backend reports no power limit"

    def device_identity(self) -> dict[str, Any]:
        """What names this device beyond its model, open: each vendor's keys go into the result's
        ``device`` section as they are (a ROCm GPU's gfx architecture, a Gaudi's execution mode)."""
        return {}

    def compute_units(self) -> int | None:
        """Compute units (SMs, CUs) of this process's device, where the runtime reports them: a
        partitioned device has fewer than the data sheet's figures count."""
        return None

    def driver(self) -> tuple[str | None, str | None]:
        """(the software under torch that sets this device's achievable rates, None and why
        when it cannot be read). Measured ceilings (hwbench calibrate) are kept per device
        model and this, so a driver update asks for a new calibration."""
        return None, f"the {self.name} backend does not name its driver"

    def other_processes(self) -> tuple[list[dict[str, Any]] | None, str | None]:
        """(the other processes computing on this process's device now, each {"pid", "memory_bytes"}, as recorded;
        None and why when the backend cannot list them). A calibration measured beside them
        measures a shared device, not its ceiling."""
        return None, f"the {self.name} backend does not list the processes on its device"

    def counting_host_syncs(self) -> contextlib.AbstractContextManager[HostSyncCount]:
        """A context that counts the times the host waits for the device inside it (nothing
        in the timed steps should: every wait leaves the device idle while Python catches
        up). Backends that cannot count say why."""
        return contextlib.nullcontext(HostSyncCount(reason=f"the {self.name} backend cannot count host waits"))

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Bracket a timed region with device synchronisation."""
        self.synchronize()
        try:
            yield
        finally:
            self.synchronize()
