"""`hwbench sweep SUITE --executor slurm`: every point one Slurm job (docs/slurm.md).

Each point (and repeat) becomes a batch script ``OUT/<suite>/<point>/repeat<N>.sbatch``
that runs `srun hwbench run ...` on the point's nodes; it is submitted with
``sbatch --parsable`` and its job id kept in ``repeat<N>.slurm`` (JSON) beside it,
its output in ``repeat<N>.log``. The sweep then waits, asking ``scontrol show job``
(``sacct`` once the controller has forgotten the job) for each job's state. A point
whose job wrote a result has that result; a job that ended without one is recorded
with its final Slurm state (FAILED, TIMEOUT, OUT_OF_MEMORY, CANCELLED, NODE_FAIL,
...) as ``error.slurm_state`` and the nearest hwbench status.

Resuming: a point whose result exists is kept, a point whose job is pending or
running is re-attached (never submitted twice), a job that ended while nobody
watched is collected. Only the command-line tools are used (sbatch, squeue's
siblings scontrol and sacct, scancel), so nothing beyond Slurm's client is needed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from hwbench.device.kinds import KINDS
from hwbench.errors import SetupError, UsageError
from hwbench.harness.suite import Point, Suite
from hwbench.harness.sweep import (
    SWEEP_ENV,
    TIMEOUT_MARGIN_S,
    PointRecord,
    SweepInterrupted,
    SweepOptions,
    _duration,
    _point_dir,
    _recorded,
    aggregate,
    folder_lock,
    point_args,
    point_options,
)
from hwbench.point import resume_key as result_key
from hwbench.result.files import AGGREGATE_FILE, result_files
from hwbench.result.model import RunResult
from hwbench.result.store import load_result, utc_now, write_json_atomic, write_text_atomic
from hwbench.spec import RunSpec

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


def check_slurm_name(option: str, value: str, lists: bool = False) -> str:
    """A partition (``lists``: a comma-separated list of them) or an account name."""
    check_script_value(option, value)
    items = value.split(",") if lists else [value]
    if not value or any(not item or re.search(r"[\s,]", item) for item in items):
        raise UsageError(f"{option} {value!r} is not accepted; give a Slurm name without whitespace"
                         + (" (several: comma-separated, as gpu,debug)" if lists else " or commas"))
    return value


def check_time(value: str) -> str:
    """sbatch --time in one of Slurm's forms, longer than zero."""
    match = TIME_FORMAT.fullmatch(value)
    if match and match.group("lead") is not None:
        fields = [int(f) for f in (match.group("lead"), match.group("m"), match.group("s")) if f is not None]
        ok = all(f < 60 for f in fields[1:])
        seconds = fields[0] * 60 if len(fields) == 1 else sum(f * 60 ** (len(fields) - 1 - i) for i, f in enumerate(fields))
    elif match:
        days, hours, minutes, secs = (int(match.group(k) or 0) for k in ("d", "h", "dm", "ds"))
        ok = hours < 24 and minutes < 60 and secs < 60
        seconds = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    if not match or not ok or seconds <= 0:
        raise UsageError(f"--time {value!r} is not accepted; give Slurm's form, longer than zero: {TIME_FORMS} "
                         "(hours < 24 after D-, minutes and seconds < 60)")
    return value


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
        for arg in self.sbatch_args:
            check_sbatch_arg(arg)


