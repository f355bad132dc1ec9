"""The memory planner (`hwbench plan`): the predicted peak device memory of each
rank for one benchmark point, from the architecture and the layout alone (no
torch, no device). docs/planner.md writes the model down with its sources.

In short, per rank of pipeline stage ``stage`` (P = parameters this rank holds
after tensor and pipeline parallelism, before data-parallel sharding):

    static  = weights + optimizer state + persistent buffers (communication, RoPE's tables)
    working = gradients already there as a backward starts
              + activations + logits + gathered (FSDP2 / ZeRO-3 unsharded units)
              + autocast's 16-bit weight copies (native engine, bf16/fp16)
    total   = static + overhead + max(working, gradients + step_transient)

``step_transient`` is what exists only after the backward (the flat gradient
all-reduce buffer, foreach AdamW temporaries, DeepSpeed's fp32 gradient copy),
when the activations are already freed. The shape is GPTConfig's: Megatron GPT-2
or the Llama architecture (grouped-query attention, SwiGLU, RMSNorm, RoPE, an
untied output layer, Qwen3's head size and QK-norm), each term following the
switches; a mixture of experts adds its router, every expert's weights (their
share on this rank with expert parallelism: ``expert_parallel``) with their
gradients and AdamW state, and what the routed tokens keep for the backward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hwbench.device.kinds import DEVICE_KINDS, KINDS
from hwbench.errors import UsageError
from hwbench.spec import ENGINES, RunSpec, expert_parallel_degrees
from hwbench.units import GIB, parse_size  # noqa: F401  (parse_size: planner.parse_size, as before)
from hwbench.workload.config import CROSS_ENTROPY_CHUNK_TOKENS, GPTConfig, stage_layers
from hwbench.workload.params import count_parameters

# Fixed per-device framework memory outside the tensors counted here: the device
# kind's estimate (hwbench/device/kinds.py; docs/planner.md).
OVERHEAD_BYTES = {name: kind.framework_overhead_bytes for name, kind in KINDS.items()}

# A plan fits when its total is at most this fraction of the device's memory: the
# caching allocator's fragmentation (reserved above allocated, commonly 5-15 %)
# and the temporaries not modelled need the rest.
DEFAULT_HEADROOM = 0.9

# DeepSpeed's default ZeRO-1/2 gradient bucket (reduce_bucket_size, elements); the
# engine (hwbench/engine/deepspeed.py) does not change it.
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000

FP32 = 4
HALF = 2


@dataclasses.dataclass(frozen=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds, after tensor and expert parallelism and
    before any data-parallel sharding."""

    blocks: int  # parameters of this stage's transformer blocks (this TP rank's share)
    block: int  # the largest of its blocks (an MoE one where there is one; this TP rank's share)
    embedding: int  # word (V*h/t) + learned position (P*h; none with RoPE) embeddings: the first stage
    # final norm, plus the output layer's weight where it is not the word embedding's (untied, or
    # tied with pp > 1: the last stage's own copy): the last stage
    head: int
    layers: int  # blocks on this stage
    # what this stage's linear layers read (their weights and biases, and the output layer's
    # weight on the last stage): the parameters autocast casts to 16 bits
    linear: int = 0
    # this rank's routed experts' weights (in ``blocks``): sharded over the expert-data-parallel
    # ranks (dp / ep) where the others are sharded over dp
    experts: int = 0

    @property
    def total(self) -> int:
        return self.blocks + self.embedding + self.head


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Predicted peak memory of one rank (bytes), for pipeline stage ``stage``.
    total = weights + optimizer + buffers + overhead
            + max(gradients_before_backward + activations + logits + gathered + cast_weights,
                  gradients + step_transient)."""

    stage: int
    weights_bytes: int
    gradients_bytes: int
    # the gradients that already exist when a backward starts, where the activations peak: all of
    # them when micro-batches accumulate (or a pipeline interleaves them), none when the one
    # micro-batch's backward makes them (the native engine sets them to None after each step)
    gradients_before_backward_bytes: int
    optimizer_bytes: int
    # persistent buffers: communication (DDP buckets, DeepSpeed's reduce bucket, the pipeline's
    # receive buffers) and RoPE's tables
    buffers_bytes: int
    activations_bytes: int  # everything kept for the backward, all micro-batches in flight on this stage
    logits_bytes: int  # last stage only
    gathered_bytes: int  # FSDP2 / ZeRO-3 unsharded parameters (and one unit's gradients) while computing
    cast_weights_bytes: int  # autocast's 16-bit copies of the linear layers' parameters, alive to the forward's end
    step_transient_bytes: int  # after the backward, when activations are freed
    overhead_bytes: int
    total_bytes: int
    parameters: int  # parameters this rank holds before dp sharding (tp and pp applied)
    microbatches_in_flight: int
    notes: tuple[str, ...] = ()

    def fits(self, capacity_bytes: int, headroom: float = DEFAULT_HEADROOM) -> bool:
        """True when the predicted peak is at most ``headroom`` x the device's memory."""
        return self.total_bytes <= headroom * capacity_bytes


