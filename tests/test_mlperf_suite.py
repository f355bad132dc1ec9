"""The shipped MLPerf Training Llama 3.1 8B suite: what its point resolves to, held to what
MLCommons publishes (read 2026-11-29; the sources are named in the suite file), and that it
cannot run without the data the user brings. Nothing here trains: the point is resolved only."""

from __future__ import annotations

import math

import pytest

from hwbench.commands.run import parse_run_spec
from hwbench.engine.optim import step_learning_rate
from hwbench.errors import UsageError
from hwbench.suites.suite import find_suite, load_suite

# MLCommons' figures, as published (not read from the suite)
SEQUENCE_LENGTH = 8192  # training_rules.adoc: llama31_8b sequence_length
TARGET_LOG_PERPLEXITY = 3.3  # training_rules.adoc: Small LLM Pretraining, Llama31_8b, "3.3 log perplexity"
EVAL_EVERY_SEQUENCES = 12288  # training_rules.adoc: evaluation frequency of Llama31_8b
EVAL_SEQUENCES = 1024  # compliance checker closed_llama31_8b.yaml: eval_samples == 1024
RCP_BATCH, RCP_LR, RCP_SLOWEST_SAMPLES = 32, 8e-4, 196_608  # rcps_llama31_8b.json, llama31_8b_ref_32
END_LR_FRACTION = 0.1  # training_rules.adoc: opt_end_learning_rate = opt_base_learning_rate * 0.1
WEIGHT_DECAY, CLIP_NORM = 0.1, 1.0  # training_rules.adoc: opt_adamw_weight_decay, opt_gradient_clip_norm
BETA_1, BETA_2, EPSILON = 0.9, 0.95, 1e-5  # training_rules.adoc: opt_adamw_beta_1, opt_adamw_beta_2, opt_adamw_epsilon
MAX_STEPS = 1_200_000  # training_rules.adoc: max_steps; opt_learning_rate_decay_steps = max_steps - warm-up steps
RCP_WARMUP_SAMPLES = 4096  # rcps_llama31_8b.json, llama31_8b_ref_32: opt_learning_rate_warmup_samples


def nemo_learning_rate(step: int) -> float:
    """The reference's rate at optimizer step ``step`` (0-based, as NeMo's scheduler counts): NeMo's
    CosineAnnealing (nemo/core/optim/lr_scheduler.py) with warmup_steps W, max_steps MAX_STEPS,
    min_lr = 0.1 lr: lr x (step + 1)/(W + 1) up to W, then a cosine from lr to min_lr over MAX_STEPS - W."""
    warmup, end = RCP_WARMUP_SAMPLES // RCP_BATCH, END_LR_FRACTION * RCP_LR
    if step <= warmup:
        return RCP_LR * (step + 1) / (warmup + 1)
    if step > MAX_STEPS:
        return end
    return end + (RCP_LR - end) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (MAX_STEPS - warmup)))


@pytest.fixture(scope="module")
def point():
    suite = load_suite(find_suite("mlperf-llama3.1-8b"))
    assert len(suite.points) == 1
    return suite.points[0]


def test_the_point_resolves_to_mlperfs_values(point):
    spec = parse_run_spec(point.run_options().to_argv(), check_paths=False)
    assert spec.model == "llama3.1-8b" and spec.seq_length == SEQUENCE_LENGTH
    assert spec.target is not None and (spec.target.metric, spec.target.value) == ("loss", TARGET_LOG_PERPLEXITY)
    assert spec.global_batch_size == RCP_BATCH and spec.precision == "bf16"
    assert spec.eval_interval * spec.global_batch_size == EVAL_EVERY_SEQUENCES
    assert spec.eval_iters * spec.global_batch_size == EVAL_SEQUENCES
    optimizer = spec.optimizer
    assert optimizer.lr == RCP_LR and optimizer.min_lr == pytest.approx(END_LR_FRACTION * RCP_LR)
    assert (optimizer.weight_decay, optimizer.clip_grad) == (WEIGHT_DECAY, CLIP_NORM)
    assert (optimizer.adam_beta1, optimizer.adam_beta2, optimizer.adam_eps) == (BETA_1, BETA_2, EPSILON)
    assert optimizer.lr_warmup_iters * RCP_BATCH == RCP_WARMUP_SAMPLES and optimizer.lr_decay_style == "cosine"
    assert optimizer.lr_decay_iters - optimizer.lr_warmup_iters == MAX_STEPS - RCP_WARMUP_SAMPLES // RCP_BATCH
    # validation: the same first 1024 sequences of MLPerf's validation file at every evaluation; all of --data trains
    assert spec.valid_data.endswith("c4-validation-91205-samples.en_text_document") and spec.split == "100,0,0"
    # every step trains toward the target, at most as many as the slowest reference run needed
    assert spec.warmup == 0 and spec.steps * spec.global_batch_size == RCP_SLOWEST_SAMPLES
    assert spec.launch.world_size == 8 and spec.fsdp and spec.parallel.dp == 8


@pytest.mark.parametrize("step", [1, 2, 64, 128, 129, 130, 131, 6144, 600_000, MAX_STEPS, MAX_STEPS + 1])
def test_the_points_learning_rate_is_the_references_at_every_step(point, step):
    """Megatron-LM's schedule (hwbench's) with the suite's options is NeMo's curve: step k of
    hwbench (1-based) is step k - 1 of NeMo's scheduler."""
    spec = parse_run_spec(point.run_options().to_argv(), check_paths=False)
    assert step_learning_rate(spec.optimizer, step) == pytest.approx(nemo_learning_rate(step - 1), rel=1e-12)


def test_without_the_data_the_point_is_refused_before_anything_runs(point, tmp_path, monkeypatch):
    """The suite names a dataset prefix the user provides: where it is absent (this machine, CI),
    `hwbench run` refuses the point in one line, so a sweep records it `invalid` and trains nothing."""
    monkeypatch.chdir(tmp_path)  # a folder without the user's data/c4-llama3.1-8b/
    with pytest.raises(UsageError) as error:
        parse_run_spec(point.run_options().to_argv())
    assert str(error.value).startswith("--data 'data/c4-llama3.1-8b/c4_text_document': no ")
    assert "\n" not in str(error.value)
    training = tmp_path / "data" / "c4-llama3.1-8b" / "c4_text_document"  # the training data alone is not enough
    training.parent.mkdir(parents=True)
    for suffix in (".bin", ".idx"):
        training.with_name(training.name + suffix).touch()
    with pytest.raises(UsageError) as error:
        parse_run_spec(point.run_options().to_argv())
    assert str(error.value).startswith(
        "--valid-data 'data/c4-llama3.1-8b/c4-validation-91205-samples.en_text_document': no ")
