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
from collections.abc import Callable
from typing import Any

from hwbench.device.telemetry import TelemetrySampler

TEMPERATURE_ON_AIP = 0  # pyhlml HLML_TEMPERATURE_SENSORS.HLML_TEMPERATURE_ON_AIP
CLOCK_SOC = 0  # pyhlml HLML_CLOCK_TYPE.HLML_CLOCK_SOC
THROTTLE_BITS = {1 << 0: "power", 1 << 1: "thermal"}  # HLML_CLOCKS_THROTTLE_REASON_POWER / _THERMAL


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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
        return _text(hlml.hlmlGetDriverVersion())
    except Exception:
        return None


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
        try:
            found = {}
            for index in range(self._hlml.hlmlDeviceGetCount()):
                handle = self._hlml.hlmlDeviceGetHandleByIndex(index)
                found[int(self._hlml.hlmlDeviceGetModuleID(handle))] = handle
        except Exception as error:
            self._reason = f"HLML could not list the devices: {type(error).__name__}: {error}"
            return
        missing = [module for module in module_ids if module not in found]
        if missing:
            self._reason = f"HLML has no device with module id {missing[0]} (it lists {sorted(found)})"
            return
        self._handles = [found[module] for module in module_ids]
        self._bus_ids = [self._bus_id(handle) for handle in self._handles]

    def _query(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception:  # HLMLError_NotSupported and friends
            return None

    def _bus_id(self, handle: Any) -> str | None:
        info = self._query(lambda: self._hlml.hlmlDeviceGetPCIInfo(handle))
        return _text(getattr(info, "bus_id", None)) if info is not None else None

    def unavailable_reason(self) -> str | None:
        return self._reason

    def device_details(self, index: int) -> dict[str, Any]:
        if index >= len(self._handles):
            return {}
        return {"name": f"hpu:{self.module_ids[index]}", "pci_bus_id": self._bus_ids[index],
                "identified_by": "HLML module id", "power_method": "hlmlDeviceGetPowerUsage (mW)"}

    def read(self) -> list[dict[str, Any]]:
        return [self._read_device(handle) for handle in self._handles]

    def _read_device(self, handle: Any) -> dict[str, Any]:
        hl = self._hlml
        power_mw = self._query(lambda: hl.hlmlDeviceGetPowerUsage(handle))
        utilization = self._query(lambda: hl.hlmlDeviceGetUtilizationRates(handle))
        memory = self._query(lambda: hl.hlmlDeviceGetMemoryInfo(handle))
        reading = {
            "power_w": power_mw / 1000.0 if power_mw is not None else None,
            "temperature_c": self._query(lambda: hl.hlmlDeviceGetTemperature(handle, TEMPERATURE_ON_AIP)),
            "sm_clock_mhz": self._query(lambda: hl.hlmlDeviceGetClockInfo(handle, CLOCK_SOC)),
            "utilization_percent": getattr(utilization, "aip", None),
            "memory_used_mib": memory.used / 2**20 if memory is not None else None,
        }
        mask = self._query(lambda: hl.hlmlDeviceGetCurrentClocksThrottleReasons(handle))
        if mask is not None:
            reading["throttle_reasons"] = [name for bit, name in THROTTLE_BITS.items() if int(mask) & bit]
        return reading

    def energy_counter_j(self) -> list[float | None]:
        counters: list[float | None] = []
        for handle in self._handles:
            millijoules = self._query(lambda: self._hlml.hlmlDeviceGetTotalEnergyConsumption(handle))
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
    try:
        handles = [hl.hlmlDeviceGetHandleByIndex(index) for index in range(hl.hlmlDeviceGetCount())]
        by_module = {int(hl.hlmlDeviceGetModuleID(handle)): handle for handle in handles}
    except Exception as error:
        return [], f"HLML could not list the devices: {type(error).__name__}: {error}"
    visible = [item.strip() for item in environ.get("HABANA_VISIBLE_MODULES", "").split(",") if item.strip()]
    modules = [int(item) for item in visible if item.isdigit()] if visible else sorted(by_module)
    devices = [_module_health(hl, module, by_module[module]) for module in modules if module in by_module]
    return devices, None if devices else f"HLML lists no module that HABANA_VISIBLE_MODULES names ({sorted(by_module)})"


def _module_health(hl: Any, module: int, handle: Any) -> Any:
    from hwbench.device.health import DeviceHealth

    sampler = HlmlSampler.__new__(HlmlSampler)  # its wrapped queries, without opening HLML again
    sampler._hlml = hl
    bus_id = sampler._bus_id(handle)
    device = DeviceHealth(f"hpu {module}" + (f" ({bus_id})" if bus_id else ""))
    memory = sampler._query(lambda: hl.hlmlDeviceGetMemoryInfo(handle))
    if memory is None:
        device.unread["memory_free_bytes"] = "HLML: no memory information"
    else:
        device.memory_free_bytes, device.memory_total_bytes = int(memory.free), int(memory.total)
    device.clock_mhz = sampler._query(lambda: hl.hlmlDeviceGetClockInfo(handle, CLOCK_SOC))
    mask = sampler._query(lambda: hl.hlmlDeviceGetCurrentClocksThrottleReasons(handle))
    if mask is not None:
        device.throttle_reasons = [name for bit, name in THROTTLE_BITS.items() if int(mask) & bit]
    for field in ("processes", "ecc_uncorrected", "clocks_locked", "persistence_mode"):
        device.unread[field] = _NOT_READ
    return device
