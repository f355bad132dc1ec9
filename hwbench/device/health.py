"""What a device's own management library says of it before a run (`hwbench preflight`): other
processes on each device, its free memory, ECC errors, retired pages and remapped rows, its links
to its peers and to the host (PCIe), clocks and throttle reasons, persistence mode; and the one
judgement of the device's health (`judge_health`), which `hwbench preflight` shows and `hwbench
accept` fails on before any timing. Read without torch: the check runs in the launcher before
any rank starts, and a device initialised there (a CUDA context) would itself be another process
on the GPU holding memory; and `hwbench preflight` starts quickly. A reading a device or library does not give is None,
with the reason in ``unread``.

The shape each reader fills (`DeviceHealth`), the CPU's reader (the kernel's /proc and /sys),
and which collective-library variables change performance (the libraries named here, in the
device layer); the vendors' readers are in nvml.py, amd_smi.py, npu_smi.py and hlml.py, each
named by its kind's entry in the registry (kinds.py) and called by preflight.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from hwbench.device.host import usable_cores


@dataclasses.dataclass
class LinkHealth:
    """One link of a device to its peers (an NVLink, an xGMI link, a Gaudi NIC port)."""

    index: int
    up: bool | None  # None: the tool gives no state for this link
    errors: dict[str, int] = dataclasses.field(default_factory=dict)  # counter name -> count since reset


@dataclasses.dataclass
class DeviceHealth:
    """One device as its management library describes it before a run."""

    name: str  # "gpu 0 (GPU-3f2...)", "npu 3", "cpu"
    processes: list[str] | None = None  # other processes computing on it, "pid 4242 python (3.1 GiB)"
    load: float | None = None  # the CPU: the 1-minute load average, other processes' demand for its cores
    cores: int | None = None  # the CPU: the cores this process may use
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    ecc_uncorrected: int | None = None  # since the driver loaded (volatile), or the kernel's EDAC count
    ecc_corrected: int | None = None
    ecc_uncorrected_aggregate: int | None = None  # over the device's life (NVML's aggregate counter)
    ecc_corrected_aggregate: int | None = None
    retired_pages_single_bit: int | None = None  # pages retired for repeated single-bit errors (before Ampere)
    retired_pages_double_bit: int | None = None  # pages retired for a double-bit (uncorrectable) error
    retirement_pending: bool | None = None  # a page retirement or row remap that waits for a GPU reset
    remapped_rows_corrected: int | None = None  # rows remapped for correctable errors (Ampere and newer)
    remapped_rows_uncorrected: int | None = None
    remap_failed: bool | None = None  # a row could not be remapped: no spare row left
    links: list[LinkHealth] | None = None  # the device's own links (NVLink, xGMI, Gaudi's NIC ports)
    link_kind: str | None = None  # what its links are: "NVLink", "xGMI", "NIC port"
    link_errors: str | None = None  # the tool's verdict on its links where it gives one and no per-link state
    pcie_width: int | None = None  # lanes the link to the host trained at
    pcie_max_width: int | None = None  # lanes the device and its slot allow
    pcie_generation: int | None = None
    pcie_max_generation: int | None = None
    health: str | None = None  # the tool's own verdict where it gives one (npu-smi's Health column)
    clock_mhz: float | None = None
    max_clock_mhz: float | None = None
    clocks_locked: bool | None = None  # set by an administrator (application clocks, a fixed performance level)
    clocks_how: str | None = None  # what clocks_locked was read from
    throttle_reasons: list[str] | None = None  # active now ("gpu idle" left out)
    hardware_throttles: list[str] = dataclasses.field(default_factory=list)  # of those, the hardware's own slowdowns
    persistence_mode: bool | None = None
    unread: dict[str, str] = dataclasses.field(default_factory=dict)  # field -> why it is None
    fixes: dict[str, str] = dataclasses.field(default_factory=dict)  # field -> the vendor's command that sets it right

    def why(self, field: str, default: str) -> str:
        return self.unread.get(field, default)


@dataclasses.dataclass
class DeviceReadings:
    kind: str  # the device kind read: cuda, rocm, npu, hpu, cpu
    source: str  # the library or tool read
    devices: list[DeviceHealth]
    reason: str | None = None  # why no device could be read


# --- the judgement -------------------------------------------------------------------------------
# One place for what a reading means (preflight's checks and accept's health read both take it):
# FAIL: the device is faulty or degraded, and what it measures is not the device's figure (or not
# trustworthy at all); WARNING: worth a look, measured all the same; INFO: a reading shown only.

FAIL, WARNING, INFO = "fail", "warning", "info"
MEMORY, LINKS = "memory", "links"  # the areas: preflight's ecc_errors and device_links checks


@dataclasses.dataclass(frozen=True)
class HealthFinding:
    device: str  # DeviceHealth.name
    area: str  # MEMORY or LINKS
    severity: str  # FAIL, WARNING or INFO
    reading: str  # what the tool said, "remap pending", "PCIe x8 of x16"
    why: str  # what it means for a measurement

    def text(self) -> str:
        return f"{self.device}: {self.reading} ({self.why})"


UNCORRECTED_NOW = "uncorrectable memory errors since the driver loaded: the memory is failing, results may be wrong"
PENDING = "a retired page or remapped row waits for a GPU reset: until then the bad memory is in use"
REMAP_FAILED = "a row could not be remapped (no spare row left): the GPU needs replacing"
LINK_DOWN = "a link the device has is down: collectives take a slower path or fail"
PCIE_NARROW = ("the link to the host trained at fewer lanes than the device and slot allow: host transfers run "
               "at a fraction of their bandwidth (a reseat or a bad riser)")
PCIE_GENERATION = ("a GPU at idle trains its link to a lower PCIe generation to save power, so the generation is "
                   "shown, not judged, before a run; the width does not change with load")


def judge_health(device: DeviceHealth) -> list[HealthFinding]:
    """Every finding of ``device``'s readings (a reading not read gives none)."""
    return [*_memory_findings(device), *_link_findings(device), *_pcie_findings(device)]


