"""Every FLOPs formula held to one real training step (forward and backward of the loss, fp32, on
the CPU) as torch's FlopCounterMode counts it, module by module, term by term: the attention's
projections, its scores, the MLP and the output layer. Where a formula's term differs from the
count, the difference is the one its source states (hwbench.workload.flops) and is asserted so:

- the scores: FlopCounterMode counts the product that ran, the whole s x s matrix (SDPA's math
  kernel multiplies the masked half too), so a formula that halves them for the causal mask
  (megatron-core-v0.12) counts half of it;
- the output layer: counted once, forward and backward (6 x B x s x h x V); palm's N leaves a
  tied one out, megatron-deepspeed's V/(16Lh) counts 3/4 of it;
- norms, biases, the embedding lookups, softmax and the loss: no matrix product, 0 here; the 6N
  formulas count 6 FLOPs per token for each norm and bias parameter (``outside_matmuls``);
- megatron-deepspeed reads L, h, s and V alone: its projections and MLP hold for GPT-2's shape
  only (``shape_caveat`` names any other);
- a mixture of experts (dropless, so every token's top-k experts run): the routed experts, the
  shared experts and the dense layers' MLPs as counted; the router (h x E) where the formula counts
  it (palm, torchtitan), left out by Megatron-LM's; megatron-deepspeed, and megatron-core-v0.7 for
  dense layers or shared experts, refuse the model (``uncounted``).

torch 2.13's FlopCounterMode has no formula for aten._grouped_mm, which runs the experts: it counts
0 for it (``test_flop_counter_mode_counts_no_grouped_mm_in_this_torch``). The step is counted with
one added here (``grouped_mm_flops``): 2 x rows x in x out over the rows the offsets cover, read
from the operands as they ran.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from hwbench.catalog import load_catalog
from hwbench.workload import GPTConfig, count_parameters
from hwbench.workload.flops import (
    FLOPS_FORMULAS,
    TRAINING_FLOPS_PER_WEIGHT,
    FlopsNotCounted,
    flops_terms,
    shape_caveat,
    uncounted,
)
from hwbench.workload.model import GPT

ATEN = torch.ops.aten
BATCH, SEQ = 2, 32
# Where a block (hwbench.workload.model.Block) keeps its attention and its MLP, and the model its
# blocks and output layer: the per-module counts are read at these names.
ATTENTION, MLP, BLOCKS, OUTPUT = "attn", "mlp", "blocks", "output"

GPT2 = GPTConfig(2, 64, 4, 64, vocab_size=1000)  # padded to 1024
LLAMA = dataclasses.replace(GPT2, num_query_groups=2, ffn_hidden_size=96, swiglu=True, normalization="RMSNorm",
                            position_embedding_type="rope", rotary_base=500000.0, add_bias_linear=False)
# (config, GPT's fused_qkv): GPT-2 shapes; the Llama 3 shape (grouped-query attention, SwiGLU,
# RMSNorm, RoPE, no biases) with a tied and an untied output layer, one KV head (multi-query),
# and q, k and v as one fused projection (Megatron's per-group layout)
STEP_SHAPES = [
    pytest.param(GPT2, False, id="gpt2"),
    pytest.param(dataclasses.replace(GPT2, ffn_hidden_size=96), False, id="gpt2-ffn96"),
    pytest.param(LLAMA, False, id="llama-tied"),
    pytest.param(dataclasses.replace(LLAMA, untie_embeddings_and_output_weights=True), False, id="llama-untied"),
    pytest.param(dataclasses.replace(LLAMA, num_query_groups=1), False, id="llama-one-kv-head"),
    pytest.param(LLAMA, True, id="llama-fused-qkv"),
]
# The catalog's MoE sizes with GPT2's 1000-token vocabulary (the logits are held above; a step over
# 151,936 took 18 s): moe-tiny Mixtral's shape (4 experts of 256, top-2, untied), moe-small
# Qwen3-MoE's (a head size of its own, QK-norm, 16 experts of 128, top-4)
MOE_TINY = dataclasses.replace(load_catalog().workloads["moe-tiny"].model, vocab_size=GPT2.vocab_size)
MOE_SMALL = dataclasses.replace(load_catalog().workloads["moe-small"].model, vocab_size=GPT2.vocab_size)
# (config, fused_qkv): those, and moe-tiny with shared experts and a dense layer between its MoE
# layers (--moe-layer-freq 2), which megatron-core-v0.7 has no term for
MOE_SHAPES = [
    pytest.param(MOE_TINY, False, id="moe-tiny"),
    pytest.param(MOE_SMALL, False, id="moe-small"),
    pytest.param(dataclasses.replace(MOE_TINY, num_layers=3, moe_layer_freq=2, moe_shared_expert_intermediate_size=96),
                 False, id="moe-shared-and-dense-layers"),
]


def grouped_mm_flops(a, b, offs=None, *args, out_val=None, **kwargs) -> int:
    """aten._grouped_mm's FLOPs from its operands as they ran: 2 x m x k x n over the rows its
    offsets cover (an expert's rows end at its offset; rows past the last are not computed). Forward
    and data gradient: (rows, in) x (E, in, out); weight gradient: (out, rows) x (rows, in) -> (E, out, in)."""
    assert offs is not None and offs.dim() == 1, "hwbench's experts always pass offsets"
    covered = int(offs[-1])
    if a.dim() == 2 and b.dim() == 3:
        return 2 * covered * a.shape[1] * b.shape[2]
    assert a.dim() == b.dim() == 2, (a.shape, b.shape)
    return 2 * a.shape[0] * covered * b.shape[1]


grouped_mm_flops._get_raw = True  # FlopCounterMode passes the tensors, not their shapes: the offsets are read


@dataclasses.dataclass(frozen=True)
class CountedStep:
    """One training step's FLOPs as FlopCounterMode counted them, by the part of the model."""

    attention_projections: int
    attention_scores: int
    mlp: int  # the dense layers' MLPs
    output_layer: int
    total: int  # everything counted anywhere in the step
    router: int = 0  # the MoE layers' routers (x W^T, W [E, h])
    routed_experts: int = 0  # the MoE layers' grouped GEMMs
    shared_experts: int = 0


def counted_step(model: torch.nn.Module, batch: int, seq: int) -> CountedStep:
    """Count one forward and backward of ``model``'s mean loss over random tokens. Attention runs on
    SDPA's math kernel: the CPU's fused kernel is not in torch's FLOP registry and would count 0.
    The experts' grouped GEMMs are counted by ``grouped_mm_flops``; the router's products are told
    apart by their width, the experts' count E (``RouterProducts``)."""
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq + 1))
    router = RouterProducts(model.config.num_experts)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False, custom_mapping={
            ATEN._grouped_mm: grouped_mm_flops, ATEN.mm: router}) as counter:
        model(tokens[:, :-1], tokens[:, 1:]).backward()
    return step_terms(model, counter.get_flop_counts(), router.flops)


