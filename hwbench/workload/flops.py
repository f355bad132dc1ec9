"""FLOPs per training iteration: the one place hwbench computes them.

TFLOP/s and MFU everywhere in hwbench come from ``model_flops_per_iteration``;
the result records which formula was used, and every known formula's figures
beside it (``metrics.by_formula``), so a run compares with a Megatron-LM log of
either generation, with Megatron-DeepSpeed or with torchtitan (docs/methodology.md, "FLOPs").
Each formula counts by term (``FlopsTerms``: attention projections, scores, MLP, the MoE layers'
router, routed and shared experts, logits), so each term is held to a count of a real training step
(tests/test_flops_counted.py). A formula that counts the recompute's extra forward
(``counts_recompute``) counts hardware FLOPs for a run that recomputes: its utilisation is shown as
HFU there (``utilisation_label``), MFU elsewhere.

A mixture-of-experts model is counted on its active parameters (each token's top-k routed experts,
the shared experts, and the router where the formula counts it: ``flops_counts`` says which), as
Megatron-LM and torchtitan count it; a formula whose source has no MoE terms refuses such a model
(``uncounted``): its figure would be a dense model's, so the run's TFLOP/s and MFU under it are null
with that reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from hwbench.workload.config import GPTConfig
from hwbench.workload.params import count_parameters


@dataclasses.dataclass(frozen=True)
class FlopsTerms:
    """One iteration's FLOPs (forward and backward over the global batch) as a formula counts
    them, by the part of the model they are in, so that each part can be held to a count of a
    real step (torch's FlopCounterMode, module by module)."""

    attention_projections: float  # q, k, v and the attention's output projection, every layer
    attention_scores: float  # q·kᵀ and the scores times v, every layer
    mlp: float  # the dense MLP's matrix products, every layer that has one (all of a dense model's)
    output_layer: float  # the projection onto the (padded) vocabulary: the logits
    outside_matmuls: float = 0.0  # 6 x the parameters in no matrix product (norms, biases): 6N counts them
    # The MoE layers' matrix products (0 for a dense model):
    router: float = 0.0  # the router's logits, h x E (0 where the formula leaves the router out)
    routed_experts: float = 0.0  # each token's top-k routed experts, SwiGLU of width f_e
    shared_experts: float = 0.0  # the shared experts every token passes through

    @property
    def total(self) -> float:
        return (self.attention_projections + self.attention_scores + self.mlp + self.output_layer
                + self.outside_matmuls + self.router + self.routed_experts + self.shared_experts)


# (config, global batch, seq length, tensor parallel (it pads the vocabulary), recompute counted) -> terms
TermsFunction = Callable[[GPTConfig, int, int, int, bool], FlopsTerms]
# config -> why the formula's source cannot count that model's FLOPs, or None when it can
Refusal = Callable[[GPTConfig], "str | None"]


def _counts_every_model(config: GPTConfig) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class FlopsFormula:
    name: str
    source: str
    expression: str
    terms: TermsFunction
    # Whether the count includes activation recomputation's extra forward pass: then, for a run
    # that recomputes, it counts hardware FLOPs and its utilisation is HFU, not MFU (model FLOPs
    # utilisation, which recomputation does not raise). Every formula says so here, the one place.
    counts_recompute: bool
    # Whether the score term counts half the s x s matrix for the causal mask (what a kernel that
    # skips the masked half computes) or the whole of it (what a dense product computes).
    halves_causal_scores: bool
    # Whether the formula reads L, h, s and V alone and counts every model as Megatron GPT-2's
    # shape (multi-head attention, a 4h GELU MLP): for another shape its figure is what that tool
    # prints, not the model's FLOPs (``shape_caveat``).
    assumes_gpt2_shape: bool = False
    # Whether a mixture-of-experts layer's router (h x E) is in the count: torchtitan's and the 6N
    # formulas' N holds it, Megatron-LM's expression leaves it out.
    counts_router: bool = False
    # Why the source cannot count a model (an MoE switch it has no term for), else None: ``uncounted``.
    refuses: Refusal = _counts_every_model


# 3 passes (forward, the backward's data and weight gradients) x 2 (a multiply and an add): the
# FLOPs per token of each weight in a training step, 6N's 6 (Megatron's 12 is this x 2 GEMMs).
TRAINING_FLOPS_PER_WEIGHT = 6


def _megatron_core(halves_causal_scores: bool) -> TermsFunction:
    """Megatron-LM's num_floating_point_operations, term by term: q and the output projection (h x
    query size each), k and v (h x num_query_groups x kv_channels each: grouped-query attention's
    smaller projections), the scores (2 x query size x s per token: q·kᵀ and times v; halved for
    the causal mask from core_v0.12.0), the MLP (2 x h x ffn_hidden_size, x 3/2 for SwiGLU's gate:
    gated_linear_multiplier) and the logits (h x padded vocabulary), each x 6. An MoE layer's MLP is
    moe_router_topk routed experts of moe_ffn_hidden_size and the shared experts of
    moe_shared_expert_intermediate_size, each with the MLP's multiplier, the router left out; the
    other layers (--moe-layer-freq) keep the dense MLP. kv_channels is the head size, so Megatron's
    query_projection_to_hidden_size_ratio is q / h. Biases and norms are not counted; the output
    layer is counted once whether tied or not: the logits are one product either way."""

    def terms(config: GPTConfig, batch: int, seq: int, tensor_parallel: int, recompute: bool) -> FlopsTerms:
        L, h, moe_layers = config.num_layers, config.hidden_size, config.moe_layers
        query = config.num_attention_heads * config.head_dim  # Megatron's query_projection_size
        key_value = config.kv_heads * config.head_dim  # k's and v's projection size, each
        scores = 2 * query * seq // (2 if halves_causal_scores else 1)  # per token and layer
        gated = 3 if config.swiglu else 2  # Megatron's ffn_expansion_factor
        per_weight = TRAINING_FLOPS_PER_WEIGHT * batch * seq
        routed = config.moe_router_topk * config.moe_ffn_size if config.moe else 0
        return FlopsTerms(
            attention_projections=float(per_weight * L * (2 * h * query + 2 * h * key_value)),
            attention_scores=float(per_weight * L * scores),
            mlp=float(per_weight * (L - moe_layers) * gated * h * config.ffn_size),
            output_layer=float(per_weight * h * config.padded_vocab_size(tensor_parallel)),
            routed_experts=float(per_weight * moe_layers * gated * h * routed),
            shared_experts=float(per_weight * moe_layers * gated * h
                                 * (config.moe_shared_expert_intermediate_size or 0)))

    return terms


def _before_moe_layer_switches(config: GPTConfig) -> str | None:
    """core_v0.7.0 has --num-experts and --moe-router-topk and counts top-k experts of
    --ffn-hidden-size in every layer, but neither --moe-layer-freq nor shared experts: a model
    with either is one it could not build, and its expression would leave them out."""
    if not config.moe:
        return None
    missing = [what for what, used in (
        (f"--moe-layer-freq {config.moe_layer_freq} (dense layers between the MoE ones)", config.moe_layer_freq > 1),
        (f"shared experts ({config.moe_shared_expert_intermediate_size} wide)",
         bool(config.moe_shared_expert_intermediate_size)),
    ) if used]
    if not missing:
        return None
    return (f"the megatron-core-v0.7 FLOPs formula (Megatron-LM core_v0.7.0) counts top-k experts in every layer and "
            f"has no term for {' or '.join(missing)}: its figure would be another model's "
            f"({DEFAULT_FLOPS_FORMULA} counts this one)")


def _dense_only(config: GPTConfig) -> str | None:
    """throughput_calculator before b7b2d5e has no expert term: L, h, s and V alone."""
    if not config.moe:
        return None
    return ("the megatron-deepspeed FLOPs formula (throughput_calculator before b7b2d5e) counts a 4h dense MLP in "
            "every layer and has no mixture-of-experts term: its figure would be a dense model's, not this one's "
            f"({DEFAULT_FLOPS_FORMULA} counts it)")


def _megatron_deepspeed(config: GPTConfig, batch: int, seq: int, tensor_parallel: int,
                        recompute: bool) -> FlopsTerms:
    """24*f*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)) by term: f passes (3; 4 with the recomputed
    forward: its checkpoint_activations_factor) of 2 FLOPs a multiply-add over 4h^2 in q, k, v and
    the output projection, 8h^2 in a 4h MLP, 2hs in the full score matrix per token and layer, and
    3/4 of the logits' hV (its V/(16Lh)). It reads L, h, s and V alone: GPT-2's shape whatever the
    model (assumes_gpt2_shape)."""
    f = 4 if recompute else 3
    L, h = config.num_layers, config.hidden_size
    per_weight = 2 * f * batch * seq
    return FlopsTerms(
        attention_projections=float(per_weight * L * 4 * h * h),
        attention_scores=float(per_weight * L * 2 * h * seq),
        mlp=float(per_weight * L * 8 * h * h),
        output_layer=per_weight * 3 * h * config.padded_vocab_size(tensor_parallel) / 4)


def _six_n(counts_tied_output: bool) -> TermsFunction:
    """B*s*(6N + 12*L*H*Q*s), N by its parts (hwbench.workload.params.ParameterCount): the attention
    and MLP weights, the output layer's weight where N holds it (an untied one always, the tied
    word embedding only where ``counts_tied_output``) and the parameters in no matrix product
    (norms, biases), which 6N counts too. An MoE layer's N is its active parameters: the router, the
    shared experts and k / E of the routed experts' (torchtitan's get_moe_model_nparams_and_flops).
    12LHQs is the full score matrix: neither convention halves it for the causal mask."""

    def terms(config: GPTConfig, batch: int, seq: int, tensor_parallel: int, recompute: bool) -> FlopsTerms:
        counts = count_parameters(config, tensor_parallel)
        tokens = batch * seq
        per_weight = TRAINING_FLOPS_PER_WEIGHT * tokens
        output_in_n = config.untie_embeddings_and_output_weights or counts_tied_output
        L, H, Q = config.num_layers, config.num_attention_heads, config.head_dim
        return FlopsTerms(
            attention_projections=float(per_weight * counts.attention_weights),
            attention_scores=float(12 * tokens * L * H * Q * seq),
            mlp=float(per_weight * counts.dense_mlp_weights),
            output_layer=float(per_weight * counts.output_weights if output_in_n else 0),
            outside_matmuls=float(per_weight * counts.outside_matmuls),
            router=float(per_weight * counts.router_weights),
            # k of every E experts' weights: E divides every layer's count, so the integer division is exact
            routed_experts=float(per_weight * (counts.routed_expert_weights * config.moe_router_topk
                                               // (config.num_experts or 1))),
            shared_experts=float(per_weight * counts.shared_expert_weights))

    return terms


MEGATRON_LM = "NVIDIA/Megatron-LM, num_floating_point_operations in megatron/training/training.py"
FLOPS_FORMULAS: dict[str, FlopsFormula] = {
    f.name: f
    for f in (
        FlopsFormula(
            name="megatron-core-v0.12",
            source=f"{MEGATRON_LM}, tag core_v0.12.0 (d580efc, 2025-05-06) and main (d98e8a6, 2026-08-22: "
                   "written term by term, the same figure for a dense model of unpacked sequences), read "
                   "2026-11-29: grouped-query attention's k and v projections (num_query_groups), SwiGLU "
                   "(gated_linear_multiplier 3/2), ffn_hidden_size, the attention scores halved for the causal "
                   "mask (s/(2h) in its general form), the logits once, tied output layer or not; a mixture of "
                   "experts on its active parameters, the same terms at core_v0.12.0 and on main: "
                   "moe_router_topk experts of moe_ffn_hidden_size and the shared experts "
                   "(moe_shared_expert_intermediate_size) in the MoE layers of --moe-layer-freq, ffn_hidden_size "
                   "in the others, the router not counted",
            expression="6*B*s*(L*(2h*(q + kv) + q*s) + m*h*(L_d*f + L_e*(k*f_e + f_s)) + h*V), q = H*Q, "
                       "kv = kv_heads*Q, m = 3 with SwiGLU else 2, L_d dense and L_e MoE layers, k of the experts "
                       "f_e wide, shared experts f_s wide; GPT-2: 72*B*s*L*h^2*(1 + s/(12h) + V/(12*L*h))",
            terms=_megatron_core(halves_causal_scores=True),
            counts_recompute=False,  # expansion factor 3 (forward, wgrad, dgrad): no recompute term
            halves_causal_scores=True,
        ),
        FlopsFormula(
            name="megatron-core-v0.7",
            source=f"{MEGATRON_LM}, tag core_v0.7.0 (a645f89, 2024-05-30), read 2026-11-29, and the same "
                   "figure from core_v0.6.0 to core_v0.11.x for every shape hwbench builds: grouped-query "
                   "attention (num_query_groups), SwiGLU (gated_linear_multiplier 3/2) and ffn_hidden_size "
                   "counted, the full attention-score matrix. core_v0.5.0 (megatron/training.py) counts "
                   "grouped-query attention but a 4h GELU MLP, so its log differs for SwiGLU or another "
                   "ffn size. A mixture of experts: moe_router_topk (num_experts_routed_to) experts of "
                   "--ffn-hidden-size, the experts' width in that version, in every layer, the router not "
                   "counted; it has no --moe-layer-freq, --moe-ffn-hidden-size or shared experts (they came in "
                   "core_v0.10.0, whose count takes shared experts in every layer and the routed ones at "
                   "ffn_hidden_size, not moe_ffn_hidden_size), so a model with dense layers or shared experts "
                   "is refused",
            expression="6*B*s*(L*(2h*(q + kv) + 2q*s + m*h*k*f) + h*V), q = H*Q, kv = kv_heads*Q, m = 3 with "
                       "SwiGLU else 2, k = 1 (dense) or the experts a token is routed to, f the MLP's (an expert's) "
                       "width; GPT-2: 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h))",
            terms=_megatron_core(halves_causal_scores=False),
            counts_recompute=False,
            halves_causal_scores=False,
            refuses=_before_moe_layer_switches,
        ),
        FlopsFormula(
            name="megatron-deepspeed",
            source="microsoft/Megatron-DeepSpeed, throughput_calculator in megatron/utils.py before commit "
                   "b7b2d5e (2024-08-19), read 2026-11-29 (hardware FLOPs when recomputing). It reads L, h, s "
                   "and V alone, so it counts multi-head attention and a 4h GELU MLP whatever the model: for "
                   "grouped-query attention, SwiGLU or another ffn size its figure is what that code prints, "
                   "not the model's FLOPs. From b7b2d5e (master at f4157be, 2024-12-24) it counts SwiGLU, "
                   "ffn_hidden_size, k and v as 2 // (heads / kv_heads) x h^2 and the logits as hV a pass: "
                   "another figure than this one. It has no mixture-of-experts term (b7b2d5e's form multiplies "
                   "the MLP by args.topk), so an MoE model is refused",
            expression="24*f*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)), f = 4 with recompute else 3",
            terms=_megatron_deepspeed,
            counts_recompute=True,
            halves_causal_scores=False,
            assumes_gpt2_shape=True,
            refuses=_dense_only,
        ),
        FlopsFormula(
            name="palm",
            source="PaLM (Chowdhery et al. 2022, arXiv:2204.02311) appendix B, N without the embedding "
                   "table: an untied output layer is in N, a tied one is not (nanoGPT's estimate_mfu has the "
                   "same expression with the tied word embedding kept in N); for a mixture of experts N is the "
                   "active non-embedding parameters (the router, the shared experts and each token's top-k "
                   "routed experts), as torchtitan counts them",
            expression="B*s*(6*N + 12*L*H*Q*s), N = active non-embedding parameters (an untied output layer "
                       "included; MoE: all but the routed experts a token is not sent to)",
            terms=_six_n(counts_tied_output=False),
            counts_recompute=False,  # PaLM's MFU leaves rematerialisation out by definition
            halves_causal_scores=False,
            counts_router=True,
        ),
        FlopsFormula(
            name="torchtitan",
            source="pytorch/torchtitan, get_dense_model_nparams_and_flops in torchtitan/models/utils.py as "
                   "torchtitan/models/llama3/model.py calls it (head_dims 2Q), main at b5bcd76 (2026-08-21), "
                   "read 2026-11-29: N is every parameter but the nn.Embedding tables, the tied word embedding "
                   "kept as the output layer's weight (since 4ed3c53, 2026-05-08), and the score term is not "
                   "halved for the causal mask. torchtitan's models have no learned position table; hwbench "
                   "leaves GPT-2's out of N, as it is in no matrix product. A mixture of experts: "
                   "get_moe_model_nparams_and_flops in the same file at the same commit (qwen3, deepseek_v3 and "
                   "gpt_oss call it), N the active parameters: the dense ones, the router, the shared "
                   "experts and top_k / num_experts of the routed experts'",
            expression="B*s*(6*N + 12*L*H*Q*s), N = active non-embedding parameters + the output layer, tied or "
                       "not (MoE: the router, the shared experts, k/E of the routed experts)",
            terms=_six_n(counts_tied_output=True),
            counts_recompute=False,  # its comment: recomputation is not counted in MFU
            halves_causal_scores=False,
            counts_router=True,
        ),
    )
}

DEFAULT_FLOPS_FORMULA = "megatron-core-v0.12"
# Names accepted on input for a formula: the old name of megatron-core-v0.7 (suites written
# before it was split by Megatron version). Results record the canonical name.
FLOPS_FORMULA_ALIASES = {"megatron-lm": "megatron-core-v0.7"}
FLOPS_FORMULA_NAMES = (*FLOPS_FORMULAS, *FLOPS_FORMULA_ALIASES)  # what --flops-formula accepts


def canonical_formula(name: str) -> str:
    """The formula's canonical name (an alias resolved); ValueError for an unknown one."""
    name = FLOPS_FORMULA_ALIASES.get(name, name)
    if name not in FLOPS_FORMULAS:
        raise ValueError(f"unknown FLOPs formula {name!r}; known: {', '.join(FLOPS_FORMULA_NAMES)}")
    return name


def counts_hardware_flops(formula: str | None, recompute: bool | None) -> bool:
    """Whether a figure counted by ``formula`` for a run that recomputes (``recompute``) or not
    counts hardware FLOPs: the formula adds the recompute's extra forward and the run recomputes.
    Its utilisation is then HFU, not MFU. An unknown or missing formula: False (nothing to say)."""
    if not recompute or not isinstance(formula, str):
        return False
    formula = FLOPS_FORMULA_ALIASES.get(formula, formula)
    return formula in FLOPS_FORMULAS and FLOPS_FORMULAS[formula].counts_recompute


def utilisation_label(formula: str | None, recompute: bool | None) -> str:
    """"HFU" for a utilisation of hardware FLOPs (counts_hardware_flops), else "MFU"."""
    return "HFU" if counts_hardware_flops(formula, recompute) else "MFU"


def hfu_reason(formula: str) -> str:
    """Why a figure of ``formula`` (one that counts recompute) reads HFU for a run that recomputes."""
    name = FLOPS_FORMULA_ALIASES.get(formula, formula)
    return (f"HFU, not MFU: the {name} formula counts activation recomputation's extra forward pass "
            f"({FLOPS_FORMULAS[name].expression}), so for a run that recomputes it is hardware FLOPs "
            "utilisation, higher than the model FLOPs utilisation of the same speed; compare it with "
            "HFU, not with MFU")


class FlopsNotCounted(ValueError):
    """The formula's source has no term for a part of this model (``uncounted`` says which)."""


def uncounted(formula: str, config: GPTConfig) -> str | None:
    """Why ``formula`` cannot count the FLOPs of a model of ``config``'s shape (a mixture-of-experts
    switch its source has no term for), or None when it counts it. A run's TFLOP/s and MFU under
    such a formula are null with this reason: its figure would be another model's."""
    return FLOPS_FORMULAS[canonical_formula(formula)].refuses(config)


def work_formula(formula: str, config: GPTConfig) -> tuple[str, str | None]:
    """The formula that counts the device's work in a run that asked for ``formula``, and why the
    asked one cannot count ``config``'s model (None when it can): ``formula`` itself, else the
    default, which counts every model hwbench builds. The device does the same work whatever a
    formula counts, so the run's duration is estimated and its speed judged on this count, while
    its reported TFLOP/s and MFU stay null with the reason."""
    reason = uncounted(formula, config)
    return (DEFAULT_FLOPS_FORMULA if reason else canonical_formula(formula)), reason


def flops_counts(formula: str, config: GPTConfig) -> str | None:
    """What ``formula``'s FLOPs of ``config`` count, in words (the result's metrics.flops_counts):
    every weight for a dense model; for a mixture of experts its active parameters, named; None
    where the formula does not count the model (``uncounted``)."""
    counted = FLOPS_FORMULAS[canonical_formula(formula)]
    if counted.refuses(config) is not None:
        return None
    if not config.moe:
        return "every weight (a dense model)"
    parts = [f"each token's {config.moe_router_topk} of {config.num_experts} routed experts in each of the "
             f"{config.moe_layers} MoE layers"]
    if config.moe_shared_expert_intermediate_size:
        parts.append("the shared experts")
    if config.moe_layers < config.num_layers:
        parts.append(f"the dense MLP of the other {config.num_layers - config.moe_layers} layers")
    parts.append("the router" if counted.counts_router else "not the router")
    return "active parameters: " + ", ".join(parts)


def flops_terms(
    config: GPTConfig,
    global_batch_size: int,
    seq_length: int,
    *,
    tensor_parallel: int = 1,
    recompute: bool = False,
    formula: str = DEFAULT_FLOPS_FORMULA,
) -> FlopsTerms:
    """One training iteration's FLOPs (forward and backward over the global batch) by term, as
    ``formula`` counts them; their total is ``model_flops_per_iteration``. FlopsNotCounted when
    the formula cannot count this model (``uncounted``)."""
    counted = FLOPS_FORMULAS[canonical_formula(formula)]
    refusal = counted.refuses(config)
    if refusal is not None:
        raise FlopsNotCounted(refusal)
    return counted.terms(config, global_batch_size, seq_length, tensor_parallel, recompute and counted.counts_recompute)


def model_flops_per_iteration(
    config: GPTConfig,
    global_batch_size: int,
    seq_length: int,
    *,
    tensor_parallel: int = 1,
    recompute: bool = False,
    formula: str = DEFAULT_FLOPS_FORMULA,
) -> float:
    """FLOPs of one training iteration (forward and backward over the global batch).

    The Megatron-LM formulas (the default among them), palm and torchtitan count model FLOPs:
    recomputation does not add to them, so MFU stays comparable with and without activation
    checkpointing. megatron-deepspeed counts the recompute (``FlopsFormula.counts_recompute``):
    hardware FLOPs. FlopsNotCounted for a model the formula cannot count (``uncounted``).
    """
    return flops_terms(config, global_batch_size, seq_length, tensor_parallel=tensor_parallel, recompute=recompute,
                       formula=formula).total


def shape_caveat(formula: str, config: GPTConfig) -> str | None:
    """Why ``formula``'s figure is not the FLOPs of a model of ``config``'s shape, or None when it
    counts that shape: a formula that assumes Megatron GPT-2's shape, for a model of another."""
    name = canonical_formula(formula)
    if not FLOPS_FORMULAS[name].assumes_gpt2_shape:
        return None
    differences = [what for what, differs in (
        (f"grouped-query attention with {config.kv_heads} KV heads", config.kv_heads != config.num_attention_heads),
        ("a SwiGLU MLP", config.swiglu),
        (f"an MLP {config.ffn_size} wide, not {4 * config.hidden_size}", config.ffn_size != 4 * config.hidden_size),
    ) if differs]
    if not differences:
        return None
    return (f"the {name} FLOPs formula counts multi-head attention and a 4h GELU MLP, not this model's shape "
            f"({'; '.join(differences)}): its TFLOP/s and MFU are what that tool prints for this model, not the "
            f"model's FLOPs ({DEFAULT_FLOPS_FORMULA} counts them)")


def flops_by_formula(config: GPTConfig, global_batch_size: int, seq_length: int, *, tensor_parallel: int = 1,
                     recompute: bool = False) -> dict[str, float | None]:
    """Every known formula's FLOPs of one iteration, by canonical name; None for a formula that
    cannot count this model (``uncounted`` says why)."""
    return {name: None if uncounted(name, config) else model_flops_per_iteration(
        config, global_batch_size, seq_length, tensor_parallel=tensor_parallel, recompute=recompute, formula=name)
        for name in FLOPS_FORMULAS}


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of one (m x k) @ (k x n) matrix product: a multiply and an add per term
    (2mnk), the count the model formulas use, so a measured GEMM rate (hwbench calibrate)
    and a run's TFLOP/s are in the same units."""
    return 2 * m * n * k
