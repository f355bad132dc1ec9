"""pytest-benchmark: `hwbench data prepare` throughput against HF tokenizers alone.

Not part of the default test run. Run it with

    python -m pytest benchmarks/test_tokenize.py --benchmark-enable -q -s

It prepares tinyshakespeare with the GPT-2 tokenizer (reference data beside the
project, ../shared/data) and encodes the same documents with HF tokenizers'
own ``encode_batch`` on one thread, the figure prepare's workers can at best
reach each: prepare adds reading, UTF-8 decoding, id conversion and writing.
Both go into ``extra_info``; the goal is a ratio of at least 0.8.

Each prepare round runs in a fresh interpreter, as ``hwbench data prepare``
does: forked workers inherit their parent's heap, and a parent that has itself
tokenized a lot (this test process, for the baseline) makes them ~20% slower.
The timing pytest-benchmark reports is therefore the whole command (start-up
and tokenizer loading included); the rates come from prepare's own clock.
"""

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hwbench.workload.prepare import read_documents
from hwbench.workload.tokenizer import gpt2_bpe, single_threaded

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
GPT2 = {"vocab_file": SHARED_DATA / "gpt2" / "gpt2-vocab.json", "merge_file": SHARED_DATA / "gpt2" / "gpt2-merges.txt"}
SHAKESPEARE = SHARED_DATA / "text" / "tinyshakespeare.txt"
ROUNDS = 5


_PREPARE = """
import json, sys
from hwbench.workload.prepare import prepare
source, output, workers, vocab, merges = sys.argv[1:]
print(json.dumps(prepare(source, output, workers=int(workers), vocab_file=vocab, merge_file=merges)))
"""


def _prepare_in_a_fresh_process(output: Path, workers: int) -> dict:
    command = [sys.executable, "-c", _PREPARE, str(SHAKESPEARE), str(output), str(workers),
               str(GPT2["vocab_file"]), str(GPT2["merge_file"])]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_against_tokenizers_encode_batch(benchmark, tmp_path, workers):
    if not SHAKESPEARE.is_file() or not GPT2["vocab_file"].is_file():
        pytest.skip(f"reference data not found under {SHARED_DATA}")
    with open(SHAKESPEARE, "rb") as stream:  # the documents prepare makes: paragraphs
        documents = [raw.decode("utf-8") for _, _, raw in read_documents(stream, "text", "paragraph")]
    tokens = sum(len(e.ids) for e in gpt2_bpe(**GPT2).hf.encode_batch(documents, add_special_tokens=False))
    baseline = {"one thread": [], "all threads": []}

    def encode_with_tokenizers() -> None:
        """Untimed by pytest-benchmark, timed here: one round of the baseline before
        each prepare round, so that both see the same machine load. A fresh tokenizer
        each time: a cold BPE cache, as every prepare run has."""
        for label in baseline:
            hf = gpt2_bpe(**GPT2).hf
            with single_threaded() if label == "one thread" else contextlib.nullcontext():
                started = time.perf_counter()
                hf.encode_batch(documents, add_special_tokens=False)
                baseline[label].append(time.perf_counter() - started)

    summaries = []

    def run():
        summaries.append(_prepare_in_a_fresh_process(tmp_path / "shakespeare", workers))

    benchmark.pedantic(run, setup=encode_with_tokenizers, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    hf_one_thread = tokens / min(baseline["one thread"])
    hf_all_threads = tokens / min(baseline["all threads"])
    assert all(s["tokens"] == tokens for s in summaries)
    per_worker = max(s["tokens_per_second_per_worker"] for s in summaries)
    ratio = per_worker / hf_one_thread
    benchmark.extra_info.update(
        tokens=tokens, documents=len(documents), workers=workers, cpu_count=os.cpu_count(),
        prepare_tokens_per_s_per_worker=round(per_worker), prepare_tokens_per_s=round(per_worker * workers),
        tokenizers_encode_batch_tokens_per_s_one_thread=round(hf_one_thread),
        tokenizers_encode_batch_tokens_per_s_all_threads=round(hf_all_threads),
        ratio_per_worker_to_one_thread=round(ratio, 3),
    )
    print(f"\nworkers={workers}: prepare {per_worker:,.0f} tokens/s per worker ({per_worker * workers:,.0f} in all); "
          f"tokenizers encode_batch {hf_one_thread:,.0f} tokens/s on one thread "
          f"({hf_all_threads:,.0f} on {os.cpu_count()} threads); ratio {ratio:.2f}")
