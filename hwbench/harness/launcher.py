"""One process tree per benchmark point: torchrun under a timeout.

    hwbench run ... --nproc-per-node N [--nnodes M --node-rank R ...]

starts ``python -m hwbench.harness.agent`` (torchrun, hwbench.harness.agent),
which starts N ranks of ``hwbench run`` with the same options; each rank sees
torchrun's environment and acts as a worker (hwbench.harness.worker). Rank 0
merges every rank's figures and leaves the result in a private run folder;
this launcher reads it, adds how the run was launched, and returns it.

When a rank fails, the result says which, how (its traceback from torchrun's
error file, or the signal that killed it) and where every rank of this node
was (their heartbeats). When the run passes ``--timeout``, the launcher ends
the whole tree (torchrun first, then anything left, by SIGKILL) and the
result has status ``timeout``. No process outlives the launcher: it makes
itself the subreaper of its tree, so even orphaned ranks are found and reaped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from hwbench.catalog import Catalog
from hwbench.device import Backend
from hwbench.device.base import oom_figures
from hwbench.device.fingerprint import environment_fingerprint
from hwbench.device.host import share_of_cores
from hwbench.device_check import checked_backend
from hwbench.errors import SetupError, UsageError
from hwbench.files import write_json_atomic
from hwbench.harness.agent import AgentFailure
from hwbench.harness.describe import describe_device, describe_workload
from hwbench.harness.faults import AGENT_FILE, RESULT_FILE, RUN_DIR_ENV, read_heartbeats
from hwbench.lifeline import child_environment, stop_signals
from hwbench.result.model import Environment, Launch, RankSummary, RunError, RunResult, Status
from hwbench.result.store import ResultFormatError, load_result, new_run_id, utc_now, write_result
from hwbench.spec import RunSpec

RUN_DIR_PREFIX = "hwbench-run-"
OWNER_FILE = "owner.json"  # the launcher that owns a run folder: pid, start time, --out
TERMINATE_GRACE_S = 10.0  # torchrun's own SIGTERM-then-SIGKILL of its workers takes a few seconds
PR_SET_CHILD_SUBREAPER = 36
RDZV_ID = "hwbench"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun_arguments(spec: RunSpec, log_dir: str) -> list[str]:
    """torchrun's options for this node of the job."""
    launch = spec.launch
    # Every rank's output goes to its log file; the console shows local rank 0's.
    # --max-restarts: torchrun stops every rank when one fails and starts them all again; the
    # ranks resume from the run's last checkpoint (hwbench.harness.checkpointing).
    args = [f"--nnodes={launch.nnodes}", f"--nproc-per-node={launch.nproc_per_node}",
            f"--max-restarts={launch.max_restarts}", f"--log-dir={log_dir}", "--tee=3", "--local-ranks-filter=0"]
    if launch.rdzv_endpoint:
        args += ["--rdzv-backend=c10d", f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--rdzv-id={RDZV_ID}",
                 f"--node-rank={launch.node_rank}"]
    else:
        port = launch.master_port or free_port()
        args += [f"--node-rank={launch.node_rank}", f"--master-addr={launch.master_addr}", f"--master-port={port}"]
    return args


