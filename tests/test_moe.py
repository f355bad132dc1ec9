"""hwbench's mixture of experts held to transformers' MixtralForCausalLM and Qwen3MoeForCausalLM:
the same weights copied across by name give the same logits, and the same AdamW steps on
hwbench's batches the same losses, with the load-balancing loss in both objectives (fp32, CPU,
tiny dims). Removing one ingredient (the renormalised top-k weights, QK-norm, the auxiliary
loss's gradient) breaks the match, so the check can fail (the router's capacity, figures and
the counts: tests/test_moe_layer.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from hwbench.engine.optim import build_optimizer
from hwbench.spec import OptimizerSpec
from hwbench.workload import GPTConfig
from hwbench.workload.data import SyntheticTokens
from hwbench.workload.model import GPT, build_model
from hwbench.workload.moe import moe_layers

transformers = pytest.importorskip("transformers", reason="the test extra's transformers holds the reference models")
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func  # noqa: E402

CPU = torch.device("cpu")
# A small Mixtral: 4 query heads sharing 2 key/value heads, 4 SwiGLU experts of width 32, top-2,
# rope base 1e6, an untied output layer; a load-balancing coefficient large enough that its
# gradient moves the router visibly in a few steps.
MIXTRAL = GPTConfig(
    num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, swiglu=True, normalization="RMSNorm",
    norm_epsilon=1e-5, position_embedding_type="rope", rotary_base=1e6, add_bias_linear=False,
    untie_embeddings_and_output_weights=True, max_position_embeddings=256, vocab_size=512,  # no padding
    num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_aux_loss_coeff=0.1,
)
# Qwen3-MoE's switches on it: a head size of its own (32, not 64 / 4) and QK-norm
QWEN3 = dataclasses.replace(MIXTRAL, kv_channels=32, qk_layernorm=True, norm_epsilon=1e-6)
SEQ, MICRO = 32, 4
LOGITS_ATOL = 1e-5


def reference_config(config: GPTConfig, aux_loss_coef: float = 0.0):
    """transformers' config of the same shape: eager attention (repeat_kv, softmax) and eager
    experts (a loop over the experts with index_add), not the SDPA and grouped GEMM hwbench runs."""
    common = dict(
        vocab_size=config.padded_vocab_size(), hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.kv_heads,
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.norm_epsilon,
        rope_theta=config.rotary_base, tie_word_embeddings=not config.untie_embeddings_and_output_weights,
        num_experts_per_tok=config.moe_router_topk, router_aux_loss_coef=aux_loss_coef, output_router_logits=True,
        attention_dropout=0.0, attn_implementation="eager", experts_implementation="eager",
    )
    if config.qk_layernorm:
        return transformers.Qwen3MoeConfig(
            **common, head_dim=config.head_dim, num_experts=config.num_experts,
            moe_intermediate_size=config.moe_ffn_size, norm_topk_prob=not config.moe_router_pre_softmax,
            decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False)
    return transformers.MixtralConfig(**common, num_local_experts=config.num_experts,
                                      intermediate_size=config.moe_ffn_size, sliding_window=None,
                                      router_jitter_noise=0.0)


def reference_state(model: GPT) -> dict[str, torch.Tensor]:
    """hwbench's weights under transformers' names; each expert's gate and up projections fused
    into its gate_up_proj ([E, 2f, h], gate first), as transformers holds them."""
    state = {}
    for name, value in model.state_dict().items():
        top = {"wte.weight": "model.embed_tokens.weight", "ln_f.weight": "model.norm.weight",
               "output.weight": "lm_head.weight"}
        if name in top:
            state[top[name]] = value
            continue
        _, layer, module, rest = name.split(".", 3)  # blocks.<layer>.<module>.<rest>
        prefix = f"model.layers.{layer}"
        if module in ("ln_1", "ln_2"):
            state[f"{prefix}.{'input_layernorm' if module == 'ln_1' else 'post_attention_layernorm'}.{rest}"] = value
        elif module == "attn":
            state[f"{prefix}.self_attn.{rest.replace('out_proj.', 'o_proj.')}"] = value
        elif rest == "router.weight":
            state[f"{prefix}.mlp.gate.weight"] = value
        elif rest == "experts.down_proj.weight":
            state[f"{prefix}.mlp.experts.down_proj"] = value
        elif rest == "experts.gate_proj.weight":
            up = model.state_dict()[name.replace("gate_proj", "up_proj")]
            state[f"{prefix}.mlp.experts.gate_up_proj"] = torch.cat([value, up], dim=1)
    return state


def reference_model(model: GPT, reference: GPTConfig | None = None, aux_loss_coef: float = 0.0) -> torch.nn.Module:
    """transformers' model of ``reference`` (else the model's own config) with the model's
    weights: every parameter of each side filled, none left at its own init."""
    config = reference_config(reference or model.config, aux_loss_coef)
    kind = transformers.Qwen3MoeForCausalLM if config.model_type == "qwen3_moe" else transformers.MixtralForCausalLM
    theirs = kind(config).float()
    assert theirs.config._experts_implementation == "eager" and theirs.config._attn_implementation == "eager"
    theirs.load_state_dict(reference_state(model), strict=True)
    return theirs.train()


def trained_scale_weights(model: GPT, seed: int = 0) -> GPT:
    """Weights at a trained model's scale rather than Megatron's init: N(0, 1/fan_in) matrices
    (logits of order 1; router logits of order 1, so the routing differs token by token), norm
    gains around 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.copy_(1.0 + 0.2 * torch.randn(parameter.shape, generator=generator))
            else:
                std = 1.0 / math.sqrt(parameter.shape[-1])
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))
    return model


