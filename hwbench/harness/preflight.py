"""A machine checked before it is measured (`hwbench preflight`, and the start of `hwbench run`
and `hwbench sweep` unless --no-preflight): what would make a figure wrong or not comparable,
each check `ok`, `warning` or `failure` with its reading, or not read here (status None) with
the reason. The device's checks come from its management tool through the device layer
(hwbench.device.preflight); the host's from the kernel's /proc and /sys. A run stores the
report in its result (`environment.preflight`), and
hwbench.result.environment says which readings make two results not comparable.

Quick by design (no torch, one pass over a few files and one call into each tool): it runs
before every point of a sweep.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hwbench.device.health import FAIL, INFO, LINKS, MEMORY, DeviceHealth, collective_settings, judge_health, meminfo
from hwbench.device.health import WARNING as HEALTH_WARNING
from hwbench.device.host import allowed_cpus, cgroup_cpu_quota, read_stripped, share_of_cores
from hwbench.errors import UsageError
from hwbench.units import human_bytes

OK, WARNING, FAILURE = "ok", "warning", "failure"
SEVERITY = {None: 0, OK: 0, WARNING: 1, FAILURE: 2}
# The device's checks, in the order of the table and the result (device_checks); the host's follow
# (preflight's host_checks), in the order of docs/preflight.md.
DEVICE_CHECKS = ("other_processes", "device_memory", "ecc_errors", "device_links", "clocks", "persistence_mode")
DEVICE_MEMORY_FREE_MIN = 0.9  # below this share free before a run, something else holds the device's memory
HOST_MEMORY_AVAILABLE_MIN = 0.2
CPU_LOAD_SHARE_MAX = 0.5  # a 1-minute load above half the usable cores: other processes compete for them
DISK_FAILURE_BYTES = 100 * 2**20  # results, logs and a sweep's records may not fit
DISK_WARNING_BYTES = 2**30


@dataclasses.dataclass
class Check:
    name: str
    status: str | None  # ok, warning, failure; None: not read here (reason says why)
    reading: str | None  # as a person reads it
    value: str | None = None  # the reading as runs are compared by it (hwbench.result.environment)
    reason: str | None = None  # why a warning or failure, or why it was not read

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PreflightReport:
    device: str  # the kind of device checked (cuda, npu, cpu, ...)
    source: str  # the tool its checks were read from
    checks: list[Check]
    checked_at: str
    duration_s: float

    @property
    def worst(self) -> str:
        return max((check.status or OK for check in self.checks), key=SEVERITY.__getitem__, default=OK)

    def of(self, status: str) -> list[Check]:
        return [check for check in self.checks if check.status == status]

    def to_dict(self) -> dict[str, Any]:
        """As the result's `environment.preflight` holds it."""
        return {"checked_at": self.checked_at, "duration_s": self.duration_s, "device": self.device,
                "source": self.source, "worst": self.worst, "checks": [check.to_dict() for check in self.checks]}


def findings(checks: Iterable[Any]) -> list[str]:
    """Each warning and failure of ``checks`` (this module's Checks, or a result's
    environment.preflight.checks) as a run says it: 'warning: swap: 2 GiB in use (why)'."""
    return [f"{check.status}: {check.name}: {check.reading} ({check.reason})" for check in checks
            if check.status in (WARNING, FAILURE)]


