"""What CUDA GPUs, AMD GPUs (ROCm), Ascend NPUs and Gaudi HPUs share: torch_npu and
habana_frameworks mirror torch.cuda as torch.npu and torch.hpu, and ROCm builds of torch
drive AMD GPUs through torch.cuda itself, so one class drives them all through that module."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch

from hwbench.device.base import Backend, EventTimer, MemoryStats, StepTimer


class AcceleratorBackend(Backend):
    """A backend over a torch.cuda-like module (``torch.cuda`` or ``torch.npu``)."""

    device_type: str  # torch's device type (a ROCm GPU is torch's "cuda")

    # counters the caching allocator keeps since the process started, never reset: the timed
    # window's are their difference across it (memory_stats after reset_peak_memory)
    WINDOW_COUNTERS = ("num_alloc_retries", "num_ooms")

    def __init__(self, api: ModuleType) -> None:
        super().__init__()
        self.api = api
        self.local_index = 0
        self._counters_at_reset: dict[str, int] = {}

    def device_count(self) -> int:
        return int(self.api.device_count())

    def device_names(self) -> list[str]:
        return [str(self.api.get_device_name(i)) for i in range(self.device_count())]

    def _mark_stand_in(self, runtime: Any) -> None:
        """A stand-in runtime (tests/fakes: it sets ``__hwbench_stand_in__``) computes on the host:
        the results are simulated, and there is no NCCL, RCCL or HCCL there."""
        self.simulated = bool(getattr(runtime, "__hwbench_stand_in__", False))
        if self.simulated:
            self.dist_backend = "gloo"

    def _set_device(self, local_rank: int) -> torch.device:
        self.local_index = local_rank
        self.api.set_device(local_rank)
        return torch.device("cpu") if self.simulated else torch.device(self.device_type, local_rank)

    def visible_id(self, variable: str) -> int:
        """This rank's device as the vendor's tool numbers it: its entry in the environment's
        ``variable`` (the ids the runtime numbers from 0), else its local index."""
        ids = [int(part) for part in os.environ.get(variable, "").split(",") if part.strip().isdigit()]
        return ids[self.local_index] if self.local_index < len(ids) else self.local_index

    def synchronize(self) -> None:
        self.api.synchronize()

    def rng_states(self) -> dict[str, torch.Tensor]:
        return {**super().rng_states(), self.name: self.api.get_rng_state()}  # this rank's device

    def set_rng_states(self, states: dict[str, torch.Tensor]) -> None:
        super().set_rng_states(states)
        if self.name in states:
            self.api.set_rng_state(states[self.name])

    def devices_in_use(self) -> tuple[list[str], str]:
        return [f"{self.name}:{self.local_index}"], f"the {self.name} device each rank is bound to"

    def step_timer(self) -> StepTimer:
        return EventTimer(self.api.Event)

    def reset_peak_memory(self) -> None:
        try:
            stats = self.api.memory_stats()
        except Exception:  # an old runtime without memory_stats: memory_stats() says so
            stats = {}
        self._counters_at_reset = {key: int(stats[key]) for key in self.WINDOW_COUNTERS if key in stats}
        self.api.reset_peak_memory_stats()

    def memory_stats(self) -> MemoryStats:
        unmeasured: dict[str, str] = {}
        stats: dict[str, Any] = {}
        try:
            stats = dict(self.api.memory_stats())
        except Exception as error:  # an old runtime without memory_stats
            unmeasured["memory_stats"] = f"{type(error).__name__}: {error}"

        def stat(key: str, field: str) -> int | None:
            if key in stats:
                return int(stats[key]) - self._counters_at_reset.get(key, 0)
            unmeasured.setdefault(field, f"memory_stats() has no '{key}'")
            return None

        return MemoryStats(
            peak_allocated_bytes=stat("allocated_bytes.all.peak", "peak_allocated_bytes"),
            peak_reserved_bytes=stat("reserved_bytes.all.peak", "peak_reserved_bytes"),
            capacity_bytes=self._capacity_bytes(unmeasured),
            alloc_retries=stat("num_alloc_retries", "alloc_retries"),
            ooms=stat("num_ooms", "ooms"),
            source=f"torch.{self.name}.memory_stats() of the caching allocator",
            unmeasured=unmeasured,
        )

    def compute_units(self) -> int | None:
        try:
            count = getattr(self.api.get_device_properties(self.local_index), "multi_processor_count", None)
        except Exception:  # a runtime without device properties
            return None
        return int(count) if count else None

    def _capacity_bytes(self, unmeasured: dict[str, str]) -> int | None:
        try:
            return int(self.api.get_device_properties(self.local_index).total_memory)
        except Exception as error:
            unmeasured["capacity_bytes"] = f"{type(error).__name__}: {error}"
            return None
