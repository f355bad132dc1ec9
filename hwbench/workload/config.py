"""The shape of a GPT model as Megatron-LM's GPTModel takes it: Megatron GPT-2 by default
(4h GELU MLP, LayerNorm, learned positions, biases, tied output layer, head size h / heads,
the vocabulary padded to a multiple of 128 x TP), and the Llama 3 architecture through
Megatron's own switches (--num-query-groups, --swiglu, --normalization RMSNorm,
--position-embedding-type rope, --ffn-hidden-size, --disable-bias-linear,
--untie-embeddings-and-output-weights); the loss choices every layer agrees on without
importing torch, and the batch arithmetic they share (one step's micro-batches per
data-parallel replica: ``accumulation_steps``). A mixture-of-experts MLP (Mixtral, Qwen3-MoE)
replaces the dense one through Megatron's MoE switches (--num-experts, --moe-router-topk,
--moe-ffn-hidden-size, ...; hwbench.workload.moe)."""

from __future__ import annotations

import dataclasses

# --cross-entropy: `standard` projects every token onto the vocabulary at once (the
# [tokens, vocab] logits and their fp32 copy exist together); `chunked` does the output
# projection, the fp32 upcast and the loss CROSS_ENTROPY_CHUNK_TOKENS tokens at a time and
# recomputes each chunk's logits in the backward (hwbench.workload.model.chunked_lm_loss).
CROSS_ENTROPY_CHOICES = ("standard", "chunked")
# Tokens per chunk: 2048 x 50304 fp32 logits are 412 MB, and a [2048, h] x [h, 50304] product
# is large enough to keep a GPU's matrix units busy. The planner counts the same figure.
CROSS_ENTROPY_CHUNK_TOKENS = 2048


