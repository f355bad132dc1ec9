"""What a device's own management library says of it before a run (`hwbench preflight`): other
processes on each device, its free memory, ECC errors, clocks and throttle reasons, persistence
mode. Read without torch: the check runs in the launcher before any rank starts, and a device
initialised there (a CUDA context) would itself be another process on the GPU holding memory;
and `hwbench preflight` starts quickly. A reading a device or library does not give is None,
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
