"""Where a run's ranks ran, judged on rank 0 from every rank's placement
(Backend.placement: threads, the CPUs it may run on, usable cores, devices):

* oversubscribed: on some node, the ranks' threads add up to more than the node's
  usable cores, or ranks share a device that each needs alone (a GPU, an NPU). Its
  figures then include time spent waiting for a core or a device, not the hardware's.
* devices used: the distinct devices the ranks computed on, summed over nodes (the
  CPU counts one per socket the ranks could run on), for charging the run's cost.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class NodePlacement:
    """The ranks of one node: their threads, the node's usable cores, the devices used."""

    node_rank: int
    host: str
    ranks: list[int]
    threads: list[int]  # per rank, in rank order
    own_cores: list[int]  # each rank's own usable cores
    usable_cores: int  # the node's: the CPUs any rank may run on, capped by the ranks' quota
    device_ranks: dict[str, int]  # device -> ranks on it
    exclusive_devices: bool
    devices_basis: str

    def oversubscription(self) -> str | None:
        """Why this node is oversubscribed, or None when it is not."""
        reasons = []
        total = sum(self.threads)
        if total > self.usable_cores:
            reasons.append(f"{_threads_text(self.threads)} = {total} > {self.usable_cores} usable cores")
        else:  # each rank fits the node, but a rank pinned to fewer cores than it has threads does not
            reasons += [f"rank {rank}: {threads} threads > its {cores} usable cores"
                        for rank, threads, cores in zip(self.ranks, self.threads, self.own_cores) if threads > cores]
        if self.exclusive_devices:
            reasons += [f"device shared: {count} ranks on {device}"
                        for device, count in self.device_ranks.items() if count > 1]
        return "; ".join(reasons) or None

    def describe(self) -> dict[str, Any]:
        reason = self.oversubscription()
        return {"threads_per_rank": self.threads, "usable_cores": self.usable_cores,
                "devices": sorted(self.device_ranks), "oversubscribed": reason is not None,
                "oversubscribed_reason": reason}


def _threads_text(threads: list[int]) -> str:
    if len(set(threads)) == 1:
        ranks = len(threads)
        return f"{ranks} rank{'s' if ranks > 1 else ''} x {threads[0]} thread{'s' if threads[0] > 1 else ''} per rank"
    return "threads " + " + ".join(map(str, threads))


def node_placements(reports: list[Any]) -> list[NodePlacement] | None:
    """One NodePlacement per node of RankReports (node_rank, host, rank, placement);
    None when a rank did not say where it ran."""
    if any(not r.placement for r in reports):
        return None
    by_node: dict[int, list[Any]] = {}
    for report in sorted(reports, key=lambda r: r.rank):
        by_node.setdefault(report.node_rank, []).append(report)
    nodes = []
    for node_rank in sorted(by_node):
        members = by_node[node_rank]
        placements = [r.placement for r in members]
        cpus = set().union(*(p["cpus"] for p in placements))
        device_ranks: dict[str, int] = {}
        for placement in placements:
            for device in placement["devices"]:
                device_ranks[device] = device_ranks.get(device, 0) + 1
        nodes.append(NodePlacement(
            node_rank=node_rank, host=members[0].host, ranks=[r.rank for r in members],
            threads=[p["threads"] for p in placements], own_cores=[p["usable_cores"] for p in placements],
            # a cgroup quota caps every rank's usable cores alike; without one, the union is the node's
            usable_cores=min(len(cpus), max(p["usable_cores"] for p in placements)),
            device_ranks=device_ranks, exclusive_devices=placements[0]["exclusive_devices"],
            devices_basis=placements[0]["devices_basis"]))
    return nodes


def placement_environment(nodes: list[NodePlacement] | None) -> dict[str, Any]:
    """The result's `environment` fields: oversubscribed (any node), its reason, threads
    per rank, devices used and how they were counted; null where a rank did not say."""
    if nodes is None:
        unknown = "a rank did not report where it ran"
        return {"oversubscribed": None, "oversubscribed_reason": None, "threads_per_rank": None,
                "devices_used": None, "devices_used_basis": unknown}
    several = len(nodes) > 1
    reasons = [(f"node {n.node_rank} ({n.host}): " if several else "") + reason
               for n in nodes if (reason := n.oversubscription())]
    bases = list(dict.fromkeys(n.devices_basis for n in nodes))
    basis = "; ".join(bases)
    if several:
        basis += " (" + ", ".join(f"node {n.node_rank}: {len(n.device_ranks)}" for n in nodes) + ")"
    return {
        "oversubscribed": bool(reasons),
        "oversubscribed_reason": "; ".join(reasons) or None,
        # the ranks' threads are equal unless set apart by hand; the most any rank used
        "threads_per_rank": max(t for n in nodes for t in n.threads),
        "devices_used": sum(len(n.device_ranks) for n in nodes),
        "devices_used_basis": basis,
    }


def cpu_list_text(cpus: list[int]) -> str:
    """CPUs as the kernel writes a cpulist: "0-3,8,10-11"."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