NORMALIZATIONS = ("LayerNorm", "RMSNorm")  # Megatron's --normalization
POSITION_EMBEDDINGS = ("learned_absolute", "rope")  # Megatron's --position-embedding-type
ROUTER_SCORE_FUNCTIONS = ("softmax", "sigmoid")  # Megatron's --moe-router-score-function
# F.grouped_mm, which runs the experts, needs rows aligned to 16 bytes: 8 elements in 16 bits
GROUPED_GEMM_ALIGNMENT = 8


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's scaling of the rotary frequencies (config.json's ``rope_scaling`` with
    rope_type llama3; Megatron's --use-rope-scaling): wavelengths longer than
    original_max_position_embeddings / low_freq_factor are divided by ``factor``, those
    shorter than original / high_freq_factor kept, the band between interpolated."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Architecture of one model size, in Megatron-LM's argument names. What is not given
    follows Megatron GPT-2's defaults (``kv_heads``, ``ffn_size`` and the padded vocabulary
    are derived here); a workload YAML's ``model`` mapping holds these fields."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    max_position_embeddings: int
    vocab_size: int = 50257
    make_vocab_size_divisible_by: int = 128
    num_query_groups: int | None = None  # key/value heads (grouped-query attention); None: one per head
    ffn_hidden_size: int | None = None  # the MLP's inner width; None: 4h
    swiglu: bool = False  # SwiGLU MLP (gate and up projections, SiLU) instead of GELU
    normalization: str = dataclasses.field(default="LayerNorm", metadata={"choices": NORMALIZATIONS})
    norm_epsilon: float = 1e-5
    position_embedding_type: str = dataclasses.field(default="learned_absolute",
                                                     metadata={"choices": POSITION_EMBEDDINGS})
    rotary_base: float = 10000.0  # RoPE's theta (Llama 3: 500000)
    rope_scaling: RopeScaling | None = None
    add_bias_linear: bool = True  # biases on every linear layer (Megatron's --disable-bias-linear: False)
    untie_embeddings_and_output_weights: bool = False  # an output layer of its own (Llama 3.1 8B, 70B)
    kv_channels: int | None = None  # the head size (Megatron's --kv-channels; Qwen3's head_dim); None: h / heads
    qk_layernorm: bool = False  # queries and keys normalised per head before RoPE (Qwen3)
    # Mixture of experts (Megatron's --num-experts and --moe-* switches); None: a dense MLP
    num_experts: int | None = None  # routed experts in each MoE layer
    moe_router_topk: int = 2  # experts each token is routed to
    moe_ffn_hidden_size: int | None = None  # each expert's inner width; None: ffn_size
    moe_shared_expert_intermediate_size: int | None = None  # shared experts' total width, every token; None: none
    moe_router_score_function: str = dataclasses.field(default="softmax",
                                                       metadata={"choices": ROUTER_SCORE_FUNCTIONS})
    moe_router_pre_softmax: bool = False  # softmax's top-k probabilities as they are, not renormalised (OLMoE)
    moe_aux_loss_coeff: float = dataclasses.field(default=0.0, metadata={"minimum": 0.0})  # load-balancing loss
    moe_expert_capacity_factor: float | None = None  # tokens over capacity dropped; None: dropless
    moe_layer_freq: int = 1  # every n-th layer (from layer 0) is an MoE layer, the others dense

    @property
    def kv_heads(self) -> int:
        """Key/value heads: num_query_groups, else one per attention head (multi-head attention)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        """The MLP's inner width: ffn_hidden_size, else Megatron GPT-2's 4h."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def moe(self) -> bool:
        """Whether MoE layers replace (some of) the dense MLPs."""
        return self.num_experts is not None

    @property
    def moe_ffn_size(self) -> int:
        """Each routed expert's inner width: moe_ffn_hidden_size, else ffn_size (Megatron's default)."""
        return self.moe_ffn_hidden_size or self.ffn_size

    def is_moe_layer(self, layer: int) -> bool:
        """Layer ``layer`` (from 0) has the MoE MLP: Megatron's --moe-layer-freq n makes every
        n-th layer one, layer 0 first."""
        return self.moe and layer % self.moe_layer_freq == 0

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(layer) for layer in range(self.num_layers))

    @property
    def rope(self) -> bool:
        return self.position_embedding_type == "rope"

    @property
    def architecture(self) -> str:
        """"GPT-2" (Megatron GPT-2's switches: multi-head attention, GELU, LayerNorm, learned
        positions, biases, a tied output layer), "Llama" (Llama 3's: RMSNorm, RoPE, SwiGLU, no
        biases; grouped-query attention, QK-norm, MoE MLPs and an untied output layer or not), else
        "custom"."""
        if (not self.swiglu and self.normalization == "LayerNorm" and not self.rope and self.add_bias_linear
                and self.kv_heads == self.num_attention_heads and not self.untie_embeddings_and_output_weights
                and not self.moe and not self.qk_layernorm and self.kv_channels is None):
            return "GPT-2"
        if self.swiglu and self.normalization == "RMSNorm" and self.rope and not self.add_bias_linear:
            return "Llama"
        return "custom"

    @property
    def head_dim(self) -> int:
        """The head size: kv_channels, else h / heads (Megatron's default)."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def padded_vocab_size(self, tensor_parallel: int = 1) -> int:
        """Megatron pads the vocabulary to a multiple of
        make_vocab_size_divisible_by x TP (50257 -> 50304 at TP1, 50432 at TP2)."""
        multiple = self.make_vocab_size_divisible_by * tensor_parallel
        return -(-self.vocab_size // multiple) * multiple

    def problems(self) -> list[str]:
        """What makes this shape unbuildable, as sentences (empty when fine). Each field is a positive
        integer already: the catalog's schema (hwbench.catalog) refuses any other value."""
        problems = []
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            problems.append(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                            f"{self.num_attention_heads}")
        if self.num_attention_heads % self.kv_heads:
            problems.append(f"num_attention_heads {self.num_attention_heads} is not divisible by num_query_groups "
                            f"{self.kv_heads}")
        if self.rope and self.head_dim % 2:
            problems.append(f"rotary embeddings need an even head size, not {self.head_dim}")
        return problems + self._moe_problems()

    def _moe_problems(self) -> list[str]:
        if self.num_experts is None:
            return []
        problems = []
        if self.moe_router_topk > self.num_experts:
            problems.append(f"moe_router_topk {self.moe_router_topk} is above num_experts {self.num_experts}; "
                            f"accepted: 1 to {self.num_experts}")
        if not self.swiglu or self.add_bias_linear:
            problems.append("num_experts needs swiglu true and add_bias_linear false: the experts are SwiGLU MLPs "
                            "without biases (Mixtral's, Qwen3-MoE's)")
        if self.moe_router_pre_softmax and self.moe_router_score_function != "softmax":
            problems.append("moe_router_pre_softmax is the softmax score function's; accepted with "
                            "moe_router_score_function softmax, or moe_router_pre_softmax false")
        widths = {"hidden_size": self.hidden_size, "the experts' width": self.moe_ffn_size,
                  "moe_shared_expert_intermediate_size": self.moe_shared_expert_intermediate_size or 0}
        unaligned = [f"{name} {width}" for name, width in widths.items() if width % GROUPED_GEMM_ALIGNMENT]
        if unaligned:
            problems.append(f"{', '.join(unaligned)}: an MoE model's widths must be multiples of "
                            f"{GROUPED_GEMM_ALIGNMENT} (the grouped GEMM's 16-byte rows)")
        return problems


def stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """The block indices of pipeline ``stage``: an even split, the first stages
    taking one more block when the layers do not divide."""
    base, extra = divmod(num_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def accumulation_steps(global_batch_size: int, micro_batch_size: int, dp: int) -> int:
    """Micro-batches each data-parallel replica runs per step (gradient accumulation): the
    one place it is computed (RunSpec, the result's spec, the data sources, DeepSpeed, MLPerf)."""
    return global_batch_size // (micro_batch_size * dp)
