"""Where training and validation tokens come from.

Three sources share one interface (``train_batch``, ``valid_batch``,
``describe``), chosen by ``--data``:

* ``builtin`` (the default): a seeded synthetic language with a known entropy
  rate (hwbench.workload.corpus), so even the embedded default reports a
  meaningful perplexity with the lowest reachable one beside it;
* ``synthetic``: tokens drawn i.i.d. from a Zipf law over the vocabulary, the
  rank-frequency shape of natural text (as Megatron's mock data, but learnable:
  the floor is the distribution's entropy);
* a path prefix: a Megatron indexed dataset (``PREFIX.bin/.idx``), split and
  sampled as Megatron does (hwbench.workload.gpt_dataset).

Every source defines its data per *sample index*, never per micro-batch: global
batch t holds samples [t*G, (t+1)*G), each data-parallel rank takes its
contiguous share and each accumulation step the next micro-batch of it. So the
tokens a run trains on depend on the seed and the global batch alone, not on the
micro batch or the parallel layout, and runs of different layouts can be
compared step by step. Validation reads the validation split the same way and
moves on from one evaluation to the next, as Megatron's validation iterator
does (or, with --valid-data, reads that dataset's first samples at every one).
A run resumed from a checkpoint continues at the sample index it saved
(``seek``: Megatron-LM's consumed samples), so it trains on the samples an
uninterrupted run would have. Batches are made on the host, so every device sees the
same tokens for the same seed, and then moved with the backend's copy.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable

import numpy as np
import torch

from hwbench.errors import UsageError
from hwbench.workload.config import accumulation_steps
from hwbench.workload.corpus import ZIPF_EXPONENT, MarkovCorpus, zipf_entropy_nats, zipf_probabilities

BLOCK = 64  # samples generated together by the synthetic sources
SPLIT_IDS = {"train": 0, "valid": 1}
Batch = tuple[torch.Tensor, torch.Tensor]
ToDevice = Callable[[torch.Tensor], torch.Tensor]


class DataError(UsageError):
    """Data that cannot be trained on (a token outside the vocabulary, say)."""


def sample_range(step: int, micro_step: int, dp_rank: int, dp_size: int, micro: int, global_batch: int) -> range:
    """Sample indices of one micro-batch: optimizer step ``step`` (0-based), its
    ``micro_step``-th accumulation step, on data-parallel rank ``dp_rank``. As
    Megatron's MegatronPretrainingSampler: each accumulation step takes the next
    micro x dp samples and rank r the r-th micro of them."""
    start = step * global_batch + (micro_step * dp_size + dp_rank) * micro
    return range(start, start + micro)


def check_token_range(sample: np.ndarray, vocab_size: int, where: str) -> None:
    """Token ids beyond the model's vocabulary (its tokenizer's, unpadded) would index past the
    embedding (a device-side assert on GPUs) or train the padding rows: refuse them with the
    place named."""
    top = int(sample.max()) if sample.size else 0
    if top >= vocab_size:
        raise DataError(f"{where}: token id {top} is outside the model's vocabulary of {vocab_size}; "
                        "prepare the data with the model's tokenizer, or train a model of the data's vocabulary")


class SampledData(abc.ABC):
    """Micro-batching over samples addressed by index (see the module docstring)."""

    kind = "abstract"
    restart_validation = False  # True: every validation reads the same first samples (a fixed validation set)

    def __init__(self, seq_length: int, micro_batch_size: int, global_batch_size: int,
                 to_device: ToDevice = lambda t: t, dp_rank: int = 0, dp_size: int = 1) -> None:
        self.seq_length, self.micro, self.global_batch = seq_length, micro_batch_size, global_batch_size
        self.to_device, self.dp_rank, self.dp_size = to_device, dp_rank, dp_size
        self.accumulation = accumulation_steps(global_batch_size, micro_batch_size, dp_size)
        self._train_calls = 0
        self._valid_start = self._valid_next = 0  # where this evaluation began; the first micro-batch not yet read
        self._first_sample = {"train": 0, "valid": 0}  # per split: the sample this run began at (seek)

    @abc.abstractmethod
    def samples(self, split: str, indices: range) -> np.ndarray:
        """(len(indices), seq+1) int64 tokens of those samples of a split."""

    @abc.abstractmethod
    def describe(self) -> dict: ...

    @property
    def has_validation(self) -> bool:
        return True

    def _batch(self, split: str, call: int) -> Batch:
        step, micro_step = divmod(call, self.accumulation)
        indices = sample_range(step, micro_step, self.dp_rank, self.dp_size, self.micro, self.global_batch)
        first = self._first_sample[split]
        indices = range(indices.start + first, indices.stop + first)
        sample = torch.from_numpy(np.ascontiguousarray(self.samples(split, indices), dtype=np.int64))
        sample = self.to_device(sample)
        return sample[:, :-1], sample[:, 1:]  # inputs and next-token labels, (micro, seq) each

    def seek(self, consumed_train_samples: int, consumed_valid_samples: int) -> None:
        """Read on from a checkpoint's data position: the samples of each split consumed so far."""
        self._first_sample = {"train": consumed_train_samples,
                              "valid": 0 if self.restart_validation else consumed_valid_samples}
        self._train_calls = 0
        self._valid_start = self._valid_next = 0

    def position(self) -> dict[str, int]:
        """The samples of each split consumed so far (Megatron-LM's names), for a checkpoint."""
        def consumed(split: str, micro_batches: int) -> int:
            return self._first_sample[split] + micro_batches // self.accumulation * self.global_batch

        return {"consumed_train_samples": consumed("train", self._train_calls),
                "consumed_valid_samples": consumed("valid", self._valid_next)}

    def train_batch(self) -> Batch:
        self._train_calls += 1
        return self._batch("train", self._train_calls - 1)

    def valid_batch(self, index: int) -> Batch:
        """The ``index``-th micro-batch of this evaluation. Validation moves on
        as Megatron's validation iterator does: an evaluation (``index`` 0 starts
        one) begins after the last micro-batch the previous evaluation read; or, with
        ``restart_validation``, every evaluation reads the same first micro-batches."""
        if self.restart_validation:
            return self._batch("valid", index)
        if index == 0:
            self._valid_start = self._valid_next
        position = self._valid_start + index
        self._valid_next = max(self._valid_next, position + 1)
        return self._batch("valid", position)


