"""The FLOPs formulas for the Llama 3 shape (grouped-query attention, SwiGLU, an untied output
layer) and the mixtures of experts (Mixtral, Qwen3-MoE): each against its source's own expression,
written out here as that source writes it, and against figures worked by hand. No model is built
(tests/test_flops_counted.py counts a real step)."""

import dataclasses

import pytest

from hwbench.catalog import load_catalog
from hwbench.workload import GPTConfig, count_parameters
from hwbench.workload.flops import (
    DEFAULT_FLOPS_FORMULA,
    FLOPS_FORMULAS,
    FlopsNotCounted,
    flops_by_formula,
    flops_counts,
    flops_terms,
    model_flops_per_iteration,
    shape_caveat,
    uncounted,
    work_formula,
)

CATALOG = load_catalog()
# GPT-2 shapes, Llama 3 shapes (tied: 1B, 3B; untied: 8B, 70B), and the small sizes of both.
MODELS = ["345m", "1.3b", "tiny", "llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b", "llama-tiny"]
MOE_MODELS = ["mixtral-8x7b", "qwen3-30b-a3b", "moe-tiny", "moe-small"]


def megatron_v0_12(config: GPTConfig, batch: int, seq: int) -> float:
    """transformer_flops() of num_floating_point_operations, Megatron-LM core_v0.12.0
    (megatron/training/training.py), for a dense model without MTP, as it is written there."""
    kv_channels = config.hidden_size // config.num_attention_heads
    query_projection_size = kv_channels * config.num_attention_heads
    query_projection_to_hidden_size_ratio = query_projection_size / config.hidden_size
    num_query_groups = config.kv_heads
    gated_linear_multiplier = 3 / 2 if config.swiglu else 1
    expansion_factor = 3 * 2 * 2
    h, L = config.hidden_size, config.num_layers
    self_attn_term = expansion_factor * L * h * h * (
        (1 + num_query_groups / config.num_attention_heads + seq / h / 2) * query_projection_to_hidden_size_ratio)
    return batch * seq * (expansion_factor * L * h * (config.ffn_size * gated_linear_multiplier)
                          + self_attn_term + 3 * 2 * h * config.padded_vocab_size())


def megatron_v0_7(config: GPTConfig, batch: int, seq: int) -> float:
    """num_floating_point_operations of Megatron-LM core_v0.7.0 (megatron/training/training.py),
    as it is written there (no MoE)."""
    kv_channels = config.hidden_size // config.num_attention_heads
    query_projection_to_hidden_size_ratio = kv_channels * config.num_attention_heads / config.hidden_size
    gated_linear_multiplier = 3 / 2 if config.swiglu else 1
    h, L = config.hidden_size, config.num_layers
    return 12 * batch * seq * L * h * h * (
        ((1 + config.kv_heads / config.num_attention_heads + seq / h) * query_projection_to_hidden_size_ratio)
        + (config.ffn_size / h) * 1 * gated_linear_multiplier
        + config.padded_vocab_size() / (2 * L * h))


def megatron_main(config: GPTConfig, batch: int, seq: int) -> float:
    """transformer_flops() of num_floating_point_operations, Megatron-LM main at d98e8a6 (2026-08-22,
    megatron/training/training.py), for multi-head or grouped-query attention without an output
    gate, MTP, a latent MoE or linear attention, as it is written there: the dense layers'
    ffn_hidden_size, the MoE layers' routed experts (moe_ffn_hidden_size x moe_router_topk) and
    shared experts, the router not counted."""
    num_layers = config.num_layers
    if config.num_experts is None:
        num_dense_layers, num_moe_layers, num_experts_routed_to = num_layers, 0, 0
    else:
        moe_layer_pattern = [1 if (i % config.moe_layer_freq == 0) else 0 for i in range(num_layers)]
        num_moe_layers = sum(moe_layer_pattern)
        num_dense_layers = num_layers - num_moe_layers
        num_experts_routed_to = config.moe_router_topk
    moe_ffn_hidden_size = config.moe_ffn_hidden_size if config.moe_ffn_hidden_size is not None else config.ffn_size
    shared_expert_ffn_hidden_size = config.moe_shared_expert_intermediate_size or 0
    forward_backward_expansion_factor, fma_expansion_factor = 3, 2
    ffn_expansion_factor = 3 if config.swiglu else 2
    query_projection_size = config.head_dim * config.num_attention_heads
    key_projection_size = value_projection_size = config.head_dim * config.kv_heads
    h = config.hidden_size
    standard_self_attn_term = forward_backward_expansion_factor * fma_expansion_factor * (
        h * (query_projection_size + key_projection_size + value_projection_size)
        + query_projection_size * seq / 2 * 2
        + query_projection_size * h)
    self_attn_term = standard_self_attn_term * num_layers
    return batch * seq * (
        forward_backward_expansion_factor * fma_expansion_factor * h * (
            (config.ffn_size * ffn_expansion_factor) * num_dense_layers
            + (moe_ffn_hidden_size * num_experts_routed_to * ffn_expansion_factor) * num_moe_layers
            + (shared_expert_ffn_hidden_size * ffn_expansion_factor) * num_moe_layers)
        + self_attn_term
        + forward_backward_expansion_factor * fma_expansion_factor * h * config.padded_vocab_size())