# parameters ---------------------------------------------------------------------
def norm_parameters(config: GPTConfig) -> int:
    """One norm's parameters: LayerNorm's gain and bias, RMSNorm's gain."""
    return 2 * config.hidden_size if config.normalization == "LayerNorm" else config.hidden_size


def qk_norm_parameters(config: GPTConfig) -> int:
    """QK-norm's two norms over the head size (Qwen3's q_norm and k_norm), whole on every rank."""
    if not config.qk_layernorm:
        return 0
    return 2 * config.head_dim * (2 if config.normalization == "LayerNorm" else 1)


def routed_expert_parameters(config: GPTConfig, tp: int, layer: int, ep: int) -> int:
    """One rank's routed experts in layer ``layer``: E / ep SwiGLU experts of width f_e (3 h f_e
    each), their width split over tp as the dense MLP's (Megatron's expert tensor parallelism
    defaults to tp); 0 in a dense layer."""
    if not config.is_moe_layer(layer):
        return 0
    assert config.num_experts is not None
    return (config.num_experts // ep) * 3 * config.hidden_size * config.moe_ffn_size // tp


def block_parameters(config: GPTConfig, tp: int, layer: int = 0, ep: int = 1) -> int:
    """Block ``layer``'s parameters on one TP rank (hwbench/engine/parallelize.py's split,
    Megatron's): q, k, v and fc1 (SwiGLU: gate and up) column-parallel, weights and biases / t;
    out_proj and fc2 (down) row-parallel, weights / t, biases whole; the norms (QK-norm's too)
    whole. With f = ffn_size, q = heads x head size and kv = kv_heads x head size:
    (2h*q + 2h*kv + m*h*f [+ q + 2kv + n*f]) / t + 2 norms [+ 2h], m = 2 (GELU) or 3 (SwiGLU),
    n = 1 or 2, [...] with biases. Megatron GPT-2 (q = kv = h, f = 4h, biases, LayerNorm):
    (12h^2 + 7h) / t + 6h, so 12h^2 + 13h at t = 1. An MoE layer's MLP: the router (E x h,
    whole), this rank's routed experts (``routed_expert_parameters``) and the shared experts
    (3 h f_s / t)."""
    h, f, kv = config.hidden_size, config.ffn_size, config.kv_heads * config.head_dim
    q = config.num_attention_heads * config.head_dim
    split = 2 * h * q + 2 * h * kv
    whole = 2 * norm_parameters(config) + qk_norm_parameters(config)
    if config.is_moe_layer(layer):
        assert config.num_experts is not None
        whole += config.num_experts * h
        split += 3 * h * (config.moe_shared_expert_intermediate_size or 0)
    else:
        split += (3 if config.swiglu else 2) * h * f
    if config.add_bias_linear:  # never with experts (GPTConfig refuses it)
        split += q + 2 * kv + (2 if config.swiglu else 1) * f
        whole += 2 * h
    return split // tp + whole + routed_expert_parameters(config, tp, layer, ep)


def stage_parameters(config: GPTConfig, tp: int, pp: int, stage: int, ep: int = 1) -> StageParams:
    """Exact per-rank parameter counts (hwbench/engine/parallelize.py's split).

    Blocks: ``block_parameters`` of each of the stage's layers (dense and MoE ones alike). The
    word embedding and the output layer are vocab-parallel (V/t rows); learned positions (none
    with RoPE) are whole, on the first stage. The output layer lives on the last stage: its
    weight is the word embedding's when tied and pp = 1, else a weight of its own (untied: Llama
    3.1 8B, 70B, Mixtral; tied with pp > 1: a copy). Linear layers' parameters: the blocks less
    their norms, and the output layer's weight."""
    h = config.hidden_size
    vocab = config.padded_vocab_size(tp)
    indices = stage_layers(config.num_layers, pp, stage)
    blocks = [block_parameters(config, tp, layer, ep) for layer in indices]
    norms = 2 * norm_parameters(config) + qk_norm_parameters(config)
    layers = len(indices)
    embedding = 0
    if stage == 0:
        embedding = vocab * h // tp + (0 if config.rope else config.max_position_embeddings * h)
    head = output = 0
    if stage == pp - 1:
        output = vocab * h // tp
        own_output = pp > 1 or config.untie_embeddings_and_output_weights
        head = norm_parameters(config) + (output if own_output else 0)
    linear = sum(blocks) - layers * norms + output
    return StageParams(blocks=sum(blocks), block=max(blocks, default=0), embedding=embedding, head=head,
                       layers=layers, linear=linear,
                       experts=sum(routed_expert_parameters(config, tp, layer, ep) for layer in indices))


# activations ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SaveRules:
    """What decides the bytes a block keeps for its backward, beside the shape: the dtypes
    (``act``: what the linear layers and attention produce, the autocast dtype; ``residual``:
    the residual stream's, fp32 under hwbench's autocast over fp32 weights), how many copies of
    each norm's output its projections keep, and whether the device runs RMSNorm fused."""

    act: int
    residual: int
    attention_input_copies: int = 1
    mlp_input_copies: int = 1
    fused_qkv: bool = False
    fused_rms_norm: bool = False


def save_rules(spec: RunSpec, backend_name: str, config: GPTConfig) -> SaveRules:
    """The rules of ``spec`` on a device kind. Autocast caches its 16-bit casts of parameters
    only, so each projection reading a norm's fp32 output casts it again and keeps its own copy
    for its weight gradient: separate q, k and v keep 3 copies, SwiGLU's separate gate and up 2
    (measured, tests/test_planner.py). One fused projection, or no autocast (fp32; DeepSpeed's
    16-bit module), reads one tensor."""
    _, _, act, residual = _dtype_bytes(spec)
    autocast = spec.precision != "fp32" and spec.engine != "deepspeed"
    return SaveRules(act=act, residual=residual,
                     attention_input_copies=3 if autocast and not spec.fused_qkv else 1,
                     mlp_input_copies=2 if autocast and config.swiglu else 1,
                     fused_qkv=spec.fused_qkv, fused_rms_norm=KINDS[backend_name].fused_rms_norm)


@dataclasses.dataclass(frozen=True)
class SavedPerToken:
    """Bytes one block keeps for its backward per token, by term (Korthikanti et al. 2022,
    "Reducing Activation Recomputation in Large Transformer Models", §4, for hwbench's block:
    SDPA keeps no (a, s, s) scores, no dropout masks). The first three are whole on every TP
    rank, the rest this rank's share."""

    norms: int  # both norms: input and statistics (``norm_saved_per_token``)
    attention_inputs: int  # copies of the first norm's output that q, k and v keep
    # copies of the second norm's output that fc1 (gate and up; an MoE layer's router, shared experts) keep
    mlp_inputs: int
    qkv: int  # what attention keeps of q, k and v (``qkv_saved_per_token``)
    attention: int  # SDPA's output (out_proj's input) and its fp32 log-sum-exp per head
    # GELU: fc1's output, GELU's; SwiGLU: gate's and up's outputs, SiLU's, their product (MoE: the shared experts')
    mlp: int
    qk_norms: int = 0  # QK-norm's inputs and statistics (``qk_norm_saved_per_token``)
    router: int = 0  # an MoE layer's routing: scores, each token's experts and weights, the dispatch order
    experts: int = 0  # an MoE layer's routed rows: the grouped GEMMs' inputs and outputs, each top-k assignment

    @property
    def total(self) -> int:
        return (self.norms + self.attention_inputs + self.mlp_inputs + self.qkv + self.attention + self.mlp
                + self.qk_norms + self.router + self.experts)


def norm_saved_per_token(config: GPTConfig, rules: SaveRules) -> int:
    """What one norm keeps per token. LayerNorm: its input and the fp32 mean and rstd.
    RMSNorm fused (``SaveRules.fused_rms_norm``): its input and the fp32 rstd; torch's
    composite: the input upcast to fp32, the fp32 normalised output (for the gain's gradient)
    and rstd."""
    h = config.hidden_size
    if config.normalization == "LayerNorm":
        return rules.residual * h + 2 * FP32
    if rules.fused_rms_norm:
        return rules.residual * h + FP32
    return 2 * FP32 * h + FP32


def qkv_saved_per_token(config: GPTConfig, rules: SaveRules) -> int:
    """What attention keeps of q (q = heads x head size wide: h unless kv_channels says) and k, v
    (kv = kv_heads x head size wide each), before tensor parallelism. Separate projections: the
    (rotated) q and k and v, ``act x (q + 2kv)``: grouped-query attention narrows k and v, and
    RoPE keeps its tables, not q and k before the rotation. One fused projection: its whole
    output, which the views attention keeps hold alive, and the copies made of it: q when rotated
    or gathered from its groups (GQA), k when rotated."""
    q, kv, c = config.num_attention_heads * config.head_dim, config.kv_heads * config.head_dim, rules.act
    saved = c * (q + 2 * kv)
    if rules.fused_qkv:
        grouped = config.kv_heads < config.num_attention_heads
        saved += c * q * (config.rope or grouped) + c * kv * config.rope
    return saved


def qk_norm_saved_per_token(config: GPTConfig, rules: SaveRules) -> int:
    """What QK-norm (Qwen3) keeps per token, before tensor parallelism: for each query and key
    head, what ``norm_saved_per_token`` keeps of a norm over the head size D. Its input is the
    projection's output in the activation dtype, so the fused RMSNorm runs only where that is the
    weights' dtype (fp32; DeepSpeed's 16-bit module): input and fp32 rstd, ``act x D + 4``.
    Under autocast (bf16 input, fp32 gain) torch falls back to the composite on every device:
    the fp32 input and normalised output and rstd, ``8D + 4`` (measured on the CPU)."""
    if not config.qk_layernorm:
        return 0
    heads, D = config.num_attention_heads + config.kv_heads, config.head_dim
    if config.normalization == "LayerNorm":
        return heads * (rules.act * D + 2 * FP32)
    fused = rules.fused_rms_norm and rules.act == rules.residual  # one dtype: no autocast
    saved = heads * ((rules.act * D if fused else 2 * FP32 * D) + FP32)
    if rules.fused_qkv and (fused or rules.act == FP32):
        # the input kept is the projection's output itself (not an fp32 upcast): for k a view of
        # the fused output, which qkv_saved_per_token counts; for q too without groups to gather
        grouped = config.kv_heads < config.num_attention_heads
        saved -= rules.act * D * (config.kv_heads + (0 if grouped else config.num_attention_heads))
    return saved


def router_saved_per_token(config: GPTConfig) -> int:
    """What an MoE layer's routing keeps per token (hwbench.workload.moe, measured): the fp32
    scores (E), the top k experts (int64) and the k weights combine multiplies by (fp32); where
    they are renormalised (softmax but moe_router_pre_softmax; sigmoid with k > 1), also the k
    unnormalised ones and their sum; sigmoid's load-balancing scores keep their sum; the dispatch
    keeps the sorted order and each row's token (int64, k each); a capacity keeps two masks of the
    kept assignments (bool, k each)."""
    k, E = config.moe_router_topk, config.num_experts or 0
    saved = FP32 * E + 8 * k + FP32 * k + 2 * 8 * k
    sigmoid = config.moe_router_score_function == "sigmoid"
    if (not sigmoid and not config.moe_router_pre_softmax) or (sigmoid and k > 1):
        saved += FP32 * k + FP32
    if sigmoid:
        saved += FP32
    if config.moe_expert_capacity_factor is not None:
        saved += 2 * k
    return saved


def experts_saved_per_token(config: GPTConfig, tp: int, ep: int, rules: SaveRules) -> int:
    """What an MoE layer's routed experts keep per token, each of its k assignments a row: the
    grouped GEMMs' input (the token's row, one copy per projection that casts it under
    autocast: ``mlp_input_copies``), gate's and up's outputs, SiLU's and their product (4 f_e,
    f_e / t), down's output (combine's index_copy keeps its source) and the unsorted rows combine
    weights. Balanced routing: each rank runs as many rows as its tokens have assignments. With
    expert parallelism (ep > 1, hwbench.engine.expert_parallel) the rows the experts receive are
    as many, and two more tensors are kept (measured on 2 ranks, tests/test_planner.py): the
    rows combine's all-to-all brings back, concatenated with the dropped ones (a copy, k x h,
    which the token order's index_copy keeps), and the order dispatch sorts the received rows
    by expert in (int64, k)."""
    k, h, c = config.moe_router_topk, config.hidden_size, rules.act
    saved = k * (rules.mlp_input_copies * c * h + 4 * c * config.moe_ffn_size // tp + 2 * c * h)
    return saved + (k * (c * h + 8) if ep > 1 else 0)


def moe_saved_per_layer(config: GPTConfig, ep: int = 1) -> int:
    """An MoE layer's saved tensors of a fixed size per micro-batch: the grouped GEMMs' offsets
    (int32, one per expert of this rank: E / ep) and, with a load-balancing loss, the
    assignments per expert (int64, E). (A capacity's choice of each expert's tokens is saved by a
    branch the forward drops: freed.)"""
    assert config.num_experts is not None
    return 4 * config.num_experts // ep + (8 * config.num_experts if config.moe_aux_loss_coeff > 0 else 0)


def saved_per_token(config: GPTConfig, tp: int, rules: SaveRules, layer: int = 0, ep: int = 1) -> SavedPerToken:
    """What block ``layer`` keeps per token. An MoE layer's MLP: the router reads the norm's
    output (under autocast its own 16-bit cast; in fp32 the output itself, which the shared
    experts read too, one copy), the shared experts' gate and up cast it again under autocast,
    and keep a SwiGLU's 4 f_s; the routing and the routed rows as ``router_saved_per_token`` and
    ``experts_saved_per_token``."""
    h, c = config.hidden_size, rules.act
    q = config.num_attention_heads * config.head_dim
    shared = 0 if config.is_moe_layer(layer) else config.ffn_size  # the dense MLP, or the shared experts
    mlp_inputs = rules.mlp_input_copies
    if config.is_moe_layer(layer):
        shared = config.moe_shared_expert_intermediate_size or 0
        mlp_inputs = 1 if rules.mlp_input_copies == 1 else 1 + (rules.mlp_input_copies if shared else 0)
    return SavedPerToken(
        norms=2 * norm_saved_per_token(config, rules),
        attention_inputs=rules.attention_input_copies * c * h,
        mlp_inputs=mlp_inputs * c * h,
        qkv=qkv_saved_per_token(config, rules) // tp,
        attention=(c * q + FP32 * config.num_attention_heads) // tp,
        mlp=(4 if config.swiglu else 2) * c * shared // tp,
        qk_norms=qk_norm_saved_per_token(config, rules) // tp,
        router=router_saved_per_token(config) if config.is_moe_layer(layer) else 0,
        experts=experts_saved_per_token(config, tp, ep, rules) if config.is_moe_layer(layer) else 0)


def rope_saved_per_layer(config: GPTConfig, s: int, rules: SaveRules) -> int:
    """RoPE's share of a block's saved tensors: the rotation multiplies q and k by the cos and
    sin tables cast to their dtype, and keeps the casts: four (s, head size) tables per block in
    16 bits. In fp32 the cast is the table itself, shared by every block (``rope_tables_bytes``)."""
    return 4 * s * config.head_dim * rules.act if config.rope and rules.act != FP32 else 0


def rope_tables_bytes(config: GPTConfig, s: int) -> int:
    """RoPE's fp32 cos and sin tables, (s, head size) each, made once per device and kept."""
    return 2 * s * config.head_dim * FP32 if config.rope else 0


def activation_bytes_per_layer(s: int, b: int, config: GPTConfig, tp: int, rules: SaveRules, layer: int = 0,
                               ep: int = 1) -> int:
    """Bytes block ``layer`` keeps for its backward: ``saved_per_token`` for each of the s*b
    tokens, RoPE's per-sequence casts and an MoE layer's fixed-size ones. Megatron GPT-2 with
    act = residual = 2 (DeepSpeed's 16-bit module): s*b*h*(8 + 24/t) plus the norms' and
    softmax's statistics, Korthikanti's 10 + 24/t less the two dropout masks."""
    moe = moe_saved_per_layer(config, ep) if config.is_moe_layer(layer) else 0
    return s * b * saved_per_token(config, tp, rules, layer, ep).total + rope_saved_per_layer(config, s, rules) + moe


def _dtype_bytes(spec: RunSpec) -> tuple[int, int, int, int]:
    """(weight, gradient, activation, residual-stream) bytes for the engine and precision."""
    if spec.precision == "fp32":
        return FP32, FP32, FP32, FP32
    if spec.engine == "deepspeed":  # DeepSpeed converts the module to fp16/bf16
        return HALF, HALF, HALF, HALF
    return FP32, FP32, HALF, FP32  # autocast over fp32 weights: the residual stream stays fp32


def microbatches_in_flight(spec: RunSpec, stage: int) -> int:
    """Micro-batches whose activations a stage holds at once: 1 without pipelining
    (accumulation runs forward then backward per micro-batch); 1F1B: pp - stage
    (at most all of them); GPipe: all of them."""
    m = spec.gradient_accumulation_steps
    if spec.parallel.pp == 1:
        return 1
    if spec.pp_schedule == "gpipe":
        return m
    return min(spec.parallel.pp - stage, m)


def gradients_exist_before_backward(spec: RunSpec) -> bool:
    """Whether the gradients are there when a backward starts (with every activation kept). The
    native engine sets them to None after each step (zero_grad(set_to_none=True)), so with one
    micro-batch and no pipeline they are made by the backward as the activations go; with
    accumulation or a pipeline the earlier micro-batches' gradients are there. DeepSpeed's are
    counted as there (its ZeRO buffers are not modelled this finely)."""
    return spec.engine == "deepspeed" or spec.parallel.pp > 1 or spec.gradient_accumulation_steps > 1


@dataclasses.dataclass(frozen=True)
class _States:
    """Weights, gradients and optimizer state of one rank, and the buffers beside them."""

    weights: int
    gradients: int
    optimizer: int
    buffers: int  # persistent communication buffers
    step_transient: int  # after the backward only
    notes: tuple[str, ...]


def plan_stage(spec: RunSpec, config: GPTConfig, backend_name: str, stage: int) -> MemoryPlan:
    """The predicted peak of a rank of pipeline stage ``stage``. ``config`` is the
    workload's shape; the spec's --max-positions is applied to it here."""
    config = spec.model_config(config)
    if backend_name not in OVERHEAD_BYTES:
        raise UsageError(f"--device {backend_name!r} is not known; accepted: {', '.join(DEVICE_KINDS)}")
    params = stage_parameters(config, spec.parallel.tp, spec.parallel.pp, stage, spec.parallel.ep)
    states = _states(spec, backend_name, params.total, params.experts)
    rules = save_rules(spec, backend_name, config)
    in_flight = microbatches_in_flight(spec, stage)
    activations, activation_notes = _activations(spec, config, params, stage, in_flight, rules)
    logits, logits_notes = _logits(spec, config, stage, in_flight)
    gathered, gathered_notes = _gathered(spec, params)
    cast_weights, cast_notes = _cast_weights(spec, params)
    buffers = (states.buffers + rope_tables_bytes(config, spec.seq_length)
               + pipeline_buffers_bytes(spec, config, stage, in_flight))
    gradients_there = gradients_exist_before_backward(spec)
    before_backward = states.gradients if gradients_there else 0
    overhead = OVERHEAD_BYTES[backend_name]
    working = before_backward + activations + logits + gathered + cast_weights
    total = (states.weights + states.optimizer + buffers + overhead
             + max(working, states.gradients + states.step_transient))
    notes = (*states.notes, *activation_notes, *cast_notes, *logits_notes, *gathered_notes)
    if not gradients_there:
        notes += ("gradients: none yet when the backward starts (one micro-batch; set to None after each step)",)
    return MemoryPlan(stage=stage, weights_bytes=states.weights, gradients_bytes=states.gradients,
                      gradients_before_backward_bytes=before_backward, optimizer_bytes=states.optimizer,
                      buffers_bytes=buffers, activations_bytes=activations, logits_bytes=logits,
                      gathered_bytes=gathered, cast_weights_bytes=cast_weights,
                      step_transient_bytes=states.step_transient, overhead_bytes=overhead, total_bytes=total,
                      parameters=params.total, microbatches_in_flight=in_flight, notes=notes)


def _states(spec: RunSpec, backend_name: str, n: int, experts: int = 0) -> _States:
    """The states of ``n`` parameters under the engine, precision and sharding of ``spec``; the
    ``experts`` among them (this rank's routed experts) are sharded over the expert-data-parallel
    ranks (dp / ep, those holding the same experts), the others over dp."""
    tp, pp, dp = spec.parallel.tp, spec.parallel.pp, spec.parallel.dp
    expert_dp = max(1, spec.parallel.expert_dp)

    def shard(bytes_per_parameter: int) -> int:
        return _ceil((n - experts) * bytes_per_parameter, dp) + _ceil(experts * bytes_per_parameter, expert_dp)

    w_b, g_b, _, _ = _dtype_bytes(spec)
    notes: list[str] = []
    deepspeed = spec.engine == "deepspeed"
    half = spec.precision != "fp32"
    zero = spec.zero_stage if deepspeed and dp > 1 else 0
    opt_per_param = _optimizer_bytes_per_parameter(spec)
    if deepspeed and half:
        notes.append("deepspeed 16-bit: 2+2+12 bytes/param (ZeRO paper, K=12)")
    weights, gradients, optimizer = n * w_b, n * g_b, n * opt_per_param
    sharded = spec.fsdp and dp > 1
    if sharded:  # FSDP2: everything sharded over dp (padding to a multiple of dp ignored)
        weights, gradients, optimizer = shard(w_b), shard(g_b), shard(opt_per_param)
    if zero >= 1:
        optimizer = shard(opt_per_param)
    if zero >= 2:
        gradients = shard(g_b)
    if zero >= 3:
        weights = shard(w_b)

    buffers = step_transient = 0
    if not deepspeed and dp > 1 and not spec.fsdp:
        if tp == 1 and pp == 1:
            # DDP's gradient buckets: a second copy (gradient_as_bucket_view=False). With expert
            # parallelism DDP leaves the experts out: their gradients go in one flat all-reduce
            # over the ranks holding the same experts after the backward (hwbench.engine.native)
            apart = experts if spec.parallel.ep > 1 else 0
            buffers = (n - apart) * g_b
            step_transient = apart * g_b
            notes.append("DDP buckets: one more gradient copy" + (" (the experts': a flat all-reduce at the step)"
                                                                  if apart else ""))
        else:
            step_transient = n * g_b  # native engine: one flat all-reduce buffer of the gradients
    if deepspeed and dp > 1 and zero in (1, 2):
        buffers = min(n, DEEPSPEED_REDUCE_BUCKET_ELEMENTS) * g_b
    if deepspeed and half:  # the fp32 gradients of (this partition of) the master weights at the step
        step_transient = max(step_transient, _ceil(n * FP32, dp if zero >= 1 else 1))
    if not deepspeed and not KINDS[backend_name].fused_adamw:
        # foreach AdamW (no fused kernel): sqrt(v) temporaries the size of the local parameters
        local = shard(1) if sharded else n
        step_transient = max(step_transient, local * FP32)
        notes.append(f"{backend_name}: foreach AdamW temporaries at the step")
    return _States(weights, gradients, optimizer, buffers, step_transient, tuple(notes))


def _optimizer_bytes_per_parameter(spec: RunSpec) -> int:
    """AdamW's state per parameter: two fp32 moments, and DeepSpeed's fp32 master weight beside
    them under 16 bits (the ZeRO paper's K = 12: 2 + 2 + 12 bytes per parameter)."""
    return 3 * FP32 if spec.engine == "deepspeed" and spec.precision != "fp32" else 2 * FP32


def state_bytes(spec: RunSpec, config: GPTConfig) -> int:
    """Every parameter's weight, gradient and optimizer state under ``spec``'s engine and
    precision (16 bytes a parameter for each engine and precision hwbench runs): what a job's
    devices hold together at the least, since sharding divides it among them and removes none."""
    w_b, g_b, _, _ = _dtype_bytes(spec)
    return count_parameters(spec.model_config(config)).total * (w_b + g_b + _optimizer_bytes_per_parameter(spec))


def _activations(spec: RunSpec, config: GPTConfig, params: StageParams, stage: int, in_flight: int,
                 rules: SaveRules) -> tuple[int, tuple[str, ...]]:
    """Everything this stage keeps for its backward, all micro-batches in flight: its blocks'
    (or with recompute their inputs, and one block's while it is recomputed), and on the last
    stage the final norm's and the output layer's inputs."""
    s, b, h = spec.seq_length, spec.micro_batch_size, config.hidden_size
    layers = [activation_bytes_per_layer(s, b, config, spec.parallel.tp, rules, layer, spec.parallel.ep)
              for layer in stage_layers(config.num_layers, spec.parallel.pp, stage)]
    notes: tuple[str, ...] = ()
    if spec.recompute:
        per_micro = params.layers * s * b * h * rules.residual  # each block's input only
        recompute_peak = max(layers, default=0)  # one block's activations while it is recomputed
        notes = ("recompute: block inputs kept, one block recomputed at a time",)
    else:
        per_micro = sum(layers)
        recompute_peak = 0
    if spec.parallel.ep > 1:
        notes += ("expert parallelism: balanced routing assumed (each rank's experts receive as many rows as its "
                  "tokens' assignments)",)
    if stage == spec.parallel.pp - 1:
        per_micro += s * b * (norm_saved_per_token(config, rules) + h * rules.act)
    elif spec.engine == "native":  # the pipeline keeps the stage's output for its backward (fwd_cache)
        per_micro += s * b * h * rules.residual
    return in_flight * per_micro + recompute_peak, notes


def pipeline_buffers_bytes(spec: RunSpec, config: GPTConfig, stage: int, in_flight: int) -> int:
    """torch.distributed.pipelining's receive buffers on a stage (native engine): one per
    micro-batch of the step for the input it receives (stages after the first; those of the
    micro-batches in flight are the first block's saved input, counted there) and one for the
    gradient of its output (stages before the last), each (b, s, h) in the residual stream's dtype.
    An input buffer also keeps the gradient its backward made until the next step clears it
    (clear_runtime_states): the m - 1 micro-batches done when the last backward starts."""
    pp, m = spec.parallel.pp, spec.gradient_accumulation_steps
    if pp == 1 or spec.engine != "native":
        return 0
    one = spec.micro_batch_size * spec.seq_length * config.hidden_size * _dtype_bytes(spec)[3]
    inputs = (m - in_flight + m - 1) * one if stage > 0 else 0
    gradients = m * one if stage < pp - 1 else 0
    return inputs + gradients


def _cast_weights(spec: RunSpec, params: StageParams) -> tuple[int, tuple[str, ...]]:
    """Autocast casts each fp32 parameter a linear layer reads to 16 bits once and keeps the copy
    in its cache until the autocast region ends, after the loss; without recompute the backward
    keeps the weights' copies until each layer's own backward too. So at the end of the forward
    every copy is alive, even under FSDP2, whose unsharded parameters are what autocast casts: the
    copies of every block stay after the block is resharded. DeepSpeed holds 16-bit weights: no casts."""
    if spec.precision == "fp32" or spec.engine == "deepspeed":
        return 0, ()
    return params.linear * HALF, ("autocast: 16-bit copies of the linear layers' parameters, 2 bytes/param, "
                                  "to the forward's end",)


def _logits(spec: RunSpec, config: GPTConfig, stage: int, in_flight: int) -> tuple[int, tuple[str, ...]]:
    """The loss's share of the last stage (none elsewhere)."""
    tp, pp = spec.parallel.tp, spec.parallel.pp
    if stage != pp - 1:
        return 0, ()
    loss_parallel = tp > 1 and pp == 1  # hwbench/engine/native.py: else the logits are gathered
    vocab = config.padded_vocab_size(tp) // (tp if loss_parallel else 1)
    notes: tuple[str, ...] = ()
    if tp > 1 and not loss_parallel:
        notes = ("tp with pp: logits gathered over the full vocabulary on the last stage",)
    s, b = spec.seq_length, spec.micro_batch_size
    if spec.cross_entropy == "chunked":
        # per micro-batch in flight: each token's fp32 log-sum-exp; at a time, one chunk's fp32
        # logits and log-sum-exp's fp32 temporary (logits less their maximum, exponentiated in
        # place). The 16-bit product is freed as its fp32 copy is made, and the backward's chunk
        # (fp32, made the gradient in place, then its 16-bit cast) is smaller (measured on the CPU)
        chunk = min(CROSS_ENTROPY_CHUNK_TOKENS, s * b)
        return (in_flight * s * b * FP32 + chunk * vocab * 2 * FP32,
                (*notes, f"chunked cross-entropy: {chunk} tokens' logits at a time"))
    # per micro-batch in flight: the fp32 log-softmax kept for the loss's backward, and under the
    # native engine's pipeline the stage's output, the logits, which it keeps for the backward
    # (fwd_cache); during one backward, its peak: the fp32 gradient nll_loss hands back and the
    # fp32 gradient log-softmax's backward makes from it (the forward's 16-bit logits and fp32
    # copy, 2 + 4, are fewer bytes)
    kept = FP32 + (_dtype_bytes(spec)[2] if pp > 1 and spec.engine == "native" else 0)
    return s * b * vocab * (in_flight * kept + 2 * FP32), notes


def _gathered(spec: RunSpec, params: StageParams) -> tuple[int, tuple[str, ...]]:
    """FSDP2's or ZeRO-3's unsharded parameters (and one unit's gradients) while computing."""
    w_b, g_b, _, _ = _dtype_bytes(spec)
    dp, pp = spec.parallel.dp, spec.parallel.pp
    if spec.fsdp and dp > 1:
        # FSDP2 units: every block, and the root (embeddings, final norm, output).
        # The root stays gathered from its forward to its backward (FSDP2 never
        # reshards the root after forward); blocks: the one computing and the one
        # prefetched, or all of the stage's when pp > 1 (reshard_after_forward=False);
        # plus one block's unsharded gradients before their reduce-scatter.
        kept_blocks = 2 if pp == 1 else params.layers
        root = params.embedding + params.head
        return (root + min(kept_blocks, params.layers) * params.block) * w_b + params.block * g_b, ()
    if spec.engine == "deepspeed" and dp > 1 and spec.zero_stage >= 3:
        # ZeRO-3 gathers module by module with a prefetch: about two blocks, or the word embedding
        return (max(params.embedding + params.head, 2 * params.block) * w_b + params.block * g_b,
                ("zero-3 gathered units approximated as max(embedding, two blocks)",))
    return 0, ()


def plan_for_all_stages(spec: RunSpec, config: GPTConfig, backend_name: str) -> list[MemoryPlan]:
    """Every pipeline stage's plan (``config`` as in plan_stage)."""
    return [plan_stage(spec, config, backend_name, stage) for stage in range(spec.parallel.pp)]


def plan_memory(spec: RunSpec, config: GPTConfig, backend_name: str) -> MemoryPlan:
    """The plan of the rank with the largest predicted peak (its ``stage`` says
    which pipeline stage; the first stage wins ties). ``config`` is the workload's
    shape, as in plan_stage."""
    plans = plan_for_all_stages(spec, config, backend_name)
    return max(plans, key=lambda plan: (plan.total_bytes, -plan.stage))


def _ceil(value: int, divisor: int) -> int:
    return -(-value // divisor)


# sizes ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Variant:
    """How a layout's data parallelism is run: the native engine plain or with FSDP2, either
    with the routed experts split over ``ep`` of the data-parallel ranks (a mixture of experts),
    or DeepSpeed with a ZeRO stage. `hwbench plan` and `hwbench tune` share these."""

    engine: str
    fsdp: bool = False
    zero: int = 0
    ep: int = 1

    @property
    def name(self) -> str:
        base = "native fsdp" if self.fsdp else "native" if self.engine == "native" else f"deepspeed zero{self.zero}"
        return base + (f" ep{self.ep}" if self.ep > 1 else "")

    @property
    def short(self) -> str:
        base = "fsdp" if self.fsdp else "plain" if self.engine == "native" else f"zero{self.zero}"
        return base + (f"-ep{self.ep}" if self.ep > 1 else "")

    def options(self) -> dict:
        """The run options that select this variant."""
        return {"engine": self.engine, "fsdp": self.fsdp or None,
                "zero": self.zero if self.engine == "deepspeed" else None, "ep": self.ep if self.ep > 1 else None}


def variants(tp: int, pp: int, dp: int, engines: Sequence[str] = ENGINES, experts: int | None = None) -> list[Variant]:
    """The variants a tp x pp x dp layout can run: native plain, FSDP2 when there is
    data parallelism to shard over, DeepSpeed ZeRO 0-3 (0 only without data
    parallelism) for pure data parallelism. For a mixture of ``experts`` routed experts a
    layer, also native plain and FSDP2 with every expert-parallel degree above 1 that divides
    both the experts and dp (hwbench.spec's rule), at tp = pp = 1: the engine runs expert
    parallelism beside data parallelism only."""
    found = []
    if "native" in engines:
        found.append(Variant("native"))
        if dp > 1:
            found.append(Variant("native", fsdp=True))
        if experts and tp == 1 and pp == 1:
            found += [Variant("native", fsdp=fsdp, ep=ep) for ep in expert_parallel_degrees(experts, dp) if ep > 1
                      for fsdp in (False, True)]
    if "deepspeed" in engines and tp == 1 and pp == 1:
        found += [Variant("deepspeed", zero=zero) for zero in range(4 if dp > 1 else 1)]
    return found


def layouts(devices: int) -> list[tuple[int, int, int]]:
    """Every (tp, pp, dp) split of ``devices``, tp-major."""
    return [(tp, pp, devices // (tp * pp)) for tp in range(1, devices + 1) for pp in range(1, devices + 1)
            if devices % (tp * pp) == 0]
