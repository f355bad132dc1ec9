"""Data sources, the built-in corpus and Megatron's GPT sampling."""

import math

import numpy as np
import pytest
import torch

from hwbench.errors import UsageError
from hwbench.workload.corpus import MarkovCorpus
from hwbench.workload.data import BuiltinCorpus, SyntheticTokens, sample_range
from hwbench.workload.gpt_dataset import GPTSamples, parse_split, split_boundaries


def _global_batches(source_factory, micro, dp_size, steps, global_batch):
    """Every sample each rank sees, per optimizer step, as rows of tokens."""
    seen = {}
    for rank in range(dp_size):
        data = source_factory(micro=micro, dp_rank=rank, dp_size=dp_size)
        for step in range(steps):
            for micro_step in range(global_batch // (micro * dp_size)):
                tokens, labels = data.train_batch()
                for row, index in zip(tokens, sample_range(step, micro_step, rank, dp_size, micro, global_batch)):
                    seen[index] = row
    return seen


@pytest.mark.parametrize("kind", ["builtin", "synthetic"])
def test_tokens_depend_on_the_global_batch_not_on_micro_batch_or_ranks(kind):
    def factory(micro, dp_rank, dp_size):
        if kind == "builtin":
            return BuiltinCorpus(32, micro, 8, seed=5, dp_rank=dp_rank, dp_size=dp_size)
        return SyntheticTokens(50257, 32, micro, 8, seed=5, dp_rank=dp_rank, dp_size=dp_size)

    reference = _global_batches(factory, micro=8, dp_size=1, steps=3, global_batch=8)
    for micro, dp in [(2, 1), (4, 2), (1, 4)]:
        other = _global_batches(factory, micro=micro, dp_size=dp, steps=3, global_batch=8)
        assert sorted(other) == list(range(24))  # every sample exactly once
        for index in range(24):
            assert torch.equal(reference[index], other[index]), (micro, dp, index)


def test_sample_range_shards_each_global_batch_once():
    covered = [i for rank in range(4) for m in range(2) for i in sample_range(3, m, rank, 4, micro=2, global_batch=16)]
    assert sorted(covered) == list(range(48, 64))


def test_markov_corpus_entropy_matches_sampled_text_and_is_deterministic():
    corpus = MarkovCorpus(seed=11)
    again = MarkovCorpus(seed=11)
    rng_a, rng_b = np.random.Generator(np.random.PCG64(1)), np.random.Generator(np.random.PCG64(1))
    sample = corpus.draw(rng_a, 64, 2049)
    assert np.array_equal(sample, again.draw(rng_b, 64, 2049))
    # the true model's loss on samples equals the computed entropy rate
    empirical = -np.log(corpus.transition[sample[:, :-1], sample[:, 1:]]).mean()
    assert empirical == pytest.approx(corpus.entropy_rate_nats, rel=0.01)
    assert np.allclose(corpus.transition.sum(axis=1), 1.0)
    assert np.allclose(corpus.stationary @ corpus.transition, corpus.stationary)
    assert corpus.entropy_rate_nats < math.log(corpus.symbols) / 2  # far more predictable than uniform


def test_validation_and_training_samples_differ():
    data = BuiltinCorpus(32, 4, 4, seed=1)
    assert not torch.equal(data.train_batch()[0], BuiltinCorpus(32, 4, 4, seed=1).valid_batch(0)[0])
    first = [data.valid_batch(i)[0] for i in range(2)]  # one evaluation of two micro-batches
    second = [data.valid_batch(i)[0] for i in range(2)]  # the next one moves on, as Megatron's iterator
    again = BuiltinCorpus(32, 4, 4, seed=1)
    assert torch.equal(second[0], again.valid_batch(2)[0]) and torch.equal(second[1], again.valid_batch(3)[0])
    assert not torch.equal(first[0], second[0])


def test_split_boundaries_by_hand():
    assert parse_split("949,50,1") == pytest.approx([0.949, 0.050, 0.001])
    # 1000 documents: round(0.949*1000) = 949, round(0.999*1000) = 999
    assert split_boundaries("949,50,1", 1000) == [(0, 949), (949, 999), (999, 1000)]
    # 10 documents: 9.49 -> 9, 9.99 -> 10: the test split is empty
    assert split_boundaries("949,50,1", 10) == [(0, 9), (9, 10), (10, 10)]
    assert split_boundaries("8/2", 5) == [(0, 4), (4, 5), (5, 5)]


@pytest.mark.parametrize("bad", ["", "a,b", "1,2,3,4", "-1,2", "0,0,0"])
def test_bad_split_is_refused(bad):
    with pytest.raises(UsageError, match="--split"):
        parse_split(bad)


class ListDataset:
    """An indexed dataset stand-in over Python lists (sequence = document)."""

    def __init__(self, documents):
        self.documents = [np.asarray(d, dtype=np.int64) for d in documents]
        self.sequence_lengths = np.array([len(d) for d in self.documents])
        self.path_prefix = "/nonexistent/list"

    def get(self, index, offset=0, length=None):
        doc = self.documents[index]
        return doc[offset:] if length is None else doc[offset:offset + length]


def test_gpt_samples_run_across_documents_by_hand(monkeypatch):
    monkeypatch.setattr(GPTSamples, "_load_cached", lambda *a: None)
    monkeypatch.setattr(GPTSamples, "_save_cached", lambda *a: None)
    docs = [[0, 1, 2], [10, 11, 12, 13], [20, 21]]  # 9 tokens per epoch
    samples = GPTSamples(ListDataset(docs), np.arange(3), seq_length=4, num_samples=4, seed=3, cache_name="t")
    # 4 samples of 4+1 tokens need 4*4+1 = 17 tokens: two epochs of 9, (18-1)//4 = 4 whole samples;
    # the second epoch gives 2 of them, not under 80 % of an epoch's 2: one shuffle over both epochs
    assert samples.epochs == 2 and samples.before_final is None and len(samples) == 4
    rng = np.random.RandomState(3)
    order = np.tile(np.arange(3, dtype=np.int32), 2)
    rng.shuffle(order)  # the documents of both epochs together, once
    stream = np.concatenate([docs[d] for d in order])
    shuffle = np.arange(4, dtype=np.uint32)
    rng.shuffle(shuffle)
    for i in range(4):
        j = shuffle[i]
        assert samples[i].tolist() == stream[j * 4: j * 4 + 5].tolist()


# --- data at Llama 3's vocabulary (128256 ids) --------------------------------------------------

LLAMA3_VOCAB = 128_256


def _llama_data(kind: str):
    """The --data source `hwbench run --model llama-tiny` trains on, made as the worker makes it
    (data only: no model is built)."""
    from hwbench.catalog import load_catalog
    from hwbench.commands.run import parse_run_spec
    from hwbench.device_check import checked_backend
    from hwbench.engine.distributed import single_process
    from hwbench.harness.worker import make_data_source

    spec = parse_run_spec(["--model", "llama-tiny", "--data", kind, "--device", "cpu", "--seq-length", "64",
                           "--micro-batch-size", "8", "--global-batch-size", "8"])
    workload = load_catalog().workloads[spec.model]
    assert workload.model.vocab_size == LLAMA3_VOCAB
    return spec, make_data_source(spec, workload, checked_backend(spec), single_process(spec.parallel))


def test_synthetic_data_covers_llama3s_vocabulary_with_its_own_floor():
    spec, data = _llama_data("synthetic")
    assert data.vocab_size == LLAMA3_VOCAB
    tokens = np.concatenate([data.train_batch()[0].numpy().ravel() for _ in range(16)])
    assert tokens.dtype == np.int64 and 0 <= tokens.min() and tokens.max() < LLAMA3_VOCAB
    # ids past uint16 drawn as often as Zipf(1) over 128256 ids says: 5.44 % of them
    beyond_uint16 = float(data.probabilities[65_536:].sum())
    assert beyond_uint16 == pytest.approx(0.0544, abs=5e-4)
    assert np.mean(tokens >= 65_536) == pytest.approx(beyond_uint16, abs=0.012)
    # the floor, from the definition H = ln(H_N) + sum(ln k / k) / H_N of Zipf(1) over N ids
    harmonic = math.fsum(1 / k for k in range(1, LLAMA3_VOCAB + 1))
    entropy = math.log(harmonic) + math.fsum(math.log(k) / k for k in range(1, LLAMA3_VOCAB + 1)) / harmonic
    assert data.entropy_nats == pytest.approx(entropy, rel=1e-12)
    assert round(data.entropy_nats, 3) == 8.113 and round(data.describe()["perplexity_floor"]) == 3336  # docs/data.md
    # --target-ppl floor*1.2 resolves against that floor, not GPT-2's 1931
    from hwbench.commands.run import parse_run_spec

    target = parse_run_spec(["--model", "llama-tiny", "--data", "synthetic", "--target-ppl", "floor*1.2"])
    assert target.target_ppl == pytest.approx(1.2 * math.exp(entropy))


def test_the_builtin_language_is_the_same_at_llama3s_vocabulary():
    """The built-in language uses 512 ids whatever the vocabulary: the same tokens and floor as
    for a GPT-2-vocabulary model, every id inside both."""
    _, llama = _llama_data("builtin")
    gpt = BuiltinCorpus(64, 8, 8, seed=llama.seed)
    tokens = llama.train_batch()[0]
    assert torch.equal(tokens, gpt.train_batch()[0]) and int(tokens.max()) < 512
    assert llama.describe()["entropy_nats"] == pytest.approx(1.439, abs=5e-4)
