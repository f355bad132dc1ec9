"""Intel Gaudi telemetry through HLML, the library behind hl-smi (PyPI package
``habana-pyhlml``, module ``pyhlml``).

A Gaudi is found by its module id (``hlmlDeviceGetModuleID``): HABANA_VISIBLE_MODULES lists
module ids and the bridge numbers the listed ones from 0. Units from the wheel's docstrings:
power in mW, total energy in mJ since the driver was loaded, temperature in C, clocks in MHz,
memory in bytes. Every query is wrapped: an unsupported reading is None.

Without the Gaudi driver ``import pyhlml`` works, and ``hlmlInit()`` prints "Failed to load
libhlml" on stdout and raises ``HLMLError_Uninitialized``: both are caught here."""

from __future__ import annotations

import contextlib
import io
from typing import Any

from hwbench.device.telemetry import TelemetrySampler, as_text, quietly

TEMPERATURE_ON_AIP = 0  # pyhlml HLML_TEMPERATURE_SENSORS.HLML_TEMPERATURE_ON_AIP
CLOCK_SOC = 0  # pyhlml HLML_CLOCK_TYPE.HLML_CLOCK_SOC
THROTTLE_BITS = {1 << 0: "power", 1 << 1: "thermal"}  # HLML_CLOCKS_THROTTLE_REASON_POWER / _THERMAL


def open_hlml() -> tuple[Any | None, str | None]:
    """(the initialised pyhlml module, None) or (None, why HLML cannot be used)."""
    try:
        import pyhlml
    except ImportError:
        return None, "habana-pyhlml (module pyhlml) is not installed"
    with contextlib.redirect_stdout(io.StringIO()):  # the wheel prints its loader's failure
        try:
            pyhlml.hlmlInit()
        except Exception as error:
            return None, (f"HLML unavailable: {type(error).__name__}: {error} (libhlml.so comes with the Gaudi "
                          "driver, /usr/lib/habanalabs)")
    return pyhlml, None


def hlml_driver_version() -> str | None:
    hlml, _ = open_hlml()
    if hlml is None:
        return None
    try:
        return as_text(hlml.hlmlGetDriverVersion())
    except Exception:
        return None


def _handles_by_module(hl: Any) -> tuple[dict[int, Any], str | None]:
    """Every Gaudi HLML lists, by module id (the ids HABANA_VISIBLE_MODULES names); ({}, why)
    when HLML cannot list them."""
    try:
        handles = [hl.hlmlDeviceGetHandleByIndex(index) for index in range(hl.hlmlDeviceGetCount())]
        return {int(hl.hlmlDeviceGetModuleID(handle)): handle for handle in handles}, None
    except Exception as error:
        return {}, f"HLML could not list the devices: {type(error).__name__}: {error}"


def _bus_id(hl: Any, handle: Any) -> str | None:
    info = quietly(lambda: hl.hlmlDeviceGetPCIInfo(handle))
    return as_text(getattr(info, "bus_id", None)) if info is not None else None


class HlmlSampler(TelemetrySampler):
    source = "hlml"
    energy_method = "HLML total energy counter (hlmlDeviceGetTotalEnergyConsumption)"

    def __init__(self, module_ids: list[int], interval_s: float = 0.5) -> None:
        super().__init__(interval_s)
        self.module_ids = module_ids
        self._handles: list[Any] = []
        self._bus_ids: list[str | None] = []
        library, self._reason = open_hlml()
        self._hlml: Any = library  # None only when it could not be opened, and then no handle is read
        if self._hlml is None:
            return
        found, self._reason = _handles_by_module(self._hlml)
        if self._reason:
            return
        missing = [module for module in module_ids if module not in found]
        if missing:
            self._reason = f"HLML has no device with module id {missing[0]} (it lists {sorted(found)})"
            return
        self._handles = [found[module] for module in module_ids]
        self._bus_ids = [_bus_id(self._hlml, handle) for handle in self._handles]

    def device_details(self, index: int) -> dict[str, Any]:
        if index >= len(self._handles):
            return {}
        return {"name": f"hpu:{self.module_ids[index]}", "pci_bus_id": self._bus_ids[index],
                "identified_by": "HLML module id", "power_method": "hlmlDeviceGetPowerUsage (mW)"}

    def read(self) -> list[dict[str, Any]]:
        return [self._read_device(handle) for handle in self._handles]

    def _read_device(self, handle: Any) -> dict[str, Any]:
        hl = self._hlml
        power_mw = quietly(lambda: hl.hlmlDeviceGetPowerUsage(handle))
        utilization = quietly(lambda: hl.hlmlDeviceGetUtilizationRates(handle))
        memory = quietly(lambda: hl.hlmlDeviceGetMemoryInfo(handle))
        reading = {
            "power_w": power_mw / 1000.0 if power_mw is not None else None,
            "temperature_c": quietly(lambda: hl.hlmlDeviceGetTemperature(handle, TEMPERATURE_ON_AIP)),
            "sm_clock_mhz": quietly(lambda: hl.hlmlDeviceGetClockInfo(handle, CLOCK_SOC)),
            "utilization_percent": getattr(utilization, "aip", None),
            "memory_used_mib": memory.used / 2**20 if memory is not None else None,
        }
        mask = quietly(lambda: hl.hlmlDeviceGetCurrentClocksThrottleReasons(handle))
        if mask is not None:
            reading["throttle_reasons"] = [name for bit, name in THROTTLE_BITS.items() if int(mask) & bit]
        return reading

    def energy_counter_j(self) -> list[float | None]:
        counters: list[float | None] = []
        for handle in self._handles:
            millijoules = quietly(lambda: self._hlml.hlmlDeviceGetTotalEnergyConsumption(handle))
            counters.append(millijoules / 1000.0 if millijoules is not None else None)
        return counters