class RouterProducts:
    """aten.mm's FLOPs (2mnk), adding up those of the routers' products: the only ones with a side
    E long (x W^T forward, and its two gradients), in a shape where no other width is E."""

    _get_raw = True  # FlopCounterMode passes the tensors

    def __init__(self, num_experts: int | None):
        self.num_experts, self.flops = num_experts, 0

    def __call__(self, a, b, *args, out_val=None, **kwargs) -> int:
        flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
        if self.num_experts in (*a.shape, *b.shape):
            self.flops += flops
        return flops


def step_terms(model: torch.nn.Module, counts: dict[str, dict], router: int = 0) -> CountedStep:
    """The counts of the attention and MLP of each block and of the output layer. A module's count
    includes its backward's; the attention's batched products (bmm) are its scores, the rest its
    projections' (mm, addmm); an MoE layer's grouped GEMMs are its routed experts, its other
    products the router's (``router``) and the shared experts'. Only whole modules are read:
    FlopCounterMode gives the backward of siblings that share their input (q, k and v; the router
    and the shared experts) to each other as well, but to their parent correctly."""
    root = type(model).__name__

    def counted(path: str, ops: set | None = None) -> int:
        return sum(n for op, n in counts.get(f"{root}.{path}", {}).items() if ops is None or op in ops)

    blocks = [f"{BLOCKS}.{index}" for index in model.blocks]
    moe = {block for index, block in zip(model.blocks, blocks, strict=True) if model.config.is_moe_layer(int(index))}
    scores = sum(counted(f"{block}.{ATTENTION}", {ATEN.bmm}) for block in blocks)
    routed = sum(counted(f"{block}.{MLP}", {ATEN._grouped_mm}) for block in moe)
    return CountedStep(
        attention_projections=sum(counted(f"{block}.{ATTENTION}") for block in blocks) - scores,
        attention_scores=scores,
        mlp=sum(counted(f"{block}.{MLP}") for block in blocks if block not in moe),
        output_layer=counted(OUTPUT),
        total=sum(counts["Global"].values()),
        router=router, routed_experts=routed,
        shared_experts=sum(counted(f"{block}.{MLP}") for block in moe) - routed - router)


