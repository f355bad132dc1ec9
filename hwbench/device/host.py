"""The host's processors as the kernel shows them (no torch): the cores this process
may run on and the physical packages (sockets) those cores sit on. The CPU backend
sizes its threads from them; every backend reports them for judging oversubscription
and for counting the CPUs a run used (docs/results.md, `environment.oversubscribed`)."""

from __future__ import annotations

import os
from pathlib import Path

SYSFS_CPU = Path("/sys/devices/system/cpu")
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def allowed_cpus() -> list[int]:
    """The logical CPUs this process may run on (its affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """Cores this process may really use: its affinity mask, capped by a cgroup
    v2 CPU quota when one is set."""
    cores = len(allowed_cpus())
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


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