def become_subreaper() -> bool:
    """Orphans of our tree (a rank whose torchrun died) are re-parented to us,
    not to init, so the launcher can still find and reap them (Linux only)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    return children


def process_tree(roots: list[int]) -> list[int]:
    """The given pids and all their descendants that are alive."""
    children = _children_map()
    found, queue = [], list(roots)
    while queue:
        pid = queue.pop()
        if pid in found or not Path(f"/proc/{pid}").exists():
            continue
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_tree(roots: list[int]) -> list[int]:
    """SIGKILL the given processes and all their descendants that are alive;
    returns the pids killed."""
    killed = []
    for pid in process_tree(roots):
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def end_tree(agent: subprocess.Popen, run_dir: Path) -> list[int]:
    """SIGTERM torchrun (it stops its workers), then SIGKILL whatever of the
    tree is left; reap it all. Returns the pids that needed SIGKILL."""
    worker_pids = [beat["pid"] for beat in read_heartbeats(run_dir).values()]
    tree = process_tree([agent.pid, *worker_pids])
    with contextlib.suppress(ProcessLookupError):
        agent.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + TERMINATE_GRACE_S
    while time.monotonic() < deadline and any(_alive(pid) for pid in tree):
        _reap()
        time.sleep(0.1)
    killed = kill_tree(tree)
    with contextlib.suppress(subprocess.TimeoutExpired):
        agent.wait(timeout=5)
    _reap()
    return killed


def _reap() -> None:
    """Collect exited orphans the subreaper inherited."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def launch(spec: RunSpec, run_argv: list[str], catalog: Catalog) -> RunResult | None:
    """Run ``hwbench run RUN_ARGV`` as a torchrun job under spec.launch.timeout_s.
    None on a node other than node 0 when its ranks finished: rank 0, on node 0,
    holds the result."""
    backend = _check_device(spec)
    run_dir = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX))
    write_json_atomic(run_dir / OWNER_FILE, {"pid": os.getpid(), "start": _start_time(os.getpid()),
                                             "out_dir": os.path.abspath(spec.out_dir)})
    started = utc_now()
    command = [sys.executable, "-m", "hwbench.harness.agent", str(run_dir), "--",
               *torchrun_arguments(spec, str(run_dir / "logs")), "--module", "hwbench", "run", *run_argv]
    environment = child_environment({**os.environ, RUN_DIR_ENV: str(run_dir)})
    # torchrun would set 1 and warn; the CPU backend sets its threads per rank itself. The
    # usable cores, not os.cpu_count(): under a cpuset or quota the host's count oversubscribes.
    environment.setdefault("OMP_NUM_THREADS", str(share_of_cores(spec.launch.nproc_per_node)))
    become_subreaper()
    agent = subprocess.Popen(command, env=environment, start_new_session=True)
    try:
        with stop_signals():  # a pod deleted, a sweep stopping, a terminal closed: as Ctrl-C
            returncode, timed_out, killed = wait_for_agent(agent, run_dir, spec.launch.timeout_s)
            result = _collect(spec, run_dir, returncode, timed_out, killed)
            if result is None:
                return None
            if not result.device:  # no rank got as far as describing itself: the launcher does
                result.device = describe_device(backend, catalog, spec.precision)
                result.workload = describe_workload(catalog.workloads[spec.model], spec)
                result.environment = Environment.model_validate(environment_fingerprint(backend))
            result.launch = _describe_launch(spec, command, started)
            return result
    except BaseException:  # Ctrl-C or anything else: nothing may outlive us
        end_tree(agent, run_dir)
        raise
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def wait_for_agent(agent: subprocess.Popen, run_dir: Path, timeout_s: float) -> tuple[int | None, bool, list[int]]:
    """Wait for torchrun's agent up to ``timeout_s``; past it, end the whole tree. Returns (its exit
    status, whether it timed out, the pids that needed SIGKILL). The caller ends the tree on
    any exception (Ctrl-C) and starts the agent after ``become_subreaper``."""
    try:
        agent.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        killed = end_tree(agent, run_dir)
        _reap()
        return agent.returncode, True, killed
    _reap()
    return agent.returncode, False, []


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22):
    with the pid, it tells a live owner from a new process that reused its pid."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def recover_stranded_runs() -> list[str]:
    """Run folders whose launcher was killed before it could clean up (SIGKILL, the OOM
    killer): a finished result in one is moved to the --out its launcher was given,
    marked as recovered; then the folder is removed. Folders of live launchers are left
    alone. Returns one line per folder for the caller to show."""
    notes = []
    for run_dir in sorted(Path(tempfile.gettempdir()).glob(RUN_DIR_PREFIX + "*")):
        owner = _load_json(run_dir / OWNER_FILE)
        if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
            continue  # not ours, or its owner is still writing the owner file
        if _alive(owner["pid"]) and _start_time(owner["pid"]) == owner.get("start"):
            continue
        notes.append(_recover(run_dir, owner))
        shutil.rmtree(run_dir, ignore_errors=True)
    return notes


