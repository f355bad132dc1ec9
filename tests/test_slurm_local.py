"""hwbench under a real Slurm: a single-node controller and node daemon on loopback,
started by tests/slurm/start_local_slurm.sh (docs/slurm.md). Marked `slurm`; they skip,
with the reason, without the slurm-wlm and munge packages or without root.

    python -m pytest -m slurm tests/test_slurm_local.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hwbench.paths import result_files
from hwbench.result.store import load_result

REPO = Path(__file__).resolve().parent.parent
START = REPO / "tests" / "slurm" / "start_local_slurm.sh"
TINY = ["--model", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1", "--seq-length", "32"]

pytestmark = pytest.mark.slurm


def _missing() -> str | None:
    tools = [
        t for t in ("slurmctld", "slurmd", "munged", "srun", "sbatch", "scontrol", "scancel") if not shutil.which(t)
    ]
    if tools:
        return f"{', '.join(tools)} not found: install the slurm-wlm and munge packages (docs/slurm.md)"
    if os.geteuid() != 0:
        return "the local Slurm needs root (slurmd starts jobs as their user)"
    return None


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    """The environment of a client of a fresh local Slurm (SLURM_CONF, PYTHONPATH)."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("slurm")
    started = subprocess.run([str(START), str(folder)], capture_output=True, text=True, timeout=120)
    if started.returncode != 0:  # the machine cannot host the daemons (a container without munge's
        # socket folder, a port taken...): not hwbench's fault; the script's own words say why
        subprocess.run([str(START), "--stop", str(folder)], timeout=60)
        pytest.skip(f"the local Slurm did not start: {started.stderr.strip()[-500:]}")
    env = {
        **os.environ,
        "SLURM_CONF": str(folder / "slurm.conf"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    daemons = [int((folder / f"{name}.pid").read_text()) for name in ("slurmctld", "slurmd", "munged")]
    try:
        yield env
    finally:
        subprocess.run([str(START), "--stop", str(folder)], timeout=60)
        left = [pid for pid in daemons if Path(f"/proc/{pid}").exists()]
        assert not left, f"daemons left running: {left}"


def _hwbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "hwbench", *args]


def test_srun_two_tasks_are_two_ranks(slurm_env, tmp_path):
    done = subprocess.run(
        ["srun", "--ntasks=2", "--kill-on-bad-exit=1", *_hwbench("run", *TINY, "--quiet", "--out", str(tmp_path))],
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [path] = result_files([tmp_path])
    result = load_result(path)
    assert result.status == "ok"
    assert result.metrics.world_size == 2 and len(result.ranks) == 2
    slurm = result.environment.slurm
    assert slurm.ntasks == 2 and slurm.partition == "debug" and slurm.cluster == "hwbench-local"
    assert slurm.nodelist == "localhost" and slurm.job_id.isdigit()
    assert result.launch.launcher == "srun" and result.launch.model_extra["master_addr"] == "localhost"


def test_one_task_per_node_launches_torchrun(slurm_env, tmp_path):
    """srun with one task and --nproc-per-node 2: the task is node 0 of a torchrun job."""
    done = subprocess.run(
        [
            "srun",
            "--ntasks=1",
            "--cpus-per-task=2",
            *_hwbench("run", *TINY, "--quiet", "--nproc-per-node", "2", "--out", str(tmp_path)),
        ],
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [path] = result_files([tmp_path])
    result = load_result(path)
    assert result.status == "ok" and result.metrics.world_size == 2
    assert result.launch.launcher == "torchrun"
    assert result.spec.launch.master_addr == "localhost"
    assert result.spec.launch.master_port == 10000 + int(result.environment.slurm.job_id) % 50000


def _suite(path: Path, points: list[dict]) -> Path:
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "name": path.stem,
                "defaults": {"model": "tiny", "steps": 2, "warmup": 1, "seq-length": 32, "timeout": 600},
                "points": points,
            }
        )
    )
    return path


