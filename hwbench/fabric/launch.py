"""`hwbench collectives` as a torchrun job: the launcher of runs (hwbench.harness.launcher) starts
torchrun's agent with ``python -m hwbench.fabric.rank`` on every rank, under the same timeout, with
the same end of the whole process tree and the same reading of failed ranks; this module builds
the typed result from what rank 0 gathered."""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from hwbench.device import select_backend
from hwbench.device.fingerprint import environment_fingerprint
from hwbench.errors import SetupError, UsageError
from hwbench.fabric.collectives import COLLECTIVES, CollectiveSettings, check_world_size, scopes
from hwbench.fabric.rank import SETTINGS_FILE
from hwbench.fabric.ring import RingSettings, pairs
from hwbench.files import write_json_atomic
from hwbench.harness.agent import AgentFailure
from hwbench.harness.faults import AGENT_FILE, RESULT_FILE, RUN_DIR_ENV, Fault, read_heartbeats
from hwbench.harness.launcher import (
    RUN_DIR_PREFIX,
    become_subreaper,
    describe_rank_failure,
    end_tree,
    free_port,
    raise_setup_problem,
    wait_for_agent,
)
from hwbench.lifeline import child_environment, stop_signals
from hwbench.result.collectives import (
    CollectivesError,
    CollectivesResult,
    Link,
    RankHost,
    Row,
    ScopeRows,
    Settings,
    SlowLink,
    judge_pairs,
)
from hwbench.result.model import Environment
from hwbench.result.store import new_run_id, utc_now


@dataclasses.dataclass(frozen=True)
class NodePlace:
    """This node's place in a run over several nodes (from Slurm: hwbench/harness/slurm_env.py)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int


@dataclasses.dataclass(frozen=True)
class CollectivesJob:
    """One `hwbench collectives` run: on this node, or this node's part of a run over ``nodes``."""

    device: str
    nproc_per_node: int
    settings: CollectiveSettings
    ring: RingSettings | None = None
    nodes: NodePlace | None = None

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * (self.nodes.nnodes if self.nodes else 1)


@dataclasses.dataclass(frozen=True)
class NodeDone:
    """What a node other than node 0 ends with: its ranks' figures went to rank 0, on node 0, which
    writes the result; ``returncode``: torchrun's agent's on this node."""

    node_rank: int
    returncode: int | None


def nodes_from_slurm() -> NodePlace | None:
    """This node's place when srun started one task per node of several (the rendezvous on the job's
    first host, a port from the job id: hwbench/harness/slurm_env.py); None outside such a step."""
    from hwbench.harness.slurm_env import SlurmTask

    task = SlurmTask.from_environ()
    if task is None or not task.in_step or task.ntasks == 1:
        return None
    if task.local_tasks != 1:
        raise UsageError(f"hwbench collectives under srun: {task.local_tasks} tasks on this node; accepted: one task "
                         "per node (srun --ntasks-per-node=1), each starting --nproc-per-node ranks")
    address, port = task.master(os.environ)
    return NodePlace(task.nnodes, task.nodeid, address, port)


def run_collectives(job: CollectivesJob) -> CollectivesResult:
    """Measure on ``job.nproc_per_node`` ranks of this node; the result, whatever happened."""
    outcome = run_on_node(job)
    if isinstance(outcome, NodeDone):
        raise RuntimeError("run_collectives runs on one node, or node 0 of several: use run_on_node")
    return outcome


