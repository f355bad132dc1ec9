"""The Slurm pieces that need no Slurm: SLURM_* read into ranks, the sbatch scripts,
the options of `hwbench slurm` and `hwbench sweep --executor slurm`. Against a real
local Slurm: tests/test_slurm_local.py (-m slurm)."""

from __future__ import annotations

import shlex

import pytest

from hwbench.cli import main
from hwbench.errors import UsageError
from hwbench.harness.slurm_env import SlurmTask, first_host, rendezvous_port, slurm_mode
from hwbench.options import RunOptions
from hwbench.suites.slurm import SlurmSettings, slurm_time


@pytest.mark.parametrize("nodelist, host", [
    ("localhost", "localhost"), ("gpu[003-010,017]", "gpu003"), ("a1,b2", "a1"),
    ("node[7,9],login[1-2]", "node7"), ("rack[2-3]-n[01-04]", "rack2-n01"), ("", ""),
])
def test_first_host_of_a_slurm_host_list(nodelist, host):
    assert first_host(nodelist) == host


def _step(**changes) -> dict[str, str]:
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8",
           "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]",
           "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_PARTITION": "h100", "SLURM_CLUSTER_NAME": "big"}
    return {**env, **changes}


def test_each_task_becomes_one_rank_with_torchruns_variables():
    task = SlurmTask.from_environ(_step())
    env = task.torchrun_environment({})
    assert env == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                   "MASTER_ADDR": "gpu07", "MASTER_PORT": str(10000 + 4242), "TORCHELASTIC_RUN_ID": "slurm-4242.0"}
    assert task.torchrun_environment({"MASTER_ADDR": "ib-gpu07", "MASTER_PORT": "29400"})["MASTER_PORT"] == "29400"
    assert slurm_mode(task, {}) == "task"
    assert slurm_mode(task, {"nproc_per_node": 4, "nnodes": 2}) == "task"  # as the sweep's scripts pass them
    assert task.record().partition == "h100" and task.record().nodelist == "gpu[07-08]"


def test_a_rank_of_srun_describes_the_whole_job(monkeypatch):
    """Each task one rank over 2 nodes: the run's spec has srun's nodes, tasks per node and
    rendezvous, not one node holding the whole world."""
    from hwbench.catalog import load_catalog
    from hwbench.harness.run import _under_slurm
    from hwbench.options import RunOptions
    from hwbench.spec import build_run_spec

    for key, value in _step().items():
        monkeypatch.setenv(key, value)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID"):
        monkeypatch.setenv(key, "")  # recorded, so what _under_slurm sets is undone after the test
        monkeypatch.delenv(key)
    options, rank_env = _under_slurm(RunOptions(model="tiny", device="cpu"))
    launch = build_run_spec(options, load_catalog(), torchrun_world_size=rank_env.world_size).launch
    assert (launch.nnodes, launch.nproc_per_node, launch.node_rank) == (2, 4, 1)
    assert (launch.master_addr, launch.master_port) == ("gpu07", 14242)
    uneven = SlurmTask.from_environ(_step(SLURM_NTASKS="3", SLURM_TASKS_PER_NODE="2,1"))
    assert uneven.rank_launch_options({}) == {"master_addr": "gpu07", "master_port": 14242}


def test_rendezvous_port_stays_a_port():
    assert 10000 <= rendezvous_port("99999999") < 60000 and rendezvous_port("12_3") == rendezvous_port("123")


def test_one_task_per_node_launches_torchrun_on_each():
    task = SlurmTask.from_environ(_step(SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="1(x2)", SLURM_PROCID="1"))
    assert slurm_mode(task, {"nproc_per_node": 8}) == "node"
    assert task.node_launch_options({}) == {"nnodes": 2, "node_rank": 1, "master_addr": "gpu07",
                                            "master_port": 14242}


