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
  only (``shape_caveat`` names any other).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from hwbench.workload import GPTConfig, count_parameters
from hwbench.workload.flops import FLOPS_FORMULAS, TRAINING_FLOPS_PER_WEIGHT, flops_terms, shape_caveat
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


@dataclasses.dataclass(frozen=True)
class CountedStep:
    """One training step's FLOPs as FlopCounterMode counted them, by the part of the model."""

    attention_projections: int
    attention_scores: int
    mlp: int
    output_layer: int
    total: int  # everything counted anywhere in the step


def counted_step(model: torch.nn.Module, batch: int, seq: int) -> CountedStep:
    """Count one forward and backward of ``model``'s mean loss over random tokens. Attention runs on
    SDPA's math kernel: the CPU's fused kernel is not in torch's FLOP registry and would count 0."""
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq + 1))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens[:, :-1], tokens[:, 1:]).backward()
    return step_terms(model, counter.get_flop_counts())


def step_terms(model: torch.nn.Module, counts: dict[str, dict]) -> CountedStep:
    """The counts of the attention and MLP of each block and of the output layer. A module's count
    includes its backward's; the attention's batched products (bmm) are its scores, the rest its
    projections' (mm, addmm). Only whole modules are read: FlopCounterMode gives the backward of
    q, k and v, which share their input, to each other as well, but to their parent correctly."""
    root = type(model).__name__

    def counted(path: str, ops: set | None = None) -> int:
        return sum(n for op, n in counts.get(f"{root}.{path}", {}).items() if ops is None or op in ops)

    blocks = [f"{BLOCKS}.{index}" for index in model.blocks]
    scores = sum(counted(f"{block}.{ATTENTION}", {ATEN.bmm}) for block in blocks)
    return CountedStep(
        attention_projections=sum(counted(f"{block}.{ATTENTION}") for block in blocks) - scores,
        attention_scores=scores,
        mlp=sum(counted(f"{block}.{MLP}") for block in blocks),
        output_layer=counted(OUTPUT),
        total=sum(counts["Global"].values()))


def output_share(formula: str, config: GPTConfig) -> float:
    """How much of the output layer's counted FLOPs ``formula`` counts, as its source says."""
    if formula == "megatron-deepspeed":
        return 3 / 4  # V/(16Lh) at f = 3: 4.5 x B x s x h x V of the 6 counted
    if formula == "palm" and not config.untie_embeddings_and_output_weights:
        return 0  # N without the embedding table, which a tied output layer is
    return 1


@pytest.mark.parametrize("config, fused_qkv", STEP_SHAPES)
def test_a_counted_training_step_holds_each_formula_term_by_term(config, fused_qkv):
    torch.manual_seed(0)
    counted = counted_step(GPT(config, fused_qkv=fused_qkv), BATCH, SEQ)
    # matrix products only: embedding lookups, norms, softmax and the loss count 0
    assert counted.total == counted.attention_projections + counted.attention_scores + counted.mlp + \
        counted.output_layer
    per_weight = TRAINING_FLOPS_PER_WEIGHT * BATCH * SEQ
    assert counted.output_layer == per_weight * config.hidden_size * config.padded_vocab_size()
    for name, formula in FLOPS_FORMULAS.items():
        terms = flops_terms(config, BATCH, SEQ, formula=name)
        assert counted.attention_scores == terms.attention_scores * (2 if formula.halves_causal_scores else 1), name
        assert counted.output_layer * output_share(name, config) == terms.output_layer, name
        if shape_caveat(name, config) is None:
            assert (counted.attention_projections, counted.mlp) == (terms.attention_projections, terms.mlp), name
        six_n = name in ("palm", "torchtitan")
        assert terms.outside_matmuls == (per_weight * count_parameters(config).outside_matmuls if six_n else 0), name
    # Megatron-LM's count before core_v0.12 is exactly this step's; v0.12's is it less half the scores
    assert flops_terms(config, BATCH, SEQ, formula="megatron-core-v0.7").total == counted.total
    assert flops_terms(config, BATCH, SEQ).total == counted.total - counted.attention_scores / 2


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
