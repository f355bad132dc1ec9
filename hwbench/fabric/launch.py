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
from hwbench.fabric.collectives import COLLECTIVES, CollectiveSettings, check_world_size, judge_pairs
from hwbench.fabric.rank import SETTINGS_FILE
from hwbench.fabric.result import (
    CollectivesError,
    CollectivesResult,
    Link,
    RankHost,
    Row,
    Settings,
    SlowLink,
)
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
from hwbench.result.model import Environment
from hwbench.result.store import new_run_id, utc_now


@dataclasses.dataclass(frozen=True)
class CollectivesJob:
    """One `hwbench collectives` run on this node."""

    device: str
    nproc_per_node: int
    settings: CollectiveSettings
    ring: RingSettings | None = None


def run_collectives(job: CollectivesJob) -> CollectivesResult:
    """Measure on ``job.nproc_per_node`` ranks of this node; the result, whatever happened."""
    import subprocess

    check_world_size(job.nproc_per_node)
    Fault.from_environ(job.nproc_per_node)  # a fault for a rank the job has not is refused before it starts
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
    torchrun = [f"--nproc-per-node={job.nproc_per_node}", "--nnodes=1", "--max-restarts=0",
                f"--log-dir={run_dir / 'logs'}", "--tee=3", "--local-ranks-filter=0", "--master-addr=127.0.0.1",
                f"--master-port={free_port()}", "--module", "hwbench.fabric.rank"]
    command = [sys.executable, "-m", "hwbench.harness.agent", str(run_dir), "--", *torchrun]
    environment = child_environment({**os.environ, RUN_DIR_ENV: str(run_dir)})
    environment.setdefault("OMP_NUM_THREADS", "1")
    become_subreaper()
    agent = subprocess.Popen(command, env=environment, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        with stop_signals():
            _returncode, timed_out, killed = wait_for_agent(agent, run_dir, job.settings.timeout_s)
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
                               dist_backend=backend.dist_backend, world_size=job.nproc_per_node, settings=settings)
    gathered = _load(run_dir / RESULT_FILE)
    if gathered is not None and not timed_out:
        names = gathered.get("device_names") or []
        result.device_model = names[0] if names else None
        ranks = sorted(gathered["ranks"], key=lambda entry: entry["rank"])
        result.ranks = [RankHost(rank=r["rank"], host=r["host"], pid=r["pid"]) for r in ranks]
        result.rows = merge_rows(ranks, job.nproc_per_node)
        if job.settings.check:
            result.check_passed = all(row.wrong == 0 for row in result.rows)
        if job.ring:
            result.slow_link = judge_ring(ranks, job.ring, job.nproc_per_node)
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


def merge_rows(ranks: list[dict], world: int) -> list[Row]:
    """nccl-tests' table from every rank's figures: the time averaged over ranks (min and max
    kept), algbw = size / time, busbw = algbw x the collective's factor, #wrong summed."""
    rows = []
    for position, first in enumerate(ranks[0]["rows"]):
        times = [rank["rows"][position]["time_s"] for rank in ranks]
        wrongs = [rank["rows"][position]["wrong"] for rank in ranks]
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