def megatron_v0_7_moe(config: GPTConfig, batch: int, seq: int) -> float:
    """num_floating_point_operations of Megatron-LM core_v0.7.0 with its MoE factor, as it is
    written there: num_experts_routed_to = moe_router_topk multiplies the MLP of every layer, whose
    --ffn-hidden-size is the experts' width in that version (no --moe-ffn-hidden-size yet)."""
    ffn_hidden_size = config.moe_ffn_size
    num_experts_routed_to = 1 if config.num_experts is None else config.moe_router_topk
    query_projection_to_hidden_size_ratio = config.head_dim * config.num_attention_heads / config.hidden_size
    gated_linear_multiplier = 3 / 2 if config.swiglu else 1
    h, L = config.hidden_size, config.num_layers
    return 12 * batch * seq * L * h * h * (
        ((1 + config.kv_heads / config.num_attention_heads + seq / h) * query_projection_to_hidden_size_ratio)
        + (ffn_hidden_size / h) * num_experts_routed_to * gated_linear_multiplier
        + config.padded_vocab_size() / (2 * L * h))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("formula, megatron", [("megatron-core-v0.12", megatron_v0_12),
                                               ("megatron-core-v0.12", megatron_main),
                                               ("megatron-core-v0.7", megatron_v0_7)])
def test_megatron_formulas_are_megatrons_own_expressions(name, formula, megatron):
    config = CATALOG.workloads[name].model
    for batch, seq in ((8, 1024), (1, 8192)):
        assert model_flops_per_iteration(config, batch, seq, formula=formula) == pytest.approx(
            megatron(config, batch, seq), rel=1e-12)


# moe-tiny with what only Megatron's later MoE switches build: shared experts and dense layers between
MOE_SHARED_DENSE = dataclasses.replace(CATALOG.workloads["moe-tiny"].model, num_layers=4, moe_layer_freq=2,
                                       moe_shared_expert_intermediate_size=512)


@pytest.mark.parametrize("config", [*(CATALOG.workloads[name].model for name in MOE_MODELS), MOE_SHARED_DENSE],
                         ids=[*MOE_MODELS, "shared-and-dense-layers"])
def test_moe_counts_are_megatrons_own_expressions(config):
    """Megatron-LM main's MoE terms (those of core_v0.12.0 too) for every MoE shape; core_v0.7.0's
    for the shapes it could build (every layer MoE, no shared experts), a refusal for the others."""
    for batch, seq in ((8, 1024), (1, 4096)):
        assert model_flops_per_iteration(config, batch, seq) == pytest.approx(megatron_main(config, batch, seq),
                                                                            rel=1e-12)
        if config.moe_layer_freq == 1 and not config.moe_shared_expert_intermediate_size:
            assert model_flops_per_iteration(config, batch, seq, formula="megatron-core-v0.7") == pytest.approx(
                megatron_v0_7_moe(config, batch, seq), rel=1e-12)
    if config is MOE_SHARED_DENSE:
        reason = uncounted("megatron-core-v0.7", config)
        assert reason is not None and "--moe-layer-freq 2" in reason and "shared experts (512 wide)" in reason
        with pytest.raises(FlopsNotCounted, match="megatron-core-v0.7"):
            model_flops_per_iteration(config, 1, 1024, formula="megatron-core-v0.7")


