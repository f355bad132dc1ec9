"""The GPT workloads: sizes, parameter counts, FLOPs, the model and its data."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from hwbench.catalog import load_catalog
from hwbench.workload import GPTConfig, count_parameters, model_flops_per_iteration
from hwbench.workload.data import SyntheticTokens
from hwbench.workload.model import GPT, lm_loss

PUBLISHED_SIZES = {  # ModelZoo test/train_full_8p.sh: layers, hidden, heads, seq
    "345m": (24, 1024, 16, 1024),
    "1.3b": (24, 2048, 16, 1024),
    "2.7b": (32, 2560, 32, 2048),
    "3.7b": (32, 3072, 32, 2048),
    "345m-nomp": (24, 1024, 16, 1024),
}


def analytic_parameters(L, h, positions, vocab):
    # tied embedding + positions + L x (2 LN + qkv + proj + 2 MLP) + final LN
    per_layer = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (4 * h * h + 4 * h) + (4 * h * h + h)
    return vocab * h + positions * h + L * per_layer + 2 * h


@pytest.mark.parametrize("name", sorted(PUBLISHED_SIZES))
def test_catalog_sizes_have_published_shapes_and_parameter_counts(name):
    workload = load_catalog().workloads[name]
    L, h, heads, seq = PUBLISHED_SIZES[name]
    m = workload.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, workload.training.seq_length) == (L, h, heads, seq)
    assert count_parameters(m).total == analytic_parameters(L, h, m.max_position_embeddings, 50304)


def test_345m_lands_near_355m_with_the_padded_gpt2_vocabulary():
    total = count_parameters(load_catalog().workloads["345m"].model).total
    assert 354e6 < total < 356e6


@pytest.mark.parametrize("name,low,high", [("1.3b", 1.25e9, 1.35e9), ("2.7b", 2.6e9, 2.7e9), ("3.7b", 3.7e9, 3.85e9)])
def test_larger_sizes_land_near_their_names(name, low, high):
    assert low < count_parameters(load_catalog().workloads[name].model).total < high


def test_published_settings_of_345m_and_table3():
    catalog = load_catalog()
    t, p = catalog.workloads["345m"].training, catalog.workloads["345m"].published
    assert (t.micro_batch_size, t.global_batch_size, t.precision, t.recompute) == (4, 16, "fp16", True)
    assert (p.devices, p.tp, p.pp, t.lr, t.min_lr) == (8, 1, 2, 1.5e-4, 1.5e-5)
    assert t.lr_warmup_iters == 3200  # 0.01 x 320000 decay iterations
    nomp = catalog.workloads["345m-nomp"]
    assert (nomp.training.global_batch_size, nomp.training.loss_scale, nomp.training.recompute) == (64, 65536, False)
    assert nomp.published.tables == ("table3",)


def test_vocabulary_is_padded_like_megatron():
    config = GPTConfig(24, 1024, 16, 1024)
    assert config.padded_vocab_size(1) == 50304
    assert config.padded_vocab_size(2) == 50432


@pytest.mark.parametrize("name", ["tiny", "small", "345m", "1.3b", "llama-tiny", "llama-small", "llama3.2-1b",
                                  "llama3.2-3b", "llama3.1-8b"])
def test_model_built_on_meta_device_has_the_counted_parameters(name):
    config = load_catalog().workloads[name].model
    with torch.device("meta"):
        model = GPT(config)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(config).total


# the model cards' figures (config.json shapes; count_parameters gives them exactly)
LLAMA_CARD_PARAMETERS = {"llama3.2-1b": 1_235_814_400, "llama3.2-3b": 3_212_749_824, "llama3.1-8b": 8_030_261_248}


@pytest.mark.parametrize("name", sorted(LLAMA_CARD_PARAMETERS))
def test_the_built_llama_has_the_model_cards_parameters_and_layers(name):
    config = load_catalog().workloads[name].model
    with torch.device("meta"):
        model = GPT(config)
    names = {n for n, _ in model.named_parameters()}
    assert sum(p.numel() for p in model.parameters()) == LLAMA_CARD_PARAMETERS[name]
    assert model.wpe is None and not any(n.endswith(".bias") for n in names)  # rotary positions, no biases
    assert isinstance(model.blocks["0"].ln_1, torch.nn.RMSNorm) and isinstance(model.ln_f, torch.nn.RMSNorm)
    attention = model.blocks["0"].attn
    assert attention.k_proj.weight.shape == (config.kv_heads * config.head_dim, config.hidden_size)
    assert ("output.weight" in names) is config.untie_embeddings_and_output_weights  # 8B untied, 1B and 3B tied


def test_megatron_flops_formulas_by_hand():
    config = GPTConfig(24, 1024, 16, 1024)
    B, s, L, h, V = 16, 1024, 24, 1024, 50304
    # Megatron-LM core_v0.12.0 and later: the scores of causal attention counted once, s/(12h)
    causal = 72 * B * s * L * h * h * (1 + s / (12 * h) + V / (12 * L * h))
    assert model_flops_per_iteration(config, B, s) == pytest.approx(causal, rel=1e-12)  # the default
    assert model_flops_per_iteration(config, B, s, formula="megatron-core-v0.12") == pytest.approx(causal, rel=1e-12)
    # core_v0.5 to v0.11: the full score matrix, s/(6h); megatron-lm is its old name
    full = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    assert model_flops_per_iteration(config, B, s, formula="megatron-core-v0.7") == pytest.approx(full, rel=1e-12)
    assert model_flops_per_iteration(config, B, s, formula="megatron-lm") == pytest.approx(full, rel=1e-12)
    # 345m, global batch 16, seq 1024, by hand: 72*16*1024*24*1024^2 = 29,686,813,949,952
    # times (1 + 1024/6144 + 50304/294912) = 1.3372396 -> 3.96984e13 FLOPs per iteration
    assert full == pytest.approx(29_686_813_949_952 * 1.3372396, rel=1e-6)


@pytest.mark.parametrize("model, seq, higher", [("345m", 1024, 0.0665), ("1.3b", 2048, 0.0713)])
def test_the_full_score_count_reads_higher_than_the_causal_one(model, seq, higher):
    """The old count's MFU over the current Megatron-LM's, at the published sequence lengths."""
    config = load_catalog().workloads[model].model
    config = dataclasses.replace(config, max_position_embeddings=max(seq, config.max_position_embeddings))
    full = model_flops_per_iteration(config, 8, seq, formula="megatron-core-v0.7")
    assert full / model_flops_per_iteration(config, 8, seq) - 1 == pytest.approx(higher, abs=5e-4)


def test_every_formula_is_computed_by_its_canonical_name():
    from hwbench.workload.flops import FLOPS_FORMULAS, canonical_formula, flops_by_formula

    config = GPTConfig(24, 1024, 16, 1024)
    every = flops_by_formula(config, 16, 1024, recompute=True)
    assert set(every) == set(FLOPS_FORMULAS) == {"megatron-core-v0.12", "megatron-core-v0.7", "megatron-deepspeed",
                                                  "palm", "torchtitan"}
    for name, flops in every.items():
        assert flops == model_flops_per_iteration(config, 16, 1024, recompute=True, formula=name)
    assert canonical_formula("megatron-lm") == "megatron-core-v0.7"
    assert "v0.12" in FLOPS_FORMULAS["megatron-core-v0.12"].source and "v0.11" in FLOPS_FORMULAS[
        "megatron-core-v0.7"].source


def test_model_flops_ignore_recompute_but_hardware_flops_count_it():
    config = GPTConfig(24, 2048, 16, 1024)
    plain = model_flops_per_iteration(config, 32, 1024)
    assert model_flops_per_iteration(config, 32, 1024, recompute=True) == plain
    hw3 = model_flops_per_iteration(config, 32, 1024, formula="megatron-deepspeed")
    hw4 = model_flops_per_iteration(config, 32, 1024, formula="megatron-deepspeed", recompute=True)
    assert hw4 / hw3 == pytest.approx(4 / 3)


@pytest.mark.parametrize("name", ["megatron-core-v0.12", "megatron-core-v0.7", "megatron-deepspeed", "palm",
                                  "torchtitan"])
def test_each_formula_says_whether_it_counts_recompute_as_its_count_does(name):
    """FlopsFormula.counts_recompute (what labels a figure HFU) agrees with the formula's own count:
    only megatron-deepspeed rises with recompute (x4/3, Megatron-DeepSpeed's
    checkpoint_activations_factor), so only its figure of a recompute run is HFU."""
    from hwbench.workload.flops import DEFAULT_FLOPS_FORMULA, FLOPS_FORMULAS, counts_hardware_flops, utilisation_label

    config = GPTConfig(24, 2048, 16, 1024)
    plain = model_flops_per_iteration(config, 32, 1024, formula=name)
    again = model_flops_per_iteration(config, 32, 1024, formula=name, recompute=True)
    assert FLOPS_FORMULAS[name].counts_recompute == (again != plain) == (name == "megatron-deepspeed")
    assert utilisation_label(name, True) == ("HFU" if name == "megatron-deepspeed" else "MFU")
    assert utilisation_label(name, False) == "MFU" and not counts_hardware_flops(name, None)
    # the exports (hwbench.exports.figures) read the default formula's figures as MFU: it counts model FLOPs
    assert not FLOPS_FORMULAS[DEFAULT_FLOPS_FORMULA].counts_recompute


def test_palm_formula_is_six_n_plus_attention():
    config = GPTConfig(12, 768, 12, 1024)
    n = count_parameters(config).non_embedding
    expected = 8 * 1024 * (6 * n + 12 * 12 * 12 * 64 * 1024)
    assert model_flops_per_iteration(config, 8, 1024, formula="palm") == expected


def test_unknown_formula_is_refused():
    with pytest.raises(ValueError, match="unknown FLOPs formula"):
        model_flops_per_iteration(GPTConfig(2, 64, 2, 32), 1, 32, formula="guess")


def _tiny_model(recompute=False):
    torch.manual_seed(0)
    return GPT(GPTConfig(2, 64, 4, 32, vocab_size=1000), recompute=recompute)


def test_initial_loss_is_near_log_vocab():
    model = _tiny_model()
    tokens = torch.randint(0, 1000, (4, 33))
    loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    assert abs(loss.item() - math.log(model.vocab_size)) < 0.1


def test_attention_goes_through_sdpa(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("is_causal"))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    model = _tiny_model()
    tokens = torch.randint(0, 1000, (2, 17))
    model(tokens[:, :-1])
    assert calls == [True, True]  # one causal call per block


def test_recompute_gives_the_same_loss_and_gradients():
    tokens = torch.randint(0, 1000, (2, 33))
    results = []
    for recompute in (False, True):
        model = _tiny_model(recompute)
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        results.append((loss.item(), model.blocks["0"].mlp.fc1.weight.grad.clone()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    torch.testing.assert_close(results[0][1], results[1][1])


def test_output_layer_is_tied_to_the_word_embedding():
    model = _tiny_model()
    names = [name for name, _ in model.named_parameters()]
    assert "wte.weight" in names and "output.weight" not in names  # one parameter, counted once
    assert model.output.weight is model.wte.weight


def test_synthetic_tokens_are_seeded_and_learnable():
    a = SyntheticTokens(50257, 16, 4, 4, seed=7)
    b = SyntheticTokens(50257, 16, 4, 4, seed=7)
    c = SyntheticTokens(50257, 16, 4, 4, seed=8)
    first_a, first_b, first_c = a.train_batch(), b.train_batch(), c.train_batch()
    assert torch.equal(first_a[0], first_b[0]) and not torch.equal(first_a[0], first_c[0])
    tokens, labels = first_a
    assert tokens.shape == labels.shape == (4, 16)
    assert torch.equal(tokens[:, 1:], labels[:, :-1])  # labels are the next tokens
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 50257
    # Zipf(1) over the GPT-2 vocabulary: entropy ~7.57 nats, well under log(V) = 10.8
    assert 7.4 < a.entropy_nats < 7.7


def test_build_model_gives_weights_that_depend_on_the_seed_alone():
    from hwbench.workload.model import build_model

    config = GPTConfig(2, 64, 4, 32, vocab_size=1000)
    a = build_model(config, device=torch.device("cpu"), seed=9)
    torch.manual_seed(12345)  # the global generator must not matter
    b = build_model(config, device=torch.device("cpu"), seed=9)
    c = build_model(config, device=torch.device("cpu"), seed=10)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.wte.weight, c.wte.weight)
    std = a.blocks["0"].mlp.fc2.weight.std().item()
    assert std == pytest.approx(0.02 / math.sqrt(4), rel=0.1)  # output projections scaled by 1/sqrt(2L)


def test_a_pipeline_stage_gets_the_same_weights_as_the_whole_model():
    from hwbench.workload.model import build_model, init_parameters

    config = GPTConfig(4, 64, 4, 32, vocab_size=1000)
    whole = build_model(config, device=torch.device("cpu"), seed=5)
    with torch.device("meta"):
        stage = GPT(config)
    stage.wte = stage.wpe = None  # the last of two stages: blocks 2 and 3, ln_f and output
    del stage.blocks["0"], stage.blocks["1"]
    stage.output.weight = torch.nn.Parameter(torch.empty(stage.output.weight.shape, device="meta"))  # untied copy
    stage.to_empty(device="cpu")
    init_parameters(stage, seed=5)
    torch.testing.assert_close(stage.output.weight, whole.wte.weight, rtol=0, atol=0)
    torch.testing.assert_close(stage.blocks["3"].mlp.fc2.weight, whole.blocks["3"].mlp.fc2.weight, rtol=0, atol=0)


def test_tensor_parallel_padding_leaves_the_real_vocabulary_rows_unchanged():
    from hwbench.workload.model import build_model

    config = GPTConfig(2, 64, 4, 32, vocab_size=1100, make_vocab_size_divisible_by=128)
    one = build_model(config, device=torch.device("cpu"), seed=5, tensor_parallel=1)
    four = build_model(config, device=torch.device("cpu"), seed=5, tensor_parallel=4)
    assert one.wte.weight.shape[0] == 1152 and four.wte.weight.shape[0] == 1536
    torch.testing.assert_close(four.wte.weight[:1100], one.wte.weight[:1100], rtol=0, atol=0)


def test_the_output_layer_stays_tied_after_leaving_the_meta_device():
    from hwbench.workload.model import build_model

    model = build_model(GPTConfig(2, 64, 4, 32, vocab_size=1000), device=torch.device("cpu"), seed=1)
    assert model.output.weight is model.wte.weight
    assert [n for n, _ in model.named_parameters()].count("output.weight") == 0


def test_each_step_trains_at_megatron_lms_rate():
    """Megatron-LM steps its scheduler after the optimizer (and step(0) at construction):
    step k trains at the schedule after k - 1 steps, so the first warm-up step runs at 0."""
    from hwbench.engine.optim import learning_rate, step_learning_rate
    from hwbench.spec import OptimizerSpec

    spec = OptimizerSpec(lr=1e-3, min_lr=1e-4, weight_decay=0.01, clip_grad=1.0, lr_warmup_iters=4,
                         lr_decay_iters=20, lr_decay_style="cosine")
    rates = [step_learning_rate(spec, step) for step in range(1, 7)]
    assert rates[:5] == [0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3]
    assert rates[5] == learning_rate(spec, 5) < 1e-3  # decay starts after the warm-up
    assert step_learning_rate(spec, 21) == learning_rate(spec, 20) == pytest.approx(1e-4)


def test_the_weights_do_not_depend_on_how_many_threads_draw_them():
    """init_parameters draws the parameters on the intra-op threads at once: the same values,
    bit for bit, as one thread drawing them one after another."""
    from hwbench.workload.model import build_model

    config = load_catalog().workloads["tiny"].model
    threads = torch.get_num_threads()
    built = {}
    try:
        for count in (1, 4):
            torch.set_num_threads(count)
            built[count] = dict(build_model(config, device=torch.device("cpu"), seed=7).named_parameters())
    finally:
        torch.set_num_threads(threads)
    assert built[1].keys() == built[4].keys() and len(built[1]) > 10
    for name, value in built[1].items():
        assert torch.equal(value, built[4][name]), name


# --- the Llama layers (their numerics against transformers: tests/test_llama.py) -------------

LLAMA_TINY = GPTConfig(2, 64, 4, 32, vocab_size=1000, num_query_groups=2, ffn_hidden_size=96, swiglu=True,
                       normalization="RMSNorm", position_embedding_type="rope", rotary_base=500000.0,
                       add_bias_linear=False)


def test_llama_init_covers_every_new_parameter():
    """Unit RMSNorm gains; N(0, 0.02) projections, the attention and MLP output projections
    (out_proj, down_proj) scaled by 1/sqrt(2L); an untied output layer drawn on its own."""
    from hwbench.workload.model import build_model

    config = dataclasses.replace(LLAMA_TINY, untie_embeddings_and_output_weights=True)
    model = build_model(config, device=torch.device("cpu"), seed=4)
    parameters = dict(model.named_parameters())
    gains = [name for name in parameters if ".ln_" in name or name.startswith("ln_")]
    assert len(gains) == 2 * config.num_layers + 1 and all(torch.equal(parameters[n], torch.ones(64)) for n in gains)
    block = model.blocks["1"]
    assert block.mlp.down_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.1)
    assert block.attn.out_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.1)
    assert block.mlp.gate_proj.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.output.weight is not model.wte.weight and "output.weight" in parameters
    assert model.output.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert not torch.equal(model.output.weight, model.wte.weight)  # its own stream, not the embedding's
    tied = build_model(LLAMA_TINY, device=torch.device("cpu"), seed=4)
    assert tied.output.weight is tied.wte.weight and torch.equal(tied.wte.weight, model.wte.weight)


def test_an_untied_output_layer_trains_apart_from_the_embedding():
    from hwbench.workload.model import build_model

    config = dataclasses.replace(LLAMA_TINY, untie_embeddings_and_output_weights=True)
    model = build_model(config, device=torch.device("cpu"), seed=4)
    tokens = torch.randint(0, 1000, (2, 17))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    # the output weight's gradient reaches every row; the embedding's only the rows of tokens seen
    assert model.output.weight.grad.abs().sum(dim=1).count_nonzero() == model.vocab_size
    assert model.wte.weight.grad.abs().sum(dim=1).count_nonzero() <= 32


def test_fused_qkv_of_a_gqa_model_is_megatrons_per_group_layout_and_computes_the_same():
    """[q of the group's G heads, k, v] per key/value group: the same weights as the separate
    projections, the same logits and gradients."""
    from hwbench.workload.model import QKV_PARTS, build_model

    separate = build_model(LLAMA_TINY, device=torch.device("cpu"), seed=7)
    fused = build_model(LLAMA_TINY, device=torch.device("cpu"), seed=7, fused_qkv=True)
    D, G = LLAMA_TINY.head_dim, 2  # 4 query heads over 2 key/value heads
    rows = fused.blocks["0"].attn.qkv_proj.weight.view(2, G + 2, D, 64)  # (groups, parts, D, h)
    attention = separate.blocks["0"].attn
    for group in range(2):
        for head in range(G):
            query = attention.q_proj.weight[(group * G + head) * D:(group * G + head + 1) * D]
            assert torch.equal(rows[group, head], query), (group, head)
        for offset, part in enumerate(QKV_PARTS[1:], start=G):
            assert torch.equal(rows[group, offset], getattr(attention, part).weight[group * D:(group + 1) * D])
    tokens = torch.randint(0, 1000, (2, 17))
    losses = [model(tokens[:, :-1], tokens[:, 1:]) for model in (separate, fused)]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-6)
    for loss in losses:
        loss.backward()
    per_group = fused.blocks["0"].attn.qkv_proj.weight.grad.view(2, G + 2, D, 64)
    torch.testing.assert_close(per_group[:, G:G + 1].reshape(-1, 64), attention.k_proj.weight.grad)


def test_gqa_attention_shares_each_key_value_head_with_its_query_group(monkeypatch):
    """SDPA gets H query heads and KV key/value heads with enable_gqa (no copies of k and v)."""
    shapes = []
    real = F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        shapes.append((q.shape[1], k.shape[1], v.shape[1], kwargs.get("enable_gqa")))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    torch.manual_seed(0)
    GPT(LLAMA_TINY)(torch.randint(0, 1000, (2, 16)))
    assert shapes == [(4, 2, 2, True)] * 2


def test_rope_tables_are_made_once_per_device_and_length():
    """The timed steps reuse the tables: the same tensors on the second call, new ones for a
    new length; made as plain tensors even when first asked for under inference_mode."""
    torch.manual_seed(0)
    model = GPT(LLAMA_TINY)
    tokens = torch.randint(0, 1000, (2, 16))
    with torch.inference_mode():
        model(tokens)
    first = model.rotary.tables(16, torch.device("cpu"))
    assert not first[0].is_inference()
    assert model.rotary.tables(16, torch.device("cpu"))[0] is first[0]
    assert model.rotary.tables(8, torch.device("cpu"))[0] is not first[0]
    torch.testing.assert_close(model.rotary.tables(8, torch.device("cpu"))[0], first[0][:8])
    model(tokens[:, :-1], tokens[:, 1:]).backward()  # training after an eval made the tables


def test_llama_recompute_gives_the_same_loss_and_gradients():
    tokens = torch.randint(0, 1000, (2, 17))
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = GPT(LLAMA_TINY, recompute=recompute)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        results.append((loss.item(), model.blocks["0"].mlp.gate_proj.weight.grad.clone()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    torch.testing.assert_close(results[0][1], results[1][1])