@pytest.mark.parametrize("launch, refused", [
    ({"nproc_per_node": 2}, "--nproc-per-node 2 does not match srun's 4 tasks"),
    ({"master_addr": "x"}, "--master-addr is set by Slurm"),
    ({"nnodes": 3}, "--nnodes is set by Slurm"),
])
def test_launch_options_that_contradict_slurm_are_refused(launch, refused):
    with pytest.raises(UsageError, match=refused):
        slurm_mode(SlurmTask.from_environ(_step()), launch)


def test_outside_srun_nothing_changes():
    assert SlurmTask.from_environ({}) is None and slurm_mode(None, {}) is None
    batch = SlurmTask.from_environ({k: v for k, v in _step().items() if k != "SLURM_STEP_ID"})
    assert batch.step_id is None and slurm_mode(batch, {}) is None  # the batch script itself: a plain run
    single = SlurmTask.from_environ(_step(SLURM_NTASKS="1", SLURM_TASKS_PER_NODE="1", SLURM_PROCID="0"))
    assert slurm_mode(single, {}) is None


def test_slurm_times():
    assert slurm_time(1800 + 120) == "0-00:32:00" and slurm_time(1) == "0-00:01:00"
    assert slurm_time(2 * 86400 + 61) == "2-00:02:00"
    for good in ("30", "1:00:00", "2-00", "1-12:00:00"):
        SlurmSettings(time=good)
    with pytest.raises(UsageError, match="--time '1h'"):
        SlurmSettings(time="1h")


def test_hwbench_slurm_prints_the_script_run_would_use(capsys):
    assert main(["slurm", "--model", "tiny", "--device", "cuda", "--nnodes", "4", "--nproc-per-node", "8",
                 "--partition", "gpu", "--account", "proj1", "--time", "01:00:00",
                 "--sbatch-arg=--exclusive"]) == 0
    script = capsys.readouterr().out
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8", "#SBATCH --gres=gpu:8",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj1", "#SBATCH --time=01:00:00",
                 "#SBATCH --exclusive"):
        assert line + "\n" in script
    assert "srun --kill-on-bad-exit=1 " in script and "run --device cuda --model tiny --nproc-per-node 8" in script
    assert "--master-port" not in script.split("srun", 1)[1]  # the nodes take the port from the job id