def test_mixtral_8x7b_by_hand():
    """Mixtral 8x7B, B 1, s 4096, megatron-core-v0.12: per token and layer, forward, q and o 2 x 4096^2
    and k, v 2 x 4096 x 1024 = 41,943,040; the scores halved, 4096 x 4096 = 16,777,216; the top 2 of
    8 SwiGLU experts 2 x 3 x 4096 x 14336 = 352,321,536 (the router's 4096 x 8 not counted); the
    logits 4096 x 32,000 (a multiple of 128: no padding) = 131,072,000; x 6 x 4096 tokens."""
    config = CATALOG.workloads["mixtral-8x7b"].model
    assert model_flops_per_iteration(config, 1, 4096) == 6 * 4096 * (
        32 * (41_943_040 + 16_777_216 + 352_321_536) + 131_072_000) == 326_477_644_038_144
    # torchtitan's N: the card's 12,879,925,248 active parameters less the untied word embedding
    # (32,000 x 4096), the router kept; and the unhalved scores, 12 x L x H x Q x s a token
    assert model_flops_per_iteration(config, 1, 4096, formula="torchtitan") == 4096 * (
        6 * (12_879_925_248 - 32_000 * 4096) + 12 * 32 * 32 * 128 * 4096)


def test_qwen3_30b_a3b_on_its_active_parameters_by_hand():
    """Qwen3-30B-A3B: torchtitan's N is the card's 3,353,032,704 active parameters (8 of 128 experts)
    less the untied word embedding (151,936 x 2048); the score term 12 x 48 layers x 32 heads x 128 x s.
    palm counts the same N (the untied output layer is in it): the same figure."""
    config = CATALOG.workloads["qwen3-30b-a3b"].model
    by_hand = 4096 * (6 * (3_353_032_704 - 151_936 * 2048) + 12 * 48 * 32 * 128 * 4096)
    assert by_hand == 114_339_361_062_912
    for formula in ("torchtitan", "palm"):
        assert model_flops_per_iteration(config, 1, 4096, formula=formula) == by_hand, formula


@pytest.mark.parametrize("name", MOE_MODELS)
def test_an_moe_model_is_counted_on_its_active_parameters_and_says_so(name):
    """Every formula that counts an MoE model counts the experts a token runs, not all of them (the
    6N ones: N the active parameters); megatron-deepspeed, which has no expert term, refuses it."""
    config = CATALOG.workloads[name].model
    counts = count_parameters(config)
    every = flops_by_formula(config, 2, 512)
    assert every["megatron-deepspeed"] is None
    reason = uncounted("megatron-deepspeed", config)
    assert reason is not None and "no mixture-of-experts term" in reason
    palm = flops_terms(config, 2, 512, formula="palm")
    assert palm.total - palm.attention_scores == 6 * 2 * 512 * (counts.non_embedding - (counts.total - counts.active))
    assert palm.router == 6 * 2 * 512 * config.num_experts * config.hidden_size * config.moe_layers
    megatron = flops_terms(config, 2, 512)
    assert megatron.router == 0 and megatron.routed_experts == palm.routed_experts
    for formula in ("megatron-core-v0.12", "torchtitan", "palm"):
        said = flops_counts(formula, config)
        assert said is not None and said.startswith(
            f"active parameters: each token's {config.moe_router_topk} of {config.num_experts} routed experts")
        assert said.endswith("the router" if FLOPS_FORMULAS[formula].counts_router else "not the router")
    assert flops_counts("megatron-deepspeed", config) is None
    assert flops_counts("megatron-core-v0.12", CATALOG.workloads["llama3.1-8b"].model) == "every weight (a dense model)"