@dataclasses.dataclass(frozen=True)
class Host:
    """Where the kernel's files are (tests point these at a tree of their own)."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")


def check_request(device: str, ranks: int, threads_per_rank: int | None) -> None:
    """`hwbench preflight`'s input and the Python API's alike: UsageError (one line)."""
    from hwbench.device.kinds import DEVICE_CHOICES

    if device not in DEVICE_CHOICES:
        raise UsageError(f"--device {device!r} is not known; accepted: {', '.join(DEVICE_CHOICES)}")
    for option, value in (("--nproc-per-node", ranks), ("--threads-per-rank", threads_per_rank)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise UsageError(f"{option} {value!r} is not accepted; give an integer >= 1")


def preflight(device: str = "auto", out_dir: str | os.PathLike = ".", ranks: int = 1,
              threads_per_rank: int | None = None,
              environ: Mapping[str, str] = os.environ, host: Host = Host()) -> PreflightReport:
    """Every check for a run of ``ranks`` ranks on this node (``threads_per_rank`` each, else
    their share of the usable cores) on ``device`` (auto: the kind the management tools find),
    writing to ``out_dir``."""
    from hwbench.device.preflight import read_devices

    started = time.perf_counter()
    try:
        readings = read_devices(device, environ)
        kind, source = readings.kind, readings.source
        checks = device_checks(readings.devices, readings.reason, readings.kind)
    except Exception as error:  # a tool that answers in a way not foreseen: the run goes on
        kind, source = device, "none"
        checks = [unreadable(name, error) for name in DEVICE_CHECKS]
    threads = threads_per_rank or share_of_cores(ranks)
    host_checks = {
        "cpu_governor": lambda: cpu_governor(host),
        "numa_balancing": lambda: numa_balancing(host),
        "transparent_hugepages": lambda: transparent_hugepages(host),
        "swap": lambda: swap(host),
        "cpu_quota": lambda: cpu_quota(ranks, threads, host),
        "collective_settings": lambda: collective(environ),
        "disk_space": lambda: disk_space(out_dir),
    }
    for name, check in host_checks.items():
        try:
            checks.append(check())
        except Exception as error:
            checks.append(unreadable(name, error))
    return PreflightReport(
        kind,
        source,
        checks,
        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        round(time.perf_counter() - started, 3),
    )


def unreadable(name: str, error: Exception) -> Check:
    """A check whose reading failed in a way not foreseen (a file of another format, a tool's
    error): a warning with the reason, never a failure, so that no run stops on the check itself."""
    return Check(name, WARNING, None, reason=f"could not be read: {type(error).__name__}: {error}")


# --- the device -----------------------------------------------------------------------------------


def device_checks(devices: list[DeviceHealth], reason: str | None, kind: str) -> list[Check]:
    if not devices:
        why = reason or f"no {kind} device found"
        return [Check(name, None, None, reason=why) for name in DEVICE_CHECKS]
    return [
        other_processes(devices),
        device_memory(devices),
        ecc_errors(devices),
        device_links(devices),
        clocks(devices),
        persistence_mode(devices),
    ]


def _combined(name: str, devices: list[DeviceHealth], judge) -> Check:
    """One check over every device: ``judge(device)`` gives (status, reading, value, reason) of
    one; the check has the worst status, each device's reading (named when there are several),
    one value when the devices agree, the reasons of the worst."""
    judged = [(device, *judge(device)) for device in devices]
    worst = max((status for _d, status, *_ in judged), key=SEVERITY.__getitem__)
    several = len(devices) > 1
    readings = [
        f"{device.name}: {reading}" if several else reading
        for device, _s, reading, _v, _r in judged
        if reading is not None
    ]
    values = list(dict.fromkeys(value for *_, value, _r in judged if value is not None))
    reasons = list(dict.fromkeys(reason for _d, status, _rd, _v, reason in judged if status == worst and reason))
    return Check(name, worst, "; ".join(readings) or None, "; ".join(values) or None, "; ".join(reasons) or None)


BUSY_CORES = "other processes keep the cores busy: a CPU run shares them, so its figures are not the machine's"
SHARED_DEVICE = "other processes compute on the device: a run would share it, and its figures would not be the device's"


def other_processes(devices: list[DeviceHealth]) -> Check:
    def judge(device: DeviceHealth):
        if device.name == "cpu":
            if device.load is None:
                return None, None, None, device.why("load", "not read")
            busy = device.load > CPU_LOAD_SHARE_MAX * (device.cores or 1)
            reading = f"load average {device.load:.2f} on {device.cores} usable cores"
            if busy:
                return WARNING, reading, None, BUSY_CORES
            return OK, reading, None, None
        if device.processes is None:
            return None, None, None, device.why("processes", "not read")
        if device.processes:
            return FAILURE, ", ".join(device.processes), "present", SHARED_DEVICE
        return OK, "none", "none", None

    return _combined("other_processes", devices, judge)


def device_memory(devices: list[DeviceHealth]) -> Check:
    def judge(device: DeviceHealth):
        free, total = device.memory_free_bytes, device.memory_total_bytes
        if free is None or not total:
            return None, None, None, device.why("memory_free_bytes", "not read")
        what = "available" if device.name == "cpu" else "free"
        reading = f"{human_bytes(free)} {what} of {human_bytes(total)}"
        least = HOST_MEMORY_AVAILABLE_MIN if device.name == "cpu" else DEVICE_MEMORY_FREE_MIN
        if free < least * total:
            return (
                WARNING,
                reading,
                None,
                (
                    f"less than {least:.0%} {what}: something else holds the memory, so a "
                    "run may fail or measure a smaller batch than this device could take"
                ),
            )
        return OK, reading, None, None

    return _combined("device_memory", devices, judge)


def ecc_errors(devices: list[DeviceHealth]) -> Check:
    """The device's memory: ECC counts, retired pages, remapped rows, the tool's health verdict
    (judged by hwbench.device.health.judge_health, as `hwbench accept` judges them)."""
    def judge(device: DeviceHealth):
        if device.ecc_uncorrected is None and device.health is None and device.remapped_rows_uncorrected is None:
            return None, None, None, device.why("ecc_uncorrected", "not read")
        parts = []
        if device.ecc_uncorrected is not None:
            parts.append(f"{device.ecc_uncorrected} uncorrected, {device.ecc_corrected or 0} corrected")
        elif device.health is not None:
            parts.append(f"health {device.health}")
        if device.ecc_uncorrected_aggregate is not None:
            parts.append(f"over its life {device.ecc_uncorrected_aggregate} uncorrected, "
                         f"{device.ecc_corrected_aggregate or 0} corrected")
        if device.remapped_rows_uncorrected is not None:
            parts.append(f"rows remapped {device.remapped_rows_uncorrected} uncorrectable, "
                         f"{device.remapped_rows_corrected or 0} correctable"
                         + (", remap pending" if device.retirement_pending else "")
                         + (", remap failure" if device.remap_failed else ""))
        if device.retired_pages_double_bit is not None:
            parts.append(f"pages retired {device.retired_pages_double_bit} double-bit, "
                         f"{device.retired_pages_single_bit or 0} single-bit"
                         + (", retirement pending" if device.retirement_pending else ""))
        return _judged(device, MEMORY, "; ".join(parts))

    return _combined("ecc_errors", devices, judge)


def device_links(devices: list[DeviceHealth]) -> Check:
    """The device's links: to its peers (NVLink, xGMI, NIC ports) and to the host (PCIe)."""
    def judge(device: DeviceHealth):
        parts = []
        if device.links is not None:
            up = sum(1 for link in device.links if link.up)
            parts.append(f"{device.link_kind or 'links'} {up} of {len(device.links)} up")
        elif device.link_errors is not None:
            parts.append(f"{device.link_kind or 'links'} error status {device.link_errors}")
        if device.pcie_width is not None:
            most = f" of x{device.pcie_max_width}" if device.pcie_max_width is not None else ""
            generation = f"gen{device.pcie_generation} " if device.pcie_generation is not None else ""
            highest = f" (gen{device.pcie_max_generation} at most)" if device.pcie_max_generation is not None else ""
            parts.append(f"PCIe {generation}x{device.pcie_width}{most}{highest}")
        if not parts:
            return None, None, None, device.why("links", device.why("pcie_width", "not read"))
        return _judged(device, LINKS, "; ".join(parts))

    return _combined("device_links", devices, judge)


