"""NVML telemetry through nvidia-ml-py (module ``pynvml``; NVIDIA's NVML API reference).

Every query is wrapped: a GPU that does not support one gives None.

NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES, so a CUDA
index is never an NVML index: a device is found by the UUID the CUDA runtime
gives it, else by its PCI bus id, else not at all (telemetry unavailable, with
the reason), and never by guessing."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from hwbench.device.telemetry import TelemetrySampler, as_text, quietly

# Clock event (throttle) reason bits, nvml.h
GPU_IDLE_BIT = 0x1
THROTTLE_BITS = {
    GPU_IDLE_BIT: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# What the summary's power figures and integrated energy are, by the call that gave the power.
INSTANT_POWER = "NVML_FI_DEV_POWER_INSTANT"
AVERAGED_POWER = "nvmlDeviceGetPowerUsage"
POWER_METHODS = {
    INSTANT_POWER: "instantaneous power (NVML field NVML_FI_DEV_POWER_INSTANT)",
    AVERAGED_POWER: "nvmlDeviceGetPowerUsage (a 1 s average on Ampere and newer)",
}
INTEGRATED_INSTANT = "integrated instantaneous power samples"
INTEGRATED_AVERAGED = "integrated 1 s-averaged power samples (approximate)"

# nvmlValueType_t -> the member of nvmlValue_t that holds the value (nvml.h)
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def decode_throttle_reasons(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def pci_bus_id(domain: int | None, bus: int | None, device: int | None) -> str | None:
    """The PCI address NVML's nvmlDeviceGetHandleByPciBusId accepts ("0000:3b:00.0"), or None
    when the runtime did not report every part; a GPU is function 0 of its PCI device."""
    if domain is None or bus is None or device is None:
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


@dataclasses.dataclass(frozen=True)
class CudaDeviceIds:
    """What the CUDA runtime says of one device: enough to find the same GPU in NVML."""

    cuda_index: int  # as torch numbers it, after CUDA_VISIBLE_DEVICES
    uuid: str | None = None  # torch's text form, without NVML's "GPU-" prefix
    pci_bus_id: str | None = None  # pci_bus_id(...)


@dataclasses.dataclass(frozen=True)
class NvmlDevice:
    """A GPU found in NVML, and how it was found."""

    handle: Any
    ids: CudaDeviceIds
    identified_by: str  # "uuid" or "pci_bus_id"
    uuid: str | None  # NVML's UUID of the physical GPU: the same on every rank that samples it


def _import_pynvml():
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    return pynvml


def _clock_event_mask(nv: Any, handle: Any) -> int | None:
    """The clock event reasons' bits (the call's older name, throttle reasons, on older drivers)."""
    mask = quietly(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle))
    if mask is None:
        mask = quietly(lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
    return int(mask) if mask is not None else None


def nvml_driver_version() -> str | None:
    pynvml = _import_pynvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
        return as_text(pynvml.nvmlSystemGetDriverVersion())
    except Exception:
        return None


class NvmlSampler(TelemetrySampler):
    source = "nvml"

    def __init__(self, devices: list[CudaDeviceIds], interval_s: float = 0.5) -> None:
        super().__init__(interval_s)
        self._pynvml = _import_pynvml()
        self._devices: list[NvmlDevice] = []
        self._power_calls: list[str | None] = [None] * len(devices)  # the call that last gave each power
        if self._pynvml is None:
            self._reason = "nvidia-ml-py (module pynvml) is not installed"
            return
        try:
            self._pynvml.nvmlInit()
        except Exception as error:
            self._reason = f"NVML unavailable: {type(error).__name__}: {error}"
            return
        try:
            self._devices = [self._find(ids) for ids in devices]
        except LookupError as error:
            self._reason = str(error)

    # Finding the device ------------------------------------------------------
    def _find(self, ids: CudaDeviceIds) -> NvmlDevice:
        """The NVML device behind a CUDA device, by UUID, else PCI bus id; LookupError
        with both failures when neither finds it (a MIG instance's UUID, for one, is
        not a GPU's, and NVML's index is not CUDA's)."""
        nv = self._pynvml
        failures = []
        if ids.uuid:
            text = ids.uuid if ids.uuid.startswith(("GPU-", "MIG-")) else f"GPU-{ids.uuid}"
            try:
                return self._found(nv.nvmlDeviceGetHandleByUUID(text), ids, "uuid", text)
            except Exception as error:
                failures.append(f"UUID {text}: {type(error).__name__}: {error}")
        else:
            failures.append("no UUID from the CUDA runtime")
        if ids.pci_bus_id:
            try:
                return self._found(nv.nvmlDeviceGetHandleByPciBusId(ids.pci_bus_id), ids, "pci_bus_id", None)
            except Exception as error:
                failures.append(f"PCI bus id {ids.pci_bus_id}: {type(error).__name__}: {error}")
        else:
            failures.append("no PCI bus id from the CUDA runtime")
        raise LookupError(f"NVML does not find CUDA device {ids.cuda_index} ({'; '.join(failures)}); "
                          "its index is not used, since NVML numbers GPUs in PCI order, not CUDA's")

    def _found(self, handle: Any, ids: CudaDeviceIds, identified_by: str, looked_up: str | None) -> NvmlDevice:
        uuid = as_text(quietly(lambda: self._pynvml.nvmlDeviceGetUUID(handle))) or looked_up
        return NvmlDevice(handle, ids, identified_by, uuid)

    def device_details(self, index: int) -> dict[str, Any]:
        if index >= len(self._devices):
            return {}
        device = self._devices[index]
        power_call = self._power_calls[index]
        return {
            "name": f"gpu:{device.ids.cuda_index}",  # distinct on the node under one CUDA_VISIBLE_DEVICES
            "uuid": device.uuid,  # the identity ranks are merged by
            "pci_bus_id": device.ids.pci_bus_id,
            "identified_by": device.identified_by,
            "power_method": POWER_METHODS.get(power_call) if power_call else None,
        }

    def integrated_energy_method(self, index: int) -> str:
        if index < len(self._power_calls) and self._power_calls[index] == INSTANT_POWER:
            return INTEGRATED_INSTANT
        return INTEGRATED_AVERAGED

    # Reading -----------------------------------------------------------------
    def _instant_power_mw(self, handle: Any) -> float | None:
        """The instantaneous power field, where this nvidia-ml-py and driver have it."""
        nv = self._pynvml
        field = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        if field is None or not hasattr(nv, "nvmlDeviceGetFieldValues"):
            return None
        values = quietly(lambda: nv.nvmlDeviceGetFieldValues(handle, [field]))
        if not values or getattr(values[0], "nvmlReturn", 1) != 0:  # each field has its own NVML_SUCCESS
            return None
        member = _VALUE_MEMBERS.get(getattr(values[0], "valueType", -1))
        return getattr(values[0].value, member) if member else None

    def _power_w(self, index: int, handle: Any) -> float | None:
        """Instantaneous power where the driver gives it: nvmlDeviceGetPowerUsage is a
        1 s average on Ampere and newer, which lags a window's first and last seconds."""
        milliwatts = self._instant_power_mw(handle)
        call = INSTANT_POWER
        if milliwatts is None:
            milliwatts = quietly(lambda: self._pynvml.nvmlDeviceGetPowerUsage(handle))
            call = AVERAGED_POWER
        if milliwatts is None:
            return None
        if self._power_calls[index] != AVERAGED_POWER:  # one averaged reading makes the whole device's figure so
            self._power_calls[index] = call
        return milliwatts / 1000.0

    def read(self) -> list[dict[str, Any]]:
        return [self._read_device(index, device.handle) for index, device in enumerate(self._devices)]

    def _read_device(self, index: int, h: Any) -> dict[str, Any]:
        nv = self._pynvml
        memory = quietly(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        utilization = quietly(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        reading = {
            "power_w": self._power_w(index, h),
            "temperature_c": quietly(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "sm_clock_mhz": quietly(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "utilization_percent": utilization.gpu if utilization is not None else None,
            "memory_used_mib": memory.used / 2**20 if memory is not None else None,
            "ecc_uncorrected": quietly(
                lambda: nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
            ),
        }
        mask = _clock_event_mask(nv, h)
        if mask is not None:
            # gpu_idle is no throttle: the window's edges sit at barriers, where every GPU
            # idles. It stays in the raw reading, apart from the reasons.
            reading["gpu_idle"] = bool(mask & GPU_IDLE_BIT)
            reading["throttle_reasons"] = decode_throttle_reasons(mask & ~GPU_IDLE_BIT)
        return reading

    def energy_counter_j(self) -> list[float | None]:
        counters = []
        for device in self._devices:
            millijoules = quietly(lambda: self._pynvml.nvmlDeviceGetTotalEnergyConsumption(device.handle))
            counters.append(millijoules / 1000.0 if millijoules is not None else None)
        return counters


def nvml_power_limit_w(ids: CudaDeviceIds) -> tuple[float | None, str]:
    """(the highest power limit the board accepts, in W, and what that is), else its default
    limit; (None, why) when NVML gives neither. A property of the model, unlike the enforced
    limit an administrator may lower: it tells an H200 NVL (up to 600 W) from an H200 SXM (up
    to 700 W) when the driver reports both as "NVIDIA H200"."""
    sampler = NvmlSampler([ids])
    reason = sampler.unavailable_reason()
    if reason:
        return None, reason
    nv, handle = sampler._pynvml, sampler._devices[0].handle
    limits = quietly(lambda: nv.nvmlDeviceGetPowerManagementLimitConstraints(handle))
    if limits and limits[1]:
        return limits[1] / 1000.0, "the highest power limit NVML accepts (nvmlDeviceGetPowerManagementLimitConstraints)"
    default = quietly(lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(handle))
    if default:
        return default / 1000.0, "the default power limit (nvmlDeviceGetPowerManagementDefaultLimit)"
    return None, "NVML reports no power limit for this GPU"


# --- before a run (hwbench preflight) ----------------------------------------------------------------

# The clock event reasons that are the hardware slowing itself down (nvml.h's HW_SLOWDOWN family),
# against software caps of power and temperature and settings
HARDWARE_SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def nvml_health(environ) -> tuple[list, str | None]:
    """Each GPU a run on this node may use, as NVML describes it before the run: the ones
    CUDA_VISIBLE_DEVICES names by UUID, else every GPU (its indices follow CUDA's order, which
    NVML's does not share); ([], why) when NVML cannot be read."""
    from hwbench.device.health import DeviceHealth

    nv = _import_pynvml()
    if nv is None:
        return [], "nvidia-ml-py (module pynvml) is not installed"
    try:
        nv.nvmlInit()
        handles = [nv.nvmlDeviceGetHandleByIndex(index) for index in range(nv.nvmlDeviceGetCount())]
    except Exception as error:
        return [], f"NVML unavailable: {type(error).__name__}: {error}"
    visible = [item.strip() for item in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    by_uuid = all(item.startswith(("GPU-", "MIG-")) for item in visible) if visible else False
    devices = []
    for index, handle in enumerate(handles):
        uuid = as_text(quietly(lambda: nv.nvmlDeviceGetUUID(handle)))
        if by_uuid and not any(uuid and uuid.startswith(item) for item in visible):
            continue
        device = DeviceHealth(f"gpu {index}" + (f" ({uuid})" if uuid else ""))
        _read_gpu(nv, handle, device)
        devices.append(device)
    return devices, None if devices else "NVML lists no GPU that CUDA_VISIBLE_DEVICES names"


def _read_gpu(nv: Any, handle: Any, device: Any) -> None:
    from hwbench.device.health import not_this_process

    not_supported = "NVML: not supported on this GPU or driver"
    processes = quietly(lambda: list(nv.nvmlDeviceGetComputeRunningProcesses(handle))
                      + list(nv.nvmlDeviceGetGraphicsRunningProcesses(handle)))
    if processes is None:
        device.unread["processes"] = not_supported
    else:
        device.processes = sorted({_process_text(nv, process) for process in processes
                                   if not_this_process(getattr(process, "pid", None))})
    memory = quietly(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
    if memory is None:
        device.unread["memory_free_bytes"] = not_supported
    else:
        device.memory_free_bytes, device.memory_total_bytes = int(memory.free), int(memory.total)
    device.ecc_uncorrected, device.ecc_corrected = _ecc_counts(nv, handle, getattr(nv, "NVML_VOLATILE_ECC", 0))
    if device.ecc_uncorrected is None:
        device.unread["ecc_uncorrected"] = "NVML: no ECC counts (ECC off, or a GPU without ECC memory)"
    _read_memory_health(nv, handle, device)
    _read_nvlinks(nv, handle, device)
    _read_pcie(nv, handle, device)
    device.clock_mhz = quietly(lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
    device.max_clock_mhz = quietly(lambda: nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM))
    target = quietly(lambda: nv.nvmlDeviceGetApplicationsClock(handle, nv.NVML_CLOCK_SM))
    default = quietly(lambda: nv.nvmlDeviceGetDefaultApplicationsClock(handle, nv.NVML_CLOCK_SM))
    if target is not None and default is not None:
        device.clocks_locked = target != default
        device.clocks_how = (f"application clocks {target} MHz (default {default}; nvidia-smi -ac sets them; NVML "
                             "has no query for clocks locked with nvidia-smi -lgc)")
    else:
        device.unread["clocks_locked"] = "NVML: no application clocks on this GPU"
    mask = _clock_event_mask(nv, handle)
    if mask is None:
        device.unread["throttle_reasons"] = not_supported
    else:
        device.throttle_reasons = decode_throttle_reasons(mask & ~GPU_IDLE_BIT)
        device.hardware_throttles = [reason for reason in device.throttle_reasons if reason in HARDWARE_SLOWDOWNS]
    persistence = quietly(lambda: nv.nvmlDeviceGetPersistenceMode(handle))
    if persistence is None:
        device.unread["persistence_mode"] = "NVML: not supported (persistence mode is Linux-only)"
    else:
        device.persistence_mode = bool(persistence)
    device.fixes["persistence_mode"] = "nvidia-smi -pm 1"


# nvmlPageRetirementCause_t and nvmlNvLinkErrorCounter_t (nvml.h), where a pynvml lacks the names
RETIRED_SINGLE_BIT, RETIRED_DOUBLE_BIT = 0, 1
NVLINK_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of nvml.h (an H100 has 18 links)


def _ecc_counts(nv: Any, handle: Any, counter: int) -> tuple[int | None, int | None]:
    """(uncorrected, corrected) ECC errors of ``counter`` (volatile: since the driver loaded;
    aggregate: the device's life); None where the GPU does not count them."""
    def count(kind: int) -> int | None:
        return quietly(lambda: nv.nvmlDeviceGetTotalEccErrors(handle, kind, counter))

    return count(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED), count(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED)


def _read_memory_health(nv: Any, handle: Any, device: Any) -> None:
    """Aggregate ECC counts, retired pages (before Ampere) and remapped rows (Ampere and newer):
    a GPU answers one of the last two, the other is unread with the reason."""
    device.ecc_uncorrected_aggregate, device.ecc_corrected_aggregate = _ecc_counts(
        nv, handle, getattr(nv, "NVML_AGGREGATE_ECC", 1))
    if device.ecc_uncorrected_aggregate is None:
        device.unread["ecc_uncorrected_aggregate"] = "NVML: no aggregate ECC counts on this GPU"
    rows = quietly(lambda: nv.nvmlDeviceGetRemappedRows(handle))
    if rows is not None:  # (corrected rows, uncorrected rows, pending, failure occurred)
        corrected, uncorrected, pending, failed = rows
        device.remapped_rows_corrected, device.remapped_rows_uncorrected = int(corrected), int(uncorrected)
        device.retirement_pending, device.remap_failed = bool(pending), bool(failed)
    else:
        device.unread["remapped_rows_uncorrected"] = "NVML: no row remapping on this GPU (it is Ampere's and newer)"
    single = quietly(lambda: nv.nvmlDeviceGetRetiredPages(
        handle, getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", RETIRED_SINGLE_BIT)))
    double = quietly(lambda: nv.nvmlDeviceGetRetiredPages(
        handle, getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", RETIRED_DOUBLE_BIT)))
    if single is not None and double is not None:
        device.retired_pages_single_bit, device.retired_pages_double_bit = len(list(single)), len(list(double))
        pending = quietly(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        if pending is not None:
            device.retirement_pending = bool(device.retirement_pending) or bool(pending)
    else:
        device.unread["retired_pages_double_bit"] = ("NVML: no page retirement on this GPU (Ampere and newer remap "
                                                     "rows instead)")


def _read_nvlinks(nv: Any, handle: Any, device: Any) -> None:
    """Each NVLink the GPU has: its state and error counters; a link number the GPU does not
    have answers NVMLError (not supported), and so does every one on a GPU without NVLink."""
    from hwbench.device.health import LinkHealth

    enabled = getattr(nv, "NVML_FEATURE_ENABLED", 1)
    links = []
    for index in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS)):
        state = quietly(lambda: nv.nvmlDeviceGetNvLinkState(handle, index))
        if state is None:
            continue
        errors = {name: quietly(lambda: nv.nvmlDeviceGetNvLinkErrorCounter(handle, index, counter))
                  for name, counter in NVLINK_COUNTERS.items()}
        links.append(LinkHealth(index, state == enabled,
                                {name: int(count) for name, count in errors.items() if count is not None}))
    device.link_kind = "NVLink"
    if links:
        device.links = links
    else:
        device.unread["links"] = "NVML: no NVLink on this GPU (a PCIe card without a bridge)"


def _read_pcie(nv: Any, handle: Any, device: Any) -> None:
    device.pcie_width = quietly(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(handle))
    device.pcie_max_width = quietly(lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(handle))
    device.pcie_generation = quietly(lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(handle))
    device.pcie_max_generation = quietly(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(handle))
    if device.pcie_width is None:
        device.unread["pcie_width"] = "NVML: no PCIe link figures (a GPU on another bus, or a virtual GPU)"


def _process_text(nv: Any, process: Any) -> str:
    name = as_text(quietly(lambda: nv.nvmlSystemGetProcessName(process.pid))) or "?"
    used = getattr(process, "usedGpuMemory", None)
    memory = f", {used / 2**30:.1f} GiB" if isinstance(used, int) and used < 2**63 else ""
    return f"pid {process.pid} {name.rsplit('/', 1)[-1]}{memory}"


def nvml_other_processes(ids: CudaDeviceIds, own_pid: int, computing: bool = False,
                         proc: str = "/proc") -> tuple[list[dict[str, Any]] | None, str | None]:
    """(the compute processes on the GPU other than ``own_pid``, each {"pid", "memory_bytes"}
    (null where NVML does not say), from nvmlDeviceGetComputeRunningProcesses; None and why when
    NVML cannot say). A process in another container may be listed under a pid this one
    cannot see; it is listed all the same.

    ``computing``: this process is bound to the GPU (so NVML lists it). The driver knows no PID
    namespaces: in a container it gives every process's pid in the host's namespace (NVIDIA/
    nvidia-docker#1483), so this process is not listed under ``own_pid``. When it is not, and
    exactly one listed pid is no process visible here (in ``proc``), that one is this process."""
    sampler = NvmlSampler([ids])
    reason = sampler.unavailable_reason()
    if reason:
        return None, reason
    nv, handle = sampler._pynvml, sampler._devices[0].handle
    try:
        running = nv.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception as error:
        return None, f"nvmlDeviceGetComputeRunningProcesses failed: {type(error).__name__}: {error}"
    listed = [(getattr(process, "pid", None), getattr(process, "usedGpuMemory", None)) for process in running or []]
    others = [{"pid": pid, "memory_bytes": used if isinstance(used, int) and used >= 0 else None}
              for pid, used in listed if pid != own_pid]
    if computing and len(others) == len(listed):  # listed under a pid of another namespace, if at all
        unseen = [other for other in others if not _visible_pid(other["pid"], proc)]
        if len(unseen) == 1:
            others.remove(unseen[0])
    return others, None


def _visible_pid(pid: Any, proc: str) -> bool:
    """Whether ``pid`` is a process in this process's PID namespace (its /proc)."""
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and os.path.exists(f"{proc}/{pid}")
