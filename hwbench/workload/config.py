"""The shape of a Megatron GPT-2 model (Megatron-LM's GPT-2 defaults: 4h MLP, head size
h / heads, the vocabulary padded to a multiple of 128 x TP), the loss choices every
layer agrees on without importing torch, and the batch arithmetic they share (one step's
micro-batches per data-parallel replica: ``accumulation_steps``)."""

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


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Architecture of one GPT size. Everything else (FFN width, head size, the
    padded vocabulary) follows Megatron's defaults and is derived here."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    max_position_embeddings: int
    vocab_size: int = 50257
    make_vocab_size_divisible_by: int = 128

    @property
    def ffn_hidden_size(self) -> int:
        return 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def padded_vocab_size(self, tensor_parallel: int = 1) -> int:
        """Megatron pads the vocabulary to a multiple of
        make_vocab_size_divisible_by x TP (50257 -> 50304 at TP1, 50432 at TP2)."""
        multiple = self.make_vocab_size_divisible_by * tensor_parallel
        return -(-self.vocab_size // multiple) * multiple

    def problems(self) -> list[str]:
        """What makes this shape unbuildable, as sentences (empty when fine). Each field is a positive
        integer already: the catalog's schema (hwbench.catalog) refuses any other value."""
        if self.hidden_size % self.num_attention_heads:
            return [f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                    f"{self.num_attention_heads}"]
        return []


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