def test_llama_3_2_1b_by_hand():
    """Llama 3.2 1B: L 16, h 2048, 32 heads of 64, 8 KV heads (k and v 512 wide), SwiGLU f 8192,
    V 128,256 (a multiple of 128: no padding), tied output; B 1, s 8192."""
    config = CATALOG.workloads["llama3.2-1b"].model
    tokens, s = 8192, 8192
    # per token and layer, forward: q and o 2 x 2048^2, k and v 2 x 2048 x 512 = 10,485,760 weights;
    # scores 2 x 2048 x s (v0.12 halves it); MLP 3 x 2048 x 8192 = 50,331,648; logits 2048 x 128,256
    projections, mlp, logits = 10_485_760, 50_331_648, 262_668_288
    v0_12 = 6 * tokens * (16 * (projections + 2048 * s + mlp) + logits)
    v0_7 = 6 * tokens * (16 * (projections + 2 * 2048 * s + mlp) + logits)
    # v0.12: 6 x 8192 x (16 x (10,485,760 + 16,777,216 + 50,331,648) + 262,668,288) = 49,152 x 1,504,182,272
    assert model_flops_per_iteration(config, 1, s) == v0_12 == 73_933_567_033_344
    assert model_flops_per_iteration(config, 1, s, formula="megatron-core-v0.7") == v0_7
    # 6N: non-embedding 16 x (10,485,760 + 50,331,648 + 2 x 2048 RMSNorm gains) + 2048 = 973,146,112;
    # torchtitan keeps the tied embedding: every parameter, 1,235,814,400 (the model's count)
    assert count_parameters(config).non_embedding == 973_146_112
    assert count_parameters(config).total == 1_235_814_400
    attention = 12 * 16 * 32 * 64 * s
    assert model_flops_per_iteration(config, 1, s, formula="palm") == tokens * (6 * 973_146_112 + attention)
    assert model_flops_per_iteration(config, 1, s, formula="torchtitan") == tokens * (6 * 1_235_814_400 + attention)


def test_untied_output_layer_is_in_n_for_palm_and_counted_once_everywhere():
    """Llama 3.1 8B unties its output layer: palm's non-embedding N holds it, so palm and torchtitan
    agree; the Megatron counts do not change with tying (the logits are one product either way)."""
    untied = CATALOG.workloads["llama3.1-8b"].model
    tied = dataclasses.replace(untied, untie_embeddings_and_output_weights=False)
    output = 128_256 * 4096
    assert count_parameters(untied).non_embedding - count_parameters(tied).non_embedding == output
    every_untied, every_tied = flops_by_formula(untied, 4, 2048), flops_by_formula(tied, 4, 2048)
    assert every_untied["palm"] == every_untied["torchtitan"]
    assert every_untied["palm"] - every_tied["palm"] == 6 * 4 * 2048 * output  # palm: only the untied one
    assert every_tied["torchtitan"] - every_tied["palm"] == 6 * 4 * 2048 * output  # torchtitan: tied or not
    for name in ("megatron-core-v0.12", "megatron-core-v0.7", "megatron-deepspeed", "torchtitan"):
        assert every_untied[name] == every_tied[name], name


@pytest.mark.parametrize("name", MODELS)
def test_terms_add_up_and_six_n_is_the_parameter_count(name):
    config = CATALOG.workloads[name].model
    counts = count_parameters(config)
    untied = counts.output_weights if config.untie_embeddings_and_output_weights else 0
    assert counts.attention_weights + counts.mlp_weights + counts.outside_matmuls + untied == counts.non_embedding
    for formula in FLOPS_FORMULAS:
        terms = flops_terms(config, 2, 512, formula=formula)
        assert terms.total == model_flops_per_iteration(config, 2, 512, formula=formula)
    palm = flops_terms(config, 2, 512, formula="palm")
    assert palm.total - palm.attention_scores == 6 * 2 * 512 * counts.non_embedding