def _recover(run_dir: Path, owner: dict[str, Any]) -> str:
    where = f"the run folder {run_dir} of a launcher that was killed (pid {owner['pid']})"
    if not (run_dir / RESULT_FILE).exists():
        return f"removed {where}; it held no finished result"
    try:
        result = load_result(run_dir / RESULT_FILE)
        result.warnings.append(f"recovered from {run_dir}: its launcher (pid {owner['pid']}) was killed after rank "
                               "0 wrote the result; launch details are missing")
        path = write_result(result, owner.get("out_dir") or ".")
    except (ResultFormatError, OSError) as error:
        return f"removed {where}; its result could not be recovered: {error}"
    return f"recovered a finished result from {where}: {path}"


def _check_device(spec: RunSpec) -> Backend:
    """Device problems fail here, once, as one line, before any rank starts."""
    backend = checked_backend(spec)
    count = backend.device_count()
    if backend.name != "cpu" and count < spec.launch.nproc_per_node:
        raise UsageError(f"--nproc-per-node {spec.launch.nproc_per_node} needs that many {backend.name} devices; "
                         f"this node has {count}")
    return backend


def _describe_launch(spec: RunSpec, command: list[str], started: str) -> Launch:
    return Launch.model_validate({"launcher": "torchrun", "node_rank": spec.launch.node_rank,
                                  "nnodes": spec.launch.nnodes, "nproc_per_node": spec.launch.nproc_per_node,
                                  "command": command, "started_at": started, "timeout_s": spec.launch.timeout_s})


def _collect(spec: RunSpec, run_dir: Path, returncode: int | None, timed_out: bool,
             killed: list[int]) -> RunResult | None:
    merged = _load_json(run_dir / RESULT_FILE)
    if merged is not None and not timed_out:
        return RunResult.from_dict(merged)
    if returncode == 0 and not timed_out and spec.launch.node_rank > 0:
        return None  # this node's ranks finished; node 0 writes the result
    agent = _load_json(run_dir / AGENT_FILE) or {}
    failures = [AgentFailure(**failure) for failure in agent.get("failures", [])]
    raise_setup_problem(failures)
    beats = read_heartbeats(run_dir)
    result = RunResult(
        run_id=new_run_id(spec.model, spec.device if spec.device != "auto" else "device"),
        status="timeout" if timed_out else "failed",
        spec=spec.to_dict(),
        started_at=utc_now(),
    )
    ranks = [
        {"rank": rank, "host": beat["host"], "pid": beat["pid"], "last_step": beat["step"], "phase": beat["phase"]}
        for rank, beat in sorted(beats.items())
    ]
    if timed_out:
        where = ", ".join(f"rank {r}: step {b['step']}" for r, b in sorted(beats.items())) or "no rank started"
        error = RunError(type="Timeout", rank=None, traceback=None, signal=None, killed_pids=killed,
                         message=f"no result after --timeout {spec.launch.timeout_s:g}s; last completed steps: {where}")
    elif failures:
        result.status, error = describe_rank_failure(failures, beats)
        error.log_tail = log_tail(run_dir, error.local_rank)
        by_rank = {f.rank: f for f in failures}
        for entry in ranks:
            failure = by_rank.get(entry["rank"])
            entry["exitcode"] = failure.exitcode if failure else None
            entry["signal"] = failure.signal if failure else None
            entry["error"] = beats[entry["rank"]].get("message") if entry["rank"] in beats else None
    elif agent.get("status") == "stopped":
        error = RunError(type="AgentStopped", rank=None, traceback=None, signal=agent.get("signal"),
                         message=f"torchrun's agent received {agent.get('signal')} from outside hwbench and stopped "
                                 "every rank")
    else:
        error = RunError(type="LaunchFailed", rank=None, traceback=None, signal=None,
                         message=f"torchrun exited with status {returncode} and no rank reported a failure "
                                 "(the rendezvous may have failed: see the messages above)")
    result.ranks = [RankSummary.model_validate(entry) for entry in ranks]
    result.error = error
    result.finished_at = utc_now()
    if spec.launch.nnodes > 1:
        result.warnings.append(
            f"ranks of other nodes are not listed: node {spec.launch.node_rank}'s launcher "
            "sees its own ranks' heartbeats only"
        )
    return result