def slurm_time(seconds: float) -> str:
    """Seconds as sbatch --time's D-HH:MM:SS, rounded up to the minute."""
    minutes = max(1, -(-int(seconds) // 60))
    return f"{minutes // 1440}-{minutes // 60 % 24:02d}:{minutes % 60:02d}:00"


def batch_script(spec: RunSpec, run_args: list[str], point_dir: Path | str, log: Path | str, settings: SlurmSettings,
                 env: dict[str, str] | None = None, sweep: dict[str, Any] | None = None,
                 job_name: str = "hwbench") -> str:
    """The sbatch script that runs `hwbench run RUN_ARGS` on the point's nodes: one
    task per device (each one rank), or one task per node that launches torchrun."""
    if spec.device not in KINDS:  # auto: the script could not ask Slurm for the devices, and a node
        # given none would quietly benchmark its CPU (as `hwbench k8s` refuses it too)
        raise UsageError(f"--device {spec.device} is not accepted for a Slurm job: the script asks Slurm for the "
                         f"devices by kind; give --device {' or '.join(KINDS)}")
    nodes, per_node = spec.launch.nnodes, spec.launch.nproc_per_node
    tasks_per_node = 1 if settings.launch == "torchrun" else per_node
    gres = KINDS[spec.device].slurm_gres
    # Every #SBATCH value is checked (no control character can start a line of its own)
    # and shell-quoted (sbatch reads #SBATCH lines with quotes, as a shell would).
    sbatch = {"job-name": check_script_value("--job-name", job_name), "nodes": int(nodes),
              "ntasks-per-node": int(tasks_per_node), "output": check_script_value("--log", str(log)),
              "time": check_time(settings.time) if settings.time
              else slurm_time(spec.launch.timeout_s + TIMEOUT_MARGIN_S)}
    if gres:
        sbatch["gres"] = f"{gres}:{int(per_node)}"
    if settings.partition:
        sbatch["partition"] = check_slurm_name("--partition", settings.partition, lists=True)
    if settings.account:
        sbatch["account"] = check_slurm_name("--account", settings.account)
    lines = ["#!/bin/bash"] + [f"#SBATCH --{name}={shlex.quote(str(value))}" for name, value in sbatch.items()]
    lines += [f"#SBATCH {shlex.quote(check_sbatch_arg(arg, bool(gres)))}" for arg in settings.sbatch_args]
    lines += ["", f"# written by hwbench: {nodes} node(s) x {per_node} device(s), "
              + ("one task per device, each one rank (ranks from SLURM_PROCID)" if tasks_per_node == per_node
                 else "one task per node, each launching torchrun with its ranks"),
              "# rendezvous: the job's first host, port 10000 + job id mod 50000 (hwbench/harness/slurm_env.py)"]
    if sweep is not None:
        lines.append(f"export {SWEEP_ENV}={shlex.quote(json.dumps(sweep, sort_keys=True))}")
    for key, value in (env or {}).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"env {key!r} is not accepted; give a variable name (letters, digits, _)")
        lines.append(f"export {key}={shlex.quote(value)}")
    quiet = ["--quiet"] if sweep is not None else []  # a sweep's log needs no progress lines
    command = [settings.python, "-m", "hwbench", "run", *quiet, *run_args, "--out", str(point_dir)]
    lines += ["", "srun --kill-on-bad-exit=1 " + shlex.join(command), ""]
    return "\n".join(lines)


def _slurm_tool(args: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=SLURM_TOOL_TIMEOUT_S)
    except FileNotFoundError:
        raise SetupError(f"{args[0]} not found: --executor slurm needs Slurm's client tools (sbatch, scontrol, "
                         "scancel) on PATH") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 1, "", f"{args[0]} did not answer in {SLURM_TOOL_TIMEOUT_S:g}s")


def submit(script: Path) -> tuple[str | None, str]:
    """(job id, '') or (None, sbatch's complaint)."""
    done = _slurm_tool(["sbatch", "--parsable", str(script)])
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or [f"sbatch exited with status {done.returncode}"])[-1]
    return done.stdout.strip().split(";")[0], ""


NO_ANSWER = "NO_ANSWER"  # job_state when the controller did not answer: ask again at the next poll


