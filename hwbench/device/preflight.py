"""The devices a run would use, read for `hwbench preflight` through their kind's management
tool, without torch (health.py says why): each kind's reader is named in the registry
(device/kinds.py): NVML for CUDA, AMD SMI for ROCm, npu-smi for Ascend, HLML for Gaudi, the
kernel for the CPU."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from hwbench.device.health import DeviceReadings
from hwbench.device.kinds import AUTO_ORDER, FALLBACK_KIND, KINDS, import_named

Reader = Callable[[Mapping[str, str]], tuple[list, "str | None"]]
# kind -> (the tool read, its reader), in --device auto's order
READERS: dict[str, tuple[str, Reader]] = {
    name: (KINDS[name].preflight.source, import_named(KINDS[name].preflight.reader)) for name in AUTO_ORDER
}


def read_devices(kind: str, environ: Mapping[str, str] = os.environ) -> DeviceReadings:
    """The devices of ``kind`` a run would use, each as its management tool describes it; for
    auto, the first kind in --device auto's order whose tool lists a device, else the CPU."""
    if kind == "auto":
        for candidate, (source, read) in READERS.items():
            if candidate == FALLBACK_KIND:
                continue
            devices, _reason = read(environ)
            if devices:
                return DeviceReadings(candidate, source, devices)
        kind = FALLBACK_KIND
    source, read = READERS[kind]
    devices, reason = read(environ)
    return DeviceReadings(kind, source, devices, reason)
