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

Health before a run (hwbench preflight, hwbench accept), with nvidia-ml-py's names and return
shapes (nvidia-ml-py's pynvml.py; NVML API reference, "Device Queries"): ECC counts
(nvmlDeviceGetTotalEccErrors, volatile and aggregate) 0, as the "Volatile Uncorr. ECC" column of
that nvidia-smi table reads; remapped rows (nvmlDeviceGetRemappedRows: corrected rows,
uncorrected rows, pending, failure) none; retired pages answer NVMLError (not supported), as on
every GPU from Ampere on, which remaps rows instead (NVML reference, nvmlDeviceGetRetiredPages);
18 NVLinks, each enabled (nvmlDeviceGetNvLinkState) with zero error counters
(nvmlDeviceGetNvLinkErrorCounter), a link number from 18 on not supported: the H100 SXM5 has 18
NVLink links (NVIDIA H100 Tensor Core GPU Architecture white paper); PCIe gen5 x16 of gen5 x16
(the H100 SXM5's host interface in the same white paper).

HWBENCH_STANDIN_NVML_HEALTH sets faults for tests, comma-separated: ``ecc_uncorrected=N`` (volatile
and aggregate), ``ecc_corrected=N``, ``remap_pending``, ``remap_failure``, ``rows_remapped=N``
(uncorrectable), ``pcie_width=N``, ``pcie_generation=N``, ``nvlink_down=I`` (link I disabled; may
repeat), ``nvlink_replay=N`` (replays on link 0).
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


# --- health (see the module's docstring) -------------------------------------------------------------

NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED = 0, 1
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 0, 1
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY = 0, 1
NVML_NVLINK_ERROR_DL_CRC_FLIT, NVML_NVLINK_ERROR_DL_CRC_DATA = 2, 3
H100_NVLINKS = 18
HEALTH_ENV = "HWBENCH_STANDIN_NVML_HEALTH"


def _faults() -> list[tuple[str, int]]:
    """HWBENCH_STANDIN_NVML_HEALTH as (name, number) pairs; a bare name is (name, 1)."""
    pairs = []
    for item in os.environ.get(HEALTH_ENV, "").split(","):
        name, _, number = item.strip().partition("=")
        if name:
            pairs.append((name, int(number) if number else 1))
    return pairs


def _fault(name: str, default: int = 0) -> int:
    return next((number for fault, number in _faults() if fault == name), default)


def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType) -> int:
    if errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        return _fault("ecc_uncorrected")
    return _fault("ecc_corrected")


def nvmlDeviceGetRemappedRows(handle):
    return (0, _fault("rows_remapped"), _fault("remap_pending"), _fault("remap_failure"))


def nvmlDeviceGetRetiredPages(handle, sourceFilter):
    raise NVMLError("Not Supported")


def nvmlDeviceGetRetiredPagesPendingStatus(handle):
    raise NVMLError("Not Supported")


def _link(link: int) -> int:
    if not 0 <= link < H100_NVLINKS:
        raise NVMLError("Not Supported")
    return link


def nvmlDeviceGetNvLinkState(handle, link) -> int:
    down = {number for fault, number in _faults() if fault == "nvlink_down"}
    return NVML_FEATURE_DISABLED if _link(link) in down else NVML_FEATURE_ENABLED


def nvmlDeviceGetNvLinkErrorCounter(handle, link, counter) -> int:
    if _link(link) == 0 and counter == NVML_NVLINK_ERROR_DL_REPLAY:
        return _fault("nvlink_replay")
    return 0


def nvmlDeviceGetCurrPcieLinkWidth(handle) -> int:
    return _fault("pcie_width", 16)


def nvmlDeviceGetMaxPcieLinkWidth(handle) -> int:
    return 16


def nvmlDeviceGetCurrPcieLinkGeneration(handle) -> int:
    return _fault("pcie_generation", 5)


def nvmlDeviceGetMaxPcieLinkGeneration(handle) -> int:
    return 5
