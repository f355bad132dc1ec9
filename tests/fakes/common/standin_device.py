"""What the CUDA, ROCm and Gaudi stand-ins share: a torch.cuda-like device API over the host CPU
(for hwbench's tests only; it drives no hardware). Each stand-in fills in the names and
figures of its device."""

from __future__ import annotations

import os
import time
import types

import torch


class HostEvent:
    """A timing event over time.perf_counter (milliseconds, as torch's events report)."""

    def __init__(self, enable_timing: bool = False, **_: object) -> None:
        self.time = None

    def record(self, stream=None) -> None:
        self.time = time.perf_counter()

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.time - self.time) * 1e3

    def synchronize(self) -> None:
        pass


# The process bound to the stand-in device (set_device called), as the NVML stand-in lists it among the
# processes with a compute context on the device: None until then.
BOUND = {"pid": None}


def visible_count(env: str, default: int = 1) -> int:
    """Devices listed in ``env`` (a comma list), else ``default``."""
    visible = os.environ.get(env)
    if visible is None:
        return default
    return len([part for part in visible.split(",") if part.strip()])


def device_api(module_name: str, visible_env: str, name: str, properties, memory_stats: dict) -> types.ModuleType:
    """A module with the calls hwbench's AcceleratorBackend makes, over the host CPU."""
    api = types.ModuleType(module_name)
    state = {"device": 0}
    api.__hwbench_stand_in__ = True
    api.is_available = lambda: True
    api.device_count = lambda: visible_count(visible_env)

    def set_device(index) -> None:
        index = int(getattr(index, "index", index) or 0)
        if not 0 <= index < api.device_count():
            raise RuntimeError(f"stand-in {module_name}: invalid device ordinal {index}")
        state["device"] = index
        BOUND["pid"] = os.getpid()

    api.set_device = set_device
    api.current_device = lambda: state["device"]
    api.get_device_name = lambda device=None: name
    api.get_device_properties = lambda device=None: properties
    api.synchronize = lambda device=None: None
    api.Event = HostEvent
    api.memory_stats = lambda device=None: dict(memory_stats)
    api.reset_peak_memory_stats = lambda device=None: None
    api.is_bf16_supported = lambda *args, **kwargs: True
    # the device's generator state, a ByteTensor as torch.cuda.get_rng_state returns (torch/cuda/random.py):
    # kept, never used to draw (the work runs on the host); torch.compile saves and restores it around
    # tracing wherever torch.cuda.is_available() (torch/_dynamo/convert_frame.py), and checkpoints keep it
    rng = {"state": torch.zeros(16, dtype=torch.uint8)}
    api.get_rng_state = lambda device="cuda": rng["state"].clone()

    def set_rng_state(new_state, device="cuda") -> None:
        rng["state"] = new_state.clone()

    api.set_rng_state = set_rng_state
    return api


TORCH_CUDA_CALLS = ("is_available", "device_count", "set_device", "current_device", "get_device_name",
                    "get_device_properties", "synchronize", "Event", "memory_stats", "reset_peak_memory_stats",
                    "is_bf16_supported", "get_rng_state", "set_rng_state")


def replace_torch_cuda(torch, visible_env: str, properties, memory_stats: dict) -> None:
    """Make the CPU build's ``torch.cuda`` answer as ``properties`` describe, over the host CPU,
    and mark it ``__hwbench_stand_in__`` (hwbench then computes on the host and marks results
    simulated). The CUDA and ROCm stand-ins differ only in the device and in torch.version."""
    api = device_api("torch.cuda", visible_env, properties.name, properties, memory_stats)
    for attribute in TORCH_CUDA_CALLS:
        setattr(torch.cuda, attribute, getattr(api, attribute))
    torch.cuda.__hwbench_stand_in__ = True
