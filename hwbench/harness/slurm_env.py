"""What Slurm tells a process it started: the one place hwbench reads SLURM_*.

Under ``srun`` every task is started with its place in the job step
(SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST).
`hwbench run` turns that into a run in one of two ways (docs/slurm.md):

- one task per device, as Megatron-LM's Slurm scripts do: every task is one
  rank; hwbench gives it torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...)
  so the same rank code runs, with the first host of the job as the rendezvous
  and a port derived from the job id;
- one task per node with ``--nproc-per-node G``: each task is one node of a
  torchrun job that hwbench's launcher starts (node rank SLURM_NODEID).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from hwbench.errors import UsageError
from hwbench.result.model import SlurmJob

PORT_BASE = 10000  # rendezvous port: PORT_BASE + job id mod PORT_SPAN, as Megatron's scripts derive it
PORT_SPAN = 50000
SLURM_RUN_PREFIX = "slurm-"  # TORCHELASTIC_RUN_ID of a rank started by srun: slurm-<job>.<step>


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``gpu[003-010,017],login`` -> ``gpu003``
    (the zero padding of a range is kept, as Slurm writes host names)."""
    depth, end = 0, len(nodelist)
    for index, char in enumerate(nodelist):  # the first item at bracket depth 0
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = index
            break
    item = nodelist[:end].strip()
    match = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", item)
    if not match:
        return item
    prefix, ranges, suffix = match.groups()
    first = ranges.split(",", 1)[0].split("-", 1)[0]
    return prefix + first + first_host(suffix) if "[" in suffix else prefix + first + suffix


