"""Ascend telemetry from ``npu-smi info`` (Ascend's npu-smi command reference).

``npu-smi info`` prints two table rows per chip:

    | 0     910B3               | OK            | 101.8       43                0    / 0             |
    | 0                         | 0000:C1:00.0  | 0           0    / 0          3318 / 65536         |

the first with the NPU (card) id, name, health, power (W), temperature (C) and
huge pages; the second with the chip number on the card, on some cards a device
id, the bus id, AICore (%), memory usage and HBM usage (MB). The layouts seen in
published outputs (tests/fakes/npu-smi/README.md):

* 910B (``Chip`` header): one chip per NPU id; the NPU id is the device id.
* Atlas A3 (``Chip  Phy-ID``): two dies per NPU id, each with its own row pair;
  the second number is the die's Phy-ID (0-15), and the second die prints
  power as ``-`` (the card's power is on die 0).
* 310P / 310B (``Chip    Device``): NPU ids are card numbers (4, 8, 32, ...);
  a Duo card repeats one NPU id for chips 0 and 1; the second number is the
  chip's device id. 310B boards print ``NA`` for the bus id.

So the table is keyed by device id (the second number where there is one,
else the NPU id): the id torch_npu numbers devices by, which
ASCEND_RT_VISIBLE_DEVICES selects from. Under load the HBM field can lose its
space ("59356/ 65536"); 310P/310B have no HBM column. The parser is tolerant
of both.
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
# The bus id, or NA where the board has no PCIe bus id (310B).
_BUS_ID = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d|NA"
_SECOND_ROW = re.compile(
    rf"^\|\s*(?P<chip>\d+)(?:\s+(?P<device>\d+))?\s*\|\s*(?P<bus>{_BUS_ID})\s*\|\s*(?P<rest>.*)\|\s*$"
)
_USAGE_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")


def _number(text: str | None) -> float | None:
    if text is None or text in ("-", "NA"):
        return None
    return float(text)


def _first_row(match: re.Match) -> dict[str, Any]:
    return {
        "npu": int(match["npu"]),
        "name": match["name"],
        "health": match["health"],
        "power_w": _number(match["power"]),
        "temperature_c": _number(match["temp"]),
    }


def _add_second_row(row: dict[str, Any], match: re.Match) -> None:
    """The chip's ids and usage figures, into the row its first line started."""
    row["chip"] = int(match["chip"])
    row["device_id"] = int(match["device"]) if match["device"] is not None else row["npu"]
    row["bus_id"] = None if match["bus"] == "NA" else match["bus"]
    rest = match["rest"]
    aicore = re.match(r"\s*" + _NUMBER, rest)
    row["utilization_percent"] = _number(aicore.group(1)) if aicore else None
    pairs = [(float(a), float(b)) for a, b in _USAGE_PAIR.findall(rest)]
    if pairs:
        row["memory_used_mb"], row["memory_total_mb"] = pairs[0]
    if len(pairs) > 1:
        row["hbm_used_mb"], row["hbm_total_mb"] = pairs[1]


def parse_npu_smi_rows(text: str) -> list[dict[str, Any]]:
    """One dict per chip (die), in the order npu-smi prints them: npu (card id),
    chip, device_id, name, health, power_w, temperature_c, bus_id (None where
    npu-smi says NA), utilization_percent (AICore), memory_used_mb /
    memory_total_mb and, on HBM cards, hbm_used_mb / hbm_total_mb. A first row
    without its second row has no chip or device_id."""
    rows: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        # The second row first: it starts with one or two numbers (chip, device
        # id) that the first-row pattern would otherwise take for an NPU row;
        # its bus-id column (an address or NA) tells them apart.
        second = _SECOND_ROW.match(line)
        if second:
            if current is not None:
                _add_second_row(current, second)
                current = None
            continue
        first = _FIRST_ROW.match(line)
        if first:
            current = _first_row(first)
            rows.append(current)
    return rows


def parse_npu_smi_info(text: str) -> dict[int, dict[str, Any]]:
    """The rows of parse_npu_smi_rows keyed by device id: the id torch_npu and
    ASCEND_RT_VISIBLE_DEVICES number devices by (the Phy-ID of an A3 die, the
    device id of a 310P/310B chip, the NPU id of a 910B). A first row alone is
    keyed by its NPU id."""
    return {row.get("device_id", row["npu"]): row for row in parse_npu_smi_rows(text)}


