"""pytest-benchmark: suite points run through `hwbench run`, reported as pytest-benchmark results.

Not part of the default test run (only tests/ is collected; benchmarks/conftest.py keeps
the benchmarks off unless --benchmark-enable).
Each round is one isolated `hwbench run` of the point (a child process, as `hwbench
sweep` runs it). The benchmark's statistics are hwbench's own device-timed figure,
the median step time of each run (`metrics.step_time_s.median`, seconds), not the
wall time of the child process, which includes start-up, warm-up and validation;
tokens/s, samples/s, TFLOP/s per device and the result files go into extra_info.

    python -m pytest benchmarks/test_suite_points.py --benchmark-enable --benchmark-autosave
    python -m pytest benchmarks/test_suite_points.py --benchmark-enable \
        --benchmark-compare --benchmark-compare-fail=median:5%

Environment variables (docs/compare.md):
    HWBENCH_BENCH_SUITE   suite name or file (default: smoke)
    HWBENCH_BENCH_POINTS  comma-separated point names (default: one-rank for smoke, every point otherwise)
    HWBENCH_BENCH_DEVICE  --device for points that do not set one (default: the point's, else auto)
    HWBENCH_BENCH_ROUNDS  runs per point (default: 3)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwbench.result.store import load_results
from hwbench.suites.executor import point_options
from hwbench.suites.suite import find_suite, load_suite

SUITE = os.environ.get("HWBENCH_BENCH_SUITE", "smoke")
ROUNDS = int(os.environ.get("HWBENCH_BENCH_ROUNDS", "3"))
DEVICE = os.environ.get("HWBENCH_BENCH_DEVICE")


def _points():
    suite = load_suite(find_suite(SUITE))
    wanted = os.environ.get("HWBENCH_BENCH_POINTS", "one-rank" if suite.name == "smoke" else "")
    names = {name.strip() for name in wanted.split(",") if name.strip()}
    return [p for p in suite.points if not names or p.name in names]


def _run_point(point, out_dir: Path, seed: int) -> None:
    # the sweep's --device for points that set none, distinct seeds per round, as `hwbench sweep --repeats`
    args = point_options(point, {"device": DEVICE or None}).merged(seed=seed).to_argv()
    done = subprocess.run([sys.executable, "-m", "hwbench", "run", "--quiet", *args, "--out", str(out_dir)],
                          env={**os.environ, **dict(point.env)}, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        pytest.fail(f"hwbench run {' '.join(args)} exited with {done.returncode}:\n{tail}")


@pytest.mark.parametrize("point", _points(), ids=lambda p: p.name)
def test_suite_point(benchmark, point, tmp_path):
    seeds = iter(range(int(point.option("seed", 1234)), 1 << 30))
    benchmark.pedantic(lambda: _run_point(point, tmp_path, next(seeds)), rounds=ROUNDS, iterations=1)
    results, _ = load_results([tmp_path])
    results.sort(key=lambda r: r.started_at)
    assert results and all(r.status == "ok" for r in results), [r.status for r in results]
    step_medians = [r.metrics.step_time_s.median for r in results]
    first = results[0]
    benchmark.extra_info.update(
        suite=SUITE, point=point.name, run_args=point.run_options().to_argv(), device=first.device.device_model,
        backend=first.device.backend, step_time_median_s=step_medians,
        tokens_per_s=[r.metrics.tokens_per_s for r in results],
        samples_per_s=[r.metrics.samples_per_s for r in results],
        tflops_per_device=[r.metrics.tflops_per_device for r in results],
        seeds=[r.spec.seed for r in results], run_ids=[r.run_id for r in results],
        torch_version=first.environment.torch_version)
    # The statistics pytest-benchmark saves and compares: hwbench's median step time of
    # each run in place of the child process's wall time (see the module docstring).
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    if stats is not None and isinstance(getattr(stats, "data", None), list) and len(stats.data) == len(step_medians):
        stats.data[:] = step_medians
        benchmark.extra_info["timing"] = "hwbench median step time per run (metrics.step_time_s.median)"
    else:
        benchmark.extra_info["timing"] = "wall time of each `hwbench run` child process"
