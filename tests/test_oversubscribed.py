"""Oversubscription and the devices a run used (environment.oversubscribed,
threads_per_rank, devices_used): judged from every rank's placement, and checked
on real CPU runs of the tiny model."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from hwbench.cli import main
from hwbench.device.base import MemoryStats, Placement
from hwbench.device.host import cpu_packages
from hwbench.harness.merge import RankReport
from hwbench.harness.placement import cpu_list_text, host_placements, run_placement
from hwbench.result.store import load_result

NO_MEMORY = MemoryStats(None, None, None, None, None, source="test")  # a rank's memory statistics without figures

# --- the judgement, from rank placements ------------------------------------------


def rank(rank, threads, cpus, usable=None, devices=("package-0",), node=0, exclusive=False, host="a"):
    placement = Placement(threads=threads, cpus=list(cpus), usable_cores=usable or len(cpus), devices=list(devices),
                          devices_basis="test basis", exclusive_devices=exclusive)
    return RankReport(rank=rank, step_times_s=[1.0], memory=NO_MEMORY, node_rank=node, host=host, placement=placement)


def judged(*reports):
    return dataclasses.asdict(run_placement(host_placements(list(reports))))


def test_two_ranks_of_two_threads_on_two_cores_are_oversubscribed():
    found = judged(rank(0, 2, [0, 1]), rank(1, 2, [0, 1]))
    assert found["oversubscribed"] is True
    assert found["oversubscribed_reason"] == "2 ranks x 2 threads per rank = 4 > 2 usable cores"
    assert found["threads_per_rank"] == 2
    assert found["devices_used"] == 1  # one socket: one CPU


def test_ranks_that_share_the_cores_out_are_not_oversubscribed():
    assert judged(rank(0, 1, [0, 1]), rank(1, 1, [0, 1]))["oversubscribed"] is False
    found = judged(rank(0, 1, [0]))
    assert (found["oversubscribed"], found["oversubscribed_reason"], found["threads_per_rank"]) == (False, None, 1)


def test_a_cgroup_quota_caps_the_node_s_cores():
    found = judged(rank(0, 2, range(8), usable=2), rank(1, 2, range(8), usable=2))
    assert found["oversubscribed_reason"] == "2 ranks x 2 threads per rank = 4 > 2 usable cores"


def test_a_rank_pinned_to_fewer_cores_than_its_threads():
    found = judged(rank(0, 2, [0]), rank(1, 1, [1, 2, 3]))
    assert found["oversubscribed_reason"] == "rank 0: 2 threads > its 1 usable cores"


def test_ranks_sharing_a_gpu_are_oversubscribed():
    found = judged(rank(0, 1, range(8), devices=["cuda:0"], exclusive=True),
                   rank(1, 1, range(8), devices=["cuda:0"], exclusive=True))
    assert found["oversubscribed_reason"] == "device shared: 2 ranks on cuda:0"
    assert found["devices_used"] == 1
    own = judged(rank(0, 1, range(8), devices=["cuda:0"], exclusive=True),
                 rank(1, 1, range(8), devices=["cuda:1"], exclusive=True))
    assert (own["oversubscribed"], own["devices_used"]) == (False, 2)


def test_a_run_is_oversubscribed_when_any_node_is_and_counts_every_node_s_devices():
    found = judged(rank(0, 1, [0, 1], node=0, host="a"), rank(1, 1, [0, 1], node=0, host="a"),
                   rank(2, 3, [0, 1], node=1, host="b", devices=["package-0", "package-1"]))
    assert found["oversubscribed_reason"] == "node 1 (b): 1 rank x 3 threads per rank = 3 > 2 usable cores"
    assert found["devices_used"] == 3
    assert found["devices_used_basis"] == "test basis (node 0 (a): 1, node 1 (b): 2)"


def test_two_nodes_on_one_host_share_its_cores():
    """Two torchrun agents on one machine (a loopback test): each alone fits, together they do not."""
    found = judged(rank(0, 2, [0, 1], node=0), rank(1, 2, [0, 1], node=1))
    assert found["oversubscribed_reason"] == "2 ranks x 2 threads per rank = 4 > 2 usable cores"
    assert found["devices_used"] == 1


def test_a_rank_without_its_placement_leaves_it_unknown():
    bare = RankReport(rank=1, step_times_s=[1.0], memory=NO_MEMORY)
    found = judged(rank(0, 1, [0]), bare)
    assert found["oversubscribed"] is None and found["devices_used"] is None


def test_cpu_list_text():
    assert cpu_list_text([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert cpu_list_text([5]) == "5"


# --- CPU packages from sysfs ------------------------------------------------------


def cpu_tree(root: Path, packages: dict[int, str]) -> Path:
    for cpu, package in packages.items():
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(package + "\n")
    return root


def test_cpu_packages_of_the_allowed_cpus(tmp_path):
    root = cpu_tree(tmp_path, {0: "0", 1: "0", 2: "1", 3: "1"})
    assert cpu_packages([0, 1], root) == ([0], None)
    assert cpu_packages([1, 2, 3], root) == ([0, 1], None)


def test_cpu_packages_unknown_gives_the_reason(tmp_path):
    root = cpu_tree(tmp_path, {0: "0", 1: "-1"})
    assert cpu_packages([0, 1], root) == (None, f"{root}/cpu1/topology/physical_package_id says -1 "
                                                "(no package information)")
    packages, reason = cpu_packages([7], root)
    assert packages is None and "cpu7/topology/physical_package_id unreadable" in reason


def test_cpu_backend_counts_one_cpu_per_node_when_the_topology_is_unknown(monkeypatch):
    from hwbench.device import cpu

    monkeypatch.setattr(cpu, "cpu_packages", lambda cpus: (None, "topology unreadable"))
    assert cpu.CpuBackend().devices_in_use() == (["cpu"], "one CPU per node: topology unreadable")


# --- real runs of the tiny model on this machine ----------------------------------

TINY = ["--model", "tiny", "--steps", "2", "--warmup", "1", "--eval-iters", "0", "--seq-length", "32",
        "--micro-batch-size", "1"]


def this_machine_s_sockets() -> int:
    """The distinct physical_package_id of the CPUs this process may use, read here
    without hwbench."""
    ids = {Path(f"/sys/devices/system/cpu/cpu{c}/topology/physical_package_id").read_text().strip()
           for c in os.sched_getaffinity(0)}
    return len(ids)


@pytest.mark.slow
def test_two_ranks_with_all_the_cores_each_are_oversubscribed(tmp_path, capsys):
    """2 ranks x (usable cores) threads each: on this 2-core machine 2 x 2 = 4 > 2. The launcher in this
    process (hwbench's main()), its ranks under torchrun as always."""
    cores = len(os.sched_getaffinity(0))
    # one step, no warm-up: oversubscribed ranks are slow, and what is checked is where they ran
    code = main(["run", "--quiet", *TINY, "--steps", "1", "--warmup", "0", "--global-batch-size", "2",
                 "--nproc-per-node", "2", "--threads-per-rank", str(cores), "--out", str(tmp_path)])
    done = capsys.readouterr()
    assert code == 0, done.err
    (path,) = tmp_path.glob("*.json")
    result = load_result(path)  # the new fields fit the declared shape
    environment = result.environment
    assert environment.oversubscribed is True
    assert environment.oversubscribed_reason == (f"2 ranks x {cores} thread{'s' if cores > 1 else ''} per rank "
                                                    f"= {2 * cores} > {cores} usable cores")
    assert environment.threads_per_rank == cores
    assert environment.devices_used == this_machine_s_sockets()
    assert environment.devices_used_basis == "CPU packages (sockets) of the cores the ranks may run on"
    assert [r.placement.threads for r in result.ranks] == [cores, cores]
    assert result.nodes[0].placement.oversubscribed is True
    assert "[oversubscribed] 2 ranks x" in done.out  # the run's own summary marks it


@pytest.mark.slow
def test_one_rank_one_thread_is_not_oversubscribed(tmp_path, capsys):
    assert main(["run", "--quiet", *TINY, "--threads-per-rank", "1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json")
    result = load_result(path)
    assert result.environment.oversubscribed is False and result.environment.oversubscribed_reason is None
    assert result.environment.threads_per_rank == 1 == result.environment.tuning["intra_op_threads"]
    assert result.environment.devices_used == this_machine_s_sockets()
    assert "oversubscribed" not in capsys.readouterr().out
