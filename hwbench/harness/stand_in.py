"""A stand-in device (hwbench/device/base.py ``simulated``: a vendor runtime replaced by one that
runs its code path on the host CPU) answers the memory statistics and the sensors of the device it
stands for with fixed values: they describe no device and this host's memory and power neither.
A simulated run records none of them as measured: each is null, and its reason in ``unmeasured``
(the result's convention) names the value the stand-in gave, so that the code path that read it
stays visible (docs/results.md, "Simulated runs").

What stays: the device's description (name, catalog entry, listed capacity), marked by
``device.simulated``, and which devices the sampler found (index, name, UUID, PCI bus id)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from hwbench.point import EMULATED, SIMULATED

if TYPE_CHECKING:
    from hwbench.device import MemoryStats

# A telemetry device's keys that say which device and how it is read, not what it read
TELEMETRY_IDENTITY = ("index", "chip", "package", "name", "host", "uuid", "pci_bus_id", "identified_by",
                      "energy_method", "energy_scope", "energy_warning", "power_method", "unmeasured")
MEMORY_KEPT = ("source", "unmeasured")
# Why a simulated run has no price, energy or projection: its figures measure this host, not the device
SIMULATED_PRICE = "not priced: a simulated device (a stand-in ran its code path on this host)"
SIMULATED_ENERGY = "not counted: a simulated device (its power and energy are a stand-in's fixed values)"
SIMULATED_PROJECTION = "not projected: a simulated device (a stand-in's figures measure this host, not the device)"
SIMULATED_SENSORS = "the device is simulated: a stand-in answers its sensors with fixed values, recorded as none"
# An emulated FP8 run (FP8 computed without FP8 units: the CPU) is a real run of this device, at a speed
# that says nothing of an FP8 device: no price, energy or projection is made of it either
EMULATED_PRICE = "not priced: FP8 emulated (computed without FP8 matrix units), so its speed is no FP8 device's"
EMULATED_ENERGY = "not counted: FP8 emulated (computed without FP8 matrix units), so its energy is no FP8 device's"
EMULATED_PROJECTION = "not projected: FP8 emulated (computed without FP8 matrix units), so its speed is no FP8 device's"
# why a stand-in's run (RunResult.stand_in) has no price, energy or projection, by kind
STAND_IN_PRICE = {SIMULATED: SIMULATED_PRICE, EMULATED: EMULATED_PRICE}
STAND_IN_ENERGY = {SIMULATED: SIMULATED_ENERGY, EMULATED: EMULATED_ENERGY}
STAND_IN_PROJECTION = {SIMULATED: SIMULATED_PROJECTION, EMULATED: EMULATED_PROJECTION}


def stand_in_value(value: Any) -> str:
    """Why a figure a stand-in gave is null: the value, and what it is."""
    return f"the device is simulated: the stand-in gave {value!r}, a test value, not a reading of a device"


def withheld(figures: dict[str, Any], kept: tuple[str, ...]) -> dict[str, Any]:
    """``figures`` with every value outside ``kept`` that the stand-in gave (not None) null, and
    its reason in ``unmeasured``."""
    reasons = dict(figures.get("unmeasured") or {})
    out = dict(figures)
    for name, value in figures.items():
        if name not in kept and value is not None:
            out[name], reasons[name] = None, stand_in_value(value)
    return {**out, "unmeasured": reasons}


def stand_in_readings(memory: MemoryStats, telemetry: dict[str, Any] | None) -> tuple[MemoryStats,
                                                                                      dict[str, Any] | None]:
    """A rank's memory statistics and telemetry summary as a simulated run records them: the
    stand-in's figures withheld; its telemetry not available, with the reason."""
    if telemetry is not None and telemetry.get("available"):
        telemetry = {**telemetry, "available": False, "reason": SIMULATED_SENSORS,
                     "devices": [withheld(device, TELEMETRY_IDENTITY) for device in telemetry.get("devices") or []]}
    return dataclasses.replace(memory, **withheld(dataclasses.asdict(memory), MEMORY_KEPT)), telemetry