def test_hwbench_slurm_one_torchrun_per_node(capsys):
    assert main(["slurm", "--model", "tiny", "--device", "cpu", "--nnodes", "2", "--nproc-per-node", "4",
                 "--launch", "torchrun"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --ntasks-per-node=1\n" in script and "--gres" not in script


@pytest.mark.parametrize("argv, message", [
    (["slurm", "--model", "tiny", "--node-rank", "1"], "--node-rank is not accepted by `hwbench slurm`"),
    (["slurm", "--model", "tiny", "--time", "soon"], "--time 'soon' is not accepted"),
    (["slurm", "--model", "tiny", "--tp", "3"], "--tp 3"),
    (["slurm", "--model", "tiny", "--sbatch-arg", "exclusive"], "--sbatch-arg 'exclusive' is not accepted"),
    (["sweep", "smoke", "--partition", "gpu"], "--partition is accepted only with --executor slurm"),
    (["sweep", "smoke", "--executor", "slurm", "--nodes-per-point", "two"], "--nodes-per-point 'two'"),
    (["sweep", "smoke", "--executor", "slurm", "--detach", "--collect"], "--detach and --collect"),
])
def test_bad_slurm_options_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_slurm_only_options_are_refused_for_a_local_sweep(capsys):
    for flag in (["--poll", "1"], ["--launch", "torchrun"], ["--nodes-per-point", "2"]):
        assert main(["sweep", "smoke", *flag]) == 2
        assert f"{flag[0]} is accepted only with --executor slurm" in capsys.readouterr().err


# Input an attack tester found getting through (each refused as one line, exit 2, nothing written).
def _suite(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ndefaults: {model: tiny, device: cpu, steps: 2}\npoints:\n  - {name: one}\n")
    return str(path)


def _one_line_refusal(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("flag", ["--partition", "--account", "--job-name", "--log"])
@pytest.mark.parametrize("bad", ["debug\ntouch /tmp/x", "a\recho", "a\x00b", "a\tb", "a\x1bb", "a\u2028b"])
def test_control_characters_never_reach_the_script(flag, bad, capsys):
    _one_line_refusal(["slurm", "--model", "tiny", "--device", "cpu", f"{flag}={bad}"],
                      f"{flag} {bad!r} is not accepted", capsys)
    assert capsys.readouterr().out == ""


def test_sweep_refuses_a_newline_in_partition_before_writing(tmp_path, capsys):
    out = tmp_path / "X"
    _one_line_refusal(["sweep", _suite(tmp_path), "--executor", "slurm", "--partition=debug\ntouch /tmp/x",
                       "--detach", "--out", str(out)], "--partition 'debug\\ntouch /tmp/x' is not accepted", capsys)
    assert not out.exists()


@pytest.mark.parametrize("flag, bad, message", [
    ("--partition", "a b", "without whitespace"), ("--partition", "a,,b", "comma-separated"),
    ("--account", "a,b", "without whitespace or commas"), ("--account", "", "is not accepted"),
    # slurmctld refuses a job name or partition of more than 1,024 bytes; sacctmgr keeps no quote in an account
    ("--partition", "p" * 1025, "Slurm refuses more than 1024 bytes (1025 given)"),
    ("--job-name", "j" * 1025, "Slurm refuses more than 1024 bytes (1025 given)"),
    ("--account", "o'neil", "Slurm's accounts hold no quote characters"),
])
def test_slurm_names_are_shaped_as_slurm_accepts(flag, bad, message, capsys):
    _one_line_refusal(["slurm", "--model", "tiny", "--device", "cpu", f"{flag}={bad}"], message, capsys)


def test_a_partition_slurm_could_hold_is_written_quoted_not_refused(capsys):
    """slurm.conf takes any text but whitespace as a partition name (';' included): the script
    quotes it, and a partition the site lacks is sbatch's refusal, recorded per point."""
    assert main(["slurm", "--model", "tiny", "--device", "cpu", "--partition=a;b"]) == 0
    assert "#SBATCH --partition='a;b'\n" in capsys.readouterr().out


def test_every_script_value_is_checked_or_quoted(capsys):
    assert main(["slurm", "--model", "tiny", "--device", "cpu", "--job-name=a b $(id)", "--log=/tmp/x y/%j.log",
                 "--partition=gpu,debug", "--sbatch-arg=--comment=a #b"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --job-name='a b $(id)'\n" in script and "#SBATCH --output='/tmp/x y/%j.log'\n" in script
    assert "#SBATCH --partition=gpu,debug\n" in script and "#SBATCH '--comment=a #b'\n" in script
    with pytest.raises(UsageError, match="env 'A;B'"):
        from hwbench.commands.run import parse_run_spec
        from hwbench.suites.slurm import batch_script

        batch_script(parse_run_spec(["--model", "tiny", "--device", "cpu"], check_paths=False), RunOptions(), "o", "l",
                     SlurmSettings(), env={"A;B": "1"})


def test_an_error_naming_a_newline_stays_one_line(capsys):
    _one_line_refusal(["slurm", "--model", "tiny", "--run-id=a\nb"], "--run-id=a\\nb", capsys)


@pytest.mark.parametrize("poll", ["nan", "inf", "-inf", "0", "-1", "3601"])
def test_poll_must_be_finite_seconds_in_range(poll, tmp_path, capsys):
    out = tmp_path / "X"
    _one_line_refusal(["sweep", _suite(tmp_path), "--executor", "slurm", "--poll", poll, "--out", str(out)],
                      "--poll", capsys)
    assert not out.exists()
    SlurmSettings(poll_s=0.5) and SlurmSettings(poll_s=3600)


def _fake_tools(tmp_path, scontrol_exit: int):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "scontrol"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho '{tool}: fatal: no controller' >&2\nexit {scontrol_exit}\n")
        (bin_dir / tool).chmod(0o755)
    return str(bin_dir)


@pytest.mark.parametrize("collect", [[], ["--collect"]])
@pytest.mark.parametrize("tools", ["none", "no controller"])
def test_a_refused_slurm_sweep_leaves_no_folder_and_no_lock(tools, collect, tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty) if tools == "none" else _fake_tools(tmp_path, 1))
    out = tmp_path / "X"
    message = "scontrol not found" if tools == "none" else "controller does not answer"
    _one_line_refusal(["sweep", _suite(tmp_path), "--executor", "slurm", "--out", str(out), *collect], message,
                      capsys)
    assert not out.exists()


@pytest.mark.parametrize("bad", ["0", "0:0", "00:00:00", "0-0", "99:99", "1:60:00", "1-25:00:00", "1-23:60",
                                 "1-0:0:60", "1h", "-5", "1-", ":30", "1:2:3:4", "1\n", "\u0661"])
def test_time_in_slurms_forms_and_longer_than_zero(bad, capsys):
    err = _one_line_refusal(["slurm", "--model", "tiny", "--device", "cpu", "--time", bad], f"--time {bad!r}",
                            capsys)
    assert "D-HH:MM:SS" in err and "MM:SS" in err
    for good in ("1", "90", "0:30", "59:59", "48:00:00", "1-0", "0-1", "1-23:59", "6-23:59:59"):
        SlurmSettings(time=good)


@pytest.mark.parametrize("arg, instead", [
    ("--nodes=5", "--nnodes"), ("--nodes 5", "--nnodes"), ("-N5", "--nnodes"), ("-N", "--nnodes"),
    ("--ntasks-per-node=2", "--nproc-per-node"), ("--output=x.log", "--log"), ("-ox", "--log"),
    ("--time=10", "--time"), ("-t10", "--time"), ("--partition=a", "--partition"), ("-pa", "--partition"),
    ("--account=a", "--account"), ("-Aa", "--account"), ("--job-name=x", "--job-name"), ("-Jx", "--job-name"),
    ("--gres=gpu:2", "--device"),
])
def test_sbatch_arg_may_not_set_what_hwbench_writes(arg, instead, capsys):
    err = _one_line_refusal(["slurm", "--model", "tiny", "--device", "cuda", f"--sbatch-arg={arg}"],
                            f"--sbatch-arg {arg!r} is not accepted", capsys)
    assert f"give {instead}" in err
    for other in ("--exclusive", "--ntasks=4", "--nodelist=a", "--time-min=5", "-n4", "--gres-flags=enforce-binding",
                  "--qos=high", "--output-x", "--gres=npu:8"):
        SlurmSettings(sbatch_args=(other,))
    assert main(["slurm", "--model", "tiny", "--device", "cpu", "--sbatch-arg=--gres=npu:8"]) == 0  # no gres of its own
    assert "#SBATCH --gres=npu:8\n" in capsys.readouterr().out


def test_sweep_refuses_an_out_folder_that_would_break_the_scripts(tmp_path, capsys):
    out = tmp_path / "X\ntouch y"
    _one_line_refusal(["sweep", _suite(tmp_path), "--executor", "slurm", "--out", str(out)], "--out ", capsys)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_a_controller_that_does_not_answer_is_asked_again_not_taken_for_an_end(monkeypatch):
    """scontrol timing out must not make a running job look ended (and be recorded failed)."""
    import subprocess

    from hwbench.suites import slurm

    answers = {"scontrol": subprocess.CompletedProcess([], 1, "", "scontrol did not answer in 30s")}
    monkeypatch.setattr(slurm, "slurm_tool", lambda args: answers[args[0]])
    assert slurm.job_state("42") == slurm.NO_ANSWER
    answers["scontrol"] = subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Invalid job id specified")
    answers["sacct"] = subprocess.CompletedProcess([], 0, "TIMEOUT\n", "")
    assert slurm.job_state("42") == "TIMEOUT"


def test_a_result_is_the_jobs_when_it_names_the_job(tmp_path):
    from hwbench.result.model import RunResult
    from hwbench.suites.slurm import _written_by

    job = type("J", (), {"job_id": "7", "submitted_at": "2026-11-23T10:00:00+00:00"})()
    early_clock = RunResult(run_id="r", status="ok", spec={}, started_at="2026-11-23T09:59:59+00:00",
                            environment={"slurm": {"job_id": "7"}})
    other_job = RunResult(
        run_id="r", status="ok", spec={}, started_at="2026-11-23T10:05:00+00:00", environment={"slurm": {"job_id": "6"}}
    )
    assert _written_by(early_clock, job) and not _written_by(other_job, job)


def test_a_slurm_script_needs_a_device_kind(capsys):
    _one_line_refusal(
        ["slurm", "--model", "tiny", "--device", "auto"], "--device auto is not accepted for a Slurm job", capsys
    )


def test_a_failed_scancel_keeps_the_job_records(tmp_path, monkeypatch):
    import subprocess

    from hwbench.errors import SetupError
    from hwbench.suites import slurm

    record = tmp_path / "p" / "repeat0.slurm"
    record.parent.mkdir()
    record.write_text('{"job_id": "9"}')
    monkeypatch.setattr(slurm, "slurm_tool", lambda args: subprocess.CompletedProcess(args, 1, "", "scancel: error"))
    with pytest.raises(SetupError, match="scancel 9 failed"):
        slurm.cancel_jobs(["9"], tmp_path)
    assert record.exists()


@pytest.mark.parametrize("device", [[], ["--device", "auto"]])
def test_a_slurm_sweep_needs_a_device_kind_before_anything_is_written(device, tmp_path, capsys):
    """Not one `invalid` record per point: the whole sweep is refused at once, before Slurm is asked."""
    out = tmp_path / "X"
    _one_line_refusal(
        ["sweep", "smoke", "--executor", "slurm", "--out", str(out), *device],
        "--device auto is not accepted for --executor slurm (point one-rank)",
        capsys,
    )
    assert not out.exists()


def test_every_path_in_the_script_is_absolute(tmp_path, monkeypatch, capsys):
    """A job starts in the folder sbatch ran in (or --chdir's): a relative --out, --data, --save,
    --load or --log in the script would land elsewhere. They are resolved from where `hwbench slurm` ran."""
    monkeypatch.chdir(tmp_path)
    assert main(["slurm", "--model", "tiny", "--device", "cpu", "--out", "res", "--data", "corpus/text",
                 "--save", "ck", "--load", "old/ck", "--log", "logs/%j.log", "--steps", "3"]) == 0
    script = capsys.readouterr().out
    assert f"#SBATCH --output={tmp_path}/logs/%j.log\n" in script
    srun = shlex.split(script.split("srun ", 1)[1])
    for flag, path in (("--out", "res"), ("--data", "corpus/text"), ("--save", "ck"), ("--load", "old/ck")):
        assert srun[srun.index(flag) + 1] == str(tmp_path / path)
    assert main(["slurm", "--model", "tiny", "--device", "cpu", "--data", "synthetic"]) == 0
    srun = shlex.split(capsys.readouterr().out.split("srun ", 1)[1])
    assert srun[srun.index("--data") + 1] == "synthetic"  # a keyword, not a path


@pytest.mark.parametrize("flag", ["--out", "--data", "--save", "--load", "--log"])
def test_a_blank_path_is_refused_not_made_the_current_folder(flag, tmp_path, monkeypatch, capsys):
    """Made absolute, an empty path would name the folder `hwbench slurm` ran in (a result folder
    or a log file there by accident): refused in one line instead."""
    monkeypatch.chdir(tmp_path)
    err = _one_line_refusal(["slurm", "--model", "tiny", "--device", "cpu", f"{flag}= "], f"{flag} ' ' is not accepted",
                            capsys)
    assert "give a" in err and list(tmp_path.iterdir()) == []