STATUS_OF = {FAIL: FAILURE, HEALTH_WARNING: WARNING, INFO: OK}


def _judged(device: DeviceHealth, area: str, reading: str):
    """(status, reading, value, reason) of ``device`` from judge_health's findings of ``area``."""
    found = [finding for finding in judge_health(device) if finding.area == area and finding.severity != INFO]
    if not found:
        return OK, reading, None, None
    status = max((STATUS_OF[finding.severity] for finding in found), key=SEVERITY.__getitem__)
    reasons = "; ".join(f"{finding.reading}: {finding.why}" for finding in found
                        if STATUS_OF[finding.severity] == status)
    return status, reading, None, reasons


def clocks(devices: list[DeviceHealth]) -> Check:
    def judge(device: DeviceHealth):
        parts = []
        if device.clock_mhz is not None:
            most = f" of {device.max_clock_mhz:g}" if device.max_clock_mhz else ""
            parts.append(f"{device.clock_mhz:g} MHz{most}")
        if device.clocks_locked is not None:
            parts.append(("locked: " if device.clocks_locked else "not locked: ") + (device.clocks_how or ""))
        if device.throttle_reasons is not None:
            parts.append(
                "throttled: " + ", ".join(device.throttle_reasons) if device.throttle_reasons else "no throttle reason"
            )
        if not parts:
            return None, None, None, device.why("clocks_locked", device.why("clock_mhz", "not read"))
        value = None if device.clocks_locked is None else ("locked" if device.clocks_locked else "not locked")
        hardware = device.hardware_throttles
        if hardware:
            return FAILURE, "; ".join(parts), value, f"the hardware slows itself down ({', '.join(hardware)})"
        if device.throttle_reasons:
            return WARNING, "; ".join(parts), value, "clocks held below their maximum by a limit (power, thermal)"
        return OK, "; ".join(parts), value, None

    return _combined("clocks", devices, judge)