def test_grouped_query_attention_and_swiglu_move_the_megatron_counts_as_their_terms_say():
    """One switch at a time on a GPT-2 shape: fewer KV heads shrink only the projections
    (k and v by the group factor), SwiGLU adds the gate (MLP x 3/2), a narrower MLP shrinks it."""
    base = GPTConfig(4, 512, 8, 1024)
    gqa = dataclasses.replace(base, num_query_groups=2)
    swiglu = dataclasses.replace(base, swiglu=True)
    narrow = dataclasses.replace(base, ffn_hidden_size=1024)
    for formula in ("megatron-core-v0.12", "megatron-core-v0.7"):
        terms = {c: flops_terms(c, 2, 256, formula=formula) for c in (base, gqa, swiglu, narrow)}
        # q and o unchanged, k and v at 2 of 8 heads: (2 + 2/4) / 4 of the projections
        assert terms[gqa].attention_projections == terms[base].attention_projections * (2 + 2 / 4) / 4
        assert terms[swiglu].mlp == terms[base].mlp * 3 / 2 and terms[narrow].mlp == terms[base].mlp / 2
        for changed in (gqa, swiglu, narrow):
            assert terms[changed].attention_scores == terms[base].attention_scores
            assert terms[changed].output_layer == terms[base].output_layer


def test_megatron_deepspeed_counts_gpt2s_shape_and_says_so():
    """Its throughput_calculator (before 2024-08) reads L, h, s and V alone: a Llama shape counts as
    the GPT-2 shape of the same L, h and V, and the run is told so (shape_caveat)."""
    llama = CATALOG.workloads["llama3.1-8b"].model
    gpt2 = GPTConfig(llama.num_layers, llama.hidden_size, llama.num_attention_heads, 8192,
                     vocab_size=llama.vocab_size)
    assert model_flops_per_iteration(llama, 4, 2048, formula="megatron-deepspeed") == model_flops_per_iteration(
        gpt2, 4, 2048, formula="megatron-deepspeed")
    assert shape_caveat("megatron-deepspeed", gpt2) is None
    caveat = shape_caveat("megatron-deepspeed", llama)
    assert caveat is not None
    for said in ("grouped-query attention with 8 KV heads", "a SwiGLU MLP", "an MLP 14336 wide, not 16384",
                 "megatron-core-v0.12 counts them"):
        assert said in caveat
    # the formulas that count these shapes have nothing to say
    assert all(shape_caveat(name, llama) is None for name in FLOPS_FORMULAS if name != "megatron-deepspeed")


def test_a_run_counted_by_a_gpt2_formula_on_a_llama_model_is_warned():
    from hwbench.device.base import MemoryStats
    from hwbench.harness.merge import RankReport, merge_ranks
    from hwbench.result.model import RunResult
    from hwbench.spec import build_run_spec, find_workload

    no_memory = MemoryStats(None, None, None, None, None, source="test")

    def warnings(formula: str) -> list[str]:
        spec = build_run_spec({"model": "llama-tiny", "device": "cpu", "steps": 2, "warmup": 1, "telemetry": False,
                               "flops_formula": formula}, CATALOG, check_paths=False)
        steps = spec.warmup + spec.steps
        report = RankReport(rank=0, step_times_s=[0.1] * spec.steps, memory=no_memory, losses=[3.0] * steps,
                            grad_norms=[1.0] * steps, lrs=[1e-4] * steps, loss_scales=[None] * steps,
                            skipped=[False] * steps, wall_time_s=0.2)
        result = RunResult(run_id="r", status="ok", spec={}, device={})
        merge_ranks(result, spec, find_workload(CATALOG, "llama-tiny"), [report])
        return result.warnings

    assert any(w.startswith("the megatron-deepspeed FLOPs formula counts") for w in warnings("megatron-deepspeed"))
    assert not any("FLOPs formula counts" in w for w in warnings("megatron-core-v0.12"))


def merged_moe_metrics(formula: str, peak_flops: float = 1e15):
    """A moe-tiny run's metrics as merge_ranks makes them (one rank, 0.1 s steps) under ``formula``,
    on a device of ``peak_flops``."""
    from hwbench.device.base import MemoryStats
    from hwbench.harness.merge import RankReport, merge_ranks
    from hwbench.result.model import RunResult
    from hwbench.spec import build_run_spec, find_workload

    spec = build_run_spec({"model": "moe-tiny", "device": "cpu", "steps": 2, "warmup": 1, "telemetry": False,
                           "flops_formula": formula}, CATALOG, check_paths=False)
    steps = spec.warmup + spec.steps
    report = RankReport(rank=0, step_times_s=[0.1] * spec.steps, memory=MemoryStats(None, None, None, None, None,
                                                                                      source="test"),
                        losses=[3.0] * steps, grad_norms=[1.0] * steps, lrs=[1e-4] * steps,
                        loss_scales=[None] * steps, skipped=[False] * steps, wall_time_s=0.2)
    result = RunResult(run_id="r", status="ok", spec={}, device={"peak_flops": peak_flops})
    merge_ranks(result, spec, find_workload(CATALOG, "moe-tiny"), [report])
    return spec, result


