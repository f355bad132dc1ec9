"""Megatron's GPT dataset over an indexed dataset, sample for sample as
megatron-core's GPTDataset (``megatron/core/datasets/gpt_dataset.py``) builds it (tests/test_data_order.py checks
it against megatron-core itself).

* Split: ``--split 949,50,1`` weights are normalised; split i covers sequences
  round(lo*N) to round(hi*N) of the N sequences (documents).
* Epochs: as many as the requested sample count needs (seq x samples + 1 tokens).
* Document order: the documents of all those epochs in one list, shuffled once
  with numpy.random.RandomState(seed); when the last epoch would contribute
  fewer than 80 % of an epoch's samples it is shuffled on its own after the
  others (megatron-core's ``separate_final_epoch``).
* Samples: that document order is one token stream; sample i is the seq+1
  tokens starting at i*seq (inputs [:-1], labels [1:]), running across document
  boundaries; every whole sample of the stream is a sample, not only the
  requested ones.
* Shuffle: a permutation of *all* those samples with the same generator (of
  the samples before the separated final epoch, then of that epoch's), so the
  samples a run sees do not depend on how many it asks for, within the same
  number of epochs.
* The three index arrays are cached next to the data (``<prefix>_cache/``) and
  reused when the dataset, split, seq, epochs and seed are the same.
* Each accumulation step reads the next micro x dp samples, rank r the r-th
  micro-batch of them, as Megatron's sampler (hwbench.workload.data.sample_range).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from hwbench.errors import UsageError
from hwbench.workload.data import SampledData, ToDevice, check_token_range
from hwbench.workload.split import parse_split

SPLIT_NAMES = ("train", "valid", "test")


def split_boundaries(text: str, count: int) -> list[tuple[int, int]]:
    """(first, end) sequence indices of the train, valid and test splits."""
    cuts = [int(round(edge * count)) for edge in itertools.accumulate(parse_split(text), initial=0.0)]
    cuts[-1] = count
    return [(cuts[i], cuts[i + 1]) for i in range(3)]


# megatron-core keeps the last epoch out of the global shuffle when it would
# contribute fewer than this share of an epoch's samples (gpt_dataset.py).
SEPARATE_FINAL_EPOCH_BELOW = 0.80
# Part of the cache key: index arrays cached by an older sample order are not reused.
ORDER_VERSION = "megatron-core-gptdataset"


def epochs_needed(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Epochs whose tokens hold ``num_samples`` samples of seq+1 tokens (megatron-core's _get_num_epochs)."""
    requested = num_samples * seq_length + 1
    return max(1, -(-requested // tokens_per_epoch))


def samples_before_final_epoch(tokens_per_epoch: int, seq_length: int, num_samples: int, epochs: int) -> int | None:
    """How many samples are shuffled apart from the final epoch's, or None when
    all are shuffled together (megatron-core's separate_final_epoch rule)."""
    if epochs == 1:
        return None
    before = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
    per_epoch = (tokens_per_epoch - 1) // seq_length
    from_final = num_samples - before
    return before if from_final < int(SEPARATE_FINAL_EPOCH_BELOW * per_epoch) else None


def document_order(documents: np.ndarray, epochs: int, rng: np.random.RandomState, separate_final: bool) -> np.ndarray:
    """Documents of all epochs in one list shuffled once; with ``separate_final``
    the final epoch shuffled on its own after the others (megatron-core's
    _build_document_index, int32 as there, so the generator draws the same)."""
    if not separate_final or epochs == 1:
        order = np.tile(np.asarray(documents), epochs).astype(np.int32)
        rng.shuffle(order)
        return order
    return np.concatenate([document_order(documents, epochs - 1, rng, False),
                           document_order(documents, 1, rng, False)])


def sample_starts(lengths: np.ndarray, doc_idx: np.ndarray, seq_length: int) -> np.ndarray:
    """(samples + 1, 2) (position in doc_idx, token offset) where each sample of
    the stream starts; the last row ends the last whole sample (megatron-core's
    build_sample_idx with drop_last_partial_sequence)."""
    starts = np.concatenate([[0], np.cumsum(lengths[doc_idx])])
    count = (int(starts[-1]) - 1) // seq_length
    positions = np.arange(count + 1, dtype=np.int64) * seq_length
    which = np.searchsorted(starts, positions, side="right") - 1
    return np.stack([which, positions - starts[which]], axis=1).astype(np.int64)


def sample_shuffle(total: int, before_final: int | None, rng: np.random.RandomState) -> np.ndarray:
    """A permutation of all ``total`` samples; with ``before_final`` the samples
    before the final epoch and that epoch's shuffled apart (megatron-core's
    _build_shuffle_index; uint32 as there below 2**32 - 1 samples)."""
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(total if before_final is None else before_final, dtype=dtype)
    rng.shuffle(first)
    if before_final is None:
        return first.astype(np.int64)
    last = np.arange(before_final, total, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate([first, last]).astype(np.int64)


class _Samples:
    """Samples of seq+1 tokens read through three index arrays, as megatron-core's:
    ``doc_idx`` (the documents in stream order), ``sample_idx`` (where each sample of
    that stream starts) and ``shuffle_idx`` (the order the samples are served in)."""

    dataset: Any
    doc_idx: np.ndarray
    sample_idx: np.ndarray
    shuffle_idx: np.ndarray

    def __len__(self) -> int:
        return len(self.shuffle_idx)

    def __getitem__(self, index: int) -> np.ndarray:
        """Sample ``index``; past the last one it starts again from the first (as
        Megatron's cyclic validation iterator does)."""
        j = int(self.shuffle_idx[index % len(self.shuffle_idx)])
        (d0, o0), (d1, o1) = self.sample_idx[j], self.sample_idx[j + 1]
        if d0 == d1:
            return np.asarray(self.dataset.get(int(self.doc_idx[d0]), int(o0), int(o1 - o0 + 1)), dtype=np.int64)
        parts = [self.dataset.get(int(self.doc_idx[d0]), int(o0))]
        parts += [self.dataset.get(int(self.doc_idx[d])) for d in range(d0 + 1, d1)]
        parts.append(self.dataset.get(int(self.doc_idx[d1]), 0, int(o1 + 1)))
        return np.concatenate(parts).astype(np.int64)


class InOrderSamples(_Samples):
    """The first ``count`` samples of a whole dataset: its documents in file order as one token
    stream, sample i its tokens i*seq to (i+1)*seq, unshuffled and without epochs. MLPerf
    Training's Llama 3.1 8B reference validates so, on the first 1,024 sequences of its C4
    validation file (--valid-data)."""

    def __init__(self, dataset, seq_length: int, count: int) -> None:
        self.dataset = dataset
        self.doc_idx = np.arange(len(dataset), dtype=np.int64)
        self.sample_idx = sample_starts(np.asarray(dataset.sequence_lengths, dtype=np.int64), self.doc_idx,
                                        seq_length)
        whole = len(self.sample_idx) - 1
        if whole < count:
            raise UsageError(f"--valid-data {dataset.path_prefix}: {whole} sequences of {seq_length + 1} tokens, "
                             f"and a validation reads --eval-iters x --global-batch-size = {count}; give a larger "
                             "dataset, or fewer --eval-iters")
        self.shuffle_idx = np.arange(count, dtype=np.int64)


class GPTSamples(_Samples):
    """Samples of seq+1 tokens over some documents of an indexed dataset, in
    megatron-core's order (module docstring). ``num_samples`` is how many a run
    asks for; it decides the number of epochs, and the dataset holds every whole
    sample of those epochs (``len``), as megatron-core's does."""

    def __init__(self, dataset, documents: np.ndarray, seq_length: int, num_samples: int,
                 seed: int, cache_name: str) -> None:
        self.dataset, self.seq_length = dataset, seq_length
        lengths = np.asarray(dataset.sequence_lengths, dtype=np.int64)
        tokens_per_epoch = int(lengths[documents].sum())
        if tokens_per_epoch < 2:
            raise UsageError(f"--data {dataset.path_prefix}: the {cache_name} split has {tokens_per_epoch} tokens; "
                             "it needs at least 2")
        self.epochs = epochs_needed(tokens_per_epoch, seq_length, num_samples)
        self.before_final = samples_before_final_epoch(tokens_per_epoch, seq_length, num_samples, self.epochs)
        self.cache_state = "built"
        arrays = self._load_cached(cache_name, documents, seed)
        if arrays is None:
            arrays = self._build(documents, lengths, seed)
            self._save_cached(cache_name, documents, seed, arrays)
        self.doc_idx, self.sample_idx, self.shuffle_idx = arrays

    def _build(self, documents, lengths, seed):
        rng = np.random.RandomState(seed)  # one generator, drawn in megatron-core's order
        doc_idx = document_order(documents, self.epochs, rng, self.before_final is not None)
        sample_idx = sample_starts(lengths, doc_idx, self.seq_length)
        shuffle_idx = sample_shuffle(len(sample_idx) - 1, self.before_final, rng)
        return doc_idx.astype(np.int64), sample_idx, shuffle_idx

    def _cache_path(self, name: str, documents: np.ndarray, seed: int) -> Path:
        prefix = Path(self.dataset.path_prefix)
        idx = prefix.with_name(prefix.name + ".idx")
        key = hashlib.sha256(repr((ORDER_VERSION, str(idx.resolve()), idx.stat().st_size,
                                   int(documents[0]) if len(documents) else 0, len(documents), self.seq_length,
                                   self.epochs, self.before_final, seed)).encode()).hexdigest()[:16]
        return prefix.with_name(prefix.name + "_cache") / f"{name}_{key}.npz"

    def _load_cached(self, name, documents, seed):
        path = self._cache_path(name, documents, seed)
        try:
            with np.load(path) as cached:
                self.cache_state = f"loaded {path}"
                return cached["doc_idx"], cached["sample_idx"], cached["shuffle_idx"]
        except (OSError, KeyError, ValueError):
            return None

    def _save_cached(self, name, documents, seed, arrays) -> None:
        path = self._cache_path(name, documents, seed)
        try:
            path.parent.mkdir(exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(handle, "wb") as stream:
                np.savez(stream, doc_idx=arrays[0], sample_idx=arrays[1], shuffle_idx=arrays[2])
            os.replace(temporary, path)
            self.cache_state = f"built and saved {path}"
        except OSError as error:  # a read-only data folder: work without the cache
            self.cache_state = f"built (not cached: {error})"


def validation_samples(train_steps: int, eval_interval: int, eval_iters: int, global_batch_size: int) -> int:
    """The validation samples Megatron asks its dataset for: enough for an
    evaluation every ``eval_interval`` steps and one more (training.py's
    (train_iters // eval_interval + 1) x eval_iters x global batch);
    ``eval_interval`` 0 means the final evaluation only."""
    evaluations = train_steps // eval_interval + 1 if eval_interval else 1
    return evaluations * eval_iters * global_batch_size


class MegatronData(SampledData):
    """Training and validation micro-batches from a Megatron indexed dataset; with
    ``valid_prefix`` (--valid-data), validation reads that dataset's first samples in
    order at every validation, instead of the split's validation part."""

    kind = "megatron-indexed"

    def __init__(self, prefix: str, split: str, seq_length: int, micro_batch_size: int, global_batch_size: int,
                 train_steps: int, eval_iters: int, seed: int, vocab_size: int, to_device: ToDevice = lambda t: t,
                 dp_rank: int = 0, dp_size: int = 1, eval_interval: int = 0, valid_prefix: str | None = None) -> None:
        from hwbench.workload.indexed import IndexedDataset

        super().__init__(seq_length, micro_batch_size, global_batch_size, to_device, dp_rank, dp_size)
        self.dataset = IndexedDataset(prefix)
        self.prefix, self.split, self.vocab_size, self.valid_prefix = prefix, split, vocab_size, valid_prefix
        self.bounds = dict(zip(SPLIT_NAMES, split_boundaries(split, len(self.dataset))))
        first, end = self.bounds["train"]
        if end <= first:
            raise UsageError(f"--split {split} leaves no training documents in --data {prefix} "
                             f"({len(self.dataset)} documents)")
        self.train = GPTSamples(self.dataset, np.arange(first, end), seq_length, train_steps * global_batch_size,
                                seed, "train")
        self.splits: dict[str, _Samples] = {"train": self.train}
        first, end = self.bounds["valid"]
        if eval_iters and valid_prefix is not None:
            self.splits["valid"] = InOrderSamples(IndexedDataset(valid_prefix), seq_length,
                                                  eval_iters * global_batch_size)
            self.restart_validation = True  # a fixed validation set
        elif eval_iters and end > first:
            self.splits["valid"] = GPTSamples(self.dataset, np.arange(first, end), seq_length,
                                              validation_samples(train_steps, eval_interval, eval_iters,
                                                                 global_batch_size), seed, "valid")
        self._check_first_batches()

    def _check_first_batches(self) -> None:
        """Data of another tokenizer (Llama 3's ids for a GPT-2 model) is refused while the data is
        opened, before anything starts, by the first global batch of each split: the ids of such
        data reach past the vocabulary in any batch. ``samples`` still checks every batch read."""
        for name, samples in self.splits.items():
            self.samples(name, range(min(self.global_batch, len(samples))))

    @property
    def has_validation(self) -> bool:
        return "valid" in self.splits

    def describe(self) -> dict:
        train = self.train
        return {
            "kind": self.kind,
            "prefix": str(self.prefix),
            "dtype": str(np.dtype(self.dataset.dtype)),
            "format_variant": getattr(self.dataset, "variant", None),
            "documents": len(self.dataset),
            "tokens": int(self.dataset.num_tokens),
            "split": self.split,
            "valid_prefix": None if self.valid_prefix is None else str(self.valid_prefix),
            "split_documents": {name: end - first for name, (first, end) in self.bounds.items()},
            "train_epochs": train.epochs,
            "index_cache": train.cache_state,
            "entropy_nats": None,
            "perplexity_floor": None,
        }

    def samples(self, split: str, indices: range) -> np.ndarray:
        sample = np.stack([self.splits[split][i] for i in indices])
        where = (f"--valid-data {self.valid_prefix}" if split == "valid" and self.valid_prefix is not None
                 else f"--data {self.prefix} ({split} split)")
        check_token_range(sample, self.vocab_size, where)
        return sample
