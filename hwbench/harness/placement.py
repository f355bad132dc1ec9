"""Where a run's ranks ran, judged on rank 0 from every rank's placement
(Backend.placement: threads, the CPUs it may run on, usable cores, devices):

* oversubscribed: on some host, the ranks' threads add up to more than the host's
  usable cores, or ranks share a device that each needs alone (a GPU, an NPU). Its
  figures then include time spent waiting for a core or a device, not the hardware's.
* devices used: the distinct devices the ranks computed on, summed over hosts (the
  CPU counts one per socket the ranks could run on), for charging the run's cost.

Ranks are grouped by host, not by torchrun node: two node ranks on one machine (a
loopback test, two agents started by hand) share its cores and its devices.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from hwbench.result.model import NodePlacement


@dataclasses.dataclass
class HostPlacement:
    """The ranks of one host: their threads, the host's usable cores, the devices used."""

    node_ranks: list[int]  # torchrun's node ranks on this host (one, unless nodes share a machine)
    host: str
    ranks: list[int]
    threads: list[int]  # per rank, in rank order
    own_cores: list[int]  # each rank's own usable cores
    usable_cores: int  # the host's: the CPUs any rank may run on, capped by the ranks' quota
    device_ranks: dict[str, int]  # device -> ranks on it
    exclusive_devices: bool
    devices_basis: str

    def oversubscription(self) -> str | None:
        """Why this host is oversubscribed, or None when it is not."""
        reasons = []
        total = sum(self.threads)
        if total > self.usable_cores:
            reasons.append(f"{_threads_text(self.threads)} = {total} > {self.usable_cores} usable cores")
        else:  # the ranks fit the host together, but a rank pinned to fewer cores than it has threads does not
            reasons += [f"rank {rank}: {threads} threads > its {cores} usable cores"
                        for rank, threads, cores in zip(self.ranks, self.threads, self.own_cores) if threads > cores]
        if self.exclusive_devices:
            reasons += [f"device shared: {count} ranks on {device}"
                        for device, count in self.device_ranks.items() if count > 1]
        return "; ".join(reasons) or None

    @property
    def label(self) -> str:
        nodes = ", ".join(map(str, self.node_ranks))
        return f"node{'s' if len(self.node_ranks) > 1 else ''} {nodes} ({self.host})"

    def describe(self) -> NodePlacement:
        reason = self.oversubscription()
        return NodePlacement(threads_per_rank=self.threads, usable_cores=self.usable_cores,
                             devices=sorted(self.device_ranks), oversubscribed=reason is not None,
                             oversubscribed_reason=reason)


def _threads_text(threads: list[int]) -> str:
    if len(set(threads)) == 1:
        ranks = len(threads)
        return f"{ranks} rank{'s' if ranks > 1 else ''} x {threads[0]} thread{'s' if threads[0] > 1 else ''} per rank"
    return "threads " + " + ".join(map(str, threads))


def host_placements(reports: list[Any]) -> list[HostPlacement] | None:
    """One HostPlacement per host of RankReports (node_rank, host, rank, placement), in
    node order; None when a rank did not say where it ran."""
    if any(not r.placement for r in reports):
        return None
    by_host: dict[str, list[Any]] = {}
    for report in sorted(reports, key=lambda r: (r.node_rank, r.rank)):
        by_host.setdefault(report.host or f"node {report.node_rank}", []).append(report)
    nodes = []
    for host, members in by_host.items():
        placements = [r.placement for r in members]
        cpus = set().union(*(p.cpus for p in placements))
        device_ranks = Counter(device for placement in placements for device in placement.devices)
        nodes.append(HostPlacement(
            node_ranks=sorted({r.node_rank for r in members}), host=host, ranks=[r.rank for r in members],
            threads=[p.threads for p in placements], own_cores=[p.usable_cores for p in placements],
            # a cgroup quota caps every rank's usable cores alike; without one, the union is the host's
            usable_cores=min(len(cpus), max(p.usable_cores for p in placements)),
            device_ranks=device_ranks, exclusive_devices=placements[0].exclusive_devices,
            devices_basis=placements[0].devices_basis))
    return nodes


@dataclasses.dataclass(frozen=True)
class RunPlacement:
    """The run's placement as the result's environment holds it; the merge copies these five
    fields there. Null where a rank did not say where it ran (the basis then says so)."""

    oversubscribed: bool | None  # on any node
    oversubscribed_reason: str | None  # None when not oversubscribed too
    threads_per_rank: int | None
    devices_used: int | None
    devices_used_basis: str


def run_placement(nodes: list[HostPlacement] | None) -> RunPlacement:
    """Whether any node was oversubscribed and why, the threads per rank, the devices used and
    how they were counted."""
    if nodes is None:
        return RunPlacement(oversubscribed=None, oversubscribed_reason=None, threads_per_rank=None,
                            devices_used=None, devices_used_basis="a rank did not report where it ran")
    several = len(nodes) > 1
    reasons = [(f"{n.label}: " if several else "") + reason for n in nodes if (reason := n.oversubscription())]
    bases = list(dict.fromkeys(n.devices_basis for n in nodes))
    basis = "; ".join(bases)
    if several:
        basis += " (" + ", ".join(f"{n.label}: {len(n.device_ranks)}" for n in nodes) + ")"
    return RunPlacement(
        oversubscribed=bool(reasons),
        oversubscribed_reason="; ".join(reasons) or None,
        # the ranks' threads are equal unless set apart by hand; the most any rank used
        threads_per_rank=max(t for n in nodes for t in n.threads),
        devices_used=sum(len(n.device_ranks) for n in nodes),
        devices_used_basis=basis,
    )


def cpu_list_text(cpus: list[int]) -> str:
    """CPUs as the kernel writes a cpulist: "0-3,8,10-11"."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
