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
    mlp_weights: int  # every layer's MLP (fc1, fc2; SwiGLU: gate, up, down)
    output_weights: int  # the output layer, V x h: its own when untied, the word embedding when tied
    outside_matmuls: int  # norm gains and biases, linear biases: in no matrix product


def count_parameters(config: GPTConfig, tensor_parallel: int = 1) -> ParameterCount:
    """Megatron's GPTModel as ``config`` shapes it, over the padded vocabulary.

    Per layer: two norms (LayerNorm: gain and bias, 2h each; RMSNorm: gain, h), q and the
    output projection h^2 each, k and v h x (kv_heads x head size) each, the MLP 2hf (GELU)
    or 3hf (SwiGLU: gate, up, down), and with biases one per output feature. Megatron GPT-2
    (4h GELU MLP, biases, MHA) gives the familiar 12h^2 + 13h; Llama 3.2 1B 1,235,814,400.
    """
    h, f, L = config.hidden_size, config.ffn_size, config.num_layers
    kv = config.kv_heads * config.head_dim
    vocab = config.padded_vocab_size(tensor_parallel)
    norm = 2 * h if config.normalization == "LayerNorm" else h
    attention = 2 * h * h + 2 * h * kv
    mlp = (3 if config.swiglu else 2) * h * f
    biases = (h + 2 * kv + h) + ((2 if config.swiglu else 1) * f + h) if config.add_bias_linear else 0
    positions = 0 if config.rope else config.max_position_embeddings * h
    embedding = vocab * h + positions
    output = vocab * h if config.untie_embeddings_and_output_weights else 0
    outside_matmuls = L * (2 * norm + biases) + norm  # the final norm too
    non_embedding = L * (attention + mlp) + outside_matmuls + output
    return ParameterCount(total=embedding + non_embedding, embedding=embedding, non_embedding=non_embedding,
                          attention_weights=L * attention, mlp_weights=L * mlp, output_weights=vocab * h,
                          outside_matmuls=outside_matmuls)
