"""AMD GPU telemetry through AMD SMI's Python library (PyPI package ``amdsmi``).

The library finds a GPU by its PCI address (``amdsmi_get_processor_handle_from_bdf``): HIP
numbers devices after HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES, so an index is never used.
Every query is wrapped: a reading a GPU does not support ("N/A", or an AmdSmiLibraryException)
is None, never a crash.

Units, from AMD SMI's reference (amdsmi_power_info_t, amdsmi_get_energy_count): socket powers
in W (``current_socket_power`` on MI300 and newer, ``average_socket_power`` on MI200 and
older; the other reads "N/A"); the energy counter is ``energy_accumulator`` ticks of
``counter_resolution`` microjoules (15.259 uJ on the boards seen); VRAM in MB.

Importing the wheel without ROCm's libamd_smi.so raises KeyError('libamd_smi.so'), not an
ImportError, after printing two lines on stdout: both are caught here (import_amdsmi)."""

from __future__ import annotations

import contextlib
import io
from typing import Any

from hwbench.device.telemetry import TelemetrySampler, quietly

# amdsmi_get_violation_status's active_* flags (AMD SMI 6.4 and newer), as the result names them
VIOLATIONS = {
    "active_prochot_thrm": "prochot_thermal",
    "active_ppt_pwr": "package_power",
    "active_socket_thrm": "socket_thermal",
    "active_vr_thrm": "voltage_regulator_thermal",
    "active_hbm_thrm": "hbm_thermal",
}
MICROJOULES = 1e-6
NOT_AVAILABLE = "N/A"


def import_amdsmi() -> tuple[Any | None, str | None]:
    """(the amdsmi module, None) or (None, why it cannot be used). The wheel prints its
    loader's failure on stdout; it is kept off hwbench's output."""
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            import amdsmi
        except ImportError:
            return None, "amdsmi is not installed (pip install amdsmi, the version of the ROCm release)"
        except (KeyError, OSError) as error:  # the wheel without ROCm's native library
            return None, (f"amdsmi cannot load libamd_smi.so ({type(error).__name__}: {error}): install ROCm's "
                          "amd-smi-lib or set ROCM_PATH")
    return amdsmi, None


def _value(reading: Any) -> float | None:
    if reading is None or reading == NOT_AVAILABLE or isinstance(reading, str):
        return None
    return float(reading)


def _throttle_reasons(smi: Any, handle: Any) -> list[str] | None:
    """The violations active now (amdsmi_get_violation_status), else the metrics table's
    single throttle flag; None where neither is reported."""
    status = quietly(lambda: smi.amdsmi_get_violation_status(handle))
    if isinstance(status, dict) and any(status.get(key) in (True, False) for key in VIOLATIONS):
        return sorted(name for key, name in VIOLATIONS.items() if status.get(key) is True)
    metrics = quietly(lambda: smi.amdsmi_get_gpu_metrics_info(handle)) or {}
    flag = metrics.get("throttle_status")
    if flag in (True, False):
        return ["throttled"] if flag else []
    return None


class AmdSmiSampler(TelemetrySampler):
    source = "amdsmi"
    energy_method = "AMD SMI energy accumulator (amdsmi_get_energy_count)"

    def __init__(self, bus_ids: list[str], interval_s: float = 0.5) -> None:
        super().__init__(interval_s)
        self.bus_ids = bus_ids
        self._handles: list[Any] = []
        self._resolution_uj: list[float | None] = [None] * len(bus_ids)
        self._power_fields: list[str | None] = [None] * len(bus_ids)
        library, self._reason = import_amdsmi()
        self._amdsmi: Any = library  # None only when it could not be imported, and then no handle is read
        if self._amdsmi is None:
            return
        try:
            self._amdsmi.amdsmi_init()
            self._handles = [self._amdsmi.amdsmi_get_processor_handle_from_bdf(bdf) for bdf in bus_ids]
        except Exception as error:  # no driver, or a bus id AMD SMI does not know
            self._reason = f"AMD SMI unavailable: {type(error).__name__}: {error}"

    def device_details(self, index: int) -> dict[str, Any]:
        if index >= len(self.bus_ids):
            return {}
        field = self._power_fields[index]
        return {"name": f"gpu:{index}", "pci_bus_id": self.bus_ids[index], "identified_by": "pci_bus_id",
                "energy_resolution_uj": self._resolution_uj[index],
                "power_method": f"amdsmi_get_power_info {field} (W)" if field else None}

    def read(self) -> list[dict[str, Any]]:
        return [self._read_device(index, handle) for index, handle in enumerate(self._handles)]

    def _read_device(self, index: int, handle: Any) -> dict[str, Any]:
        smi = self._amdsmi
        activity = quietly(lambda: smi.amdsmi_get_gpu_activity(handle)) or {}
        vram = quietly(lambda: smi.amdsmi_get_gpu_vram_usage(handle)) or {}
        clock = quietly(lambda: smi.amdsmi_get_clock_info(handle, smi.AmdSmiClkType.GFX)) or {}
        reading: dict[str, Any] = {
            "power_w": self._power_w(index, handle),
            "temperature_c": self._temperature_c(handle),
            "sm_clock_mhz": _value(clock.get("clk")),
            "utilization_percent": _value(activity.get("gfx_activity")),
            "memory_used_mib": _value(vram.get("vram_used")),
        }
        reasons = _throttle_reasons(smi, handle)
        if reasons is not None:
            reading["throttle_reasons"] = reasons
        return reading

    def _power_w(self, index: int, handle: Any) -> float | None:
        info = quietly(lambda: self._amdsmi.amdsmi_get_power_info(handle)) or {}
        for field in ("current_socket_power", "average_socket_power", "socket_power"):
            watts = _value(info.get(field))
            if watts is not None:
                self._power_fields[index] = field
                return watts
        return None

    def _temperature_c(self, handle: Any) -> float | None:
        smi = self._amdsmi
        for sensor in ("HOTSPOT", "EDGE"):  # junction first: MI300 reports no edge temperature
            kind = getattr(smi.AmdSmiTemperatureType, sensor)
            value = quietly(lambda: smi.amdsmi_get_temp_metric(handle, kind, smi.AmdSmiTemperatureMetric.CURRENT))
            if _value(value) is not None:
                return _value(value)
        return None

    def energy_counter_j(self) -> list[float | None]:
        counters: list[float | None] = []
        for index, handle in enumerate(self._handles):
            count = quietly(lambda: self._amdsmi.amdsmi_get_energy_count(handle))
            if not isinstance(count, dict):
                counters.append(None)
                continue
            ticks = count.get("energy_accumulator", count.get("power"))  # "power" before AMD SMI 6.4
            resolution = _value(count.get("counter_resolution"))
            self._resolution_uj[index] = resolution
            counters.append(float(ticks) * resolution * MICROJOULES if ticks is not None and resolution else None)
        return counters


