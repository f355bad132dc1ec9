"""Megatron's data order, sample for sample: hwbench's MegatronData against
megatron-core's own GPTDataset (built by its BlendedMegatronDatasetBuilder, as
Megatron's training builds it) over the same indexed dataset, split and seed.

megatron-core is a test-only dependency (pyproject's ``test`` extra); without it
the comparisons skip with the reason and the self-contained checks still run."""

from __future__ import annotations

import types

import numpy as np
import pytest

from hwbench.workload.gpt_dataset import MegatronData
from hwbench.workload.indexed import write_indexed_dataset

SEQ, GLOBAL, SEED, VOCAB = 16, 4, 1234, 1000


def _corpus(tmp_path, documents: int, seed: int = 7) -> str:
    """An indexed dataset of ``documents`` documents of 1 to 40 tokens (short
    ones too, so samples run across several documents)."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1, VOCAB, size=int(rng.integers(1, 41))) for _ in range(documents)]
    prefix = tmp_path / f"corpus{documents}"
    write_indexed_dataset(prefix, docs, "uint16")
    return str(prefix)


def _hwbench(prefix: str, train_steps: int, eval_iters: int = 2, eval_interval: int = 0, split: str = "90,10,0"):
    return MegatronData(prefix, split, SEQ, micro_batch_size=GLOBAL, global_batch_size=GLOBAL,
                        train_steps=train_steps, eval_iters=eval_iters, seed=SEED, vocab_size=VOCAB,
                        eval_interval=eval_interval)


def _megatron(prefix: str, train_steps: int, eval_iters: int = 2, eval_interval: int = 0, split: str = "90,10,0",
              cache=None):
    """megatron-core's train and valid GPTDatasets, asked for the sample counts
    Megatron's training.py asks for (train_val_test_num_samples)."""
    gpt_dataset = pytest.importorskip("megatron.core.datasets.gpt_dataset",
                                      reason="megatron-core is not installed (pip install megatron-core)")
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder

    tokenizer = types.SimpleNamespace(vocab_size=VOCAB, eod=0, pad=-1, special_tokens_dict={}, eos=0,
                                      unique_identifiers={"class": "stand-in"})
    config = gpt_dataset.GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ, blend=([prefix], None), split=split, path_to_cache=str(cache),
        tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False)
    evaluations = train_steps // eval_interval + 1 if eval_interval else 1
    sizes = [train_steps * GLOBAL, evaluations * eval_iters * GLOBAL, 0]
    train, valid, _ = BlendedMegatronDatasetBuilder(gpt_dataset.GPTDataset, sizes, lambda: True, config).build()
    return train, valid


def _megatron_sample(dataset, index: int) -> list[int]:
    return dataset._query_document_sample_shuffle_indices(index)[0].tolist()


def _valid_passes(data: MegatronData, evaluations: int, iters: int) -> list[list[int]]:
    """Every validation sample of ``evaluations`` evaluations, in order, as the worker asks for them."""
    rows = []
    for _ in range(evaluations):
        for index in range(iters * data.accumulation):
            tokens, labels = data.valid_batch(index)
            rows += [t.tolist() + label[-1:].tolist() for t, label in zip(tokens, labels)]
    return rows


@pytest.mark.parametrize("documents, train_steps, epochs, separate", [
    (400, 20, 1, False),  # one epoch: the shuffle covers every sample of it, not only the 80 asked for
    (60, 30, 2, True),    # the second epoch gives only 41 of its 78 samples: shuffled apart (separate_final_epoch)
    (60, 38, 2, False),   # the second epoch gives 73 (over 80 %): one shuffle over both epochs
])
def test_training_samples_equal_megatron_cores(tmp_path, documents, train_steps, epochs, separate):
    prefix = _corpus(tmp_path, documents)
    ours = _hwbench(prefix, train_steps)
    samples = ours.splits["train"]
    assert (samples.epochs, samples.before_final is not None) == (epochs, separate)
    train, _ = _megatron(prefix, train_steps, cache=tmp_path / "mcore")
    # the index arrays themselves, then every sample of the dataset (not only the ones a run reads)
    assert samples.doc_idx.tolist() == train.document_index.tolist()
    assert samples.sample_idx.tolist() == train.sample_index.tolist()
    assert samples.shuffle_idx.tolist() == train.shuffle_index.tolist()
    assert len(samples) == len(train)
    for index in range(len(train)):
        assert samples[index].tolist() == _megatron_sample(train, index), index
    train_rows = [r for i in range(train_steps) for r in
                  (lambda b: [t.tolist() + label[-1:].tolist() for t, label in zip(*b)])(ours.train_batch())]
    assert train_rows == [_megatron_sample(train, i) for i in range(train_steps * GLOBAL)]


def test_validation_moves_on_across_evaluations_as_megatrons_iterator(tmp_path):
    prefix = _corpus(tmp_path, 400)
    ours = _hwbench(prefix, 12, eval_iters=2, eval_interval=4)
    _, valid = _megatron(prefix, 12, eval_iters=2, eval_interval=4, cache=tmp_path / "mcore")
    rows = _valid_passes(ours, evaluations=3, iters=2)  # steps 4, 8 and 12
    assert rows == [_megatron_sample(valid, i) for i in range(3 * 2 * GLOBAL)]
    assert rows[:2 * GLOBAL] != rows[2 * GLOBAL:4 * GLOBAL]  # the second evaluation reads new samples


def test_an_18_step_run_sees_the_first_18_steps_of_a_30_step_run(tmp_path):
    prefix = _corpus(tmp_path, 400)  # one epoch holds both runs' samples
    short, long = _hwbench(prefix, 18), _hwbench(prefix, 30)
    for step in range(18):
        for a, b in zip(short.train_batch(), long.train_batch()):
            assert a.tolist() == b.tolist(), step


def test_data_parallel_ranks_read_their_share_of_megatrons_global_batch(tmp_path):
    prefix = _corpus(tmp_path, 400)
    train, _ = _megatron(prefix, 6, cache=tmp_path / "mcore")
    for rank in range(2):
        data = MegatronData(prefix, "90,10,0", SEQ, micro_batch_size=1, global_batch_size=GLOBAL, train_steps=6,
                            eval_iters=0, seed=SEED, vocab_size=VOCAB, dp_rank=rank, dp_size=2)
        for step in range(6):
            for micro in range(2):
                tokens, labels = data.train_batch()
                index = step * GLOBAL + micro * 2 + rank  # Megatron's sampler: micro x dp per step, rank r the r-th
                assert tokens[0].tolist() + labels[0, -1:].tolist() == _megatron_sample(train, index)
