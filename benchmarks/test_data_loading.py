"""pytest-benchmark: the cost of reading one micro-batch from each data source,
and its share of a training step of the same shape.

    python -m pytest benchmarks/test_data_loading.py --benchmark-enable -s

Goal (docs/performance.md): reading samples under 1 % of step time.
"""

import time
from pathlib import Path

import pytest

from hwbench.catalog import load_catalog
from hwbench.device import select_backend
from hwbench.engine.distributed import single_process
from hwbench.engine.native import NativeEngine
from hwbench.harness.worker import make_data_source
from hwbench.spec import build_run_spec

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    text, vocab, merges = (SHARED / "text" / "tinyshakespeare.txt", SHARED / "gpt2" / "gpt2-vocab.json",
                           SHARED / "gpt2" / "gpt2-merges.txt")
    if not text.exists():
        pytest.skip("../shared/data is absent")
    from hwbench.workload.prepare import prepare

    prefix = tmp_path_factory.mktemp("data") / "shakespeare"
    summary = prepare(text, prefix, tokenizer="gpt2-bpe", vocab_file=vocab, merge_file=merges, append_eod=True)
    return summary["outputs"]["text"]


@pytest.mark.parametrize("source", ["builtin", "synthetic", "megatron"])
def test_micro_batch_read_share_of_step(benchmark, source, shakespeare):
    catalog = load_catalog()
    data_option = shakespeare if source == "megatron" else source
    spec = build_run_spec({"model": "small", "device": "auto", "data": data_option, "steps": 1000}, catalog)
    backend = select_backend(spec.device)
    backend.prepare_process()
    workload = catalog.workloads["small"]
    data = make_data_source(spec, workload, backend, single_process(spec.parallel))
    engine = NativeEngine(workload.model, spec, backend)
    for _ in range(3):
        engine.train_step(data.train_batch)
    backend.synchronize()
    started = time.perf_counter()
    for _ in range(3):
        engine.train_step(data.train_batch)
    backend.synchronize()
    step_s = (time.perf_counter() - started) / 3

    benchmark.pedantic(data.train_batch, rounds=200, iterations=1)
    # the mean, not the median: synthetic sources draw 64 samples at once, so most calls are cheap
    per_step_read_s = benchmark.stats.stats.mean * spec.gradient_accumulation_steps
    share = per_step_read_s / step_s
    benchmark.extra_info.update(step_s=step_s, read_per_step_s=per_step_read_s, share_of_step=share,
                                micro_batch=spec.micro_batch_size, seq=spec.seq_length)
    print(f"\n{source}: read {per_step_read_s * 1e3:.3f} ms per step, step {step_s * 1e3:.0f} ms, "
          f"share {share:.3%}")
