"""hwbench's Llama 3 layers held to transformers' LlamaForCausalLM: the same weights copied
across by name give the same logits, and the same AdamW steps on hwbench's batches give the
same losses, to float rounding (fp32, CPU, tiny dims). Removing one ingredient (Llama 3.1's
rope scaling, the rope base) breaks the match, so the check can fail."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from hwbench.engine.optim import build_optimizer
from hwbench.spec import OptimizerSpec
from hwbench.workload import GPTConfig
from hwbench.workload.config import RopeScaling
from hwbench.workload.data import SyntheticTokens
from hwbench.workload.model import GPT, build_model

transformers = pytest.importorskip("transformers", reason="the test extra's transformers holds the reference Llama")

CPU = torch.device("cpu")
# A small Llama 3: 4 query heads sharing 2 key/value heads, SwiGLU, RMSNorm, rope base 500000 with
# Llama 3.1's scaling. original_max_position_embeddings is scaled down with the model (8192 in the
# model cards) so that the short sequences here reach the scaled and the interpolated bands: of
# the 8 frequencies of head size 16, wavelengths 6.3 (kept), 33 (interpolated), 172 and longer
# (divided by the factor).
LLAMA = GPTConfig(
    num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=192,
    swiglu=True, normalization="RMSNorm", norm_epsilon=1e-5, position_embedding_type="rope",
    rotary_base=500000.0, rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                   original_max_position_embeddings=64),
    add_bias_linear=False, max_position_embeddings=256, vocab_size=512,  # a multiple of 128: no padding
)
SEQ, MICRO = 32, 4
LOGITS_ATOL = 1e-5


def reference_config(config: GPTConfig) -> transformers.LlamaConfig:
    """transformers' LlamaConfig of the same shape, with its own attention (eager: repeat_kv,
    softmax; not the SDPA hwbench calls). rope_theta and rope_scaling are the config.json names
    of the model cards (transformers 4.57 reads them; 5 turns them into rope_parameters)."""
    scaling = None if config.rope_scaling is None else {**dataclasses.asdict(config.rope_scaling),
                                                         "rope_type": "llama3"}
    return transformers.LlamaConfig(
        vocab_size=config.padded_vocab_size(), hidden_size=config.hidden_size,
        intermediate_size=config.ffn_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.kv_heads,
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.norm_epsilon,
        rope_theta=config.rotary_base, rope_scaling=scaling, attention_bias=config.add_bias_linear,
        mlp_bias=config.add_bias_linear, tie_word_embeddings=not config.untie_embeddings_and_output_weights,
        hidden_act="silu", attention_dropout=0.0, attn_implementation="eager",
    )


def reference_name(name: str) -> str:
    """hwbench's parameter name -> LlamaForCausalLM's."""
    parts = {"wte.weight": "model.embed_tokens.weight", "ln_f.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    if name in parts:
        return parts[name]
    _, layer, rest = name.split(".", 2)
    module, rest = rest.split(".", 1)  # blocks.<layer>.<module>.<rest>
    module = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn": "self_attn",
              "mlp": "mlp"}[module]
    return f"model.layers.{layer}.{module}.{rest.replace('out_proj.', 'o_proj.')}"


def reference_llama(model: GPT, reference: GPTConfig | None = None) -> torch.nn.Module:
    """transformers' Llama of ``reference`` (else the model's own config) with the model's
    weights: every parameter of each side is filled, none left at its own init."""
    llama = transformers.LlamaForCausalLM(reference_config(reference or model.config)).float()
    assert llama.config._attn_implementation == "eager"
    state = {reference_name(name): value for name, value in model.state_dict().items()}
    llama.load_state_dict(state, strict=True)
    return llama.train()


def trained_scale_weights(model: GPT, seed: int = 0) -> GPT:
    """Weights at a trained model's scale rather than Megatron's init (N(0, 0.02): attention
    then sees nearly equal scores and the positions hardly matter): N(0, 1/fan_in) matrices
    (logits of order 1), norm gains around 1, so every ingredient shows in the logits."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 1:  # norm gains
                parameter.copy_(1.0 + 0.2 * torch.randn(parameter.shape, generator=generator))
            else:
                std = 1.0 / math.sqrt(parameter.shape[1])
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))
    return model