def test_an_moe_run_has_tflops_and_mfu_on_active_parameters_where_the_formula_counts_it():
    spec, result = merged_moe_metrics("megatron-core-v0.12")
    metrics = result.metrics
    expected = model_flops_per_iteration(spec.model_config(CATALOG.workloads["moe-tiny"].model),
                                         spec.global_batch_size, spec.seq_length)
    assert metrics.flops_per_iteration == expected
    assert metrics.tflops_per_device == pytest.approx(expected / 0.1 / 1e12)
    assert metrics.mfu == pytest.approx(expected / 0.1 / 1e15)
    assert metrics.flops_counts.startswith("active parameters: each token's 2 of 4 routed experts")
    assert metrics.why("mfu") is None and result.status == "ok"
    from hwbench.report.summary import run_summary_rows

    assert dict(run_summary_rows(result))["TFLOP/s per device"].endswith(
        "(FLOPs formula: megatron-core-v0.12, active parameters)")
    # the formula without expert terms: its figures null, with its reason, beside the others
    figures = metrics.by_formula["megatron-deepspeed"]
    assert (figures.flops_per_iteration, figures.tflops_per_device, figures.mfu) == (None, None, None)
    assert "no mixture-of-experts term" in figures.why("mfu")
    assert metrics.by_formula["torchtitan"].mfu > 0


def test_an_moe_run_under_a_formula_without_expert_terms_has_null_figures_with_the_reason():
    _, result = merged_moe_metrics("megatron-deepspeed")
    metrics = result.metrics
    assert (metrics.flops_per_iteration, metrics.tflops_per_device, metrics.mfu, metrics.flops_counts) == (
        None, None, None, None)
    for figure in ("tflops_per_device", "mfu", "mfu_measured_ceiling"):
        assert "no mixture-of-experts term" in metrics.why(figure), figure
    assert not any("FLOPs formula counts" in w for w in result.warnings)  # null, not a figure with a caveat
    assert result.status == "ok" and metrics.by_formula["megatron-core-v0.12"].mfu > 0
    from hwbench.report.summary import run_summary_rows

    row = dict(run_summary_rows(result))["TFLOP/s per device"]
    assert row.startswith("null: the megatron-deepspeed FLOPs formula") and "no mixture-of-experts term" in row


def test_the_estimate_and_the_merge_count_one_fallback_for_a_formula_that_cannot_count_the_model():
    """moe-tiny under megatron-deepspeed (no expert term): the duration estimate's work and the
    merge's speed check both count the default formula's FLOPs (work_formula), the device's work
    whatever the asked formula reports: a peak just under that rate makes the run implausible,
    one just over it does not, and the estimate counts the same FLOPs per step."""
    from hwbench.device import select_backend
    from hwbench.harness.estimate import run_work

    spec, result = merged_moe_metrics("megatron-deepspeed")
    counting, reason = work_formula("megatron-deepspeed", spec.model_config(CATALOG.workloads["moe-tiny"].model))
    assert counting == DEFAULT_FLOPS_FORMULA and reason is not None and "no mixture-of-experts term" in reason
    per_step = result.metrics.by_formula[counting].flops_per_iteration
    assert per_step and result.metrics.flops_per_iteration is None
    assert run_work(spec, CATALOG, select_backend("cpu")).flops == pytest.approx(per_step * (spec.warmup + spec.steps))
    rate = per_step / 0.1  # one rank, 0.1 s steps
    _, under = merged_moe_metrics("megatron-deepspeed", peak_flops=rate * 0.99)
    _, over = merged_moe_metrics("megatron-deepspeed", peak_flops=rate * 1.01)
    assert under.status == "invalid" and under.error and under.error.type == "ImplausibleThroughput"
    assert over.status == "ok"
