"""Device telemetry sampled by a background thread around the timed steps.

A sampler reads every visible device at a fixed interval; its summary holds
means, maxima and energy. Readings a device does not support are None and the
summary says why, so a missing sensor never stops a benchmark.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

# How each reading is summarised over the timed window.
MEAN_AND_MAX = ("power_w", "temperature_c", "sm_clock_mhz", "utilization_percent", "memory_used_mib")
INTEGRATED_POWER = "integrated power samples"
# Energy and mean power x window disagreeing by more than this factor means a wrong
# reading (another device's counter, a unit), not sampling noise; checked only with this
# many power samples, since the edge samples (at barriers, idle) skew a short window's mean.
ENERGY_MISMATCH_FACTOR = 2.0
ENERGY_CHECK_MIN_SAMPLES = 10


def quietly(call: Callable[[], Any]) -> Any:
    """``call()``, or None where it raises: a vendor library's query a device does not support
    (NVMLError_NotSupported, AmdSmiLibraryException, HLMLError_NotSupported) is not measured."""
    try:
        return call()
    except Exception:
        return None


def as_text(value: Any) -> str | None:
    """A vendor library's string (bytes from the C API, or str) as text; None stays None."""
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class TelemetrySampler:
    """Base sampler: subclasses implement ``read`` (one reading per device) and
    may override ``energy_counter_j`` when the device has an energy counter."""

    source = "none"
    energy_method = "energy counter"  # what energy_counter_j reads, as the result names it
    _reason: str | None = None  # why this sampler measures nothing (unavailable_reason); None when it works

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, list[dict[str, Any]]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._energy_start: list[float | None] = []
        self._edge_times: set[float] = set()  # when the samples at start and stop were taken
        self._window: tuple[float, float] | None = None

    # To be provided by vendors -------------------------------------------
    def read(self) -> list[dict[str, Any]]:
        """One reading per device, open (summarised by name): keys from MEAN_AND_MAX plus
        'throttle_reasons' (list of names) and 'ecc_uncorrected' (count); None where unsupported."""
        return []

    def energy_counter_j(self) -> list[float | None]:
        """Cumulative energy per device in joules, where the device counts it."""
        return []

    def unavailable_reason(self) -> str | None:
        """Why this sampler measures nothing, or None when it works."""
        return self._reason

    def device_details(self, index: int) -> dict[str, Any]:
        """What names device ``index`` in the summary beyond its index, open (a RAPL domain's name,
        a GPU's UUID): merging ranks keys devices by it (hwbench.harness.merge.device_key)."""
        return {}

    def integrated_energy_method(self, index: int) -> str:
        """The result's energy_method for device ``index`` when its energy is integrated power."""
        return INTEGRATED_POWER

    # Running -------------------------------------------------------------
    def start(self) -> None:
        if self.unavailable_reason():
            return
        self._energy_start = self.energy_counter_j()
        self._window = (time.monotonic(), math.nan)
        self._take_sample(edge=True)  # the first reading, before the thread, so a window always has two
        self._thread = threading.Thread(target=self._loop, name="hwbench-telemetry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take_sample()

    def _take_sample(self, edge: bool = False) -> None:
        try:
            taken = time.monotonic()
            self.samples.append((taken, self.read()))
            if edge:
                self._edge_times.add(taken)
        except Exception as error:  # a flaky sensor must not end the run
            if len(self.errors) < 5:
                self.errors.append(f"{type(error).__name__}: {error}")

    def inside_samples(self) -> list[tuple[float, list[dict[str, Any]]]]:
        """The samples the thread took inside the window, without the two taken at ``start``
        and ``stop``: those are taken where the caller synchronises, with the device idle."""
        return [sample for sample in self.samples if sample[0] not in self._edge_times]

    def stop(self) -> dict[str, Any]:
        """Stop sampling and summarise the window since ``start``: an open mapping (each vendor adds
        its own keys), which the worker validates once as the result's Telemetry section."""
        reason = self.unavailable_reason()
        if reason:
            return {"source": self.source, "available": False, "reason": reason, "devices": []}
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._take_sample(edge=True)  # one reading at the very end of the window
        energy_end = self.energy_counter_j()
        start = self._window[0] if self._window else time.monotonic()
        return self._summarise(time.monotonic() - start, energy_end)

    def _summarise(self, window_s: float, energy_end: list[float | None]) -> dict[str, Any]:
        device_count = max((len(r) for _, r in self.samples), default=0)
        devices = []
        for index in range(device_count):
            readings = [r[index] for _, r in self.samples if index < len(r)]
            times = [t for t, r in self.samples if index < len(r)]
            devices.append(self._summarise_device(index, readings, times, window_s, energy_end))
        return {
            "source": self.source,
            "available": True,
            "interval_s": self.interval_s,
            "window_s": window_s,
            "samples": len(self.samples),
            "errors": self.errors,
            "devices": devices,
        }

    def _summarise_device(self, index, readings, times, window_s, energy_end) -> dict[str, Any]:
        summary: dict[str, Any] = {"index": index}
        unmeasured: dict[str, str] = {}
        for key in MEAN_AND_MAX:
            values = [r.get(key) for r in readings if r.get(key) is not None]
            if values:
                summary[f"{key}_mean"] = sum(values) / len(values)
                summary[f"{key}_max"] = max(values)
            else:
                summary[f"{key}_mean"] = summary[f"{key}_max"] = None
                unmeasured[key] = "not reported by this device"
        inside = [r for t, r in zip(times, readings) if t not in self._edge_times]
        summary["throttle_reasons"] = _throttle_reasons(readings, inside, unmeasured)
        ecc = [r.get("ecc_uncorrected") for r in readings if r.get("ecc_uncorrected") is not None]
        summary["ecc_uncorrected_delta"] = (max(ecc) - min(ecc)) if ecc else None
        summary["energy_j"], summary["energy_method"] = self._energy(index, readings, times, energy_end)
        if summary["energy_j"] is None:
            unmeasured["energy_j"] = "no energy counter and no power readings"
        power_samples = sum(1 for r in readings if r.get("power_w") is not None)
        mismatch = _energy_mismatch(summary["energy_j"], summary["power_w_mean"], window_s, power_samples)
        if mismatch:
            summary["energy_warning"] = mismatch
        summary["unmeasured"] = unmeasured
        # after the readings, so a sampler can say how they were taken (NVML's power call)
        summary.update(self.device_details(index))
        return summary

    def _energy(self, index, readings, times, energy_end):
        begin = self._energy_start[index] if index < len(self._energy_start) else None
        end = energy_end[index] if index < len(energy_end) else None
        if begin is not None and end is not None:
            return end - begin, self.energy_method
        powers = [(t, r.get("power_w")) for t, r in zip(times, readings) if r.get("power_w") is not None]
        if len(powers) >= 2:  # trapezoidal integration of sampled power
            joules = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(powers, powers[1:]))
            return joules, self.integrated_energy_method(index)
        return None, None