class NpuSmiSampler(TelemetrySampler):
    """Runs ``npu-smi info`` at each interval and reads the chips named by
    device id (parse_npu_smi_info); ``npu-smi`` takes a few hundred
    milliseconds, so intervals under one second are raised to one second."""

    source = "npu-smi"

    def __init__(self, device_ids: list[int], interval_s: float = 1.0, command: str = "npu-smi") -> None:
        super().__init__(max(1.0, interval_s))
        self.device_ids = device_ids
        self._command = shutil.which(command)
        self._places: dict[int, dict[str, Any]] = {}  # device id -> its bus id and chip, as npu-smi printed them
        if self._command is None:
            self._reason = "npu-smi is not on PATH (it comes with the Ascend driver)"

    def device_details(self, index: int) -> dict[str, Any]:
        """The chip's identity on its host: its npu-smi device id (in the name), its PCI
        bus id and chip number on the card (two chips of a 310P Duo share the bus id)."""
        if index >= len(self.device_ids):
            return {}
        device_id = self.device_ids[index]
        place = self._places.get(device_id, {})
        return {"name": f"npu:{device_id}", "pci_bus_id": place.get("bus_id"), "chip": place.get("chip"),
                "identified_by": "npu-smi device id"}

    def read(self) -> list[dict[str, Any]]:
        assert self._command is not None, "read() of an unavailable npu-smi reader"
        output = subprocess.run(
            [self._command, "info"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
        table = parse_npu_smi_info(output)
        readings = []
        for device_id in self.device_ids:
            row = dict(table.get(device_id, {}))
            if "chip" in row:
                self._places[device_id] = {"bus_id": row.get("bus_id"), "chip": row["chip"]}
            # npu-smi's "MB" columns count MiB (a 64 GB card's HBM total reads 65536); on HBM cards
            # the HBM figure is the device memory
            used = row.get("hbm_used_mb") if row.get("hbm_used_mb") is not None else row.get("memory_used_mb")
            readings.append({**row, "memory_used_mib": used})
        return readings


# --- before a run (hwbench preflight) ----------------------------------------------------------------

# A row of the process table under the chips: | NPU Chip | Process id | Process name | Process memory(MB) |
_PROCESS_ROW = re.compile(r"^\|\s*(?P<npu>\d+)\s+(?P<chip>\d+)\s*\|\s*(?P<pid>\d+)\s*\|\s*(?P<name>[^|]*?)\s*\|"
                          r"\s*(?P<memory>\d+)\s*\|\s*$")


def parse_npu_smi_processes(text: str) -> list[dict[str, Any]]:
    """The process table of ``npu-smi info``: npu, chip, pid, name and memory (MiB) of each process."""
    return [{"npu": int(m["npu"]), "chip": int(m["chip"]), "pid": int(m["pid"]), "name": m["name"],
             "memory_mib": int(m["memory"])}
            for m in map(_PROCESS_ROW.match, text.splitlines()) if m]


def npu_smi_health(environ, command: str = "npu-smi") -> tuple[list, str | None]:
    """Each chip ``npu-smi info`` lists (those ASCEND_RT_VISIBLE_DEVICES names, where set), as it
    describes them before a run: processes, HBM (else memory) free, its Health verdict; ([], why)
    when npu-smi is missing or fails. npu-smi info shows no ECC counts, clocks or persistence."""
    from hwbench.device.health import DeviceHealth, not_this_process

    path = shutil.which(command)
    if path is None:
        return [], "npu-smi is not on PATH (it comes with the Ascend driver)"
    try:
        output = subprocess.run([path, "info"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return [], f"npu-smi info failed: {type(error).__name__}: {error}"
    visible = {int(item) for item in environ.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if item.strip().isdigit()}
    processes = parse_npu_smi_processes(output)
    devices = []
    for row in parse_npu_smi_rows(output):
        device_id = row.get("device_id", row["npu"])
        if visible and device_id not in visible:
            continue
        device = DeviceHealth(f"npu {device_id}", health=row.get("health") or None)
        device.processes = [f"pid {p['pid']} {p['name']}, {p['memory_mib'] / 1024:.1f} GiB" for p in processes
                            if (p["npu"], p["chip"]) == (row["npu"], row.get("chip")) and not_this_process(p["pid"])]
        used, total = ((row.get("hbm_used_mb"), row.get("hbm_total_mb")) if row.get("hbm_total_mb")
                       else (row.get("memory_used_mb"), row.get("memory_total_mb")))
        if used is not None and total:  # npu-smi's MB are MiB
            device.memory_total_bytes, device.memory_free_bytes = int(total * 2**20), int((total - used) * 2**20)
        for field in ("ecc_uncorrected", "clocks_locked", "throttle_reasons", "persistence_mode"):
            device.unread[field] = "npu-smi info does not show it"
        # npu-smi's per-chip queries (info -t ecc, -t health, the HCCS and RoCE link tools) would;
        # they are not read, since no recorded output of them backs a stand-in here
        for field in ("remapped_rows_uncorrected", "links", "pcie_width"):
            device.unread[field] = ("npu-smi info shows no retired memory, link state or PCIe link; its Health "
                                    "column is the verdict read")
        devices.append(device)
    return devices, None if devices else "npu-smi info lists no chip that ASCEND_RT_VISIBLE_DEVICES names"