def _memory_findings(device: DeviceHealth) -> list[HealthFinding]:
    def found(severity: str, reading: str, why: str) -> HealthFinding:
        return HealthFinding(device.name, MEMORY, severity, reading, why)

    findings = []
    if device.health is not None and device.health.upper() != "OK":
        findings.append(found(FAIL, f"health {device.health}", "the device reports a fault: results may be wrong"))
    if device.ecc_uncorrected:
        findings.append(found(FAIL, f"{device.ecc_uncorrected} uncorrected ECC errors", UNCORRECTED_NOW))
    if device.retirement_pending:
        findings.append(found(FAIL, "page retirement or row remap pending", PENDING))
    if device.remap_failed:
        findings.append(found(FAIL, "row remap failure", REMAP_FAILED))
    if device.ecc_uncorrected_aggregate and not device.ecc_uncorrected:
        findings.append(found(WARNING, f"{device.ecc_uncorrected_aggregate} uncorrected ECC errors over its life",
                              "none since the driver loaded: the bad memory was retired or remapped"))
    worn = {"pages retired (single-bit)": device.retired_pages_single_bit,
            "pages retired (double-bit)": device.retired_pages_double_bit,
            "rows remapped (uncorrectable)": device.remapped_rows_uncorrected}
    for what, count in worn.items():
        if count:
            findings.append(found(WARNING, f"{count} {what}", "memory taken out of use: the device is wearing"))
    if device.ecc_corrected or device.remapped_rows_corrected:
        findings.append(found(INFO, f"{device.ecc_corrected or 0} corrected ECC errors, "
                                    f"{device.remapped_rows_corrected or 0} rows remapped (correctable)",
                              "corrected: no wrong result, shown"))
    return findings


