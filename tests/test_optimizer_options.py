"""The optimizer and its schedule as run options (Megatron-LM's names: --lr-warmup-iters,
--lr-warmup-fraction, --lr-warmup-init, --lr-decay-iters, --lr-decay-style, --adam-beta1,
--adam-beta2, --adam-eps, --weight-decay, --clip-grad) and --valid-data: what a bad combination
is told, what the engines train with, and the fixed validation set."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from hwbench.catalog import load_catalog
from hwbench.cli import main
from hwbench.commands.run import parse_run_spec
from hwbench.device.cpu import CpuBackend
from hwbench.engine.native import NativeEngine
from hwbench.engine.optim import learning_rate, step_learning_rate
from hwbench.errors import UsageError
from hwbench.workload.data import SyntheticTokens
from hwbench.workload.gpt_dataset import MegatronData
from hwbench.workload.indexed import write_indexed_dataset

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
    (["--valid-data", "data/valid"],
     "--valid-data is a dataset to validate --data PREFIX on, and --data synthetic makes its own validation "
     "samples; leave --valid-data out, or give --data PREFIX"),
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


# --- --valid-data ------------------------------------------------------------------------------

SEQ, GLOBAL, VOCAB = 8, 4, 1000


def _dataset(path, documents) -> str:
    write_indexed_dataset(path, documents, "uint16")
    return str(path)


def _data(tmp_path, valid_documents, eval_iters=2, **batching) -> MegatronData:
    rng = np.random.default_rng(5)
    train = _dataset(tmp_path / "train", [rng.integers(1, VOCAB, size=20) for _ in range(40)])
    valid = _dataset(tmp_path / "valid", valid_documents)
    return MegatronData(train, "100,0,0", SEQ, micro_batch_size=batching.get("micro", GLOBAL),
                        global_batch_size=GLOBAL, train_steps=3, eval_iters=eval_iters, seed=1234, vocab_size=VOCAB,
                        dp_rank=batching.get("dp_rank", 0), dp_size=batching.get("dp_size", 1), valid_prefix=valid)


def test_every_validation_reads_the_first_sequences_in_order(tmp_path):
    """The validation dataset's documents in file order as one stream (10, 11, ...): sample i is
    tokens i x seq to (i + 1) x seq, the same ones at the second evaluation as at the first."""
    stream = np.arange(10, 10 + 100)
    documents = [stream[:7], stream[7:30], stream[30:31], stream[31:]]  # samples cross document ends
    data = _data(tmp_path, documents)
    first = [data.valid_batch(i) for i in range(2)]
    second = [data.valid_batch(i) for i in range(2)]
    for (inputs, _), (again, _) in zip(first, second):
        assert torch.equal(inputs, again)
    for index, (inputs, labels) in enumerate(first):  # eval iter `index`: samples 4 index .. 4 index + 3
        for row in range(GLOBAL):
            start = (index * GLOBAL + row) * SEQ
            assert inputs[row].tolist() == stream[start:start + SEQ].tolist()
            assert labels[row].tolist() == stream[start + 1:start + SEQ + 1].tolist()
    described = data.describe()
    assert described["valid_prefix"] == str(tmp_path / "valid") and data.has_validation
    data.seek(consumed_train_samples=8, consumed_valid_samples=16)  # a resumed run: the same set still
    assert torch.equal(data.valid_batch(0)[0], first[0][0])
    assert data.position()["consumed_valid_samples"] == 0


def test_each_data_parallel_rank_reads_its_share_of_the_fixed_set(tmp_path):
    stream = np.arange(10, 10 + 100)
    whole = _data(tmp_path, [stream]).valid_batch(0)[0]
    ranks = []
    for rank in range(2):
        (tmp_path / str(rank)).mkdir()
        ranks.append(_data(tmp_path / str(rank), [stream], micro=2, dp_rank=rank, dp_size=2))
    shares = [rank.valid_batch(0)[0] for rank in ranks]
    assert torch.equal(torch.cat(shares), whole)


def test_a_validation_dataset_too_short_for_the_evaluation_is_refused(tmp_path):
    with pytest.raises(UsageError) as refused:
        _data(tmp_path, [np.arange(10, 10 + 40)], eval_iters=2)  # 4 whole samples of 9 tokens; 8 asked for
    assert str(refused.value) == (f"--valid-data {tmp_path / 'valid'}: 4 sequences of 9 tokens, and a validation "
                                  "reads --eval-iters x --global-batch-size = 8; give a larger dataset, or fewer "
                                  "--eval-iters")


def test_valid_data_needs_no_validation_split_for_a_target(tmp_path):
    train = _dataset(tmp_path / "train", [np.arange(1, 200)])
    valid = _dataset(tmp_path / "valid", [np.arange(1, 200)])
    spec = parse_run_spec([*TINY, "--data", train, "--split", "100,0,0", "--valid-data", valid,
                           "--target-loss", "3"])
    assert (spec.valid_data, spec.split, spec.eval_interval) == (valid, "100,0,0", 10)
    with pytest.raises(UsageError, match="leaves no validation documents; give the validation part a weight, or "
                                         "--valid-data PREFIX"):
        parse_run_spec([*TINY, "--data", train, "--split", "100,0,0", "--target-loss", "3"])


@pytest.mark.heavy
def test_a_cpu_run_trains_and_records_the_options(tmp_path):
    """The whole path: `hwbench run` with the options, its result's spec and steps."""
    rng = np.random.default_rng(3)
    train = _dataset(tmp_path / "train", [rng.integers(1, VOCAB, size=int(rng.integers(20, 200))) for _ in range(200)])
    valid = _dataset(tmp_path / "valid", [rng.integers(1, VOCAB, size=300) for _ in range(20)])
    out = tmp_path / "runs"
    assert main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--steps", "3", "--warmup", "0",
                 "--data", train, "--split", "100,0,0", "--valid-data", valid, "--eval-iters", "2",
                 "--adam-beta2", "0.95", "--lr-warmup-iters", "1", "--no-preflight", "--out", str(out)]) == 0
    result = json.loads(next(out.glob("*.json")).read_text())
    optimizer = result["spec"]["optimizer"]
    assert (optimizer["adam_beta1"], optimizer["adam_beta2"], optimizer["adam_eps"]) == (0.9, 0.95, 1e-8)
    assert (optimizer["lr_warmup_iters"], optimizer["lr_warmup_fraction"]) == (1, None)
    assert [step["lr"] for step in result["steps"]][:2] == [0.0, 1e-3]
    assert result["spec"]["valid_data"] == result["metrics"]["data"]["valid_prefix"] == valid
    assert result["metrics"]["validation"] and result["status"] == "ok"