def output_share(formula: str, config: GPTConfig) -> float:
    """How much of the output layer's counted FLOPs ``formula`` counts, as its source says."""
    if formula == "megatron-deepspeed":
        return 3 / 4  # V/(16Lh) at f = 3: 4.5 x B x s x h x V of the 6 counted
    if formula == "palm" and not config.untie_embeddings_and_output_weights:
        return 0  # N without the embedding table, which a tied output layer is
    return 1


@pytest.mark.parametrize("config, fused_qkv", STEP_SHAPES + MOE_SHAPES)
def test_a_counted_training_step_holds_each_formula_term_by_term(config, fused_qkv):
    torch.manual_seed(0)
    counted = counted_step(GPT(config, fused_qkv=fused_qkv), BATCH, SEQ)
    # matrix products only: embedding lookups, norms, softmax, the routing and the loss count 0
    assert counted.total == counted.attention_projections + counted.attention_scores + counted.mlp + \
        counted.output_layer + counted.router + counted.routed_experts + counted.shared_experts
    per_weight = TRAINING_FLOPS_PER_WEIGHT * BATCH * SEQ
    assert counted.output_layer == per_weight * config.hidden_size * config.padded_vocab_size()
    if config.moe:  # dropless: every token's top-k experts ran, each a SwiGLU of three products
        assert counted.routed_experts == per_weight * config.moe_layers * config.moe_router_topk * 3 * \
            config.hidden_size * config.moe_ffn_size > 0
        assert counted.router == per_weight * config.moe_layers * config.hidden_size * config.num_experts > 0
    for name, formula in FLOPS_FORMULAS.items():
        if uncounted(name, config):
            with pytest.raises(FlopsNotCounted):
                flops_terms(config, BATCH, SEQ, formula=name)
            continue
        terms = flops_terms(config, BATCH, SEQ, formula=name)
        assert counted.attention_scores == terms.attention_scores * (2 if formula.halves_causal_scores else 1), name
        assert counted.output_layer * output_share(name, config) == terms.output_layer, name
        if shape_caveat(name, config) is None:
            assert (counted.attention_projections, counted.mlp) == (terms.attention_projections, terms.mlp), name
        assert (counted.routed_experts, counted.shared_experts) == (terms.routed_experts, terms.shared_experts), name
        assert terms.router == (counted.router if formula.counts_router else 0), name  # Megatron leaves it out
        six_n = name in ("palm", "torchtitan")
        assert terms.outside_matmuls == (per_weight * count_parameters(config).outside_matmuls if six_n else 0), name
    # Megatron-LM's count before core_v0.12 is exactly this step's but the router; v0.12's is it less half the scores
    if not uncounted("megatron-core-v0.7", config):
        assert flops_terms(config, BATCH, SEQ, formula="megatron-core-v0.7").total == counted.total - counted.router
    assert flops_terms(config, BATCH, SEQ).total == counted.total - counted.attention_scores / 2 - counted.router


