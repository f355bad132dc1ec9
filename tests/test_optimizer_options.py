"""The optimizer and its schedule as run options (Megatron-LM's names: --lr-warmup-iters,
--lr-warmup-fraction, --lr-warmup-init, --lr-decay-iters, --lr-decay-style, --adam-beta1,
--adam-beta2, --adam-eps, --weight-decay, --clip-grad): what a bad combination is told and what
the engines train with."""

from __future__ import annotations

import math

import pytest
import torch

from hwbench.catalog import load_catalog
from hwbench.cli import main
from hwbench.commands.run import parse_run_spec
from hwbench.device.cpu import CpuBackend
from hwbench.engine.native import NativeEngine
from hwbench.engine.optim import learning_rate, step_learning_rate
from hwbench.workload.data import SyntheticTokens

TINY = ["--model", "tiny", "--device", "cpu", "--data", "synthetic", "--seq-length", "16"]


@pytest.mark.parametrize("argv, line", [
    (["--lr-warmup-iters", "3", "--lr-warmup-fraction", "0.1"],
     "--lr-warmup-iters 3 and --lr-warmup-fraction 0.1 both set the warm-up; give one of them"),
    (["--min-lr", "0.01"],
     "--min-lr 0.01 is above --lr 0.001 (the workload's); give --min-lr at most 0.001, or a larger --lr"),
    (["--lr", "1e-5"],
     "--min-lr 0.0001 (the workload's) is above --lr 1e-05; give --min-lr at most 1e-05, or a larger --lr"),
    (["--lr-warmup-init", "0.002"],
     "--lr-warmup-init 0.002 is above --lr 0.001 (the workload's); give --lr-warmup-init at most 0.001, or a "
     "larger --lr"),
    (["--lr-decay-iters", "2"],
     "--lr-warmup-iters 2 (the workload's) is not below --lr-decay-iters 2, where the decay ends; give a shorter "
     "warm-up or a later --lr-decay-iters"),
    (["--lr-warmup-fraction", "1"],
     "--lr-warmup-fraction 1.0 (200 steps) is not below --lr-decay-iters 200 (the workload's), where the decay "
     "ends; give a shorter warm-up or a later --lr-decay-iters"),
    (["--adam-beta2", "1"], "--adam-beta2 1 is not accepted; give a number from 0 up to, not including, 1"),
    (["--adam-beta1", "-0.1"], "--adam-beta1 -0.1 is not accepted; give a number from 0 up to, not including, 1"),
    (["--adam-eps", "0"], "--adam-eps 0 is not accepted; give a number > 0"),
    (["--lr-decay-style", "WSD"], "--lr-decay-style 'WSD' is not accepted; give one of cosine, linear, constant"),
    (["--clip-grad", "-1"], "--clip-grad -1 is not accepted; give a number >= 0"),
    (["--clip-grad", "0", "--engine", "deepspeed", "--pp", "2", "--nproc-per-node", "2"],
     "--clip-grad 0 with --engine deepspeed --tp 1 --pp 2 in fp32 with ZeRO 0: DeepSpeed's pipeline engine takes "
     "the gradient norm only while it clips; accepted: --clip-grad > 0, --zero 1, --precision bf16 or fp16, or "
     "--engine native"),
])
def test_a_bad_combination_is_one_line_and_nothing_is_written(tmp_path, capsys, argv, line):
    out = tmp_path / "runs"
    assert main(["run", *TINY, "--out", str(out), *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"hwbench: error: {line}"]
    assert not out.exists() or not any(out.iterdir())


def test_megatrons_schedule_flags_are_run_options():
    """Megatron-LM's flags, once refused with "it comes from the workload", now set the run."""
    optimizer = parse_run_spec([*TINY, "--lr-decay-iters", "1000", "--lr-decay-style", "linear",
                                "--weight-decay", "0.2", "--clip-grad", "0.5", "--lr-warmup-fraction", "0.05"],
                               check_paths=False).optimizer
    assert (optimizer.lr_decay_iters, optimizer.lr_decay_style, optimizer.weight_decay, optimizer.clip_grad) == (
        1000, "linear", 0.2, 0.5)
    assert (optimizer.lr_warmup_fraction, optimizer.lr_warmup_iters) == (0.05, 50)


def test_a_workloads_warmup_fraction_is_of_the_decay_the_run_gives():
    """1.3b's warm-up is 0.01 of its decay iterations, as Megatron-LM's --lr-warmup-fraction: 3200 of
    320000, and 10 of a run's --lr-decay-iters 1000; a count given instead replaces it."""
    catalog_spec = parse_run_spec(["--model", "1.3b"], check_paths=False).optimizer
    assert (catalog_spec.lr_warmup_iters, catalog_spec.lr_warmup_fraction) == (3200, 0.01)
    shorter = parse_run_spec(["--model", "1.3b", "--lr-decay-iters", "1000"], check_paths=False).optimizer
    assert (shorter.lr_warmup_iters, shorter.lr_warmup_fraction) == (10, 0.01)
    counted = parse_run_spec(["--model", "1.3b", "--lr-warmup-iters", "7"], check_paths=False).optimizer
    assert (counted.lr_warmup_iters, counted.lr_warmup_fraction) == (7, None)


def test_the_warmup_starts_at_lr_warmup_init():
    """Megatron-LM's OptimizerParamScheduler.get_lr: init + (max - init) x iteration / warm-up."""
    optimizer = parse_run_spec([*TINY, "--lr-warmup-iters", "4", "--lr-warmup-init", "2e-4"],
                               check_paths=False).optimizer
    assert [learning_rate(optimizer, i) for i in range(5)] == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4, 1e-3])
    assert step_learning_rate(optimizer, 1) == 2e-4  # the first step trains at the warm-up's start


