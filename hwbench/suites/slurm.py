"""`hwbench sweep SUITE --executor slurm`: every point one Slurm job (docs/slurm.md), and
the sbatch scripts `hwbench slurm` prints.

SlurmExecutor, the point loop's executor for Slurm, writes each point and repeat as
``OUT/<suite>/<point>/repeat<N>.sbatch`` (`srun hwbench run ...` on the point's nodes),
submits it with ``sbatch --parsable`` (job id in ``repeat<N>.slurm``, output in
``repeat<N>.log``), re-attaches to an earlier sweep's job instead of submitting twice,
and polls ``scontrol show job`` (``sacct`` once the controller forgot the job). A job's
result is what its run wrote, else its final Slurm state (``error.slurm_state``) as the
nearest hwbench status. Only Slurm's client tools are used (sbatch, scontrol, sacct, scancel).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hwbench.device.kinds import KINDS
from hwbench.errors import SetupError, UsageError
from hwbench.files import write_json_atomic, write_text_atomic
from hwbench.harness.faults import SWEEP_ENV
from hwbench.options import MULTI_NODE_PORT, RunOptions
from hwbench.result.model import RunResult
from hwbench.result.store import utc_now
from hwbench.spec import RunSpec
from hwbench.suites.executor import TIMEOUT_MARGIN_S, Executor, Job, PointRun, Say, duration, keyed_results, recorded

LAUNCHES = ("tasks", "torchrun")  # one task per device (Megatron's way), or one torchrun per node
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
# A job that ended without a result: its final state as the nearest hwbench status.
STATUS_OF_STATE = {"TIMEOUT": "timeout", "DEADLINE": "timeout", "OUT_OF_MEMORY": "oom"}
# Ended by something other than the point itself, or never started because sbatch refused it
# (a wrong --partition): a resumed sweep submits it again.
SUBMIT_FAILED = "SUBMIT_FAILED"
RESUBMIT_STATES = ("CANCELLED", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED", SUBMIT_FAILED)
SLURM_TOOL_TIMEOUT_S = 60.0
SUMMARY_EVERY_S = 60.0
# sbatch --time's forms: MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
TIME_FORMS = "MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
TIME_FORMAT = re.compile(r"(?P<lead>\d+)(?::(?P<m>\d{1,2}))?(?::(?P<s>\d{1,2}))?"
                         r"|(?P<d>\d+)-(?P<h>\d{1,2})(?::(?P<dm>\d{1,2}))?(?::(?P<ds>\d{1,2}))?", re.ASCII)
POLL_MAX_S = 3600.0
# The #SBATCH options hwbench writes itself: (long name, short letter or None) -> the hwbench option to use.
WRITTEN_OPTIONS = {("nodes", "N"): "--nnodes (or --nodes-per-point in a sweep)",
                   ("ntasks-per-node", None): "--nproc-per-node and --launch",
                   ("output", "o"): "--log (hwbench slurm; a sweep writes OUT/<suite>/<point>/repeat<N>.log)",
                   ("time", "t"): "--time", ("partition", "p"): "--partition", ("account", "A"): "--account",
                   ("job-name", "J"): "--job-name (hwbench slurm; a sweep names its jobs hwbench-<suite>-<point>)",
                   ("gres", None): "--device and --nproc-per-node (hwbench writes --gres for them)"}


# The one place the values that go into an sbatch script are checked (docs/slurm.md).
def check_script_value(option: str, value: str) -> str:
    """Any value written into an sbatch script: no control character (a newline would
    end the #SBATCH line and start a script line of its own)."""
    if any(ord(char) < 32 or 127 <= ord(char) < 160 or char in "\u2028\u2029" for char in value):
        raise UsageError(f"{option} {value!r} is not accepted; give a value without control characters "
                         "(newline, tab, ...)")
    return value


# What Slurm refuses in a name (its source: slurmctld's job_create refuses a job name or
# partition of more than 1,024 bytes; sacctmgr turns quote characters into '`', so no account
# holds one). slurm.conf takes any other text as a partition name (';' and '$' included, quoted or
# escaped), so those are left to the site: a partition that does not exist is sbatch's refusal,
# recorded per point.
MAX_SLURM_NAME_BYTES = 1024


def check_slurm_name(option: str, value: str, lists: bool = False) -> str:
    """A partition (``lists``: a comma-separated list of them) or an account name."""
    check_script_value(option, value)
    items = value.split(",") if lists else [value]
    if not value or any(not item or re.search(r"[\s,]", item) for item in items):
        raise UsageError(f"{option} {value!r} is not accepted; give a Slurm name without whitespace"
                         + (" (several: comma-separated, as gpu,debug)" if lists else " or commas"))
    if not lists and re.search("[\"']", value):
        raise UsageError(f"{option} {value!r} is not accepted; Slurm's accounts hold no quote characters")
    return check_name_length(option, value)


def check_name_length(option: str, value: str) -> str:
    if len(value.encode()) > MAX_SLURM_NAME_BYTES:
        raise UsageError(f"{option} {value[:40]!r}... is not accepted; Slurm refuses more than "
                         f"{MAX_SLURM_NAME_BYTES} bytes ({len(value.encode())} given)")
    return value


def check_time(value: str) -> str:
    """sbatch --time in one of Slurm's forms, longer than zero."""
    match = TIME_FORMAT.fullmatch(value)
    if match and match.group("lead") is not None:
        fields = [int(f) for f in (match.group("lead"), match.group("m"), match.group("s")) if f is not None]
        ok = all(f < 60 for f in fields[1:])
        seconds = fields[0] * 60 if len(fields) == 1 else sum(f * 60 ** (len(fields) - 1 - i)
                                                               for i, f in enumerate(fields))
    elif match:
        days, hours, minutes, secs = (int(match.group(k) or 0) for k in ("d", "h", "dm", "ds"))
        ok = hours < 24 and minutes < 60 and secs < 60
        seconds = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    if not match or not ok or seconds <= 0:
        raise UsageError(f"--time {value!r} is not accepted; give Slurm's form, longer than zero: {TIME_FORMS} "
                         "(hours < 24 after D-, minutes and seconds < 60)")
    return value


def check_log(path: str) -> str:
    """--log: a file path (an empty one, made absolute, would name the folder itself)."""
    if not path.strip():
        raise UsageError(f"--log {path!r} is not accepted; give a file path, e.g. hwbench-%j.log")
    return check_script_value("--log", path)


def check_poll(seconds: float) -> float:
    """--poll: finite seconds, 0 < poll <= POLL_MAX_S."""
    if not (math.isfinite(seconds) and 0 < seconds <= POLL_MAX_S):
        raise UsageError(f"--poll {seconds!r} is not accepted; give seconds > 0 and <= {POLL_MAX_S:g}")
    return seconds


def check_sbatch_arg(arg: str, gres_written: bool = False) -> str:
    """One more sbatch option, not one hwbench writes itself (--gres only for a device
    that hwbench writes one for: an NPU site names its own)."""
    check_script_value("--sbatch-arg", arg)
    if not arg.startswith("-") or arg in ("-", "--"):
        raise UsageError(f"--sbatch-arg {arg!r} is not accepted; give one sbatch option such as "
                         "--sbatch-arg=--qos=high")
    for (long, short), instead in WRITTEN_OPTIONS.items():
        if long == "gres" and not gres_written:
            continue
        if (re.fullmatch(rf"--{re.escape(long)}(?:[=\s].*)?", arg, re.S)
                or (short and arg.startswith(f"-{short}") and not arg.startswith("--"))):
            raise UsageError(f"--sbatch-arg {arg!r} is not accepted; hwbench writes --{long} itself: give {instead}")
    return arg


def check_device_kind(device: str | None, where: str = "a Slurm job") -> None:
    """A script asks Slurm for the devices by kind: with auto, a node given none would quietly
    benchmark its CPU (as `hwbench k8s` refuses it too)."""
    if (device or "auto") not in KINDS:
        raise UsageError(f"--device {device or 'auto'} is not accepted for {where}: the script asks Slurm for the "
                         f"devices by kind; give --device {' or '.join(KINDS)}")


def check_slurm_tools(collect: bool) -> None:
    """Slurm's client tools on PATH (sbatch unless only collecting), before anything is written."""
    for tool in ("scontrol",) + (() if collect else ("sbatch",)):
        if shutil.which(tool) is None:
            raise SetupError(f"{tool} not found: --executor slurm needs Slurm's client tools (sbatch, scontrol, "
                             "scancel) on PATH")


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """How a sweep's points go to Slurm (`hwbench sweep --executor slurm` options)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None  # sbatch --time; None: each point's --timeout plus a margin
    nodes_per_point: int | None = None  # None ("auto"): each point's own --nnodes
    sbatch_args: tuple[str, ...] = ()
    launch: str = "tasks"
    poll_s: float = 10.0
    detach: bool = False  # submit and return
    collect: bool = False  # submit nothing: gather the jobs of an earlier (detached) sweep
    python: str = sys.executable  # the interpreter every node runs (a shared file system)

    def __post_init__(self) -> None:
        if self.partition is not None:
            check_slurm_name("--partition", self.partition, lists=True)
        if self.account is not None:
            check_slurm_name("--account", self.account)
        if self.time is not None:
            check_time(self.time)
        if self.nodes_per_point is not None and self.nodes_per_point < 1:
            raise UsageError(f"--nodes-per-point {self.nodes_per_point} is not accepted; give auto or an integer >= 1")
        if self.launch not in LAUNCHES:
            raise UsageError(f"--launch {self.launch!r} is not accepted; give one of {', '.join(LAUNCHES)}")
        check_poll(self.poll_s)
        if self.detach and self.collect:
            raise UsageError("--detach and --collect are not accepted together; submit with --detach, later --collect")
        for arg in self.sbatch_args:
            check_sbatch_arg(arg)


def slurm_time(seconds: float) -> str:
    """Seconds as sbatch --time's D-HH:MM:SS, rounded up to the minute."""
    minutes = max(1, -(-int(seconds) // 60))
    return f"{minutes // 1440}-{minutes // 60 % 24:02d}:{minutes % 60:02d}:00"


def sbatch_header(sbatch: dict[str, Any], settings: SlurmSettings) -> list[str]:
    """A job script's first lines: ``sbatch``'s options (a value None: a flag such as
    --exclusive), the settings' partition and account, then the user's own --sbatch-arg lines."""
    sbatch = dict(sbatch)
    if settings.partition:
        sbatch["partition"] = check_slurm_name("--partition", settings.partition, lists=True)
    if settings.account:
        sbatch["account"] = check_slurm_name("--account", settings.account)
    lines = ["#!/bin/bash"] + [f"#SBATCH --{name}" + ("" if value is None else f"={shlex.quote(str(value))}")
                               for name, value in sbatch.items()]
    return lines + [f"#SBATCH {shlex.quote(check_sbatch_arg(arg, 'gres' in sbatch))}" for arg in settings.sbatch_args]


def batch_script(spec: RunSpec, options: RunOptions, point_dir: Path | str, log: Path | str, settings: SlurmSettings,
                 env: dict[str, str] | None = None, sweep: dict[str, Any] | None = None,
                 job_name: str = "hwbench") -> str:
    """The sbatch script that runs `hwbench run` with ``options`` (``spec`` is what they
    resolve to) on the point's nodes, its result into ``point_dir``: one task per device
    (each one rank), or one task per node that launches torchrun."""
    check_device_kind(spec.device)
    nodes, per_node = spec.launch.nnodes, spec.launch.nproc_per_node
    tasks_per_node = 1 if settings.launch == "torchrun" else per_node
    gres = KINDS[spec.device].slurm_gres
    # Every #SBATCH value is checked (no control character can start a line of its own)
    # and shell-quoted (sbatch reads #SBATCH lines with quotes, as a shell would).
    sbatch = {
        "job-name": check_name_length("--job-name", check_script_value("--job-name", job_name)),
        "nodes": int(nodes),
        "ntasks-per-node": int(tasks_per_node),
        # The job may start in another folder (--chdir, a script submitted from elsewhere): every path absolute.
        "output": os.path.abspath(check_log(str(log))),
        "time": check_time(settings.time) if settings.time else slurm_time(spec.launch.timeout_s + TIMEOUT_MARGIN_S),
    }
    if gres:
        sbatch["gres"] = f"{gres}:{int(per_node)}"
    lines = sbatch_header(sbatch, settings)
    tasks = ("one task per device, each one rank (ranks from SLURM_PROCID)" if tasks_per_node == per_node
             else "one task per node, each launching torchrun with its ranks")
    lines += ["", f"# written by hwbench: {nodes} node(s) x {per_node} device(s), {tasks}",
              "# rendezvous: the job's first host, port 10000 + job id mod 50000 (hwbench/harness/slurm_env.py)"]
    if sweep is not None:
        lines.append(f"export {SWEEP_ENV}={shlex.quote(json.dumps(sweep, sort_keys=True))}")
    for key, value in (env or {}).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"env {key!r} is not accepted; give a variable name (letters, digits, _)")
        lines.append(f"export {key}={shlex.quote(value)}")
    quiet = ["--quiet"] if sweep is not None else []  # a sweep's log needs no progress lines
    command = [settings.python, "-m", "hwbench", "run", *quiet,
               *options.with_absolute_paths().merged(out=None).to_argv(), "--out", os.path.abspath(point_dir)]
    lines += ["", "srun --kill-on-bad-exit=1 " + shlex.join(command), ""]
    return "\n".join(lines)


def slurm_tool(args: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=SLURM_TOOL_TIMEOUT_S)
    except FileNotFoundError:
        raise SetupError(
            f"{args[0]} not found: --executor slurm needs Slurm's client tools (sbatch, scontrol, scancel) on PATH"
        ) from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 1, "", f"{args[0]} did not answer in {SLURM_TOOL_TIMEOUT_S:g}s")


def submit(script: Path) -> tuple[str | None, str]:
    """(job id, '') or (None, sbatch's complaint)."""
    done = slurm_tool(["sbatch", "--parsable", str(script)])
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or [f"sbatch exited with status {done.returncode}"])[-1]
    return done.stdout.strip().split(";")[0], ""