def moe_model(config: GPTConfig = MIXTRAL, **changes) -> GPT:
    return trained_scale_weights(build_model(dataclasses.replace(config, **changes), device=CPU, seed=3))


def hwbench_batches(config: GPTConfig, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = SyntheticTokens(config.vocab_size, SEQ, MICRO, MICRO, seed=11)
    return [data.train_batch() for _ in range(count)]


def taken_aux_loss(model: GPT) -> float:
    """The load-balancing losses the last training forward added to the objective, summed over layers."""
    return sum(float(layer.figures.take(layer.router.num_experts, CPU)[-1]) for layer in moe_layers(model))


@pytest.mark.parametrize("config", [MIXTRAL, QWEN3], ids=["mixtral", "qwen3-moe"])
def test_moe_logits_match_transformers(config):
    model = moe_model(config)
    theirs = reference_model(model)
    tokens, _ = hwbench_batches(config, 1)[0]
    with torch.no_grad():
        ours, reference = model(tokens), theirs(input_ids=tokens)
    assert ours.shape == reference.logits.shape == (MICRO, SEQ, 512)
    assert ours.abs().max() > 1.0  # logits of trained scale, not near zero
    torch.testing.assert_close(ours, reference.logits, rtol=0, atol=LOGITS_ATOL)
    # the routing is real: every expert of every layer receives tokens, none receives them all
    for router_logits in reference.router_logits:
        chosen = router_logits.topk(2, dim=-1).indices.flatten().bincount(minlength=4)
        assert (chosen > 0).all() and (chosen < MICRO * SEQ).all()


def test_one_layers_objective_is_transformers_loss_with_its_coefficient():
    """transformers adds router_aux_loss_coef x load_balancing_loss_func to its loss; for one
    layer that function is top-k times Megatron's loss, so with coefficient c / k it adds what
    hwbench adds with c: the language-model loss and the auxiliary loss hwbench records sum to
    transformers' loss."""
    config = dataclasses.replace(MIXTRAL, num_layers=1)
    model = moe_model(config)
    theirs = reference_model(model, aux_loss_coef=config.moe_aux_loss_coeff / config.moe_router_topk)
    tokens, labels = hwbench_batches(config, 1)[0]
    ours = model(tokens, labels)
    aux = taken_aux_loss(model)
    reference = theirs(input_ids=tokens, labels=labels, shift_labels=labels.contiguous())
    assert aux == pytest.approx(config.moe_aux_loss_coeff * float(reference.aux_loss) / 2, rel=1e-5)
    assert 0.5 * config.moe_aux_loss_coeff < aux < 2 * config.moe_aux_loss_coeff  # near 1 x coeff: balanced-ish
    assert ours.item() + aux == pytest.approx(reference.loss.item(), rel=1e-6)


def reference_objective(theirs, config: GPTConfig, tokens, labels) -> torch.Tensor:
    """transformers' language-model loss plus Megatron's load-balancing loss of each layer, summed
    over the layers (transformers' own pools every layer's routing into one loss), each layer's from
    transformers' load_balancing_loss_func on that layer's router logits."""
    out = theirs(input_ids=tokens, labels=labels, shift_labels=labels.contiguous())
    per_layer = [load_balancing_loss_func((logits,), config.num_experts, config.moe_router_topk)
                 for logits in out.router_logits]
    return out.loss + config.moe_aux_loss_coeff / config.moe_router_topk * torch.stack(per_layer).sum()


def train_side_by_side(model: GPT, theirs, config: GPTConfig, steps: int) -> list[tuple[float, float]]:
    """The same AdamW (hwbench's build_optimizer on each side) on hwbench's batches; each step's
    objective as each side reports it: hwbench's language-model loss plus the auxiliary loss it
    recorded, transformers' (reference_objective)."""
    spec = OptimizerSpec(lr=1e-3, min_lr=1e-3, weight_decay=0.1, clip_grad=1.0, lr_warmup_iters=0,
                         lr_decay_iters=10, lr_decay_style="constant")
    ours_optimizer = build_optimizer(model, spec, {"foreach": False})
    theirs_optimizer = build_optimizer(theirs, spec, {"foreach": False})
    losses = []
    for tokens, labels in hwbench_batches(config, steps):
        ours = model(tokens, labels)
        reference = reference_objective(theirs, config, tokens, labels)
        for loss, optimizer in ((ours, ours_optimizer), (reference, theirs_optimizer)):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        losses.append((ours.item() + taken_aux_loss(model), reference.item()))
    return losses


@pytest.mark.parametrize("config", [MIXTRAL, QWEN3], ids=["mixtral", "qwen3-moe"])
def test_moe_trains_like_transformers_over_adamw_steps(config):
    model = moe_model(config)
    theirs = reference_model(model)
    losses = train_side_by_side(model, theirs, config, 4)
    for step, (ours, reference) in enumerate(losses, start=1):
        assert ours == pytest.approx(reference, rel=1e-5), f"step {step}: {losses}"
    assert losses[-1][0] < losses[0][0] - 0.1  # the steps trained: the comparison is of moving weights
    tokens, _ = hwbench_batches(config, 1)[0]
    with torch.no_grad():  # and the weights moved alike, the routers' too
        torch.testing.assert_close(model(tokens), theirs(input_ids=tokens).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("config, changes", [
    (MIXTRAL, {"moe_router_pre_softmax": True}),  # the top-2 weights as softmax gives them (OLMoE's), not renormalised
    (QWEN3, {"qk_layernorm": False}),  # Qwen3 without its QK-norm
    (MIXTRAL, {"moe_router_topk": 1}),  # top-1 routing
], ids=["no-top-k-renormalisation", "no-qk-norm", "top-1"])
def test_removing_one_ingredient_breaks_the_logits(config, changes):
    model = moe_model(config, **changes)
    theirs = reference_model(trained_scale_weights(build_model(config, device=CPU, seed=3)))
    theirs.load_state_dict({name: value for name, value in reference_state(model).items()}, strict=False)
    tokens, _ = hwbench_batches(config, 1)[0]
    with torch.no_grad():
        difference = (model(tokens) - theirs(input_ids=tokens).logits).abs().max().item()
    assert difference > 1000 * LOGITS_ATOL


def test_training_without_the_auxiliary_gradient_parts_from_transformers():
    """hwbench with coefficient 0 against transformers' objective with the load-balancing loss:
    the same logits at first, then the routers move apart (the check sees the auxiliary gradient)."""
    model = moe_model(MIXTRAL, moe_aux_loss_coeff=0.0)
    theirs = reference_model(model, reference=MIXTRAL)
    losses = train_side_by_side(model, theirs, MIXTRAL, 3)
    router = model.blocks["0"].mlp.router.weight
    reference_router = theirs.model.layers[0].mlp.gate.weight
    assert (router - reference_router).abs().max() > 1e-4
    assert losses[-1][0] != pytest.approx(losses[-1][1], rel=1e-5)
