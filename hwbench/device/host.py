"""The host's processors as the kernel shows them (no torch): the cores this process
may run on and the physical packages (sockets) those cores sit on. The CPU backend
sizes its threads from them; every backend reports them for judging oversubscription
and for counting the CPUs a run used (docs/results.md, `environment.oversubscribed`)."""

from __future__ import annotations

import os
from pathlib import Path

SYSFS_CPU = Path("/sys/devices/system/cpu")
PROC, SYS = Path("/proc"), Path("/sys")


def allowed_cpus() -> list[int]:
    """The logical CPUs this process may run on (its affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def read_stripped(path: Path) -> str | None:
    """A small system file's text without its surrounding white space; None when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_quota(proc_root: Path, sys_root: Path) -> tuple[float | None, str]:
    """(the CPUs this process's cgroup may use, None without a quota; the file it came from): its own
    cgroup v2 group's cpu.max (a container's slice), else the root's, else cgroup v1's CFS quota.
    ValueError when the file is there but unreadable as a quota."""
    relative = ""
    for line in (read_stripped(proc_root / "self/cgroup") or "").splitlines():
        if line.startswith("0::"):
            relative = line[3:].lstrip("/")
    root = sys_root / "fs/cgroup"
    for path in dict.fromkeys([root / relative / "cpu.max", root / "cpu.max"]):
        text = read_stripped(path)
        if text:
            quota, _, period = text.partition(" ")
            return (None if quota == "max" else int(quota) / int(period or 100000)), str(path)
    v1 = [root / "cpu", root / "cpu,cpuacct"]  # where cgroup v1 mounts its CPU controller
    quota_v1 = next(filter(None, (read_stripped(folder / "cpu.cfs_quota_us") for folder in v1)), None)
    period_v1 = next(filter(None, (read_stripped(folder / "cpu.cfs_period_us") for folder in v1)), None)
    if quota_v1 and period_v1 and quota_v1 != "-1":
        return int(quota_v1) / int(period_v1), "cgroup v1 cpu.cfs_quota_us"
    return None, "no cgroup CPU quota"


def usable_cores() -> int:
    """Cores this process may really use: its affinity mask, capped by its cgroup's CPU quota
    (cgroup_cpu_quota, which preflight's check reads too)."""
    cores = len(allowed_cpus())
    try:
        quota, _ = cgroup_cpu_quota(PROC, SYS)
    except ValueError:
        return cores
    return cores if quota is None else min(cores, max(1, int(quota)))


def cpu_packages(cpus: list[int], sysfs_cpu: Path = SYSFS_CPU) -> tuple[list[int] | None, str | None]:
    """The distinct physical packages (sockets) of ``cpus``, from
    cpuN/topology/physical_package_id; (None, why) when the kernel does not say."""
    packages = set()
    for cpu in cpus:
        path = sysfs_cpu / f"cpu{cpu}" / "topology" / "physical_package_id"
        try:
            package = int(path.read_text().strip())
        except (OSError, ValueError) as error:
            return None, f"{path} unreadable ({type(error).__name__})"
        if package < 0:  # -1: the architecture does not report packages
            return None, f"{path} says -1 (no package information)"
        packages.add(package)
    return sorted(packages), None


def share_of_cores(local_ranks: int) -> int:
    """A rank's intra-op threads when none were asked for: the usable cores shared among the ranks
    on this host (the launcher sets OMP_NUM_THREADS the same way), at least 1."""
    return max(1, usable_cores() // max(1, local_ranks))