def _link_findings(device: DeviceHealth) -> list[HealthFinding]:
    kind = device.link_kind or "link"
    findings = []
    links = device.links or []
    up = [link for link in links if link.up]
    down = [link for link in links if link.up is False]
    if up and down:  # a device with links in use, some of them down
        indices = ", ".join(str(link.index) for link in down)
        findings.append(HealthFinding(device.name, LINKS, FAIL, f"{kind} {indices} down ({len(up)} of "
                                      f"{len(up) + len(down)} up)", LINK_DOWN))
    elif down:
        findings.append(HealthFinding(device.name, LINKS, WARNING, f"no {kind} up (of {len(down)})",
                                      f"no bridge or switch, or the fabric is down: no {kind} traffic"))
    counted = {f"{kind} {link.index} {name}": count for link in links for name, count in link.errors.items() if count}
    if counted:
        findings.append(HealthFinding(device.name, LINKS, WARNING,
                                      ", ".join(f"{name} {count}" for name, count in counted.items()),
                                      "errors the link recovered from (replayed or retrained): a noisy link"))
    if device.link_errors:
        findings.append(HealthFinding(device.name, LINKS, WARNING, f"{kind} error status: {device.link_errors}",
                                      "the tool counts link errors since the driver loaded"))
    return findings


def _pcie_findings(device: DeviceHealth) -> list[HealthFinding]:
    findings = []
    width, most = device.pcie_width, device.pcie_max_width
    if width is not None and most is not None and width < most:
        findings.append(HealthFinding(device.name, LINKS, FAIL, f"PCIe x{width} of x{most}", PCIE_NARROW))
    generation, highest = device.pcie_generation, device.pcie_max_generation
    if generation is not None and highest is not None and generation < highest:
        findings.append(HealthFinding(device.name, LINKS, INFO, f"PCIe gen{generation} of gen{highest}",
                                      PCIE_GENERATION))
    return findings


# --- a node's read, as accept keeps it --------------------------------------------------------------

def readings_to_dict(readings: DeviceReadings) -> dict:
    """As JSON keeps it (a Slurm node's probe job hands its read to `hwbench accept` so)."""
    return dataclasses.asdict(readings)


def readings_from_dict(data: dict) -> DeviceReadings:
    """What readings_to_dict wrote; ValueError when it is not that."""
    try:
        devices = [DeviceHealth(**{**device, "links": None if device.get("links") is None
                                   else [LinkHealth(**link) for link in device["links"]]})
                   for device in data["devices"]]
        return DeviceReadings(data["kind"], data["source"], devices, data.get("reason"))
    except (KeyError, TypeError) as error:
        raise ValueError(f"not a device health read: {type(error).__name__}: {error}") from error


@dataclasses.dataclass
class NodeHealth:
    """One node's devices as their management library read them (hwbench accept, before timing)."""

    node: str  # the host name, or the Slurm node's
    readings: DeviceReadings

    @property
    def findings(self) -> list[HealthFinding]:
        return [finding for device in self.readings.devices for finding in judge_health(device)]

    def where(self, finding: HealthFinding) -> str:
        return f"{finding.device} of {self.node}: {finding.reading} ({finding.why})"

    @property
    def failed(self) -> bool:
        return any(finding.severity == FAIL for finding in self.findings)

    def lines(self) -> list[str]:
        """Each failure and warning, failures first; else that every device read has no fault, or
        why none was read."""
        if not self.readings.devices:
            return [f"device health of {self.node} not read: {self.readings.reason or 'no device listed'}"]
        found = sorted((finding for finding in self.findings if finding.severity != INFO),
                       key=lambda finding: finding.severity != FAIL)
        return [f"{finding.severity}: {self.where(finding)}" for finding in found] or [
            f"{self.node}: {len(self.readings.devices)} {self.readings.kind} device(s) read from "
            f"{self.readings.source}, no fault"]


# --- the CPU --------------------------------------------------------------------------------------

PROC = Path("/proc")
EDAC = Path("/sys/devices/system/edac/mc")


def cpu_readings(environ: Mapping[str, str]) -> tuple[list[DeviceHealth], str | None]:
    """The CPU's preflight reader (the registry names it, device/kinds.py): the one CPU, always read."""
    return [cpu_health()], None


