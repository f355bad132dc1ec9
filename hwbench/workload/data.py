"""Synthetic token data for throughput runs.

Tokens are drawn i.i.d. from a Zipf law over the (unpadded) vocabulary, the
rank-frequency shape of natural text. Throughput does not depend on the token
values, but a learnable distribution makes the loss curve mean something: a
model can lower its loss exactly to the distribution's entropy, which is
reported beside the measured loss as the floor. Batches are drawn on the host
from a seeded generator, so every device sees the same tokens for the same seed.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator

import torch

ZIPF_EXPONENT = 1.0


class SyntheticTokens:
    """Micro-batches of (tokens, labels), each (micro_batch, seq) int64."""

    kind = "synthetic-zipf"

    def __init__(self, vocab_size: int, seq_length: int, micro_batch_size: int, seed: int,
                 to_device: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
                 exponent: float = ZIPF_EXPONENT) -> None:
        self.vocab_size, self.seq_length, self.micro_batch_size = vocab_size, seq_length, micro_batch_size
        self.to_device = to_device  # the backend's host-to-device copy
        self.exponent = exponent
        ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
        weights = ranks.pow(-exponent)
        self.probabilities = weights / weights.sum()
        self._cdf = torch.cumsum(self.probabilities, 0).to(torch.float64)
        self._cdf[-1] = 1.0
        self._generator = torch.Generator().manual_seed(seed)

    @property
    def entropy_nats(self) -> float:
        """The lowest mean cross-entropy any model can reach on this data."""
        p = self.probabilities
        return float(-(p * p.log()).sum())

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "zipf_exponent": self.exponent,
            "entropy_nats": self.entropy_nats,
            "perplexity_floor": math.exp(self.entropy_nats),
        }

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        uniform = torch.rand(self.micro_batch_size, self.seq_length + 1, generator=self._generator,
                             dtype=torch.float64)
        sample = torch.searchsorted(self._cdf, uniform).clamp_(max=self.vocab_size - 1)
        sample = self.to_device(sample)
        return sample[:, :-1], sample[:, 1:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()