NO_ANSWER = "NO_ANSWER"  # job_state when the controller did not answer: ask again at the next poll


def job_state(job_id: str) -> str | None:
    """The job's state (PENDING, RUNNING, COMPLETED, ...) from the controller, or from
    accounting once the controller forgot it; None when neither knows the job."""
    done = slurm_tool(["scontrol", "show", "job", "-o", job_id])
    match = re.search(r"\bJobState=(\S+)", done.stdout) if done.returncode == 0 else None
    if match:
        return match.group(1)
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        return NO_ANSWER  # a controller that did not answer has not forgotten the job: it may still run
    done = slurm_tool(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
    words = done.stdout.split() if done.returncode == 0 else []
    return words[0].rstrip("+") if words else None


def cancel_jobs(jobs: list[str], out_dir: Path) -> None:
    """scancel the jobs and forget their records under ``out_dir``, so the same sweep
    command submits those points again."""
    if not jobs:
        return
    done = slurm_tool(["scancel", *jobs])
    if done.returncode != 0:  # the jobs may still run: keep their records, so the sweep re-attaches
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise SetupError(f"scancel {' '.join(jobs)} failed ({reason}); the jobs are kept and the same command "
                         "re-attaches to them")
    for record in out_dir.rglob("repeat*.slurm"):
        if _read_job(record).get("job_id") in jobs:
            record.unlink(missing_ok=True)


def cluster_name() -> str:
    """The cluster's name (the key of a Slurm sweep's results, instead of this host's)."""
    done = slurm_tool(["scontrol", "show", "config"])
    match = re.search(r"^ClusterName\s*=\s*(\S+)", done.stdout, re.M) if done.returncode == 0 else None
    if done.returncode != 0:
        raise SetupError("--executor slurm: Slurm's controller does not answer: "
                         f"{(done.stderr.strip().splitlines() or ['scontrol failed'])[-1]}")
    return match.group(1) if match else "unknown"


def _read_job(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class SlurmExecutor(Executor):
    """Every point (and repeat) one Slurm job: the point loop's executor for
    `hwbench sweep --executor slurm`. Submits (or re-attaches to an earlier sweep's
    job), then polls the jobs' states and collects each ended job's result, or a
    record of its final state."""

    def __init__(self, settings: SlurmSettings, force: bool, say: Say) -> None:
        from hwbench.catalog import load_catalog

        self.settings, self.force, self.say, self.detach = settings, force, say, settings.detach
        self.defaults: dict[str, Any] = {"nnodes": settings.nodes_per_point}
        self.catalog = load_catalog()
        self.started = self.last_summary = time.monotonic()

    def check(self, runs: list[PointRun], out_dir: Path) -> None:
        """Everything that can refuse the sweep, before its folder and lock exist."""
        check_script_value("--out", str(out_dir.resolve()))  # in every script's --output and srun line
        for run in runs:  # the whole sweep refused at once, not one `invalid` point after another
            check_device_kind(run.options.device, f"--executor slurm (point {run.point.name})")
            check_script_value(f"suite {run.folder.parent.name!r} point", _job_name(run))
        check_slurm_tools(self.settings.collect)

    def machine(self) -> dict[str, Any]:
        import torch

        return {"slurm_cluster": cluster_name(), "torch": torch.__version__}

    def again(self, kept: RunResult) -> bool:
        """A job ended by something other than the point (cancelled, a node failure) or
        refused by sbatch is submitted again, unless only collecting."""
        return not self.settings.collect and kept.error is not None and kept.error.slurm_state in RESUBMIT_STATES

    def submit(self, run: PointRun, kept: Path | None) -> RunResult | Job | None:
        job = self._earlier_job(run, has_result=kept is not None)
        if job is not None:
            self.say(f"{run.label}: job {job.job_id} {job.state} (re-attached)")
            return job
        if kept:  # a cancelled or refused job's record: this submission replaces it
            kept.unlink(missing_ok=True)
        if self.settings.collect:
            self.say(f"{run.label}: not submitted (no job to collect)")
            return None
        return self._submit(run)

    def _earlier_job(self, run: PointRun, has_result: bool) -> Job | None:
        """The job an earlier sweep submitted for this run, when it is still out or ended
        without anyone collecting it (re-attached, never submitted twice)."""
        earlier = {} if self.force else _read_job(_job_file(run))
        if earlier.get("key") != run.key or not earlier.get("job_id"):
            return None
        state = job_state(earlier["job_id"])
        if not (state in ACTIVE_STATES or (state and not has_result)):
            return None
        return Job(run, earlier["job_id"], state, earlier.get("submitted_at", ""))

    def _submit(self, run: PointRun) -> RunResult | Job:
        """The submitted job, or the result recorded for a point that could not be submitted."""
        from hwbench.spec import build_run_spec

        # Checked as `hwbench run` will check it on the nodes (not the planner: this is not
        # a node): a bad layout is recorded without a job. Slurm gives the launch, not a port.
        launch = {"master_port": MULTI_NODE_PORT} if run.options.given().get("nnodes", 1) > 1 else {}
        try:
            spec = build_run_spec(run.options.merged(out=str(run.folder), **launch), self.catalog)
            # the point's device may bring a --gres an --sbatch-arg also sets: that point is invalid
            folder = run.folder.resolve()
            text = batch_script(spec, run.options, folder, folder / f"repeat{run.repeat}.log", self.settings, run.env,
                                run.sweep, _job_name(run))
        except UsageError as error:
            return recorded(run, "invalid", str(error))
        run.folder.mkdir(parents=True, exist_ok=True)
        script = write_text_atomic(run.folder / f"repeat{run.repeat}.sbatch", text)
        submitted_at = utc_now()
        job_id, problem = submit(script)
        if job_id is None:
            return recorded(run, "invalid", f"sbatch refused the job: {problem}", extra={"slurm_state": SUBMIT_FAILED})
        write_json_atomic(_job_file(run),
                          {"job_id": job_id, "key": run.key, "submitted_at": submitted_at, "script": script.name})
        self.say(f"{run.label}: submitted as job {job_id}")
        return Job(run, job_id, "PENDING", submitted_at)

    def wait(self, jobs: list[Job]) -> list[tuple[Job, RunResult]]:
        """Poll every --poll seconds until one or more jobs ended; each change of state,
        and every minute a count of what is still out, said."""
        while True:
            ended = []
            for job in jobs:
                state = job_state(job.job_id) or "UNKNOWN"
                if state == NO_ANSWER:
                    continue
                if state != job.state:
                    job.state = state
                    if state in ACTIVE_STATES:
                        self.say(f"{job.run.label}: job {job.job_id} {state}")
                if state not in ACTIVE_STATES:
                    ended.append((job, collect(job, state)))
            if ended:
                return ended
            if time.monotonic() - self.last_summary >= SUMMARY_EVERY_S:
                self.last_summary = time.monotonic()
                states = [job.state for job in jobs]
                counts = ", ".join(f"{states.count(s)} {s.lower()}" for s in dict.fromkeys(states))
                self.say(f"waiting for {len(jobs)} job(s): {counts} "
                         f"({duration(self.last_summary - self.started)} so far)")
            time.sleep(self.settings.poll_s)


def _job_file(run: PointRun) -> Path:
    return run.folder / f"repeat{run.repeat}.slurm"


def _job_name(run: PointRun) -> str:
    return f"hwbench-{run.folder.parent.name}-{run.point.name}"


def _written_by(result: RunResult, job: Job) -> bool:
    """The result is this job's: it names the job (environment.slurm), or, from a run that recorded no
    job, it started after the submission (both utc_now(); ISO text compares as time)."""
    recorded_job = result.environment.slurm.job_id if result.environment.slurm is not None else None
    return recorded_job == job.job_id if recorded_job else result.started_at >= job.submitted_at


def collect(job: Job, state: str) -> RunResult:
    """The ended job's result: what `hwbench run` wrote, else a record of its final state."""
    run = job.run
    found = keyed_results(run.folder).get(run.key)
    if found and _written_by(found[1], job):
        return found[1]
    log = run.folder / f"repeat{run.repeat}.log"
    tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else []
    last_line = next((line for line in reversed(tail) if line.strip()), "")
    status = STATUS_OF_STATE.get(state, "failed")
    message = f"Slurm job {job.job_id} ended {state} without a result" + (f": {last_line}" if last_line else "")
    if state == "UNKNOWN":
        message = f"Slurm no longer knows job {job.job_id} and it left no result"
    return recorded(run, status, message,
                    extra={"slurm_state": state, "slurm_job_id": job.job_id, "log_tail": "\n".join(tail) or None})
