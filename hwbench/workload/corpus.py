"""The built-in corpus: a seeded synthetic language with a known entropy rate.

The default workload needs data that downloads nothing yet gives a meaningful
perplexity. This corpus is a first-order Markov chain over ``symbols`` token ids:
each symbol has ``branching`` likely successors with Zipf-shaped weights, mixed
with a small uniform part so every transition is possible (the chain is then
ergodic). Its entropy rate H = sum_i pi_i H(P_i) is computed exactly from the
transition matrix, so exp(H) is the lowest perplexity any model can reach and is
reported beside the measured one.

hwbench.workload.data draws samples in blocks with numpy's PCG64 from (seed,
split, block): the same on every machine, random-access (no stream to replay),
and the validation split never overlaps the training split.
"""

from __future__ import annotations

import math

import numpy as np

ZIPF_EXPONENT = 1.0  # --data synthetic: tokens i.i.d. from Zipf(1) over the vocabulary


def zipf_probabilities(vocab_size: int, exponent: float = ZIPF_EXPONENT) -> np.ndarray:
    weights = np.arange(1, vocab_size + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()


def zipf_entropy_nats(vocab_size: int, exponent: float = ZIPF_EXPONENT) -> float:
    p = zipf_probabilities(vocab_size, exponent)
    return float(-(p * np.log(p)).sum())


def entropy_floor_nats(data: str, seed: int, vocab_size: int) -> float | None:
    """The lowest mean cross-entropy any model can reach on ``--data`` (its entropy rate):
    the built-in language of ``seed``, or the Zipf law of --data synthetic; None for a
    dataset, whose entropy is unknown. Known before the run starts, so a target relative to
    it (``--target-ppl floor*1.2``) is resolved and checked with the other options."""
    if data == "builtin":
        return MarkovCorpus(seed=seed).entropy_rate_nats
    if data == "synthetic":
        return zipf_entropy_nats(vocab_size)
    return None


class MarkovCorpus:
    kind = "builtin-markov"

    def __init__(self, seed: int = 1234, symbols: int = 512, branching: int = 4, uniform_mix: float = 0.02,
                 zipf_exponent: float = 1.0) -> None:
        self.seed, self.symbols, self.branching, self.uniform_mix = seed, symbols, branching, uniform_mix
        rng = np.random.Generator(np.random.PCG64([seed, 0xC0DE]))
        # For each symbol: `branching` distinct successors and their Zipf weights.
        self.successors = np.stack([rng.choice(symbols, size=branching, replace=False) for _ in range(symbols)])
        weights = np.arange(1, branching + 1, dtype=np.float64) ** -zipf_exponent
        self.successor_probs = weights / weights.sum()
        self.transition = self._dense_transition()
        self.stationary = self._stationary_distribution()

    def _dense_transition(self) -> np.ndarray:
        n = self.symbols
        matrix = np.full((n, n), self.uniform_mix / n)
        rows = np.repeat(np.arange(n), self.branching)
        np.add.at(matrix, (rows, self.successors.ravel()), np.tile(self.successor_probs, n) * (1 - self.uniform_mix))
        return matrix

    def _stationary_distribution(self) -> np.ndarray:
        pi = np.full(self.symbols, 1.0 / self.symbols)
        for _ in range(10_000):
            nxt = pi @ self.transition
            if np.abs(nxt - pi).sum() < 1e-13:
                break
            pi = nxt
        return nxt / nxt.sum()

    @property
    def entropy_rate_nats(self) -> float:
        p = self.transition
        row_entropy = -(p * np.log(p)).sum(axis=1)
        return float(self.stationary @ row_entropy)

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "symbols": self.symbols,
            "branching": self.branching,
            "uniform_mix": self.uniform_mix,
            "seed": self.seed,
            "entropy_nats": self.entropy_rate_nats,
            "perplexity_floor": math.exp(self.entropy_rate_nats),
        }

    def draw(self, rng: np.random.Generator, count: int, length: int) -> np.ndarray:
        """``count`` independent stretches of the chain, ``length`` tokens each
        (int64), the first token drawn from the stationary distribution. All the
        randomness is drawn up front; the loop over positions is one gather."""
        first = rng.choice(self.symbols, size=count, p=self.stationary)
        cdf = np.cumsum(self.successor_probs)
        picks = np.minimum(np.searchsorted(cdf, rng.random((count, length)), side="right"), self.branching - 1)
        uniform = rng.integers(0, self.symbols, size=(count, length))
        use_uniform = rng.random((count, length)) < self.uniform_mix
        out = np.empty((count, length), dtype=np.int64)
        out[:, 0] = first
        for position in range(1, length):
            chained = self.successors[out[:, position - 1], picks[:, position]]
            out[:, position] = np.where(use_uniform[:, position], uniform[:, position], chained)
        return out