def rendezvous_port(job_id: str) -> int:
    """A port every task of the job derives alike without talking to the others."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


@dataclasses.dataclass(frozen=True)
class SlurmTask:
    """This process's place in a Slurm job (and step, under srun)."""

    job_id: str
    step_id: str | None  # None in the batch script itself, outside any srun
    procid: int
    ntasks: int
    localid: int
    local_tasks: int
    nodeid: int
    nnodes: int
    nodelist: str
    partition: str | None
    cluster: str | None
    account: str | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SlurmTask | None:
        """This process's task, or None outside a Slurm job."""
        env = os.environ if environ is None else environ
        if "SLURM_JOB_ID" not in env:
            return None
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        ntasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
        nnodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
        local_tasks = _tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", ""),
                                     int(env.get("SLURM_NODEID", "0")), ntasks // max(nnodes, 1))
        step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
        return cls(job_id=env["SLURM_JOB_ID"], step_id=step if step not in (None, "", "4294967294") else None,
                   procid=int(env.get("SLURM_PROCID", "0")), ntasks=ntasks, localid=int(env.get("SLURM_LOCALID", "0")),
                   local_tasks=local_tasks, nodeid=int(env.get("SLURM_NODEID", "0")), nnodes=nnodes,
                   nodelist=nodelist, partition=env.get("SLURM_JOB_PARTITION"),
                   cluster=env.get("SLURM_CLUSTER_NAME"), account=env.get("SLURM_JOB_ACCOUNT"))

    @property
    def in_step(self) -> bool:
        """Started by srun (a job step), not the batch script itself."""
        return self.step_id is not None

    def master(self, environ: Mapping[str, str]) -> tuple[str, int]:
        """Node 0's address and the rendezvous port: MASTER_ADDR/MASTER_PORT when the
        user exported them, else the job's first host and a port from the job id."""
        address = environ.get("MASTER_ADDR") or first_host(self.nodelist) or "127.0.0.1"
        port = int(environ["MASTER_PORT"]) if environ.get("MASTER_PORT", "").isdigit() else rendezvous_port(self.job_id)
        return address, port

    def torchrun_environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """torchrun's variables for this task as one rank (one task per device)."""
        address, port = self.master(environ)
        return {"RANK": str(self.procid), "WORLD_SIZE": str(self.ntasks), "LOCAL_RANK": str(self.localid),
                "LOCAL_WORLD_SIZE": str(self.local_tasks), "GROUP_RANK": str(self.nodeid),
                "MASTER_ADDR": address, "MASTER_PORT": str(port),
                "TORCHELASTIC_RUN_ID": f"{SLURM_RUN_PREFIX}{self.job_id}.{self.step_id}"}

    def rank_launch_options(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """`hwbench run` launch options that describe the job this task is one rank of
        (one task per device): its nodes, tasks per node and rendezvous, so the run's
        spec says what ran (without them a rank takes srun's world for one node's).
        Tasks spread unevenly over the nodes have no tasks-per-node: the rendezvous only."""
        address, port = self.master(environ)
        options: dict[str, Any] = {"master_addr": address, "master_port": port}
        if self.local_tasks * self.nnodes == self.ntasks:
            options.update(nnodes=self.nnodes, nproc_per_node=self.local_tasks, node_rank=self.nodeid)
        return options

    def node_launch_options(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """`hwbench run` launch options for this task as one node of a torchrun job
        (one task per node)."""
        address, port = self.master(environ)
        return {"nnodes": self.nnodes, "node_rank": self.nodeid, "master_addr": address, "master_port": port}

    def record(self) -> SlurmJob:
        """The job as a result's ``environment.slurm``."""
        return SlurmJob(job_id=self.job_id, step_id=self.step_id, nodelist=self.nodelist or None,
                        nnodes=self.nnodes, ntasks=self.ntasks, partition=self.partition,
                        cluster=self.cluster, account=self.account)


def _tasks_on_node(tasks_per_node: str, node: int, fallback: int) -> int:
    """This node's entry of Slurm's compressed SLURM_TASKS_PER_NODE (``2(x3),1``)."""
    counts: list[int] = []
    for item in filter(None, tasks_per_node.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            return max(fallback, 1)
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node] if node < len(counts) else max(fallback, 1)


def slurm_record() -> SlurmJob | None:
    """``environment.slurm`` of a result: the job this process runs in, or None."""
    task = SlurmTask.from_environ()
    return task.record() if task else None


def slurm_mode(task: SlurmTask | None, launch: Mapping[str, Any]) -> str | None:
    """How `hwbench run` runs in this Slurm step, given its launch options (None where
    not given): "task" (each task one rank), "node" (each task one node of a torchrun
    job, asked for with --nproc-per-node G and one task per node), or None (not under
    srun, or a single task: a plain run)."""
    if task is None or not task.in_step:
        return None
    nproc_per_node = launch.get("nproc_per_node")
    # the launch options srun sets itself, when given: the rendezvous, a node count other than the job's
    given = [name for name in ("node_rank", "master_addr", "master_port", "rdzv_endpoint")
             if launch.get(name) is not None] + (["nnodes"] if launch.get("nnodes") not in (None, task.nnodes) else [])
    if task.local_tasks == 1 and (nproc_per_node or 1) > 1:
        if given:
            raise UsageError(
                f"--{given[0].replace('_', '-')} is set by Slurm under srun (node rank from SLURM_NODEID, "
                f"{task.nnodes} nodes, the rendezvous on the job's first host); leave it out"
            )
        return "node"
    if task.ntasks == 1:
        return None
    if nproc_per_node not in (None, task.local_tasks):
        raise UsageError(
            f"--nproc-per-node {nproc_per_node} does not match srun's {task.local_tasks} tasks on this "
            "node; under srun each task is one rank (leave --nproc-per-node out), or start one task per "
            "node (srun --ntasks-per-node=1) for hwbench to launch --nproc-per-node ranks on each"
        )
    if given:
        flag = "nnodes" if "nnodes" in given else given[0]
        raise UsageError(
            f"--{flag.replace('_', '-')} is set by Slurm under srun (ranks from SLURM_PROCID, "
            "the rendezvous on the job's first host); leave it out"
        )
    return "task"