# --- before a run (hwbench preflight) ----------------------------------------------------------------

# What this reader does not ask HLML for (it reads what the run's sampler above reads): why each is None
_NOT_READ = "HLML: hwbench's preflight does not read it from HLML yet"


def hlml_health(environ) -> tuple[list, str | None]:
    """Each Gaudi a run on this node may use (the module ids HABANA_VISIBLE_MODULES lists, else
    every one), as HLML describes it before the run: free memory, SOC clock, throttle reasons;
    ([], why) when HLML cannot be read."""
    hl, reason = open_hlml()
    if hl is None:
        return [], reason
    by_module, reason = _handles_by_module(hl)
    if reason:
        return [], reason
    visible = [item.strip() for item in environ.get("HABANA_VISIBLE_MODULES", "").split(",") if item.strip()]
    modules = [int(item) for item in visible if item.isdigit()] if visible else sorted(by_module)
    devices = [_module_health(hl, module, by_module[module]) for module in modules if module in by_module]
    return devices, None if devices else f"HLML lists no module that HABANA_VISIBLE_MODULES names ({sorted(by_module)})"


def _module_health(hl: Any, module: int, handle: Any) -> Any:
    from hwbench.device.health import DeviceHealth

    bus_id = _bus_id(hl, handle)
    device = DeviceHealth(f"hpu {module}" + (f" ({bus_id})" if bus_id else ""))
    memory = quietly(lambda: hl.hlmlDeviceGetMemoryInfo(handle))
    if memory is None:
        device.unread["memory_free_bytes"] = "HLML: no memory information"
    else:
        device.memory_free_bytes, device.memory_total_bytes = int(memory.free), int(memory.total)
    device.clock_mhz = quietly(lambda: hl.hlmlDeviceGetClockInfo(handle, CLOCK_SOC))
    mask = quietly(lambda: hl.hlmlDeviceGetCurrentClocksThrottleReasons(handle))
    if mask is not None:
        device.throttle_reasons = [name for bit, name in THROTTLE_BITS.items() if int(mask) & bit]
    _read_gaudi_health(hl, handle, device)
    for field in ("processes", "clocks_locked", "persistence_mode"):
        device.unread[field] = _NOT_READ
    return device


# pyhlml's HLML_MEMORY_ERROR (0 corrected, 1 uncorrected), HLML_ECC_COUNTER (0 volatile, 1 aggregate)
# and HLML_ROW_REPLACEMENT_CAUSE (0 multiple single-bit errors, 1 a double-bit error)
CORRECTED, UNCORRECTED, VOLATILE, AGGREGATE = 0, 1, 0, 1
ROWS_SINGLE_BIT, ROWS_DOUBLE_BIT = 0, 1
NIC_PORT_BITS = 128  # hlmlDeviceGetMacAddrInfo's port mask: two 64-bit words


def _read_gaudi_health(hl: Any, handle: Any, device: Any) -> None:
    """ECC counts, replaced rows, NIC ports and the PCIe link, as habana-pyhlml reads them."""
    from hwbench.device.health import LinkHealth

    def ecc(kind: int, counter: int) -> int | None:
        return quietly(lambda: hl.hlmlDeviceGetTotalECCErrors(handle, kind, counter))

    device.ecc_uncorrected, device.ecc_corrected = ecc(UNCORRECTED, VOLATILE), ecc(CORRECTED, VOLATILE)
    device.ecc_uncorrected_aggregate, device.ecc_corrected_aggregate = ecc(UNCORRECTED, AGGREGATE), ecc(CORRECTED,
                                                                                                        AGGREGATE)
    if device.ecc_uncorrected is None:
        device.unread["ecc_uncorrected"] = "HLML: no ECC counts"
    device.remapped_rows_corrected = quietly(lambda: hl.hlmlDeviceGetReplacedRowsCount(handle, ROWS_SINGLE_BIT))
    device.remapped_rows_uncorrected = quietly(lambda: hl.hlmlDeviceGetReplacedRowsCount(handle, ROWS_DOUBLE_BIT))
    pending = quietly(lambda: hl.hlmlDeviceGetReplacedRowsPendingStatus(handle))
    device.retirement_pending = bool(pending) if pending is not None else None
    if device.remapped_rows_uncorrected is None:
        device.unread["remapped_rows_uncorrected"] = "HLML: no replaced rows (an older driver)"
    device.unread["remap_failed"] = "HLML reports no row replacement failure"
    masks = quietly(lambda: hl.hlmlDeviceGetMacAddrInfo(handle))
    device.link_kind = "NIC port"
    if masks is not None:
        ports = [port for port in range(NIC_PORT_BITS) if (masks[0][port // 64] >> (port % 64)) & 1]
        states = [quietly(lambda: hl.hlmlDeviceNicGetLink(handle, port)) for port in ports]
        device.links = [LinkHealth(port, None if up is None else bool(up)) for port, up in zip(ports, states)]
    else:
        device.unread["links"] = "HLML: no NIC port mask (hlmlDeviceGetMacAddrInfo, an older habana-pyhlml)"
    device.pcie_width = quietly(lambda: hl.hlmlDeviceGetCurrPCIELinkWidth(handle))
    device.pcie_generation = quietly(lambda: hl.hlmlDeviceGetCurrPCIELinkGeneration(handle))
    device.unread["pcie_max_width"] = "HLML gives no maximum PCIe width or generation: the width is shown, not judged"