def run_on_node(job: CollectivesJob) -> CollectivesResult | NodeDone:
    """This node's ranks measured (with the other nodes' when ``job.nodes``): node 0 returns the
    result, whatever happened; another node what its ranks ended with."""
    import subprocess

    check_world_size(job.world_size)
    Fault.from_environ(job.world_size)  # a fault for a rank the job has not is refused before it starts
    backend = select_backend(job.device)
    if backend.simulated:  # a stand-in runtime on the host CPU has no collective backend of its vendor's
        raise SetupError(f"--device {backend.name}: the device is simulated (a stand-in runtime on the host CPU); "
                         "there is no fabric to measure: give --device cpu, or run on the real device")
    if backend.name != "cpu" and backend.device_count() < job.nproc_per_node:
        raise UsageError(f"--nproc-per-node {job.nproc_per_node} needs that many {backend.name} devices; "
                         f"this node has {backend.device_count()}")
    run_dir = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX))
    write_json_atomic(run_dir / SETTINGS_FILE, {"device": backend.name, "settings": job.settings.to_dict(),
                                                "ring": dataclasses.asdict(job.ring) if job.ring else None})
    started = utc_now()
    nodes = job.nodes or NodePlace(1, 0, "127.0.0.1", free_port())
    torchrun = [f"--nproc-per-node={job.nproc_per_node}", f"--nnodes={nodes.nnodes}", f"--node-rank={nodes.node_rank}",
                "--max-restarts=0", f"--log-dir={run_dir / 'logs'}", "--tee=3", "--local-ranks-filter=0",
                f"--master-addr={nodes.master_addr}", f"--master-port={nodes.master_port}", "--module",
                "hwbench.fabric.rank"]
    command = [sys.executable, "-m", "hwbench.harness.agent", str(run_dir), "--", *torchrun]
    environment = child_environment({**os.environ, RUN_DIR_ENV: str(run_dir)})
    environment.setdefault("OMP_NUM_THREADS", "1")
    become_subreaper()
    agent = subprocess.Popen(command, env=environment, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        with stop_signals():
            returncode, timed_out, killed = wait_for_agent(agent, run_dir, job.settings.timeout_s)
            if nodes.node_rank != 0:
                return NodeDone(nodes.node_rank, 124 if timed_out else returncode)
            result = _result(job, backend, run_dir, timed_out, killed)
    except BaseException:  # Ctrl-C or anything else: nothing may outlive us
        end_tree(agent, run_dir)
        raise
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    result.started_at, result.finished_at = started, utc_now()
    result.environment = Environment.model_validate(environment_fingerprint(backend))
    return result


def _result(job: CollectivesJob, backend, run_dir: Path, timed_out: bool, killed: list[int]) -> CollectivesResult:
    settings = Settings.model_validate({**job.settings.to_dict(), "collectives": list(job.settings.collectives)})
    result = CollectivesResult(run_id=new_run_id("collectives", backend.name), status="ok", device=backend.name,
                               dist_backend=backend.dist_backend, world_size=job.world_size, settings=settings)
    gathered = _load(run_dir / RESULT_FILE)
    if gathered is not None and not timed_out:
        names = gathered.get("device_names") or []
        result.device_model = names[0] if names else None
        ranks = sorted(gathered["ranks"], key=lambda entry: entry["rank"])
        result.ranks = [RankHost(rank=r["rank"], host=r["host"], pid=r["pid"]) for r in ranks]
        result.rows = merge_rows([rank["rows"] for rank in ranks], job.world_size)
        result.scopes = merge_scopes(ranks)
        if job.settings.check:
            rows = result.rows + [row for scope in result.scopes for row in scope.rows]
            result.check_passed = all(row.wrong == 0 for row in rows)
        if job.ring:
            result.slow_link = judge_ring(ranks, job.ring, job.world_size)
        return result
    beats = read_heartbeats(run_dir)
    result.ranks = [RankHost(rank=rank, host=beat["host"], pid=beat["pid"]) for rank, beat in sorted(beats.items())]
    if timed_out:
        result.status = "timeout"
        result.error = CollectivesError(type="Timeout", message=timeout_message(beats, job.settings.timeout_s),
                                        rank=laggard(beats), killed_pids=killed)
        return result
    failures = [AgentFailure(**failure) for failure in (_load(run_dir / AGENT_FILE) or {}).get("failures", [])]
    raise_setup_problem(failures)  # a rank that refused its input: one line, exit 2
    result.status = "failed"
    if failures:
        _status, error = describe_rank_failure(failures, beats)
        result.error = CollectivesError(type="RankFailed", message=error.message, rank=error.rank)
    else:
        result.error = CollectivesError(type="LaunchFailed", message="torchrun exited and no rank reported a failure "
                                        "(the rendezvous may have failed)")
    return result


def _load(path: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def laggard(beats: dict[int, dict]) -> int | None:
    """The rank behind the others (the lowest last step, when not every rank is there): the one
    that hangs, while the others wait for it in the next collective."""
    if not beats:
        return None
    behind = min(beats, key=lambda rank: (beats[rank]["step"], rank))
    return behind if len({beat["step"] for beat in beats.values()}) > 1 else None


def timeout_message(beats: dict[int, dict], timeout_s: float) -> str:
    rank = laggard(beats)
    if rank is None:
        where = ", ".join(f"rank {r}: {b['phase']}" for r, b in sorted(beats.items())) or "no rank started"
        return f"no result after --timeout {timeout_s:g}s; {where}"
    ahead = max(beats.values(), key=lambda beat: beat["step"])
    return (f"no result after --timeout {timeout_s:g}s: rank {rank} (host {beats[rank]['host']}) stopped before "
            f"{ahead['phase']}, where the other ranks wait for it; its last: {beats[rank]['phase']}")


def merge_scopes(ranks: list[dict]) -> list[ScopeRows]:
    """A multi-node run's intra-node and inter-node tables, each merged over its member ranks (the
    busbw factor of its group's size); none on one host."""
    merged = []
    for scope in scopes([rank["host"] for rank in ranks]):
        if not scope.groups:
            merged.append(ScopeRows(scope=scope.name, groups=[], unmeasured=scope.unmeasured))
            continue
        members = [rank["scopes"][scope.name] for rank in ranks if rank["scopes"].get(scope.name) is not None]
        merged.append(ScopeRows(scope=scope.name, groups=scope.groups, rows=merge_rows(members, len(scope.groups[0]))))
    return merged


def merge_rows(rank_rows: list[list[dict]], world: int) -> list[Row]:
    """nccl-tests' table from every rank's figures (``rank_rows``: each rank's rows, in one order):
    the time averaged over ranks (min and max kept), algbw = size / time, busbw = algbw x the
    collective's factor for ``world`` ranks, #wrong summed."""
    rows = []
    for position, first in enumerate(rank_rows[0]):
        times = [mine[position]["time_s"] for mine in rank_rows]
        wrongs = [mine[position]["wrong"] for mine in rank_rows]
        mean_s = statistics.fmean(times)
        factor = COLLECTIVES[first["collective"]].bus_factor(world)
        algbw = first["size_bytes"] / mean_s / 1e9 if mean_s > 0 else None
        rows.append(Row(collective=first["collective"], in_place=first["in_place"], size_bytes=first["size_bytes"],
                        elements=first["elements"], time_us=mean_s * 1e6, time_us_min=min(times) * 1e6,
                        time_us_max=max(times) * 1e6, algbw_gbs=algbw,
                        busbw_gbs=None if algbw is None else algbw * factor, bus_factor=factor,
                        wrong=None if min(wrongs) < 0 else sum(wrongs)))
    return rows


def judge_ring(ranks: list[dict], ring: RingSettings, world: int) -> SlowLink:
    """Each pair of the ring with its time, bandwidth and slowdown; every slow pair named."""
    hosts = {rank["rank"]: rank["host"] for rank in ranks}
    times = {int(index): seconds for rank in ranks for index, seconds in rank["ring"].items()}
    seconds = [times[index] for index in range(len(pairs(world)))]
    verdict = judge_pairs(seconds, ring.threshold)
    links = [Link(sender=sender, receiver=receiver, sender_host=hosts[sender], receiver_host=hosts[receiver],
                  time_us=pair_s * 1e6, busbw_gbs=ring.size_bytes / pair_s / 1e9 if pair_s > 0 else None,
                  slowdown=slowdown)
             for (sender, receiver), pair_s, slowdown in zip(pairs(world), seconds, verdict.slowdowns, strict=True)]
    return SlowLink(size_bytes=ring.size_bytes, threshold=ring.threshold, links=links,
                    median_time_us=verdict.median_s * 1e6, slow=[links[index] for index in verdict.slow])
