"""Megatron's GPT dataset over an indexed dataset (FACTS.md §5).

* Split: ``--split 949,50,1`` weights are normalised; split i covers sequences
  round(lo*N) to round(hi*N) of the N sequences (documents).
* Samples: the documents of a split, shuffled per epoch with
  numpy.random.RandomState(seed), form one token stream; sample i is the seq+1
  tokens starting at i*seq (inputs [:-1], labels [1:]), running across document
  boundaries. As many epochs are taken as the requested sample count needs; the
  sample order is then shuffled with the same generator.
* The three index arrays are cached next to the data (``<prefix>_cache/``) and
  reused when the dataset, split, seq, sample count and seed are the same.
* Each data-parallel rank reads its own contiguous share of every global batch
  (hwbench.workload.data.sample_range).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
from hwbench.errors import UsageError
from hwbench.workload.data import SampledData, ToDevice, check_token_range
from hwbench.workload.split import parse_split

SPLIT_NAMES = ("train", "valid", "test")


def split_boundaries(text: str, count: int) -> list[tuple[int, int]]:
    """(first, end) sequence indices of the train, valid and test splits."""
    fractions = parse_split(text)
    edges = [0.0]
    for fraction in fractions:
        edges.append(edges[-1] + fraction)
    cuts = [int(round(edge * count)) for edge in edges]
    cuts[-1] = count
    return [(cuts[i], cuts[i + 1]) for i in range(3)]


class GPTSamples:
    """Samples of seq+1 tokens over some documents of an indexed dataset."""

    def __init__(self, dataset, documents: np.ndarray, seq_length: int, num_samples: int,
                 seed: int, cache_name: str) -> None:
        self.dataset, self.seq_length, self.num_samples = dataset, seq_length, num_samples
        lengths = np.asarray(dataset.sequence_lengths, dtype=np.int64)
        tokens_per_epoch = int(lengths[documents].sum())
        if tokens_per_epoch < 2:
            raise UsageError(f"--data {dataset.path_prefix}: the {cache_name} split has {tokens_per_epoch} tokens; "
                             "it needs at least 2")
        self.epochs = 1
        while (self.epochs * tokens_per_epoch - 1) // seq_length < num_samples:
            self.epochs += 1
        self.cache_state = "built"
        arrays = self._load_cached(cache_name, documents, seed)
        if arrays is None:
            arrays = self._build(documents, lengths, seed)
            self._save_cached(cache_name, documents, seed, arrays)
        self.doc_idx, self.sample_idx, self.shuffle_idx = arrays

    def _build(self, documents, lengths, seed):
        rng = np.random.RandomState(seed)
        doc_idx = np.concatenate([rng.permutation(documents) for _ in range(self.epochs)]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths[doc_idx])])
        positions = np.arange(self.num_samples + 1, dtype=np.int64) * self.seq_length
        which = np.searchsorted(starts, positions, side="right") - 1
        sample_idx = np.stack([which, positions - starts[which]], axis=1).astype(np.int64)
        shuffle_idx = rng.permutation(self.num_samples).astype(np.int64)
        return doc_idx, sample_idx, shuffle_idx

    def _cache_path(self, name: str, documents: np.ndarray, seed: int) -> Path:
        prefix = Path(self.dataset.path_prefix)
        idx = prefix.with_name(prefix.name + ".idx")
        key = hashlib.sha256(repr((str(idx.resolve()), idx.stat().st_size, int(documents[0]) if len(documents) else 0,
                                   len(documents), self.seq_length, self.num_samples, seed)).encode()).hexdigest()[:16]
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

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> np.ndarray:
        j = int(self.shuffle_idx[index])
        (d0, o0), (d1, o1) = self.sample_idx[j], self.sample_idx[j + 1]
        if d0 == d1:
            return np.asarray(self.dataset.get(int(self.doc_idx[d0]), int(o0), int(o1 - o0 + 1)), dtype=np.int64)
        parts = [self.dataset.get(int(self.doc_idx[d0]), int(o0))]
        parts += [self.dataset.get(int(self.doc_idx[d])) for d in range(d0 + 1, d1)]
        parts.append(self.dataset.get(int(self.doc_idx[d1]), 0, int(o1 + 1)))
        return np.concatenate(parts).astype(np.int64)


class MegatronData(SampledData):
    """Training and validation micro-batches from a Megatron indexed dataset."""

    kind = "megatron-indexed"

    def __init__(self, prefix: str, split: str, seq_length: int, micro_batch_size: int, global_batch_size: int,
                 train_steps: int, eval_iters: int, seed: int, vocab_size: int, to_device: ToDevice = lambda t: t,
                 dp_rank: int = 0, dp_size: int = 1) -> None:
        from hwbench.workload.indexed import IndexedDataset

        super().__init__(seq_length, micro_batch_size, global_batch_size, to_device, dp_rank, dp_size)
        self.dataset = IndexedDataset(prefix)
        self.prefix, self.split, self.vocab_size = prefix, split, vocab_size
        self.bounds = dict(zip(SPLIT_NAMES, split_boundaries(split, len(self.dataset))))
        first, end = self.bounds["train"]
        if end <= first:
            raise UsageError(f"--split {split} leaves no training documents in --data {prefix} "
                             f"({len(self.dataset)} documents)")
        self.splits = {"train": GPTSamples(self.dataset, np.arange(first, end), seq_length,
                                           train_steps * global_batch_size, seed, "train")}
        first, end = self.bounds["valid"]
        if eval_iters and end > first:
            self.splits["valid"] = GPTSamples(self.dataset, np.arange(first, end), seq_length,
                                              eval_iters * global_batch_size, seed, "valid")

    @property
    def has_validation(self) -> bool:
        return "valid" in self.splits

    def describe(self) -> dict:
        train = self.splits["train"]
        return {
            "kind": self.kind,
            "prefix": str(self.prefix),
            "dtype": str(np.dtype(self.dataset.dtype)),
            "format_variant": getattr(self.dataset, "variant", None),
            "documents": len(self.dataset),
            "tokens": int(self.dataset.num_tokens),
            "split": self.split,
            "split_documents": {name: end - first for name, (first, end) in self.bounds.items()},
            "train_epochs": train.epochs,
            "index_cache": train.cache_state,
            "entropy_nats": None,
            "perplexity_floor": None,
        }

    def samples(self, split: str, indices: range) -> np.ndarray:
        sample = np.stack([self.splits[split][i] for i in indices])
        check_token_range(sample, self.vocab_size, f"--data {self.prefix} ({split} split)")
        return sample