def _native_engine(*argv: str) -> tuple[NativeEngine, SyntheticTokens]:
    spec = parse_run_spec([*TINY, "--micro-batch-size", "1", "--global-batch-size", "1", *argv], check_paths=False)
    backend = CpuBackend()
    backend.prepare_process()
    model = load_catalog().workloads["tiny"].model
    data = SyntheticTokens(model.vocab_size, spec.seq_length, spec.micro_batch_size, spec.global_batch_size,
                           spec.seed)
    return NativeEngine(model, spec, backend), data


def test_the_native_engine_trains_with_the_options_betas_epsilon_and_warmup():
    engine, data = _native_engine("--steps", "3", "--adam-beta2", "0.95", "--adam-eps", "1e-5",
                                  "--lr-warmup-iters", "1")
    rates = [engine.train_step(data.train_batch).lr for _ in range(3)]
    for group in engine.optimizer.param_groups:  # what torch's AdamW reads at every step
        assert (group["betas"], group["eps"]) == ((0.9, 0.95), 1e-5)
    # warm-up over 1 step from 0, then tiny's cosine from 1e-3 towards 1e-4 at step 200
    decayed = 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 1 / 199))
    assert rates == pytest.approx([0.0, 1e-3, decayed], rel=1e-12)
    assert [group["lr"] for group in engine.optimizer.param_groups] == pytest.approx([decayed] * 2)
    # AdamW's second moment after 3 steps: (1 - beta2) x sum of beta2^(3-k) g_k^2; > 0 where a gradient was
    state = engine.optimizer.state[next(iter(engine.model.parameters()))]
    assert int(state["step"]) == 3 and float(state["exp_avg_sq"].max()) > 0


def test_clip_grad_0_steps_with_the_gradients_unclipped():
    """Megatron-LM's --clip-grad 0: no clipping (clipping by 0 would zero every gradient)."""
    engine, data = _native_engine("--clip-grad", "0", "--lr-warmup-iters", "0")
    stepped = []
    engine.optimizer.register_step_pre_hook(
        lambda *_: stepped.append(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(p.grad) for p in engine.model.parameters() if p.grad is not None]))))
    outcome = engine.train_step(data.train_batch)
    assert float(outcome.grad_norm) > 0
    assert float(stepped[0]) == pytest.approx(float(outcome.grad_norm), rel=1e-5)
