"""Parameter counts from the architecture alone, without allocating weights."""

from __future__ import annotations

import dataclasses

from hwbench.workload.config import GPTConfig


@dataclasses.dataclass(frozen=True)
class ParameterCount:
    total: int
    embedding: int  # word + learned position embeddings (a tied output layer shares the word embedding)
    non_embedding: int  # transformer blocks, the final norm and an untied output layer
    # The weights of the matrix products, which the 6N FLOPs formulas count (hwbench.workload.flops):
    attention_weights: int  # every layer's q, k, v and output projections
    mlp_weights: int  # every layer's MLP (fc1, fc2; SwiGLU: gate, up, down; MoE: router, every expert, shared experts)
    output_weights: int  # the output layer, V x h: its own when untied, the word embedding when tied
    outside_matmuls: int  # norm gains and biases (QK-norm's too), linear biases: in no matrix product
    active: int  # what one token passes through: all but the routed experts it is not sent to (= total when dense)
    # The MoE layers' parts of mlp_weights (0 for a dense model): what the FLOPs formulas count apart
    router_weights: int = 0  # every MoE layer's router, E x h
    routed_expert_weights: int = 0  # every MoE layer's E routed experts, 3 h f_e each
    shared_expert_weights: int = 0  # every MoE layer's shared experts, 3 h f_s

    @property
    def dense_mlp_weights(self) -> int:
        """The dense layers' MLPs: mlp_weights less the MoE layers' parts."""
        return self.mlp_weights - self.router_weights - self.routed_expert_weights - self.shared_expert_weights


def count_parameters(config: GPTConfig, tensor_parallel: int = 1) -> ParameterCount:
    """Megatron's GPTModel as ``config`` shapes it, over the padded vocabulary.

    Per layer: two norms (LayerNorm: gain and bias, 2h each; RMSNorm: gain, h), q and the
    output projection h x (heads x head size) each, k and v h x (kv_heads x head size) each,
    QK-norm's two norms over the head size, the MLP 2hf (GELU) or 3hf (SwiGLU: gate, up, down),
    and with biases one per output feature. An MoE layer's MLP is the router (E x h), E SwiGLU
    experts of width f_e (3 h f_e each) and the shared experts (3 h f_s); a token is active in
    top-k of the experts. Megatron GPT-2 (4h GELU MLP, biases, MHA) gives the familiar
    12h^2 + 13h; Llama 3.2 1B 1,235,814,400; Mixtral 8x7B 46,702,792,704 of which
    12,879,925,248 active.
    """
    h, f, L = config.hidden_size, config.ffn_size, config.num_layers
    q, kv = config.num_attention_heads * config.head_dim, config.kv_heads * config.head_dim
    vocab = config.padded_vocab_size(tensor_parallel)
    norm_per_feature = 2 if config.normalization == "LayerNorm" else 1
    norm = norm_per_feature * h
    qk_norms = 2 * norm_per_feature * config.head_dim if config.qk_layernorm else 0
    attention = 2 * h * q + 2 * h * kv
    dense_mlp = (3 if config.swiglu else 2) * h * f
    biases = (q + 2 * kv + h) + ((2 if config.swiglu else 1) * f + h) if config.add_bias_linear else 0
    moe_layers = config.moe_layers
    experts = config.num_experts or 0
    routed_expert = 3 * h * config.moe_ffn_size
    router, shared = experts * h, 3 * h * (config.moe_shared_expert_intermediate_size or 0)
    idle_experts = (experts - config.moe_router_topk) * routed_expert if config.moe else 0
    mlp_weights = (L - moe_layers) * dense_mlp + moe_layers * (router + experts * routed_expert + shared)
    positions = 0 if config.rope else config.max_position_embeddings * h
    embedding = vocab * h + positions
    output = vocab * h if config.untie_embeddings_and_output_weights else 0
    outside_matmuls = L * (2 * norm + biases + qk_norms) + norm  # the final norm too
    non_embedding = L * attention + mlp_weights + outside_matmuls + output
    total = embedding + non_embedding
    return ParameterCount(total=total, embedding=embedding, non_embedding=non_embedding,
                          attention_weights=L * attention, mlp_weights=mlp_weights, output_weights=vocab * h,
                          outside_matmuls=outside_matmuls, active=total - moe_layers * idle_experts,
                          router_weights=moe_layers * router, shared_expert_weights=moe_layers * shared,
                          routed_expert_weights=moe_layers * experts * routed_expert)
