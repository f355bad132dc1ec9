"""Ascend telemetry from ``npu-smi info`` (FACTS.md §6).

``npu-smi info`` prints two table rows per NPU:

    | 0     910B3               | OK            | 101.8       43                0    / 0             |
    | 0                         | 0000:C1:00.0  | 0           0    / 0          3318 / 65536         |

the first with name, health, power (W), temperature (C) and huge pages; the
second with bus id, AICore (%), memory usage and HBM usage (MB). Under load the
HBM field can lose its space ("59356/ 65536"); 310P cards have no HBM column.
The parser is tolerant of both.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

from hwbench.device.telemetry import TelemetrySampler

_NUMBER = r"(-?\d+(?:\.\d+)?|-|NA)"
_FIRST_ROW = re.compile(
    r"^\|\s*(?P<npu>\d+)\s+(?P<name>[^\s|]+)\s*\|\s*(?P<health>[^|]*?)\s*\|\s*"
    + _NUMBER.replace("(", "(?P<power>", 1)
    + r"\s+"
    + _NUMBER.replace("(", "(?P<temp>", 1)
    + r"\b"
)
_SECOND_ROW = re.compile(
    r"^\|\s*(?P<chip>\d+)(?:\s+(?P<device>\d+))?\s*\|\s*(?P<bus>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*\|\s*(?P<rest>.*)\|\s*$"
)
_USAGE_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")


def _number(text: str | None) -> float | None:
    if text is None or text in ("-", "NA"):
        return None
    return float(text)


def parse_npu_smi_info(text: str) -> dict[int, dict[str, Any]]:
    """Per NPU id: name, health, power_w, temperature_c, utilization_percent
    (AICore), memory_used_mb / memory_total_mb and hbm_used_mb / hbm_total_mb."""
    devices: dict[int, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        # The second row first: on 310P cards it starts with two numbers (chip and
        # device), which the first-row pattern would otherwise take for an NPU row.
        second = _SECOND_ROW.match(line)
        if second:
            if current is not None:
                rest = second["rest"]
                aicore = re.match(r"\s*" + _NUMBER, rest)
                current["bus_id"] = second["bus"]
                current["utilization_percent"] = _number(aicore.group(1)) if aicore else None
                pairs = [(float(a), float(b)) for a, b in _USAGE_PAIR.findall(rest)]
                if pairs:
                    current["memory_used_mb"], current["memory_total_mb"] = pairs[0]
                if len(pairs) > 1:
                    current["hbm_used_mb"], current["hbm_total_mb"] = pairs[1]
                current = None
            continue
        first = _FIRST_ROW.match(line)
        if first:
            current = {
                "npu": int(first["npu"]),
                "name": first["name"],
                "health": first["health"],
                "power_w": _number(first["power"]),
                "temperature_c": _number(first["temp"]),
            }
            devices[current["npu"]] = current
    return devices


class NpuSmiSampler(TelemetrySampler):
    """Runs ``npu-smi info`` at each interval; ``npu-smi`` takes a few hundred
    milliseconds, so intervals under one second are raised to one second."""

    source = "npu-smi"

    def __init__(self, npu_ids: list[int], interval_s: float = 1.0, command: str = "npu-smi") -> None:
        super().__init__(max(1.0, interval_s))
        self.npu_ids = npu_ids
        self._command = shutil.which(command)

    def unavailable_reason(self) -> str | None:
        if self._command is None:
            return "npu-smi is not on PATH (it comes with the Ascend driver)"
        return None

    def read(self) -> list[dict[str, Any]]:
        output = subprocess.run(
            [self._command, "info"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
        table = parse_npu_smi_info(output)
        readings = []
        for npu in self.npu_ids:
            row = dict(table.get(npu, {}))
            if row.get("hbm_used_mb") is not None:  # on HBM cards that is the device memory
                row["memory_used_mb"] = row["hbm_used_mb"]
            readings.append(row)
        return readings
