"""The Slurm pieces that need no Slurm: SLURM_* read into ranks, the sbatch scripts,
the options of `hwbench slurm` and `hwbench sweep --executor slurm`. Against a real
local Slurm: tests/test_slurm_local.py (-m slurm)."""

from __future__ import annotations

import pytest

from hwbench.cli import main
from hwbench.errors import UsageError
from hwbench.harness.slurm import SlurmSettings, slurm_time
from hwbench.harness.slurm_env import SlurmTask, first_host, rendezvous_port, slurm_mode


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
    assert task.record()["partition"] == "h100" and task.record()["nodelist"] == "gpu[07-08]"


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
    assert "srun --kill-on-bad-exit=1 " in script and "run --model tiny" in script
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