def persistence_mode(devices: list[DeviceHealth]) -> Check:
    def judge(device: DeviceHealth):
        if device.persistence_mode is None:
            return None, None, None, device.why("persistence_mode", "not read")
        if device.persistence_mode:
            return OK, "on", "on", None
        fix = device.fixes.get("persistence_mode")
        return (
            WARNING,
            "off",
            "off",
            (
                "the driver lets go of the device between runs: each run's start pays its "
                "initialisation and finds default clocks" + (f" ({fix})" if fix else "")
            ),
        )

    return _combined("persistence_mode", devices, judge)


# --- the host -------------------------------------------------------------------------------------


def _bracketed(text: str) -> str:
    """The selected word of a sysfs choice, `always [madvise] never` -> madvise."""
    return next((word[1:-1] for word in text.split() if word.startswith("[")), text)


def cpu_governor(host: Host) -> Check:
    cpus = list(allowed_cpus())
    base = host.sys / "devices/system/cpu"
    governors = {cpu: read_stripped(base / f"cpu{cpu}/cpufreq/scaling_governor") for cpu in cpus}
    read = {cpu: governor for cpu, governor in governors.items() if governor}
    if not read:
        return Check(
            "cpu_governor",
            None,
            None,
            reason=f"no cpufreq in {base}/cpu{cpus[0] if cpus else 0}/cpufreq "
            "(a virtual machine, or no frequency driver)",
        )
    names = sorted(set(read.values()))
    reading = ", ".join(f"{name} on {sum(1 for g in read.values() if g == name)} CPUs" for name in names)
    if names != ["performance"]:
        return Check(
            "cpu_governor",
            WARNING,
            reading,
            ", ".join(names),
            "not performance: the CPUs change frequency with their load, so step times and CPU figures vary "
            "(cpupower frequency-set -g performance)",
        )
    return Check("cpu_governor", OK, reading, "performance")


def numa_balancing(host: Host) -> Check:
    setting = read_stripped(host.proc / "sys/kernel/numa_balancing")
    nodes = len(list((host.sys / "devices/system/node").glob("node[0-9]*")))
    if setting is None:
        return Check(
            "numa_balancing",
            None,
            None,
            reason="the kernel has no automatic NUMA balancing (/proc/sys/kernel/numa_balancing)",
        )
    value = "off" if setting == "0" else "on"
    reading = f"{value} ({nodes} NUMA node{'s' if nodes != 1 else ''})"
    if value == "on" and nodes > 1:
        return Check(
            "numa_balancing",
            WARNING,
            reading,
            value,
            "the kernel moves pages between NUMA nodes during the run, which costs time at moments it "
            "chooses (sysctl kernel.numa_balancing=0)",
        )
    return Check("numa_balancing", OK, reading, value)


