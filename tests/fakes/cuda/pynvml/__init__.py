"""STAND-IN for NVML's Python bindings (PyPI ``nvidia-ml-py``, module ``pynvml``), for hwbench's
tests only: the calls hwbench's NVML code makes (hwbench/device/nvml.py), with nvidia-ml-py's
names and units (power in mW, energy in mJ, memory in bytes), answering for the one H100 of the
stand-in CUDA build (../sitecustomize.py), found by its UUID or PCI address.

Figures and where they come from: GPU 0 of the nvidia-smi table in NVIDIA/nccl issue #1264
(NVIDIA-SMI 550.54.15, an HGX H100 SXM): 'NVIDIA H100 80GB HBM3' at 00000000:18:00.0, 28 C,
88 W of a 700 W cap, 0 MiB of 81,559 MiB in use, 0 % utilization. The energy counter grows at
88 W with wall-clock time; the SM clock (1,980 MHz, the H100 SXM5's boost clock in NVIDIA's
H100 white paper) and a clear clock-event mask are fixed test values. The power limit NVML
gives is the 700 W cap nvidia-smi printed (nvmlDeviceGetPowerManagementDefaultLimit); the
limit constraints are not answered (NVMLError), as a driver may refuse them.

The compute processes (nvmlDeviceGetComputeRunningProcesses: those with a compute context on the
device, NVML API reference) are the process bound to the stand-in device (torch.cuda.set_device),
with the stand-in's recorded reserved peak as its memory; none before. Under
HWBENCH_STANDIN_NVML_PID it is listed under that pid, as in a container, where the driver, which
knows no PID namespaces, gives the host's pid (NVIDIA/nvidia-docker#1483). No graphics processes.
"""

from __future__ import annotations

import os
import time
import types

import standin_device

__hwbench_stand_in__ = True

MIB = 2**20
DRIVER = "550.54.15"
UUID = "GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9"  # the stand-in CUDA device's, with NVML's prefix
BUS_ID = "00000000:18:00.0"
POWER_MW = 88_000
LIMIT_MW = 700_000
TOTAL_BYTES = 81559 * MIB
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
_START = time.monotonic()
_HANDLE = object()


class NVMLError(Exception):
    pass


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return DRIVER


def nvmlDeviceGetCount() -> int:
    return 1


def nvmlDeviceGetHandleByIndex(index: int):
    if index != 0:
        raise NVMLError("Invalid Argument")
    return _HANDLE


def nvmlDeviceGetHandleByUUID(uuid) -> object:
    if (uuid.decode() if isinstance(uuid, bytes) else uuid) != UUID:
        raise NVMLError("Not Found")
    return _HANDLE


def nvmlDeviceGetHandleByPciBusId(bus_id) -> object:
    text = (bus_id.decode() if isinstance(bus_id, bytes) else bus_id).upper()
    if text.split(":", 1)[-1] != BUS_ID.split(":", 1)[-1]:  # NVML accepts the short and the long domain
        raise NVMLError("Not Found")
    return _HANDLE


def nvmlDeviceGetUUID(handle) -> str:
    return UUID


def nvmlDeviceGetName(handle) -> str:
    return "NVIDIA H100 80GB HBM3"


def nvmlDeviceGetPowerUsage(handle) -> int:
    return POWER_MW


def nvmlDeviceGetTotalEnergyConsumption(handle) -> int:
    return int(POWER_MW * (time.monotonic() - _START))  # mW x s = mJ


def nvmlDeviceGetPowerManagementDefaultLimit(handle) -> int:
    return LIMIT_MW


def nvmlDeviceGetPowerManagementLimitConstraints(handle):
    raise NVMLError("Not Supported")


def nvmlDeviceGetTemperature(handle, sensor) -> int:
    return 28


def nvmlDeviceGetClockInfo(handle, clock) -> int:
    return 1980


def nvmlDeviceGetUtilizationRates(handle):
    return types.SimpleNamespace(gpu=0, memory=0)


def nvmlDeviceGetMemoryInfo(handle):
    return types.SimpleNamespace(total=TOTAL_BYTES, used=0, free=TOTAL_BYTES)


def nvmlDeviceGetCurrentClocksEventReasons(handle) -> int:
    return 0


def nvmlDeviceGetComputeRunningProcesses(handle) -> list:
    pid = standin_device.BOUND["pid"]
    if pid is None:
        return []
    listed = int(os.environ.get("HWBENCH_STANDIN_NVML_PID") or pid)
    return [types.SimpleNamespace(pid=listed, usedGpuMemory=2_147_483_648)]


def nvmlDeviceGetGraphicsRunningProcesses(handle) -> list:
    return []
