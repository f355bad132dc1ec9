"""STAND-IN for AMD SMI's Python library (PyPI ``amdsmi``), for hwbench's tests only.

The calls hwbench's AMD SMI sampler makes (hwbench/device/amd_smi.py), with the names, argument
types and return shapes of amdsmi 7.0.2 (its amdsmi_interface.py), answering for one MI300X at
PCI address 0000:0c:00.0 (the stand-in ROCm build's device, ../sitecustomize.py).

Figures and where they come from:

* power: ``current_socket_power`` 717 W with ``average_socket_power`` "N/A", as an MI300X
  reports them in ROCm/pytorch pull request #1457 ("MI300: Current socket power: 717, Average
  socket power: N/A"; an MI200 reports the reverse).
* energy: ``counter_resolution`` 15.259 uJ, the resolution rocm-smi prints for the energy
  accumulator ("energy_accumulator (15.259uJ (2^-16))", ollama/ollama issue #9633); the
  accumulator grows at the 717 W above, with wall-clock time, so energy / window is 717 W.
* the rest (hotspot 52 C, no edge sensor, GFX clock 2100 MHz, 100 % GFX activity, 61,440 MB of
  VRAM in use, the package-power violation active, amdgpu 6.10.5) are fixed test values.

Health before a run (hwbench preflight, hwbench accept), with amdsmi's names and return shapes
(amdsmi_interface.py): the processor list (amdsmi_get_processor_handles, this one GPU and its
BDF), ECC counts (amdsmi_get_gpu_total_ecc_count: correctable, uncorrectable, deferred) 0; no
bad page (amdsmi_get_gpu_bad_page_info: a list of {"value", "page_address", "page_size",
"status"}, empty); seven xGMI links up (amdsmi_get_gpu_xgmi_link_status: {"status": ["U", ...],
"total_links"}): an MI300X of an eight-GPU platform reaches each of its seven peers over its own
link (AMD Instinct MI300X platform data sheet); xGMI error status NO_ERRORS
(amdsmi_gpu_xgmi_error_status); PCIe x16 of x16 at 32,000 MT/s (gen5), the MI300X's host
interface in the same data sheet (amdsmi_get_pcie_info: "pcie_static" and "pcie_metric").

HWBENCH_STANDIN_AMDSMI_HEALTH sets faults for tests, comma-separated: ``ecc_uncorrected=N``,
``bad_page_pending``, ``xgmi_down=I`` (link I down), ``pcie_width=N``.
"""

from __future__ import annotations

import enum
import os
import time

__hwbench_stand_in__ = True
__version__ = "7.0.2+standin"

BUS_ID = "0000:0c:00.0"
SOCKET_POWER_W = 717
RESOLUTION_UJ = 15.259
_START = time.monotonic()


class AmdSmiLibraryException(Exception):
    pass


class AmdSmiClkType(enum.IntEnum):
    SYS = 0
    GFX = 0
    MEM = 4


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


class processor_handle:  # noqa: N801 (amdsmi_wrapper's name)
    def __init__(self, bdf: str) -> None:
        self.bdf = bdf


def amdsmi_init(flag=None) -> None:
    pass


def amdsmi_shut_down() -> None:
    pass


def amdsmi_get_processor_handle_from_bdf(bdf: str) -> processor_handle:
    if bdf.lower() != BUS_ID:
        raise AmdSmiLibraryException(f"AMDSMI_STATUS_NOT_FOUND: no GPU at {bdf}")
    return processor_handle(bdf)


def amdsmi_get_power_info(handle) -> dict:
    return {"socket_power": SOCKET_POWER_W, "current_socket_power": SOCKET_POWER_W, "average_socket_power": "N/A",
            "gfx_voltage": "N/A", "soc_voltage": "N/A", "mem_voltage": "N/A", "power_limit": 750}


def amdsmi_get_energy_count(handle) -> dict:
    joules = SOCKET_POWER_W * (time.monotonic() - _START)
    return {"energy_accumulator": int(joules / (RESOLUTION_UJ * 1e-6)), "counter_resolution": RESOLUTION_UJ,
            "timestamp": time.monotonic_ns()}


def amdsmi_get_temp_metric(handle, sensor_type, metric) -> int:
    if sensor_type == AmdSmiTemperatureType.EDGE:
        raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")
    return 52


def amdsmi_get_clock_info(handle, clock_type) -> dict:
    return {"clk": 2100, "min_clk": 500, "max_clk": 2100, "clk_locked": False, "clk_deep_sleep": 0}


def amdsmi_get_gpu_activity(handle) -> dict:
    return {"gfx_activity": 100, "umc_activity": 38, "mm_activity": "N/A"}


def amdsmi_get_gpu_vram_usage(handle) -> dict:
    return {"vram_total": 196592, "vram_used": 61440}


def amdsmi_get_violation_status(handle) -> dict:
    return {"active_prochot_thrm": False, "active_ppt_pwr": True, "active_socket_thrm": False,
            "active_vr_thrm": False, "active_hbm_thrm": False}


def amdsmi_get_gpu_metrics_info(handle) -> dict:
    return {"throttle_status": True}


def amdsmi_get_gpu_driver_info(handle) -> dict:
    return {"driver_name": "amdgpu", "driver_version": "6.10.5", "driver_date": "2015/01/01 00:00"}


# --- health (see the module's docstring) -------------------------------------------------------------

HEALTH_ENV = "HWBENCH_STANDIN_AMDSMI_HEALTH"
XGMI_LINKS = 7


class AmdSmiXgmiStatus(enum.IntEnum):
    NO_ERRORS = 0
    ERROR = 1
    MULTIPLE_ERRORS = 2


class AmdSmiMemoryPageStatus(enum.IntEnum):
    RESERVED = 0
    PENDING = 1
    UNRESERVABLE = 2


def _faults() -> dict[str, int]:
    faults = {}
    for item in os.environ.get(HEALTH_ENV, "").split(","):
        name, _, number = item.strip().partition("=")
        if name:
            faults[name] = int(number) if number else 1
    return faults


def amdsmi_get_processor_handles() -> list:
    return [processor_handle(BUS_ID)]


def amdsmi_get_gpu_device_bdf(handle) -> str:
    return handle.bdf


def amdsmi_get_gpu_total_ecc_count(handle) -> dict:
    return {"correctable_count": 0, "uncorrectable_count": _faults().get("ecc_uncorrected", 0), "deferred_count": 0}


def amdsmi_get_gpu_bad_page_info(handle) -> list:
    if "bad_page_pending" in _faults():
        return [{"value": 0, "page_address": 0x1F0000, "page_size": 4096, "status": AmdSmiMemoryPageStatus.PENDING}]
    return []


def amdsmi_get_gpu_xgmi_link_status(handle) -> dict:
    down = _faults().get("xgmi_down")
    return {"status": ["D" if index == down else "U" for index in range(XGMI_LINKS)], "total_links": XGMI_LINKS}


def amdsmi_gpu_xgmi_error_status(handle) -> AmdSmiXgmiStatus:
    return AmdSmiXgmiStatus.NO_ERRORS


def amdsmi_get_pcie_info(handle) -> dict:
    return {"pcie_static": {"max_pcie_width": 16, "max_pcie_speed": 32, "pcie_interface_version": 5,
                            "slot_type": "OAM"},
            "pcie_metric": {"pcie_width": _faults().get("pcie_width", 16), "pcie_speed": 32000,
                            "pcie_bandwidth": "N/A", "pcie_replay_count": 0}}