def _job_state_after(job: str, env: dict, settled, seconds: float = 60) -> str:
    """The job's state as the controller reports it, polled until ``settled(state)``
    holds or ``seconds`` have passed (then the last state seen)."""
    deadline = time.monotonic() + seconds
    while True:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True)
        match = re.search(r"\bJobState=(\S+)", shown.stdout)
        state = match.group(1) if match else f"unknown ({shown.stdout.strip() or shown.stderr.strip()})"
        if settled(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def _wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


def test_sweep_of_three_jobs_one_failing_one_cancelled(slurm_env, tmp_path):
    suite = _suite(
        tmp_path / "trio.yaml",
        [
            {"name": "good"},
            {"name": "crash", "env": {"HWBENCH_FAULT": "0:2:raise"}},
            {"name": "cancelled", "env": {"HWBENCH_FAULT": "0:1:hang"}},
        ],
    )
    out = tmp_path / "out"
    sweep = subprocess.Popen(
        _hwbench("sweep", str(suite), "--executor", "slurm", "--device", "cpu", "--out", str(out), "--poll", "0.5"),
        env=slurm_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        job_file = out / "trio" / "cancelled" / "repeat0.slurm"
        _wait_for(job_file, 120)
        subprocess.run(["scancel", json.loads(job_file.read_text())["job_id"]], env=slurm_env, check=True)
        stdout, stderr = sweep.communicate(timeout=300)
    finally:
        sweep.kill()
    assert sweep.returncode == 1, stderr
    results = {name: load_result(p) for p in result_files([out]) for name in [p.parent.name]}
    assert results["good"].status == "ok"
    assert (
        results["good"].environment.slurm.job_id
        == json.loads((out / "trio" / "good" / "repeat0.slurm").read_text())["job_id"]
    )
    assert results["crash"].status == "failed" and results["crash"].error.type == "InjectedFault"
    cancelled = results["cancelled"]
    assert cancelled.status == "failed" and cancelled.error.slurm_state == "CANCELLED"
    assert "CANCELLED" in stdout  # the summary names the state
    for name in ("good", "crash"):  # the cancelled job may never have started, so may have no log
        assert "hwbench run" in (out / "trio" / name / "repeat0.sbatch").read_text()
        assert (out / "trio" / name / "repeat0.log").exists()


def test_multi_rank_points_keep_the_result_their_ranks_wrote(slurm_env, tmp_path):
    """DP2, TP2 and PP2 on 2 CPU ranks, each point a job of 2 srun tasks: rank 0's result
    carries the sweep's key, so the sweep takes it as the point's result."""
    suite = _suite(
        tmp_path / "ranks.yaml",
        [
            {"name": "dp2", "nproc-per-node": 2},
            {"name": "tp2", "nproc-per-node": 2, "tp": 2},
            {"name": "pp2", "nproc-per-node": 2, "pp": 2},
        ],
    )
    out = tmp_path / "out"
    done = subprocess.run(
        _hwbench("sweep", str(suite), "--executor", "slurm", "--device", "cpu", "--out", str(out), "--poll", "0.5"),
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    for name, layout in (("dp2", [1, 1, 2]), ("tp2", [2, 1, 1]), ("pp2", [1, 2, 1])):
        job = json.loads((out / "ranks" / name / "repeat0.slurm").read_text())
        [path] = result_files([out / "ranks" / name])
        result = load_result(path)
        assert result.status == "ok" and result.metrics.world_size == 2, (name, result.error)
        assert [getattr(result.spec.parallel, d) for d in ("tp", "pp", "dp")] == layout
        assert result.launch.launcher == "srun" and result.environment.slurm.job_id == job["job_id"]
        assert result.sweep.point == name and result.sweep.key == job["key"]


def test_detached_sweep_is_collected_then_kept(slurm_env, tmp_path):
    suite = _suite(tmp_path / "solo.yaml", [{"name": "one"}])
    base = _hwbench(
        "sweep", str(suite), "--executor", "slurm", "--device", "cpu", "--out", str(tmp_path / "out"), "--poll", "0.5"
    )
    detached = subprocess.run([*base, "--detach"], env=slurm_env, capture_output=True, text=True, timeout=120)
    assert detached.returncode == 0, detached.stderr
    assert "1 job(s) out" in detached.stdout
    job = json.loads((tmp_path / "out" / "solo" / "one" / "repeat0.slurm").read_text())["job_id"]
    again = subprocess.run(base, env=slurm_env, capture_output=True, text=True, timeout=300)  # re-attaches
    assert again.returncode == 0, again.stderr
    assert f"job {job}" in again.stderr and "re-attached" in again.stderr and "submitted" not in again.stderr
    collected = subprocess.run([*base, "--collect"], env=slurm_env, capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0 and "kept from an earlier sweep" in collected.stderr
    [path] = result_files([tmp_path / "out"])
    assert load_result(path).environment.slurm.job_id == job


def test_a_refused_submission_is_recorded_then_submitted_again(slurm_env, tmp_path):
    suite = _suite(tmp_path / "typo.yaml", [{"name": "one"}])
    base = _hwbench(
        "sweep", str(suite), "--executor", "slurm", "--device", "cpu", "--out", str(tmp_path / "out"), "--poll", "0.5"
    )
    refused = subprocess.run(
        [*base, "--partition", "nosuch"], env=slurm_env, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1
    [path] = result_files([tmp_path / "out"])
    record = load_result(path)
    assert record.status == "invalid" and record.error.slurm_state == "SUBMIT_FAILED"
    assert "sbatch refused the job" in record.error.message
    fixed = subprocess.run(base, env=slurm_env, capture_output=True, text=True, timeout=300)
    assert fixed.returncode == 0, fixed.stderr
    assert [load_result(p).status for p in result_files([tmp_path / "out"])] == ["ok"]  # the record replaced


def test_ctrl_c_without_a_terminal_leaves_the_jobs_running(slurm_env, tmp_path):
    from conftest import sigint_as_usual

    suite = _suite(tmp_path / "stuck.yaml", [{"name": "hang", "env": {"HWBENCH_FAULT": "0:1:hang"}}])
    out = tmp_path / "out"
    sweep = subprocess.Popen(
        _hwbench("sweep", str(suite), "--executor", "slurm", "--device", "cpu", "--out", str(out), "--poll", "0.5"),
        env=slurm_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_usual,
    )
    job_file = out / "stuck" / "hang" / "repeat0.slurm"
    try:
        _wait_for(job_file, 120)
        time.sleep(1)
        sweep.send_signal(2)
        _, stderr = sweep.communicate(timeout=60)
    finally:
        sweep.kill()
    job = json.loads(job_file.read_text())["job_id"]
    try:
        assert sweep.returncode == 130, stderr
        assert f"jobs {job} keep running" in stderr
        state = subprocess.run(["scontrol", "show", "job", "-o", job], env=slurm_env, capture_output=True, text=True)
        assert "JobState=PENDING" in state.stdout or "JobState=RUNNING" in state.stdout
        assert result_files([out]) == []  # nothing written for a job still out
    finally:
        subprocess.run(["scancel", job], env=slurm_env)


def test_ctrl_c_at_a_terminal_asks_and_cancels(slurm_env, tmp_path):
    import os
    import pty

    from conftest import sigint_as_usual

    suite = _suite(tmp_path / "asked.yaml", [{"name": "hang", "env": {"HWBENCH_FAULT": "0:1:hang"}}])
    out = tmp_path / "out"
    controller, terminal = pty.openpty()
    sweep = subprocess.Popen(
        _hwbench("sweep", str(suite), "--executor", "slurm", "--device", "cpu", "--out", str(out), "--poll", "0.5"),
        env=slurm_env,
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_usual,
    )
    os.close(terminal)
    job_file = out / "asked" / "hang" / "repeat0.slurm"
    try:
        _wait_for(job_file, 120)
        job = json.loads(job_file.read_text())["job_id"]
        time.sleep(1)
        sweep.send_signal(2)
        os.write(controller, b"y\n")
        _, stderr = sweep.communicate(timeout=60)
    finally:
        sweep.kill()
        os.close(controller)
        subprocess.run(
            ["scancel", json.loads(job_file.read_text())["job_id"]] if job_file.exists() else ["true"], env=slurm_env
        )
    assert sweep.returncode == 130, stderr
    assert f"cancelled jobs {job}" in stderr
    assert not job_file.exists()  # forgotten: the same command submits the point again
    # scancel returns once the controller has the request; the job shows COMPLETING until its
    # node daemon has ended the job's processes, then CANCELLED.
    final = _job_state_after(job, slurm_env, lambda state: state not in ("PENDING", "RUNNING", "COMPLETING"))
    assert final == "CANCELLED"


def test_the_python_api_runs_a_sweep_on_slurm(slurm_env, tmp_path, monkeypatch):
    import hwbench
    from hwbench.suites.slurm import SlurmSettings

    for key in ("SLURM_CONF", "PYTHONPATH"):
        monkeypatch.setenv(key, slurm_env[key])
    suite = _suite(tmp_path / "api.yaml", [{"name": "one"}])
    [record] = hwbench.sweep(suite, out=tmp_path / "out", device="cpu", slurm=SlurmSettings(poll_s=0.5))
    [result] = record.results
    assert result.status == "ok" and result.environment.slurm.partition == "debug"


def _accept(suite: Path, out: Path, *extra: str) -> list[str]:
    csv = suite.parent / "baseline.csv"  # an empty device_model cell matches any device
    csv.write_text("model,device_model,tokens_per_s\ntiny,,1\n")
    device = [] if "--device" in extra else ["--device", "cpu"]
    return _hwbench("accept", "--suite", str(suite), "--baseline", str(csv), "--out", str(out), "--executor", "slurm",
                    "--poll", "0.5", "--probe-time", "0.2", *device, *extra)


def test_accept_probes_each_node_by_a_job_and_names_its_slow_device(slurm_env, tmp_path):
    """The node's devices probed by a job on that node (sbatch --nodelist); device 1 half as fast in each
    measurement, its training point included (HWBENCH_FAULT's slow kind), is named: FAIL, exit 3."""
    suite = _suite(tmp_path / "acc.yaml", [{"name": "dp2", "nproc-per-node": 2}])
    out = tmp_path / "out"
    done = subprocess.run(_accept(suite, out, "--devices-per-node", "2"), capture_output=True, text=True, timeout=600,
                          env={**slurm_env, "HWBENCH_FAULT": "1:3:slow"}, cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    assert "probing the devices of node localhost: job" in done.stderr
    probes = [json.loads(line) for line in (out / "probes.jsonl").read_text().splitlines()]
    assert [(p["node"], p["index"], p["error"]) for p in probes] == [("localhost", 0, None), ("localhost", 1, None)]
    assert all(p["training_tokens_per_s"]["n"] == p["training_point"]["steps"] for p in probes)
    script = (out / "probes" / "localhost.sbatch").read_text()
    assert "#SBATCH --nodelist=localhost" in script and "-m hwbench.acceptance.node_probes cpu" in script
    verdict = (out / "accept.md").read_text().split("## Devices")[0]
    named = [line for line in verdict.splitlines() if line.startswith("- device")]
    assert any(line.startswith("- device 1 of localhost") and ": training " in line for line in named), verdict
    assert not any(line.startswith("- device 0 of") for line in named), verdict
    assert "device 1 of localhost" in done.stdout
    [path] = result_files([out / "acc"])
    assert load_result(path).status == "ok"  # the suite's point ran as its own job after the probes


def test_accept_names_a_node_whose_probe_job_failed_with_its_cause(slurm_env, tmp_path):
    """--device cuda on a node without one: its probe job fails on the node; a FAIL naming the node and the
    cause from the job's log, not a crash; the suite's point is judged as well."""
    suite = _suite(tmp_path / "acc.yaml", [{"name": "one"}])
    out = tmp_path / "out"
    done = subprocess.run(_accept(suite, out, "--device", "cuda"), capture_output=True, text=True,
                          timeout=300, env=slurm_env, cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    [record] = [json.loads(line) for line in (out / "probes.jsonl").read_text().splitlines()]
    assert record["node"] == "localhost" and record["index"] is None
    assert re.match(r"probe job \d+ ended FAILED \(its log: .*cuda", record["error"]), record["error"]
    assert "node localhost: its probe failed: probe job" in done.stdout
    assert "point one:" in done.stdout  # the point's own failure beside it
    refused = subprocess.run(_accept(suite, tmp_path / "out2", "--partition", "nosuch"), capture_output=True,
                             text=True, timeout=120, env=slurm_env, cwd=tmp_path)
    assert refused.returncode == 2 and "--partition 'nosuch' is not accepted: sinfo lists no node" in refused.stderr
    assert not (tmp_path / "out2").exists()
    # more devices than the node has CPUs (each probe one thread): refused before any job is submitted
    too_many = subprocess.run(_accept(suite, tmp_path / "out3", "--devices-per-node", "100000"), capture_output=True,
                              text=True, timeout=120, env=slurm_env, cwd=tmp_path)
    assert too_many.returncode == 2 and too_many.stderr.count("\n") == 1, too_many.stderr
    assert "--devices-per-node 100000 is not accepted: Slurm reports" in too_many.stderr
    assert "CPUs on node localhost; give 1 to" in too_many.stderr and not (tmp_path / "out3").exists()
