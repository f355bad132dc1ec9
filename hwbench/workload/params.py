"""Parameter counts from the architecture alone, without allocating weights."""

from __future__ import annotations

import dataclasses

from hwbench.workload.config import GPTConfig


@dataclasses.dataclass(frozen=True)
class ParameterCount:
    total: int
    embedding: int  # word + position embeddings (the output layer is tied to the word embedding)
    non_embedding: int  # transformer blocks and the final LayerNorm


def count_parameters(config: GPTConfig, tensor_parallel: int = 1) -> ParameterCount:
    """Megatron GPT-2: tied word embedding over the padded vocabulary, learned
    positions, per layer two LayerNorms, qkv and output projections and a 4h MLP,
    all with biases; a final LayerNorm.

    per layer: LN 2h + qkv (3h^2 + 3h) + proj (h^2 + h) + LN 2h + fc1 (4h^2 + 4h)
    + fc2 (4h^2 + h) = 12h^2 + 13h.
    """
    h = config.hidden_size
    vocab = config.padded_vocab_size(tensor_parallel)
    embedding = vocab * h + config.max_position_embeddings * h
    non_embedding = config.num_layers * (12 * h * h + 13 * h) + 2 * h
    return ParameterCount(
        total=embedding + non_embedding, embedding=embedding, non_embedding=non_embedding
    )
