"""pytest-benchmark: `hwbench data prepare` throughput against HF tokenizers alone.

Not part of the default test run. Run it with

    python -m pytest benchmarks/test_tokenize.py --benchmark-enable -q -s

It prepares tinyshakespeare with the GPT-2 tokenizer (reference data beside the
project, ../shared/data) and encodes the same documents with HF tokenizers'
own ``encode_batch`` on one thread, the figure prepare's workers can at best
reach each: prepare adds reading, UTF-8 decoding, id conversion and writing.
(prepare calls ``encode_batch_fast``, which skips the character offsets; that
is measured too.) All go into ``extra_info``; the goal is a ratio of at least
0.8 to ``encode_batch``.

Every round of both runs in a fresh interpreter, as ``hwbench data prepare``
does: a process that has already tokenized a lot tokenizes more slowly (its
heap; forked workers inherit it), which would favour whichever ran first. The
timing pytest-benchmark reports is therefore the whole command (start-up and
tokenizer loading included); the rates come from the processes' own clocks.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


_ENCODE_BATCH = """
import contextlib, json, sys, time
from hwbench.workload.prepare import read_documents
from hwbench.workload.tokenizer import gpt2_bpe, single_threaded
source, vocab, merges, method, one_thread = sys.argv[1:]
with open(source, "rb") as stream:  # the documents prepare makes: paragraphs
    documents = [raw.decode("utf-8") for _, _, raw in read_documents(stream, "text", "paragraph")]
hf = gpt2_bpe(vocab, merges).hf
with single_threaded() if one_thread == "1" else contextlib.nullcontext():
    started = time.perf_counter()
    encodings = getattr(hf, method)(documents, add_special_tokens=False)
    seconds = time.perf_counter() - started
tokens = sum(len(e.ids) for e in encodings)
print(json.dumps({"documents": len(documents), "tokens": tokens, "tokens_per_second": tokens / seconds}))
"""


def _encode_batch_in_a_fresh_process(method: str, one_thread: bool) -> dict:
    command = [sys.executable, "-c", _ENCODE_BATCH, str(SHAKESPEARE), str(GPT2["vocab_file"]),
               str(GPT2["merge_file"]), method, "1" if one_thread else "0"]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def _prepare_in_a_fresh_process(output: Path, workers: int) -> dict:
    command = [sys.executable, "-c", _PREPARE, str(SHAKESPEARE), str(output), str(workers),
               str(GPT2["vocab_file"]), str(GPT2["merge_file"])]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_against_tokenizers_encode_batch(benchmark, tmp_path, workers):
    if not SHAKESPEARE.is_file() or not GPT2["vocab_file"].is_file():
        pytest.skip(f"reference data not found under {SHARED_DATA}")
    baseline = {("encode_batch", True): [], ("encode_batch_fast", True): [], ("encode_batch", False): []}

    def encode_with_tokenizers() -> None:
        """Untimed by pytest-benchmark: one round of the baselines before each
        prepare round, so that all see the same machine load."""
        for (method, one_thread), rates in baseline.items():
            rates.append(_encode_batch_in_a_fresh_process(method, one_thread))

    summaries = []

    def run():
        summaries.append(_prepare_in_a_fresh_process(tmp_path / "shakespeare", workers))

    benchmark.pedantic(run, setup=encode_with_tokenizers, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    best = {key: max(b["tokens_per_second"] for b in rates) for key, rates in baseline.items()}
    hf_one_thread, hf_fast_one_thread = best["encode_batch", True], best["encode_batch_fast", True]
    hf_all_threads = best["encode_batch", False]
    tokens, documents = baseline["encode_batch", True][0]["tokens"], baseline["encode_batch", True][0]["documents"]
    assert all(s["tokens"] == tokens and s["documents"] == documents for s in summaries)
    per_worker = max(s["tokens_per_second_per_worker"] for s in summaries)
    ratio = per_worker / hf_one_thread
    benchmark.extra_info.update(
        tokens=tokens, documents=documents, workers=workers, cpu_count=os.cpu_count(),
        prepare_tokens_per_s_per_worker=round(per_worker), prepare_tokens_per_s=round(per_worker * workers),
        tokenizers_encode_batch_tokens_per_s_one_thread=round(hf_one_thread),
        tokenizers_encode_batch_fast_tokens_per_s_one_thread=round(hf_fast_one_thread),
        tokenizers_encode_batch_tokens_per_s_all_threads=round(hf_all_threads),
        ratio_per_worker_to_one_thread=round(ratio, 3),
        ratio_per_worker_to_encode_batch_fast=round(per_worker / hf_fast_one_thread, 3),
    )
    print(f"\nworkers={workers}: prepare {per_worker:,.0f} tokens/s per worker ({per_worker * workers:,.0f} in all); "
          f"tokenizers encode_batch {hf_one_thread:,.0f} tokens/s on one thread "
          f"({hf_all_threads:,.0f} on {os.cpu_count()} threads), encode_batch_fast {hf_fast_one_thread:,.0f}; "
          f"ratio {ratio:.2f} (to encode_batch_fast {per_worker / hf_fast_one_thread:.2f})")