def amdgpu_driver_version(bus_id: str | None) -> str | None:
    """The amdgpu driver version AMD SMI reports for the GPU at ``bus_id``, else the kernel
    module's (/sys/module/amdgpu/version, present with the DKMS driver)."""
    smi, _ = import_amdsmi()
    if smi is not None and bus_id:
        try:
            smi.amdsmi_init()
            info = smi.amdsmi_get_gpu_driver_info(smi.amdsmi_get_processor_handle_from_bdf(bus_id))
            if info.get("driver_version") not in (None, "", NOT_AVAILABLE):
                return str(info["driver_version"])
        except Exception:
            pass
    try:
        return open("/sys/module/amdgpu/version").read().strip() or None
    except OSError:
        return None


# --- before a run (hwbench preflight) ----------------------------------------------------------------

# The violations that are the hardware protecting itself (thermal, voltage), against the power budget
HARDWARE_VIOLATIONS = ("prochot_thermal", "socket_thermal", "voltage_regulator_thermal", "hbm_thermal")
AUTO_PERF_LEVEL = "AUTO"  # amdsmi_get_gpu_perf_level's default; MANUAL, STABLE_* and DETERMINISM fix the clocks


def amdsmi_health(environ) -> tuple[list, str | None]:
    """Every GPU AMD SMI lists, as it describes it before a run; ([], why) when it cannot be read."""
    from hwbench.device.health import DeviceHealth, not_this_process

    smi, reason = import_amdsmi()
    if smi is None:
        return [], reason
    try:
        smi.amdsmi_init()
        handles = list(smi.amdsmi_get_processor_handles())
    except Exception as error:
        return [], f"AMD SMI unavailable: {type(error).__name__}: {error}"
    devices = []
    for index, handle in enumerate(handles):
        bdf = quietly(lambda: smi.amdsmi_get_gpu_device_bdf(handle))
        device = DeviceHealth(f"gpu {index}" + (f" ({bdf})" if bdf else ""))
        processes = quietly(lambda: smi.amdsmi_get_gpu_process_list(handle))
        if processes is None:
            device.unread["processes"] = "AMD SMI: no process list (it needs root on some releases)"
        else:
            others = [process for process in processes
                      if not_this_process(process.get("pid") if isinstance(process, dict) else process)]
            device.processes = sorted({_process_text(process) for process in others})
        vram = quietly(lambda: smi.amdsmi_get_gpu_vram_usage(handle)) or {}
        total, used = _value(vram.get("vram_total")), _value(vram.get("vram_used"))
        if total is not None and used is not None:  # MB
            device.memory_total_bytes, device.memory_free_bytes = int(total * 2**20), int((total - used) * 2**20)
        else:
            device.unread["memory_free_bytes"] = "AMD SMI: no VRAM usage"
        ecc = quietly(lambda: smi.amdsmi_get_gpu_total_ecc_count(handle)) or {}
        device.ecc_uncorrected = _count(ecc.get("uncorrectable_count"))
        device.ecc_corrected = _count(ecc.get("correctable_count"))
        if device.ecc_uncorrected is None:
            device.unread["ecc_uncorrected"] = "AMD SMI: no ECC counts"
        _read_bad_pages(smi, handle, device)
        _read_xgmi(smi, handle, device)
        _read_pcie(smi, handle, device)
        clock = quietly(lambda: smi.amdsmi_get_clock_info(handle, smi.AmdSmiClkType.GFX)) or {}
        device.clock_mhz, device.max_clock_mhz = _value(clock.get("clk")), _value(clock.get("max_clk"))
        level = quietly(lambda: smi.amdsmi_get_gpu_perf_level(handle))
        if level is None:
            device.unread["clocks_locked"] = "AMD SMI: no performance level"
        else:
            text = str(getattr(level, "name", level)).removeprefix("AMDSMI_DEV_PERF_LEVEL_")
            device.clocks_locked, device.clocks_how = text != AUTO_PERF_LEVEL, f"performance level {text}"
        device.throttle_reasons = _throttle_reasons(smi, handle)
        device.hardware_throttles = [
            reason for reason in device.throttle_reasons or [] if reason in HARDWARE_VIOLATIONS
        ]
        if device.throttle_reasons is None:
            device.unread["throttle_reasons"] = "AMD SMI: no violation status or throttle flag"
        device.unread["persistence_mode"] = "AMD GPUs have no persistence mode (the amdgpu driver stays loaded)"
        devices.append(device)
    return devices, None if devices else "AMD SMI lists no GPU"