def job_state(job_id: str) -> str | None:
    """The job's state (PENDING, RUNNING, COMPLETED, ...) from the controller, or from
    accounting once the controller forgot it; None when neither knows the job."""
    done = _slurm_tool(["scontrol", "show", "job", "-o", job_id])
    match = re.search(r"\bJobState=(\S+)", done.stdout) if done.returncode == 0 else None
    if match:
        return match.group(1)
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        return NO_ANSWER  # a controller that did not answer has not forgotten the job: it may still run
    done = _slurm_tool(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
    words = done.stdout.split() if done.returncode == 0 else []
    return words[0].rstrip("+") if words else None


def cancel_jobs(jobs: list[str], out_dir: Path) -> None:
    """scancel the jobs and forget their records under ``out_dir``, so the same sweep
    command submits those points again."""
    if not jobs:
        return
    done = _slurm_tool(["scancel", *jobs])
    if done.returncode != 0:  # the jobs may still run: keep their records, so the sweep re-attaches
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise SetupError(f"scancel {' '.join(jobs)} failed ({reason}); the jobs are kept and the same command "
                         "re-attaches to them")
    for record in out_dir.rglob("repeat*.slurm"):
        if _read_job(record).get("job_id") in jobs:
            record.unlink(missing_ok=True)


def cluster_name() -> str:
    """The cluster's name (the key of a Slurm sweep's results, instead of this host's)."""
    done = _slurm_tool(["scontrol", "show", "config"])
    match = re.search(r"^ClusterName\s*=\s*(\S+)", done.stdout, re.M) if done.returncode == 0 else None
    if done.returncode != 0:
        raise SetupError(f"--executor slurm: Slurm's controller does not answer: "
                         f"{(done.stderr.strip().splitlines() or ['scontrol failed'])[-1]}")
    return match.group(1) if match else "unknown"


def _read_job(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@dataclasses.dataclass
class Job:
    """One submitted point (and repeat) the sweep is waiting for."""

    record: PointRecord
    index: int  # in record.results: where its result goes
    job_id: str
    point_dir: Path
    args: list[str]
    sweep: dict[str, Any]
    label: str
    state: str = "SUBMITTED"
    submitted_at: str = ""  # results that started before are an earlier job's (with --force)
    reattached: bool = False  # re-attached to a job an earlier sweep submitted


def _keyed_results(point_dir: Path) -> dict[str, tuple[Path, RunResult]]:
    found: dict[str, tuple[Path, RunResult]] = {}
    for path in result_files([point_dir]) if point_dir.is_dir() else []:
        try:
            result = load_result(path)
        except Exception:  # unreadable files are reported by `hwbench report`; here they only do not count
            continue
        key = (result.sweep or {}).get("key")
        if key:
            found[key] = (path, result)
    return found


def _machine() -> dict[str, Any]:
    import torch

    return {"slurm_cluster": cluster_name(), "torch": torch.__version__}


def run_slurm_sweep(suite: Suite, options: SweepOptions, settings: SlurmSettings,
                    say: Callable[[str], None] | None = None) -> list[PointRecord]:
    """Submit every point not yet done (or, collecting, none), then wait for the jobs
    (unless detached). Raises SweepInterrupted (with the jobs still out) on
    SIGINT/SIGTERM/SIGHUP: the jobs keep running, and the caller may cancel_jobs()."""
    say = say or (lambda _text: None)
    # Everything that can refuse the sweep is asked before the suite's folder and lock exist.
    check_script_value("--out", str(options.out_dir.resolve()))  # in every script's --output and srun line
    for point in suite.points:
        _point_dir(options, suite, point)
        check_script_value(f"suite {suite.name!r} point", _job_name(suite, point))
    check_slurm_tools(settings.collect)
    machine = _machine()  # asks the controller: refused here when none answers
    with folder_lock(options.out_dir / suite.name, options.wait):
        records: list[PointRecord] = []
        jobs: list[Job] = []
        try:
            _submit_points(suite, options, settings, machine, say, records, jobs)
        except KeyboardInterrupt:  # while submitting: the jobs already out keep running, or are cancelled
            raise SweepInterrupted(signal.SIGINT, [job.job_id for job in jobs]) from None
        if not settings.detach:
            _wait(jobs, settings, say)
        for record in records:
            record.results = [r for r in record.results if r is not None]
            record.aggregate = aggregate(record.point, record.results) if options.repeats > 1 else None
            if record.aggregate:
                write_json_atomic(_point_dir(options, suite, record.point) / AGGREGATE_FILE, record.aggregate)
        return records


def _submit_points(suite, options, settings, machine, say, records: list[PointRecord], jobs: list[Job]) -> None:
    """Fill ``records`` (one per point: kept results, or None where a job will bring one)
    and ``jobs`` (submitted or re-attached)."""
    from hwbench.catalog import load_catalog

    catalog = load_catalog()
    total = len(suite.points) * options.repeats
    done = 0
    for point in suite.points:
        point_dir = _point_dir(options, suite, point)
        record = PointRecord(point, [])
        records.append(record)
        existing = {} if options.force else _keyed_results(point_dir)
        for repeat in range(options.repeats):
            done += 1
            args, run_options = _point_run(point, options, settings, repeat)
            key = result_key(args, repeat, dict(point.env), machine)
            sweep = {"suite": suite.name, "suite_path": suite.path, "point": point.name, "repeat": repeat,
                     "repeats": options.repeats, "key": key}
            label = f"[{done}/{total}] {point.name}" + (f" repeat {repeat + 1}" if options.repeats > 1 else "")
            kept = existing.get(key)
            if kept and (settings.collect or (kept[1].error or {}).get("slurm_state") not in RESUBMIT_STATES):
                record.results.append(kept[1])
                record.reused += 1
                say(f"{label}: {kept[1].status} (kept from an earlier sweep; --force runs it again)")
                continue
            fresh = Job(record, len(record.results), "", point_dir, args, sweep, label, "PENDING")
            job = _earlier_job(fresh, has_result=kept is not None, force=options.force)
            if job is None:
                if kept:  # a cancelled or refused job's record: this submission replaces it
                    kept[0].unlink(missing_ok=True)
                if settings.collect:
                    say(f"{label}: not submitted (no job to collect)")
                    continue
                job = _submit_point(point, run_options, catalog, suite, settings, fresh)
            if isinstance(job, RunResult):
                record.results.append(job)
                say(f"{label}: {job.status} ({job.error['message']})")
                continue
            jobs.append(job)
            record.results.append(None)
            record.jobs.append(job.job_id)
            say(f"{label}: job {job.job_id} {job.state} (re-attached)" if job.reattached
                else f"{label}: submitted as job {job.job_id}")


def _earlier_job(job: Job, has_result: bool, force: bool) -> Job | None:
    """``job`` filled with the job an earlier sweep submitted for this point and repeat, when
    it is still out or ended without anyone collecting it (re-attached, never submitted
    twice); None otherwise, ``job`` untouched."""
    earlier = {} if force else _read_job(_job_file(job))
    if earlier.get("key") != job.sweep["key"] or not earlier.get("job_id"):
        return None
    state = job_state(earlier["job_id"])
    if not (state in ACTIVE_STATES or (state and not has_result)):
        return None
    job.job_id, job.state, job.submitted_at = earlier["job_id"], state, earlier.get("submitted_at", "")
    job.reattached = True
    return job


def _job_file(job: Job) -> Path:
    return job.point_dir / f"repeat{job.sweep['repeat']}.slurm"


def _point_run(point: Point, options: SweepOptions, settings: SlurmSettings, repeat: int) -> tuple[list[str], Any]:
    """The point's `hwbench run` arguments and options for this repeat (with
    --nodes-per-point for points that do not set --nnodes)."""
    args, run_options = point_args(point, options), point_options(point, options)
    if settings.nodes_per_point and point.option("nnodes") is None:
        args += ["--nnodes", str(settings.nodes_per_point)]
        run_options = run_options.merged(nnodes=settings.nodes_per_point)
    if options.repeats > 1:  # distinct seeds, as a local sweep
        seed = int(point.option("seed", 1234)) + repeat
        args += ["--seed", str(seed)]
        run_options = run_options.merged(seed=seed)
    return args, run_options


def _job_name(suite: Suite, point: Point) -> str:
    return f"hwbench-{suite.name}-{point.name}"


def _submit_point(point, run_options, catalog, suite, settings, job: Job) -> RunResult | Job:
    """The submitted job, or the result recorded for a point that could not be submitted."""
    from hwbench.spec import build_run_spec

    # Checked here as `hwbench run` will check it on the nodes: a bad layout is
    # recorded without a job. (The memory planner is not asked: this machine is
    # not the nodes'.) Under srun the launch comes from Slurm, so no master port.
    args, point_dir, sweep = job.args, job.point_dir, job.sweep
    launch = {"master_port": 29500} if run_options.given().get("nnodes", 1) > 1 else {}
    try:
        spec = build_run_spec(run_options.merged(out=str(point_dir), **launch), catalog)
    except UsageError as error:
        return _recorded("invalid", args, str(error), point_dir, sweep)
    point_dir.mkdir(parents=True, exist_ok=True)
    repeat = sweep["repeat"]
    script = point_dir / f"repeat{repeat}.sbatch"
    try:  # the point's device may bring a --gres an --sbatch-arg also sets: that point is invalid
        text = batch_script(spec, args, point_dir.resolve(), point_dir.resolve() / f"repeat{repeat}.log", settings,
                            dict(point.env), sweep, _job_name(suite, point))
    except UsageError as error:
        return _recorded("invalid", args, str(error), point_dir, sweep)
    write_text_atomic(script, text)
    job.submitted_at = utc_now()
    job_id, problem = submit(script)
    if job_id is None:
        return _recorded("invalid", args, f"sbatch refused the job: {problem}", point_dir, sweep,
                         extra={"slurm_state": SUBMIT_FAILED})
    job.job_id = job_id
    write_json_atomic(_job_file(job), {"job_id": job_id, "key": sweep["key"], "submitted_at": job.submitted_at,
                                       "script": script.name})
    return job


def _wait(jobs: list[Job], settings: SlurmSettings, say: Callable[[str], None]) -> None:
    """Poll until every job has ended, collecting each as it ends."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}

    def on_term(signal_number, _frame):
        raise SweepInterrupted(signal_number)

    for sig in previous:
        signal.signal(sig, on_term)
    waiting = list(jobs)
    started = last_summary = time.monotonic()
    try:
        while waiting:
            for job in list(waiting):
                state = job_state(job.job_id) or "UNKNOWN"
                if state == NO_ANSWER:
                    continue
                if state != job.state:
                    job.state = state
                    if state in ACTIVE_STATES:
                        say(f"{job.label}: job {job.job_id} {state}")
                if state not in ACTIVE_STATES:
                    result = collect(job, state)
                    job.record.results[job.index] = result
                    job.record.jobs.remove(job.job_id)
                    waiting.remove(job)
                    say(f"{job.label}: {result.status}" + (f" ({result.error['message']})" if result.error else ""))
            if waiting and time.monotonic() - last_summary >= SUMMARY_EVERY_S:
                last_summary = time.monotonic()
                states = [job.state for job in waiting]
                counts = ", ".join(f"{states.count(s)} {s.lower()}" for s in dict.fromkeys(states))
                say(f"waiting for {len(waiting)} job(s): {counts} ({_duration(last_summary - started)} so far)")
            if waiting:
                time.sleep(settings.poll_s)
    except KeyboardInterrupt:
        raise SweepInterrupted(signal.SIGINT, [job.job_id for job in waiting]) from None
    except SweepInterrupted as stop:
        raise SweepInterrupted(stop.signal_number, [job.job_id for job in waiting]) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _written_by(result: RunResult, job: Job) -> bool:
    """The result is this job's: it names the job (environment.slurm), or, from a run that recorded no
    job, it started after the submission (both utc_now(); ISO text compares as time)."""
    recorded = ((result.environment or {}).get("slurm") or {}).get("job_id")
    return recorded == job.job_id if recorded else result.started_at >= job.submitted_at


def collect(job: Job, state: str) -> RunResult:
    """The ended job's result: what `hwbench run` wrote, else a record of its final state."""
    found = _keyed_results(job.point_dir).get(job.sweep["key"])
    if found and _written_by(found[1], job):
        return found[1]
    log = job.point_dir / f"repeat{job.sweep['repeat']}.log"
    tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else []
    last_line = next((line for line in reversed(tail) if line.strip()), "")
    status = STATUS_OF_STATE.get(state, "failed")
    message = f"Slurm job {job.job_id} ended {state} without a result" + (f": {last_line}" if last_line else "")
    if state == "UNKNOWN":
        message = f"Slurm no longer knows job {job.job_id} and it left no result"
    return _recorded(status, job.args, message, job.point_dir, job.sweep,
                     extra={"slurm_state": state, "slurm_job_id": job.job_id, "log_tail": "\n".join(tail) or None})
