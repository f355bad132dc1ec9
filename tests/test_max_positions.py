"""--max-positions: the length of the learned position embedding, so that a GPT-2 size
(1,024 positions in the catalog) runs at seq 2048, as the speed-1.3b suite's points need. The
override must reach every place that builds, counts or plans the model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hwbench.catalog import load_catalog
from hwbench.cli import main
from hwbench.commands.run import parse_run_spec
from hwbench.errors import UsageError
from hwbench.harness.describe import describe_workload
from hwbench.options import RunOptions
from hwbench.planner import plan_memory
from hwbench.workload import count_parameters, model_flops_per_iteration

CATALOG = load_catalog()
H_13B = CATALOG.workloads["1.3b"].model.hidden_size  # 2048


def spec_of(*argv):
    return parse_run_spec(["--data", "synthetic", *argv], check_paths=False)


def test_a_gpt2_size_runs_at_seq_2048_only_with_the_override():
    with pytest.raises(UsageError) as refused:
        spec_of("--model", "1.3b", "--seq-length", "2048")
    message = str(refused.value)
    assert "--seq-length 2048" in message and "1024 positions" in message and "--max-positions 2048" in message
    spec = spec_of("--model", "1.3b", "--seq-length", "2048", "--max-positions", "2048")
    assert spec.seq_length == 2048 and spec.max_positions == 2048
    assert spec.model_config(CATALOG.workloads["1.3b"].model).max_position_embeddings == 2048
    assert spec.to_dict()["max_positions"] == 2048  # recorded in the result's spec


def test_without_the_option_the_spec_records_the_workloads_positions():
    spec = spec_of("--model", "1.3b")
    assert spec.max_positions == 1024
    assert spec.model_config(CATALOG.workloads["1.3b"].model) is CATALOG.workloads["1.3b"].model


@pytest.mark.parametrize("value", [1023, 0, -5, 2**40])
def test_a_max_positions_outside_seq_to_the_maximum_is_refused(value):
    with pytest.raises(UsageError) as refused:
        spec_of("--model", "1.3b", "--max-positions", str(value))
    assert f"--max-positions {value}" in str(refused.value) and "from --seq-length 1024" in str(refused.value)


def test_megatrons_name_suites_and_child_argv_carry_it():
    spec = spec_of("--model", "1.3b", "--seq-length", "2048", "--max-position-embeddings", "4096")
    assert spec.max_positions == 4096
    options = RunOptions.from_mapping({"model": "1.3b", "seq-length": 2048, "max-positions": 2048})
    assert options.max_positions == 2048
    assert (
        "--max-positions" in options.to_argv()
        and options.to_argv()[options.to_argv().index("--max-positions") + 1] == "2048"
    )
    with pytest.raises(UsageError, match="--max-positions 'many'"):
        RunOptions.from_mapping({"max_positions": "many"})


def test_parameters_planner_and_flops_see_the_longer_position_table():
    workload = CATALOG.workloads["1.3b"]
    short = spec_of("--model", "1.3b", "--seq-length", "1024")
    long_table = spec_of("--model", "1.3b", "--seq-length", "1024", "--max-positions", "2048")
    extra = (2048 - 1024) * H_13B  # one row of h parameters per position
    described_short, described_long = describe_workload(workload, short), describe_workload(workload, long_table)
    assert described_long.max_position_embeddings == 2048
    assert described_long.parameters - described_short.parameters == extra
    assert described_long.parameters == count_parameters(long_table.model_config(workload.model)).total
    plan_short, plan_long = plan_memory(short, workload.model, "cuda"), plan_memory(long_table, workload.model, "cuda")
    assert plan_long.parameters - plan_short.parameters == extra
    assert plan_long.total_bytes > plan_short.total_bytes
    # FLOPs: the position lookup is not a matmul, so the Megatron formula does not move; the
    # sequence does (the attention term).
    assert model_flops_per_iteration(long_table.model_config(workload.model), 8, 1024) == model_flops_per_iteration(
        workload.model, 8, 1024
    )


def test_hwbench_plan_takes_it_and_refuses_a_seq_past_the_table(capsys):
    argv = [
        "plan",
        "--model",
        "1.3b",
        "--seq-length",
        "2048",
        "--devices",
        "1",
        "--device-memory",
        "80GiB",
        "--layout",
        "1x1x1",
    ]
    assert main(argv) == 2
    assert "--max-positions 2048" in capsys.readouterr().err
    assert main(argv + ["--max-positions", "2048"]) == 0
    assert "1x1x1" in capsys.readouterr().out


@pytest.mark.slow
def test_a_run_trains_and_records_the_longer_table(tmp_path):
    """tiny (128 positions) at seq 256: one real step on the CPU; the result says what was trained."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hwbench",
            "run",
            "--quiet",
            "--device",
            "cpu",
            "--model",
            "tiny",
            "--seq-length",
            "256",
            "--max-positions",
            "256",
            "--micro-batch-size",
            "2",
            "--global-batch-size",
            "2",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--eval-iters",
            "0",
            "--data",
            "synthetic",
            "--no-telemetry",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (path,) = tmp_path.glob("*.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok"
    assert result["spec"]["max_positions"] == 256 and result["spec"]["seq_length"] == 256
    tiny = CATALOG.workloads["tiny"].model
    assert result["workload"]["max_position_embeddings"] == 256
    assert result["workload"]["parameters"] == count_parameters(tiny).total + 128 * tiny.hidden_size


def test_a_rotary_model_keeps_its_own_bound_and_takes_its_own_value_only():
    """The Llama sizes have no position table: --max-positions of their own bound changes
    nothing (a suite may give it to every point); any other value is refused (test_cli_input)."""
    llama = CATALOG.workloads["llama-tiny"].model
    for argv in ((), ("--max-positions", "131072")):
        spec = spec_of("--model", "llama-tiny", *argv)
        assert spec.max_positions == 131072 and spec.model_config(llama) is llama
    with pytest.raises(UsageError, match="rotary"):
        spec_of("--model", "llama-tiny", "--max-positions", "8192")