def _throttle_reasons(readings: list[dict[str, Any]], inside: list[dict[str, Any]],
                      unmeasured: dict[str, str]) -> list[str] | None:
    """The sorted union of the reasons in the samples ``inside`` the window. The samples
    at start and stop are left out: they are taken at the barriers around the timed
    steps, where the device waits, not where it trains."""
    if not any("throttle_reasons" in r for r in readings):
        return None
    if not any("throttle_reasons" in r for r in inside):
        unmeasured["throttle_reasons"] = "no sample inside the window, only its edges (at barriers)"
        return None
    return sorted({name for r in inside for name in (r.get("throttle_reasons") or [])})


def _energy_mismatch(energy_j: float | None, power_w_mean: float | None, window_s: float,
                     power_samples: int) -> str | None:
    """A note when energy and mean power x window disagree past ENERGY_MISMATCH_FACTOR."""
    if energy_j is None or not power_w_mean or window_s <= 0 or power_samples < ENERGY_CHECK_MIN_SAMPLES:
        return None
    ratio = energy_j / (power_w_mean * window_s)
    if 1 / ENERGY_MISMATCH_FACTOR <= ratio <= ENERGY_MISMATCH_FACTOR:
        return None
    return (f"energy {energy_j:.4g} J is {ratio:.2f}x the mean power x window "
            f"({power_w_mean:.4g} W x {window_s:.4g} s): one of them is not this device's")