# AMD SMI's amdsmi_pcie_info_t: the current speed in MT/s, by PCIe generation
PCIE_GENERATIONS = {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6}


def _read_bad_pages(smi: Any, handle: Any, device: Any) -> None:
    """The pages the driver retired (amdsmi_get_gpu_bad_page_info: one record a page, its status
    RESERVED, PENDING or UNRESERVABLE). amdgpu retires a page on an uncorrectable error, so
    they count as double-bit retirements; PENDING waits for a reset, UNRESERVABLE could not be
    retired (a failure like NVML's row remap failure)."""
    pages = quietly(lambda: smi.amdsmi_get_gpu_bad_page_info(handle))
    if not isinstance(pages, list):  # older releases say "No bad pages found." as a string
        if isinstance(pages, str):
            device.retired_pages_double_bit, device.retirement_pending, device.remap_failed = 0, False, False
        else:
            device.unread["retired_pages_double_bit"] = "AMD SMI: no bad page list (it needs root on some releases)"
        return
    statuses = [str(getattr(page.get("status"), "name", page.get("status"))).upper() for page in pages]
    device.retired_pages_double_bit = sum(1 for status in statuses if status.endswith("RESERVED"))
    device.retirement_pending = any(status.endswith("PENDING") for status in statuses)
    device.remap_failed = any(status.endswith("UNRESERVABLE") for status in statuses)


def _read_xgmi(smi: Any, handle: Any, device: Any) -> None:
    """Each xGMI link's state (amdsmi_get_gpu_xgmi_link_status: "U" up, "D" down, "X" disabled,
    a link not in use) and the device's xGMI error status (amdsmi_gpu_xgmi_error_status)."""
    from hwbench.device.health import LinkHealth

    device.link_kind = "xGMI"
    status = quietly(lambda: smi.amdsmi_get_gpu_xgmi_link_status(handle))
    states = status.get("status") if isinstance(status, dict) else None
    if isinstance(states, list):
        device.links = [LinkHealth(index, state == "U") for index, state in enumerate(states) if state in ("U", "D")]
    else:
        device.unread["links"] = "AMD SMI: no xGMI link status (a GPU without xGMI, or an older AMD SMI)"
    error = quietly(lambda: smi.amdsmi_gpu_xgmi_error_status(handle))
    if error is not None:
        name = str(getattr(error, "name", error)).removeprefix("AMDSMI_XGMI_STATUS_")
        device.link_errors = None if name in ("NO_ERRORS", "0") else name.lower()


def _read_pcie(smi: Any, handle: Any, device: Any) -> None:
    info = quietly(lambda: smi.amdsmi_get_pcie_info(handle))
    if not isinstance(info, dict):
        device.unread["pcie_width"] = "AMD SMI: no PCIe information"
        return
    static, metric = info.get("pcie_static") or {}, info.get("pcie_metric") or {}
    device.pcie_width, device.pcie_max_width = _count(metric.get("pcie_width")), _count(static.get("max_pcie_width"))
    speed = _count(metric.get("pcie_speed"))
    device.pcie_generation = PCIE_GENERATIONS.get(speed) if speed is not None else None
    device.pcie_max_generation = _count(static.get("max_pcie_interface_version"))  # AMD SMI 7.1 and newer


def _count(value: Any) -> int | None:
    number = _value(value)
    return None if number is None else int(number)


def _process_text(process: Any) -> str:
    info = process if isinstance(process, dict) else {}
    pid, name = info.get("pid", process), info.get("name") or "?"
    return f"pid {pid} {name}"