def test_flop_counter_mode_counts_no_grouped_mm_in_this_torch():
    """Why grouped_mm_flops is here: torch's own registry has no formula for aten._grouped_mm (torch
    2.13), so a step of experts counts 0 for them. Should torch gain one, it must agree with ours."""
    x = torch.randn(24, 16, requires_grad=True)
    weight = torch.randn(3, 8, 16, requires_grad=True)
    offsets = torch.tensor([8, 16, 24], dtype=torch.int32)

    def step() -> int:
        torch.nn.functional.grouped_mm(x, weight.transpose(-2, -1), offs=offsets).square().sum().backward()
        return 3 * 2 * 24 * 16 * 8  # forward, data and weight gradients of a 24 x 16 by 16 x 8 product

    with FlopCounterMode(display=False) as builtin:
        expected = step()
    with FlopCounterMode(display=False, custom_mapping={ATEN._grouped_mm: grouped_mm_flops}) as ours:
        step()
    assert ours.get_total_flops() == expected
    from torch.utils.flop_counter import flop_registry

    assert builtin.get_total_flops() == (expected if ATEN._grouped_mm in flop_registry else 0)


def test_torchtitans_moe_parameters_are_what_its_formula_counts():
    """torchtitan's get_moe_model_nparams_and_flops sorts a model's named parameters: "embedding" ones,
    "moe.shared_experts", "moe.router", "moe.routed_experts" (k/E of them active), the rest dense; N is
    the dense less the embedding (untied) plus the active sparse ones. Done here over hwbench's MoE
    model's own parameters by their names (wte, mlp.shared_experts, mlp.router, mlp.experts), it is the
    torchtitan formula's N."""
    config = dataclasses.replace(MOE_TINY, num_layers=3, moe_layer_freq=2, moe_shared_expert_intermediate_size=96)
    with torch.device("meta"):
        model = GPT(config)
    parts = dict.fromkeys(("embedding", "shared", "router", "routed", "dense"), 0)
    for name, parameter in model.named_parameters():
        part = next((part for key, part in (("wte", "embedding"), ("mlp.shared_experts", "shared"),
                                            ("mlp.router", "router"), ("mlp.experts", "routed"))
                     if key in name), "dense")
        parts[part] += parameter.numel()
    active = (parts["dense"] + parts["router"] + parts["shared"]
              + parts["routed"] * config.moe_router_topk // config.num_experts)
    tokens = BATCH * SEQ
    scores = 6 * config.num_layers * config.num_attention_heads * 2 * config.head_dim * SEQ  # head_dims 2Q
    terms = flops_terms(config, BATCH, SEQ, formula="torchtitan")
    assert terms.total == tokens * (6 * active + scores)


def test_a_gpt2_formula_misses_what_the_step_counts_for_another_shape():
    """The counted step tells the shapes apart where megatron-deepspeed cannot: a 96-wide MLP
    counts 96/256 of what it assumes (4h = 256), and it says so."""
    narrow = dataclasses.replace(GPT2, ffn_hidden_size=96)
    torch.manual_seed(0)
    counted = counted_step(GPT(narrow), BATCH, SEQ)
    assumed = flops_terms(narrow, BATCH, SEQ, formula="megatron-deepspeed")
    assert counted.mlp == assumed.mlp * 96 / 256
    assert counted.attention_projections == assumed.attention_projections  # multi-head attention: as assumed
    assert shape_caveat("megatron-deepspeed", narrow) is not None
