"""pytest-benchmark: one training step of a small GPT through hwbench's engine.

Not part of the default test run. Run it with

    python -m pytest benchmarks --benchmark-enable --benchmark-autosave

and compare runs with --benchmark-compare / --benchmark-compare-fail=median:5%.
"""

import pytest

from hwbench.catalog import load_catalog
from hwbench.device import select_backend
from hwbench.engine.distributed import single_process
from hwbench.engine.native import NativeEngine
from hwbench.harness.worker import make_data_source
from hwbench.spec import build_run_spec


@pytest.mark.parametrize("model,precision", [("tiny", "fp32"), ("small", "fp32"), ("small", "bf16"), ("small", "fp16")])
def test_train_step(benchmark, model, precision):
    catalog = load_catalog()
    spec = build_run_spec({"model": model, "precision": precision, "device": "auto"}, catalog)
    backend = select_backend(spec.device)
    if backend.precision_problem(precision):
        pytest.skip(backend.precision_problem(precision))
    backend.prepare_process()
    backend.seed(spec.seed)
    workload = catalog.workloads[model]
    engine = NativeEngine(workload.model, spec, backend)
    data = make_data_source(spec, workload, backend, single_process(spec.parallel))

    def step():
        engine.train_step(data.train_batch)
        backend.step_done()  # as hwbench's loop: the CPU heap bound is part of a step's cost
        backend.synchronize()

    for _ in range(3):  # warm-up: allocator and heap growth, kernel selection
        step()
    benchmark.extra_info.update(device=backend.device_names()[0], tokens_per_step=spec.tokens_per_iteration,
                                tuning=backend.tuning)
    benchmark.pedantic(step, rounds=8, iterations=1)
