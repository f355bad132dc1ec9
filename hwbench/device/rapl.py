"""CPU package energy from RAPL through the kernel's powercap interface.

Each top-level zone /sys/class/powercap/intel-rapl:N whose `name` is `package-N`
(Intel, and AMD on kernels whose RAPL driver registers there) has a cumulative
`energy_uj` counter that wraps at `max_energy_range_uj`. The sampler reads it at
every telemetry interval and adds up the increments, one wrap allowed between two
readings (a 262 J range at 200 W wraps in about 20 min, far above the interval), so
the energy over the timed window is right however often the counter wrapped.

What it measures: the whole package (socket) of the cores the run may use, every
process on it included, not this run alone; DRAM is not in it. Since Linux 5.10
`energy_uj` is readable by root only (CVE-2020-8694); unreadable, the telemetry
is unavailable with that reason.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from pathlib import Path
from typing import Any

from hwbench.device.telemetry import TelemetrySampler

POWERCAP = Path("/sys/class/powercap")
ENERGY_METHOD = "rapl-package"
ENERGY_SCOPE = ("RAPL package domain: the whole CPU socket, every process on it (not only this run's ranks); "
                "DRAM not included")
_ZONE = re.compile(r"^intel-rapl:(\d+)$")  # top-level zones only: intel-rapl:N:M are sub-domains (core, dram)
_PACKAGE = re.compile(r"^package-(\d+)(?:-die-\d+)?$")


@dataclasses.dataclass(frozen=True)
class PackageDomain:
    """One RAPL package zone: its folder, `name`, package id and counter range."""

    path: Path
    name: str
    package: int
    max_energy_range_uj: int

    def energy_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())


def package_domains(root: Path = POWERCAP, packages: list[int] | None = None
                    ) -> tuple[list[PackageDomain], str | None]:
    """The package zones under ``root`` (only those of ``packages`` when given), each
    with a counter that can be read now; ([], why) when there is none to read."""
    zones = sorted((p for p in root.glob("intel-rapl:*") if _ZONE.match(p.name)),
                   key=lambda p: int(p.name.rsplit(":", 1)[1])) if root.is_dir() else []
    domains = []
    for zone in zones:
        try:
            name = (zone / "name").read_text().strip()
            found = _PACKAGE.match(name)
            if found and (packages is None or int(found.group(1)) in packages):
                domains.append(PackageDomain(zone, name, int(found.group(1)),
                                             int((zone / "max_energy_range_uj").read_text().strip())))
        except (OSError, ValueError):
            continue  # a zone without a readable name or range is not one we can use
    if not root.is_dir():
        return [], f"no RAPL: {root} does not exist (no powercap driver: an older kernel, or a virtual machine)"
    if not domains:
        where = f" for CPU package {', '.join(map(str, packages))}" if packages is not None else ""
        return [], f"no RAPL: {root} has no intel-rapl package domain{where}"
    for domain in domains:
        try:
            domain.energy_uj()
        except PermissionError:
            return [], (f"RAPL energy unreadable: {domain.path / 'energy_uj'} is root-only (Linux >= 5.10); "
                        "run as root or grant read access to measure CPU energy")
        except (OSError, ValueError) as error:
            return [], f"RAPL energy unreadable: {domain.path / 'energy_uj'}: {type(error).__name__}: {error}"
    return domains, None


def counter_increment_uj(before: int, after: int, range_uj: int) -> int:
    """Energy between two readings of a counter that wraps to 0 past ``range_uj``."""
    return after - before if after >= before else after + (range_uj - before)


class RaplSampler(TelemetrySampler):
    """Package energy and mean power per CPU package over the timed window."""

    source = "rapl"
    energy_method = ENERGY_METHOD

    def __init__(self, interval_s: float = 0.5, root: Path = POWERCAP, packages: list[int] | None = None) -> None:
        super().__init__(interval_s)
        self.domains, self._reason = package_domains(root, packages)
        self._lock = threading.Lock()  # read() runs in the sampler thread, energy_counter_j() in the caller's
        self._last: list[int | None] = [None] * len(self.domains)
        self._total_uj: list[int | None] = [0] * len(self.domains)
        self._last_time: float | None = None

    def _advance(self) -> tuple[list[int | None], float | None]:
        """Read every counter, add what it grew since the last reading to the totals;
        (the increments in µJ, seconds since the last reading)."""
        with self._lock:
            now = time.monotonic()
            elapsed = None if self._last_time is None else now - self._last_time
            self._last_time = now
            increments: list[int | None] = []
            for i, domain in enumerate(self.domains):
                try:
                    reading = domain.energy_uj()
                except (OSError, ValueError):
                    reading = None
                previous, self._last[i] = self._last[i], reading
                if reading is None or self._total_uj[i] is None:
                    self._total_uj[i] = None  # a lost reading makes the window's total unknown
                    increments.append(None)
                elif previous is None:
                    increments.append(None)
                else:
                    step = counter_increment_uj(previous, reading, domain.max_energy_range_uj)
                    self._total_uj[i] = (self._total_uj[i] or 0) + step  # not None: checked above
                    increments.append(step)
            return increments, elapsed

    def read(self) -> list[dict[str, Any]]:
        increments, elapsed = self._advance()
        # The counter moves in steps of about 1 ms: over a much shorter gap (the reading
        # right after start) the power would be noise, so it is left out.
        if elapsed is None or elapsed < self.interval_s / 2:
            return [{"power_w": None} for _ in increments]
        return [{"power_w": step / 1e6 / elapsed if step is not None else None}
                for step in increments]

    def energy_counter_j(self) -> list[float | None]:
        self._advance()
        return [None if total is None else total / 1e6 for total in self._total_uj]

    def _summarise_device(self, index, readings, times, window_s, energy_end) -> dict[str, Any]:
        summary = super()._summarise_device(index, readings, times, window_s, energy_end)
        if summary["energy_j"] is not None and window_s > 0:  # exact, where the sampled mean is not
            summary["power_w_mean"] = summary["energy_j"] / window_s
            if summary["power_w_max"] is None:
                summary["unmeasured"]["power_w"] = ("max: no reading spanned half an interval; "
                                                    "the mean is energy / window")
            else:
                summary["unmeasured"].pop("power_w", None)
        return summary

    def device_details(self, index: int) -> dict[str, Any]:
        domain = self.domains[index]
        return {"name": domain.name, "package": domain.package, "energy_scope": ENERGY_SCOPE}
