"""The devices a run would use, read for `hwbench preflight` through their kind's management
tool, without torch (health.py says why): NVML for CUDA, AMD SMI for ROCm, npu-smi for Ascend,
the kernel for the CPU; Gaudi's HLML is not read yet."""

from __future__ import annotations

import os
from collections.abc import Mapping

from hwbench.device.amd_smi import amdsmi_health
from hwbench.device.health import DeviceReadings, cpu_health
from hwbench.device.npu_smi import npu_smi_health
from hwbench.device.nvml import nvml_health

READERS = {"npu": ("npu-smi", npu_smi_health), "cuda": ("nvml", nvml_health), "rocm": ("amdsmi", amdsmi_health)}


def read_devices(kind: str, environ: Mapping[str, str] = os.environ) -> DeviceReadings:
    """The devices of ``kind`` a run would use, each as its management tool describes it; for
    auto, the first kind in --device auto's order whose tool lists a device, else the CPU (a
    Gaudi, which torch finds, is not asked for)."""
    if kind == "auto":
        for candidate, (source, read) in READERS.items():
            devices, _reason = read(environ)
            if devices:
                return DeviceReadings(candidate, source, devices)
        kind = "cpu"
    if kind == "cpu":
        return DeviceReadings("cpu", "/proc, /sys", [cpu_health()])
    if kind not in READERS:
        return DeviceReadings(kind, "none", [], f"hwbench reads no preflight figures from the {kind} tools yet")
    source, read = READERS[kind]
    devices, reason = read(environ)
    return DeviceReadings(kind, source, devices, reason)