def cpu_health(proc: Path = PROC, edac: Path = EDAC) -> DeviceHealth:
    """The CPU as a device: the load other processes put on its cores, the memory available,
    the memory controllers' ECC counts (EDAC)."""
    device = DeviceHealth("cpu", cores=usable_cores())
    try:
        device.load = float((proc / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError) as error:
        device.unread["load"] = f"{proc / 'loadavg'} unreadable ({type(error).__name__})"
    memory = meminfo(proc)
    if "MemAvailable" in memory and "MemTotal" in memory:
        device.memory_free_bytes, device.memory_total_bytes = memory["MemAvailable"], memory["MemTotal"]
    else:
        device.unread["memory_free_bytes"] = f"{proc / 'meminfo'} has no MemAvailable and MemTotal"
    controllers = sorted(edac.glob("mc*")) if edac.is_dir() else []
    if controllers:
        try:
            device.ecc_uncorrected = sum(int((mc / "ue_count").read_text()) for mc in controllers)
            device.ecc_corrected = sum(int((mc / "ce_count").read_text()) for mc in controllers)
        except (OSError, ValueError) as error:
            device.unread["ecc_uncorrected"] = f"EDAC counts in {edac} unreadable ({type(error).__name__})"
    else:
        device.unread["ecc_uncorrected"] = (f"no EDAC memory controller in {edac} (a virtual machine, or no EDAC "
                                            "driver for this memory controller)")
    device.unread["clock_mhz"] = "the CPU's clocks follow its frequency governor (the cpu_governor check)"
    device.unread["persistence_mode"] = "a CPU has no persistence mode"
    device.unread["links"] = "the CPU is one device: it has no links to peers, and no PCIe link of its own"
    return device


def meminfo(proc: Path = PROC) -> dict[str, int]:
    """/proc/meminfo in bytes (its kB are KiB)."""
    found = {}
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                found[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return found


# --- collective libraries ---------------------------------------------------------------------------

# Variables that change how NCCL/RCCL and HCCL move data (NCCL's "Environment Variables" page,
# Ascend's HCCL environment variable reference): set ones are recorded and compared between runs.
COLLECTIVE_SETTINGS = (
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE",
    "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS", "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE",
    "NCCL_CROSS_NIC", "NCCL_COLLNET_ENABLE", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_NET", "NCCL_DEBUG",
    "NCCL_LAUNCH_MODE", "NCCL_TOPO_FILE", "NCCL_GRAPH_FILE", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_TC",
    "NCCL_MNNVL_ENABLE", "TORCH_NCCL_AVOID_RECORD_STREAMS", "TORCH_NCCL_HIGH_PRIORITY",
    "HCCL_ALGO", "HCCL_BUFFSIZE", "HCCL_INTRA_PCIE_ENABLE", "HCCL_INTRA_ROCE_ENABLE", "HCCL_OP_EXPANSION_MODE",
    "HCCL_DETERMINISTIC", "HCCL_RDMA_TC", "HCCL_RDMA_SL", "HCCL_SOCKET_IFNAME", "HCCL_OP_BASE_FFTS_MODE_ENABLE",
)
# Of those, the values that switch a fast path off or slow every collective down.
SLOWING_SETTINGS = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1",
                    "NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "TRACE", "HCCL_DETERMINISTIC": "true"}


def collective_settings(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(the performance settings of the collective libraries set in ``environ``, those that slow
    collectives down)."""
    found = {name: environ[name] for name in COLLECTIVE_SETTINGS if environ.get(name, "").strip()}
    slowing = [f"{name}={value}" for name, value in found.items()
               if SLOWING_SETTINGS.get(name, "").lower() == value.strip().lower()]
    return found, slowing


def not_this_process(pid: object, proc: Path = PROC) -> bool:
    """False for this process itself and the processes that started it: a Python session that ran
    on the device before (hwbench.run twice) holds a context there, and so may the `hwbench sweep`
    or launcher that started this run (it asks the device's name and memory for its estimate and
    plan); neither is another process competing with the run."""
    return pid not in own_process_tree(proc)


def own_process_tree(proc: Path = PROC) -> set[int]:
    """This process's pid and its ancestors' (parent, grandparent, ...), read from /proc; this pid
    and its parent's where /proc cannot be read."""
    pids = {os.getpid(), os.getppid()}
    pid = os.getppid()
    while pid > 1 and len(pids) < 64:  # a bound: a chain of ancestors is short
        try:
            # /proc/PID/stat: "pid (comm) state ppid ...", and comm may hold spaces or parentheses
            parent = int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        pids.add(parent)
        pid = parent
    return pids