def _error_message(failure: AgentFailure) -> tuple[str, str | None]:
    """(message, traceback) from torchrun's error file of a failed rank."""
    data = failure.error_file_data or {}
    message = data.get("message")
    if isinstance(message, dict):
        return str(message.get("message", "")), (message.get("extraInfo") or {}).get("py_callstack")
    if isinstance(message, str):
        return message, None
    return str(failure.message or ""), None


LOG_TAIL_LINES = 40


def log_tail(run_dir: Path, local_rank: int | None) -> str | None:
    """The last lines a rank wrote to stderr (torchrun's per-rank log)."""
    if local_rank is None:
        return None
    logs = sorted((run_dir / "logs").glob(f"**/attempt_*/{local_rank}/stderr.log"))
    if not logs:
        return None
    lines = logs[-1].read_text(errors="replace").splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:]) or None


def raise_setup_problem(failures: list[AgentFailure]) -> None:
    """A rank that stopped on bad input or a missing device says so as the
    launcher would have: one line, exit 2, no result."""
    for failure in failures:
        message, _ = _error_message(failure)
        for kind, error in (("UsageError: ", UsageError), ("SetupError: ", SetupError)):
            if message.startswith(kind):
                raise error(f"rank {failure.rank}: {message[len(kind) :].strip()}")


def root_cause(failures: list[AgentFailure], beats: dict[int, dict]) -> AgentFailure:
    """The rank whose failure made the others fail. One rank failing makes its
    peers fail too (a collective loses its peer; torchrun SIGTERMs the rest),
    so: a rank that died by a signal other than torchrun's SIGTERM first, then
    the rank whose own exception came first (heartbeat time, sub-second), then
    torchrun's order."""

    def order(failure: AgentFailure) -> tuple:
        killed_by_agent = failure.signal == "SIGTERM"
        own_signal = failure.signal is not None and not killed_by_agent
        failed_at = beats.get(failure.rank, {}).get("failed_at")
        return (not own_signal, failed_at is None, failed_at or 0.0, failure.timestamp or 0, failure.rank)

    return min(failures, key=order)


def describe_rank_failure(failures: list[AgentFailure],
                           beats: dict[int, dict]) -> tuple[Status, RunError]:
    """Status and error of the root-cause failure."""
    first = root_cause(failures, beats)
    message, trace = _error_message(first)
    status: Status = "failed"
    # The worker raises RankFailure("<status>: <type>: <message>"): oom, invalid, storage or failed.
    if message.startswith("RankFailure: "):
        reported, _, message = message[len("RankFailure: ") :].partition(": ")
        status = TypeAdapter(Status).validate_python(reported)
    figures = oom_figures(message) if status == "oom" else {}
    if first.signal:  # a rank that wrote its failure may still be stopped by torchrun while it cleans up
        stopped = f"killed by {first.signal} (exit code {first.exitcode})"
        message = f"{message}; then {stopped}" if message else stopped
    elif not message:
        message = f"exited with status {first.exitcode}"
    message = f"rank {first.rank}: {message}"
    return status, RunError(type="RankFailed", log_tail=None, rank=first.rank, local_rank=first.local_rank,
                            exitcode=first.exitcode, signal=first.signal, message=message,
                            traceback=trace, failed_ranks=[f.rank for f in failures],
                            **figures)  # requested and free bytes of an out-of-memory failure
