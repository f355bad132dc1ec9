"""The simulation behind docs/history.md: how well `hwbench history changes` finds a 5% step
and how often it raises a false regression, with noise built from real repeated runs.

    python benchmarks/history_simulation.py [--runs FOLDER] [--series N]

--runs: result files of one point run again and again (default tests/data/history/noise, 20
runs of `hwbench run --model tiny --seq-length 64 --steps 10 --warmup 2` on the 2-vCPU
development machine). Their tokens/s gives the first noise model: their relative deviations
from the median, resampled (a normal with their CV, 105% here, would draw negative
throughputs). Then normal noise at fixed CVs shows where the method meets the goals. Seeds
are fixed, so the figures are reproducible. Takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hwbench.history import simulation  # noqa: E402
from hwbench.history.changes import ALPHA, MIN_NIGHTS  # noqa: E402
from hwbench.result.store import load_results  # noqa: E402


def row(name: str, noise: simulation.NoiseModel, series: int, threshold: float = 0.05) -> str:
    start = time.perf_counter()
    steps = simulation.simulate_steps(noise, series, seed=2026, threshold=threshold)
    quiet = simulation.simulate_noise_only(noise, series, seed=2027, threshold=threshold)
    return (f"| {name} | {series} | {steps.rate('detected'):.1%} | {steps.rate('located'):.1%} | "
            f"{steps.rate('gate_failed'):.1%} | {quiet.false_change} / {series} | {quiet.false_gate} / {series} | "
            f"{time.perf_counter() - start:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=str(ROOT / "tests" / "data" / "history" / "noise"))
    parser.add_argument("--series", type=int, default=1000, help="series per figure at 2%% noise (others: a fifth)")
    args = parser.parse_args()
    results, _ = load_results([args.runs])
    values = [r.metrics.tokens_per_s for r in results if r.status == "ok"]
    print(f"{len(values)} real runs: tokens/s median {statistics.median(values):.0f}, min {min(values):.0f}, "
          f"max {max(values):.0f}, CV {statistics.stdev(values) / statistics.fmean(values):.1%}")
    print(f"method: E-divisive means, t test p < {ALPHA:g}, {MIN_NIGHTS} nights a side; {simulation.NIGHTS} nights, "
          f"{simulation.REPEATS} runs a night (median), step of -5% at a night drawn from "
          f"{simulation.FIRST_STEP}..{simulation.LAST_STEP}, gate threshold 5%\n")
    print("| noise (run to run) | series | step found within 3 nights | step located within 1 night | "
          "gate failed within 3 nights | noise only: false regression on some night | noise only: gate failed "
          "on some night | time |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    few = max(1, args.series // 5)
    measured = simulation.NoiseModel.from_runs(values, resample=True)
    print(row(f"this machine's runs resampled (CV {measured.cv:.0%})", measured, few), flush=True)
    for cv in (0.005, 0.01, 0.02, 0.03, 0.05):
        print(row(f"normal, CV {cv:.1%}", simulation.NoiseModel(cv), args.series if cv == 0.02 else few), flush=True)
    print(row("normal, CV 2.0%, gate threshold 3%", simulation.NoiseModel(0.02), few, threshold=0.03), flush=True)


if __name__ == "__main__":
    main()