class BlockGenerated(SampledData):
    """Synthetic sources that draw BLOCK samples at a time from PCG64(seed, split, block)."""

    def __init__(self, seed: int, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seed = seed
        self._blocks: dict[str, tuple[int, np.ndarray]] = {}  # per split: the last block drawn

    @abc.abstractmethod
    def draw_block(self, rng: np.random.Generator, length: int) -> np.ndarray: ...

    def _block(self, split: str, block: int) -> np.ndarray:
        cached = self._blocks.get(split)
        if cached is None or cached[0] != block:  # a validation pass does not evict the training block
            rng = np.random.Generator(np.random.PCG64([self.seed, SPLIT_IDS[split], block]))
            cached = self._blocks[split] = (block, self.draw_block(rng, self.seq_length + 1))
        return cached[1]

    def samples(self, split: str, indices: range) -> np.ndarray:
        return np.stack([self._block(split, i // BLOCK)[i % BLOCK] for i in indices])


class SyntheticTokens(BlockGenerated):
    """i.i.d. Zipf-distributed tokens over the vocabulary."""

    kind = "synthetic-zipf"

    def __init__(self, vocab_size: int, seq_length: int, micro_batch_size: int, global_batch_size: int, seed: int,
                 to_device: ToDevice = lambda t: t, dp_rank: int = 0, dp_size: int = 1,
                 exponent: float = ZIPF_EXPONENT) -> None:
        super().__init__(seed, seq_length, micro_batch_size, global_batch_size, to_device, dp_rank, dp_size)
        self.vocab_size, self.exponent = vocab_size, exponent
        self.probabilities = zipf_probabilities(vocab_size, exponent)
        self._cdf = np.cumsum(self.probabilities)

    @property
    def entropy_nats(self) -> float:
        """The lowest mean cross-entropy any model can reach on this data."""
        return zipf_entropy_nats(self.vocab_size, self.exponent)

    def describe(self) -> dict:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "zipf_exponent": self.exponent,
                "entropy_nats": self.entropy_nats, "perplexity_floor": math.exp(self.entropy_nats)}

    def draw_block(self, rng: np.random.Generator, length: int) -> np.ndarray:
        tokens = np.searchsorted(self._cdf, rng.random((BLOCK, length)), side="right")
        return np.minimum(tokens, self.vocab_size - 1)


class BuiltinCorpus(BlockGenerated):
    """The built-in Markov language (hwbench.workload.corpus)."""

    kind = MarkovCorpus.kind

    def __init__(self, seq_length: int, micro_batch_size: int, global_batch_size: int, seed: int,
                 to_device: ToDevice = lambda t: t, dp_rank: int = 0, dp_size: int = 1) -> None:
        super().__init__(seed, seq_length, micro_batch_size, global_batch_size, to_device, dp_rank, dp_size)
        self.corpus = MarkovCorpus(seed=seed)

    def describe(self) -> dict:
        return self.corpus.describe()

    def draw_block(self, rng: np.random.Generator, length: int) -> np.ndarray:
        return self.corpus.draw(rng, BLOCK, length)
