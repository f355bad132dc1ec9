"""NVML telemetry through nvidia-ml-py (module ``pynvml``), FACTS.md §8.

Every query is wrapped: a GPU that does not support one gives None."""

from __future__ import annotations

from typing import Any, Callable

from hwbench.device.telemetry import TelemetrySampler

# Clock event (throttle) reason bits, nvml.h
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def decode_throttle_reasons(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def _import_pynvml():
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    return pynvml


def nvml_driver_version() -> str | None:
    pynvml = _import_pynvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None


class NvmlSampler(TelemetrySampler):
    source = "nvml"

    def __init__(self, uuids: list[str], indices: list[int], interval_s: float = 0.5) -> None:
        super().__init__(interval_s)
        self._pynvml = _import_pynvml()
        self._handles: list[Any] = []
        self._names = [f"gpu:{index}" for index in indices]  # distinct on the node, unlike the summary's index
        self._reason: str | None = None
        if self._pynvml is None:
            self._reason = "nvidia-ml-py (module pynvml) is not installed"
            return
        try:
            self._pynvml.nvmlInit()
            padded = list(uuids) + [None] * (len(indices) - len(uuids))
            self._handles = [self._handle(uuid, index) for uuid, index in zip(padded, indices)]
        except Exception as error:
            self._reason = f"NVML unavailable: {type(error).__name__}: {error}"

    def _handle(self, uuid: str | None, index: int):
        if uuid:
            text = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            try:
                return self._pynvml.nvmlDeviceGetHandleByUUID(text)
            except Exception:
                pass
        return self._pynvml.nvmlDeviceGetHandleByIndex(index)

    def unavailable_reason(self) -> str | None:
        return self._reason

    def device_details(self, index: int) -> dict[str, Any]:
        return {"name": self._names[index]} if index < len(self._names) else {}

    def _query(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception:  # NVMLError_NotSupported and friends: not measured
            return None

    def read(self) -> list[dict[str, Any]]:
        nv = self._pynvml
        readings = []
        for h in self._handles:
            power_mw = self._query(lambda: nv.nvmlDeviceGetPowerUsage(h))
            mask = self._query(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
            if mask is None:
                mask = self._query(lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
            memory = self._query(lambda: nv.nvmlDeviceGetMemoryInfo(h))
            utilization = self._query(lambda: nv.nvmlDeviceGetUtilizationRates(h))
            reading = {
                "power_w": power_mw / 1000.0 if power_mw is not None else None,
                "temperature_c": self._query(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                "sm_clock_mhz": self._query(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                "utilization_percent": utilization.gpu if utilization is not None else None,
                "memory_used_mb": memory.used / 2**20 if memory is not None else None,
                "ecc_uncorrected": self._query(
                    lambda: nv.nvmlDeviceGetTotalEccErrors(
                        h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                    )
                ),
            }
            if mask is not None:
                reading["throttle_reasons"] = decode_throttle_reasons(int(mask))
            readings.append(reading)
        return readings

    def energy_counter_j(self) -> list[float | None]:
        counters = []
        for h in self._handles:
            millijoules = self._query(lambda: self._pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
            counters.append(millijoules / 1000.0 if millijoules is not None else None)
        return counters