def transparent_hugepages(host: Host) -> Check:
    base = host.sys / "kernel/mm/transparent_hugepage"
    enabled, defrag = read_stripped(base / "enabled"), read_stripped(base / "defrag")
    if enabled is None:
        return Check("transparent_hugepages", None, None, reason=f"{base} does not exist (no THP in this kernel)")
    value = f"enabled {_bracketed(enabled)}" + (f", defrag {_bracketed(defrag)}" if defrag else "")
    if defrag and _bracketed(defrag) == "always":
        return Check(
            "transparent_hugepages",
            WARNING,
            value,
            value,
            "defrag always: allocations stall while the kernel compacts memory into huge pages",
        )
    return Check("transparent_hugepages", OK, value, value)


def swap(host: Host) -> Check:
    memory = meminfo(host.proc)
    if "SwapTotal" not in memory:
        return Check("swap", None, None, reason=f"{host.proc / 'meminfo'} has no SwapTotal")
    total, used = memory["SwapTotal"], memory["SwapTotal"] - memory.get("SwapFree", memory["SwapTotal"])
    if not total:
        return Check("swap", OK, "no swap", "none")
    reading = f"{human_bytes(used)} used of {human_bytes(total)}"
    if used:
        return Check(
            "swap",
            WARNING,
            reading,
            "in use",
            "memory is swapped out: a run that touches those pages waits for the disk",
        )
    return Check("swap", OK, reading, "unused")


def cpu_quota(ranks: int, threads_per_rank: int, host: Host) -> Check:
    try:
        quota, where = cgroup_cpu_quota(host.proc, host.sys)
    except ValueError as error:
        return Check("cpu_quota", None, None, reason=f"the cgroup CPU quota is unreadable ({error})")
    threads = ranks * threads_per_rank
    allowed = len(allowed_cpus())
    reading = f"{ranks} rank{'s' if ranks != 1 else ''} x {threads_per_rank} threads = {threads} on " + (
        f"a quota of {quota:g} CPUs ({where})" if quota is not None else f"{allowed} allowed CPUs, no quota"
    )
    value = f"{quota:g} CPUs" if quota is not None else "no quota"
    if quota is not None and threads > quota:
        return Check(
            "cpu_quota",
            WARNING,
            reading,
            value,
            "more threads than the quota: the kernel throttles the ranks each period, so steps stall",
        )
    if threads > allowed:
        return Check(
            "cpu_quota",
            WARNING,
            reading,
            value,
            "more threads than allowed CPUs: the ranks' threads share cores (--threads-per-rank)",
        )
    return Check("cpu_quota", OK, reading, value)


def collective(environ: Mapping[str, str]) -> Check:
    found, slowing = collective_settings(environ)
    reading = ", ".join(f"{name}={value}" for name, value in found.items()) or "none set"
    if slowing:
        return Check(
            "collective_settings",
            WARNING,
            reading,
            reading,
            f"{', '.join(slowing)} turns a fast path off: collectives are slower than the machine allows",
        )
    return Check("collective_settings", OK, reading, reading)


def disk_space(out_dir: str | os.PathLike) -> Check:
    folder = Path(out_dir).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError as error:
        return Check("disk_space", None, None, reason=f"{folder}: {error.strerror or error}")
    reading = f"{human_bytes(free)} free in {folder}"
    if not folder.is_dir():  # --out a file, or under one: `hwbench run` refuses it
        return Check("disk_space", FAILURE, reading, None, f"{folder} is a file: results cannot go there")
    if free < DISK_FAILURE_BYTES:
        return Check(
            "disk_space",
            FAILURE,
            reading,
            None,
            "results and logs may not fit: the run's files would go to the temp folder",
        )
    if free < DISK_WARNING_BYTES:
        return Check("disk_space", WARNING, reading, None, "under 1 GiB free for results and logs")
    return Check("disk_space", OK, reading)