def llama_model(untied: bool, **changes) -> GPT:
    config = dataclasses.replace(LLAMA, untie_embeddings_and_output_weights=untied, **changes)
    return trained_scale_weights(build_model(config, device=CPU, seed=3))


def hwbench_batches(config: GPTConfig, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """hwbench's own training batches: inputs and the next tokens as labels (data.py shifts them)."""
    data = SyntheticTokens(config.vocab_size, SEQ, MICRO, MICRO, seed=11)
    return [data.train_batch() for _ in range(count)]


@pytest.mark.parametrize("untied", [False, True], ids=["tied", "untied"])
def test_llama_logits_match_transformers(untied):
    model = llama_model(untied)
    llama = reference_llama(model)
    assert (llama.lm_head.weight is llama.model.embed_tokens.weight) is (not untied)
    tokens, _ = hwbench_batches(model.config, 1)[0]
    with torch.no_grad():
        ours, theirs = model(tokens), llama(input_ids=tokens).logits
    assert ours.shape == theirs.shape == (MICRO, SEQ, 512)
    assert ours.abs().max() > 1.0  # logits of trained scale, not near zero
    torch.testing.assert_close(ours, theirs, rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize("untied", [False, True], ids=["tied", "untied"])
def test_llama_trains_like_transformers_over_adamw_steps(untied):
    """The same AdamW (hwbench's build_optimizer on each side: lr, betas, eps, weight decay
    off biases and gains) and hwbench's batches; transformers' own loss, given hwbench's
    already shifted labels (shift_labels)."""
    model = llama_model(untied)
    llama = reference_llama(model)
    optimizer_spec = OptimizerSpec(lr=1e-3, min_lr=1e-3, weight_decay=0.1, clip_grad=1.0, lr_warmup_iters=0,
                                   lr_decay_iters=10, lr_decay_style="constant")
    ours_optimizer = build_optimizer(model, optimizer_spec, {"foreach": False})
    theirs_optimizer = build_optimizer(llama, optimizer_spec, {"foreach": False})
    losses = []
    for tokens, labels in hwbench_batches(model.config, 4):
        ours = model(tokens, labels)
        # transformers flattens the labels with view(): a contiguous copy of the same values
        theirs = llama(input_ids=tokens, labels=labels, shift_labels=labels.contiguous()).loss
        for loss, optimizer in ((ours, ours_optimizer), (theirs, theirs_optimizer)):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        losses.append((ours.item(), theirs.item()))
    for step, (ours_loss, theirs_loss) in enumerate(losses, start=1):
        assert ours_loss == pytest.approx(theirs_loss, rel=1e-5), f"step {step}: {losses}"
    assert losses[-1][0] < losses[0][0] - 0.1  # the steps trained: the comparison is of moving weights
    # and the weights moved alike: the last step's logits agree too
    tokens, _ = hwbench_batches(model.config, 1)[0]
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), llama(input_ids=tokens).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("changes", [
    {"rope_scaling": None},  # Llama 3's rope without 3.1's scaling
    {"rotary_base": 10000.0},  # Llama 2's rope base
], ids=["no-rope-scaling", "rope-base-10000"])
def test_removing_one_ingredient_breaks_the_match(changes):
    """hwbench without the ingredient against transformers with it, the same weights: the
    logits part by far more than the tolerance."""
    model = llama_model(untied=False, **changes)
    llama = reference_llama(model, reference=LLAMA)
    tokens, _ = hwbench_batches(model.config, 1)[0]
    with torch.no_grad():
        difference = (model(tokens) - llama(input_ids=tokens).logits).abs().max().item()
    assert difference > 1000 * LOGITS_ATOL


def test_rope_frequencies_are_transformers_llama3_ones():
    """hwbench's inverse frequencies, scaled as Llama 3.1 scales them, for the catalog's
    Llama 3.1 8B shape: transformers' _compute_llama3_parameters, bit for bit."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hwbench.catalog import load_catalog
    from hwbench.workload.layers import inverse_frequencies

    config = load_catalog().workloads["llama3.1-8b"].model
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](reference_config(config))
    ours = inverse_frequencies(config.head_dim, config.rotary_base, config.rope_scaling)
    assert torch.equal(ours, theirs)
    unscaled = inverse_frequencies(config.head_dim, config.rotary_base, None)
    assert (ours < unscaled).sum() >= config.head_dim // 4  # the scaling changed the low frequencies
