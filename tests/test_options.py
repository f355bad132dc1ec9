"""The run-option table (hwbench.options) and the command line as a user meets it:
Megatron's names, defaults that adapt to data parallelism, one vocabulary across
commands, and commands that start without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hwbench.catalog import load_catalog
from hwbench.cli import command_parser, main
from hwbench.commands.run import parse_run_spec
from hwbench.errors import UsageError
from hwbench.options import RUN_OPTIONS, RunOptions
from hwbench.spec import build_run_spec


def test_a_megatron_launch_lines_flags_can_be_pasted():
    spec = parse_run_spec(["--model", "tiny", "--nproc-per-node", "2", "--tensor-model-parallel-size", "2",
                           "--pipeline-model-parallel-size", "1", "--train-iters", "3", "--fp16",
                           "--recompute-activations", "--lr", "2e-4", "--min-lr", "1e-5", "--seed", "7",
                           "--eval-interval", "2", "--eval-iters", "1", "--split", "98,2,0",
                           "--data-path", "synthetic", "--vocab-file", "gpt2-vocab.json", "--merge-file",
                           "gpt2-merges.txt"], check_paths=False)
    assert (spec.parallel.tp, spec.parallel.pp, spec.parallel.dp) == (2, 1, 1)
    assert spec.steps == 3 and spec.precision == "fp16" and spec.recompute is True and spec.seed == 7
    assert spec.optimizer.lr == 2e-4 and spec.optimizer.min_lr == 1e-5
    assert (spec.eval_interval, spec.eval_iters, spec.split, spec.data) == (2, 1, "98,2,0", "synthetic")
    assert parse_run_spec(["--model", "tiny", "--bf16", "--checkpoint-activations"], check_paths=False).precision == "bf16"


@pytest.mark.parametrize("flag,advice", [("--sequence-parallel", "not supported"), ("--num-layers", "--model"),
                                         ("--use-flash-attn", "SDPA"), ("--deepspeed", "--engine deepspeed")])
def test_a_megatron_flag_hwbench_does_not_take_is_named_with_what_to_use(capsys, flag, advice):
    assert main(["run", "--model", "tiny", flag] + (["24"] if flag == "--num-layers" else [])) == 2
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and flag in line and advice in line


@pytest.mark.parametrize("options,expected", [
    ({"model": "small", "nproc_per_node": 2}, (8, 16)),  # neither given: micro 8, global 8 x 2
    ({"model": "small", "nproc_per_node": 2, "dp": 2, "fsdp": True}, (8, 16)),
    ({"model": "small", "nproc_per_node": 2, "engine": "deepspeed", "zero": 2}, (8, 16)),
    ({"model": "tiny", "nproc_per_node": 2}, (4, 8)),  # the workload's 8 already fits 4 x 2: unchanged
    ({"model": "tiny", "nproc_per_node": 3}, (4, 12)),  # rounded up to a multiple of 4 x 3
    ({"model": "small", "nproc_per_node": 2, "micro_batch_size": 2}, (2, 8)),  # micro given: global follows
    ({"model": "small", "nproc_per_node": 2, "global_batch_size": 12}, (6, 12)),  # global given: micro follows
    ({"model": "1.3b", "nproc_per_node": 8}, (8, 32)),  # the published setting is kept
])
def test_batch_sizes_adapt_to_data_parallelism_when_not_given(options, expected):
    spec = build_run_spec(RunOptions(**options), load_catalog(), check_paths=False)
    assert (spec.micro_batch_size, spec.global_batch_size) == expected


def test_a_batch_combination_the_user_gave_is_still_refused():
    with pytest.raises(UsageError, match="--global-batch-size 10 is not a multiple of --micro-batch-size 4"):
        build_run_spec(RunOptions(model="tiny", micro_batch_size=4, global_batch_size=10), load_catalog(),
                       check_paths=False)


def test_model_names_match_in_any_case():
    assert build_run_spec(RunOptions(model="1.3B"), load_catalog(), check_paths=False).model == "1.3b"
    assert build_run_spec(RunOptions(model="TINY"), load_catalog(), check_paths=False).model == "tiny"


def test_options_survive_the_trip_to_a_child_process_argv():
    options = RunOptions(model="tiny", nproc_per_node=2, tp=2, recompute=False, telemetry=False, lr=3e-4,
                         timeout=60.0, data="synthetic", precision="bf16", fsdp=None)
    assert parse_run_spec(options.to_argv(), check_paths=False) == build_run_spec(options, load_catalog(),
                                                                                   check_paths=False)


def test_a_suite_value_is_coerced_or_refused_by_the_table():
    assert RunOptions.from_mapping({"seq-length": "32", "recompute": "false"}) == RunOptions(seq_length=32,
                                                                                          recompute=False)
    with pytest.raises(UsageError, match="`tpp` is not a `hwbench run` option"):
        RunOptions.from_mapping({"tpp": 2})
    with pytest.raises(UsageError, match="--steps 'ten' is not accepted; give an integer"):
        RunOptions.from_mapping({"steps": "ten"})


def test_every_command_names_the_same_thing_the_same_way():
    """The device kind is --device everywhere; a job's device count is --devices (plan, tune),
    per node --nproc-per-node (run, sweep, k8s); the report's projection has its own name."""
    flags = {}
    for name in ("run", "sweep", "tune", "plan", "k8s", "report"):
        _, parser = command_parser(name)
        flags[name] = {s for a in parser._actions for s in a.option_strings if a.help != "==SUPPRESS=="}
    assert all("--device" in flags[c] for c in ("run", "sweep", "tune", "plan"))
    assert "--backend" not in flags["plan"]
    assert {"--devices"} <= flags["plan"] & flags["tune"]
    assert all("--nproc-per-node" in flags[c] for c in ("run", "sweep", "k8s"))
    assert "--projection-devices" in flags["report"]
    assert {o.flag for o in RUN_OPTIONS} <= flags["run"]


@pytest.mark.parametrize("argv", [["--help"], ["models"], ["plan", "--model", "1.3b", "--devices", "8",
                                                             "--device-memory", "32GiB"], ["run", "--help"],
                                  ["calibrate", "--help"]])
def test_commands_that_need_no_device_do_not_import_torch(argv):
    """What keeps `hwbench --help` and `hwbench models` well under a second (docs/performance.md)."""
    code = ("import sys\nfrom hwbench.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "sys.stdout.flush()\nprint('TORCH' if 'torch' in sys.modules else 'NO TORCH', file=sys.stderr)" % argv)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "NO TORCH", done.stderr[-2000:]


def test_the_run_table_says_why_a_figure_is_missing_and_names_the_formula():
    import json
    from pathlib import Path

    from hwbench.report.summary import run_summary_rows
    from hwbench.result.model import RunResult

    data = json.loads((Path(__file__).parent / "data" / "compare" / "tiny-cpu.json").read_text())
    rows = dict(run_summary_rows(RunResult.from_dict(data)))
    assert rows["peak memory"].startswith("allocated n/a on CPU: resident set below, resident set ")
    assert rows["TFLOP/s per device"].endswith("(FLOPs formula: megatron-core-v0.7)")  # its name since schema 2


@pytest.mark.parametrize("name", sorted(__import__("hwbench.cli", fromlist=["COMMANDS"]).COMMANDS))
def test_every_commands_help_prints(name, capsys):
    """argparse formats help with %: a default such as slurm's `hwbench-%j.log` must be escaped."""
    _, parser = command_parser(name)
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--help"])
    assert done.value.code == 0
    assert f"usage: hwbench {name}" in capsys.readouterr().out
