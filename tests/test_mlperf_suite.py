"""The shipped MLPerf Training Llama 3.1 8B suite: what its point resolves to, held to what
MLCommons publishes (read 2026-11-29; the sources are named in the suite file), and that it
cannot run without the data the user brings. Nothing here trains: the point is resolved only."""

from __future__ import annotations

import pytest

from hwbench.commands.run import parse_run_spec
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
    assert spec.optimizer.lr == RCP_LR and spec.optimizer.min_lr == pytest.approx(END_LR_FRACTION * RCP_LR)
    # the workload's weight decay and clipping are MLPerf's; its warm-up, decay and betas are not (said in the suite)
    assert (spec.optimizer.weight_decay, spec.optimizer.clip_grad) == (WEIGHT_DECAY, CLIP_NORM)
    # every step trains toward the target, at most as many as the slowest reference run needed
    assert spec.warmup == 0 and spec.steps * spec.global_batch_size == RCP_SLOWEST_SAMPLES
    assert spec.launch.world_size == 8 and spec.fsdp and spec.parallel.dp == 8


def test_without_the_data_the_point_is_refused_before_anything_runs(point, tmp_path, monkeypatch):
    """The suite names a dataset prefix the user provides: where it is absent (this machine, CI),
    `hwbench run` refuses the point in one line, so a sweep records it `invalid` and trains nothing."""
    monkeypatch.chdir(tmp_path)  # a folder without the user's data/c4-llama3.1-8b/
    with pytest.raises(UsageError) as error:
        parse_run_spec(point.run_options().to_argv())
    assert str(error.value).startswith("--data 'data/c4-llama3.1-8b/c4_text_document': no ")
    assert "\n" not in str(error.value)
