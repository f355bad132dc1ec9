"""The short table a device session prints last (the device tool returns the tail of the
output): one line per result under the given folders, the planner's prediction beside the
measured peak, and the side-by-side ratios when OUT/side_by_side.json exists; then each of the
GPU session's goals (benchmarks/README.md) judged on what the folder holds: PASS, FAIL with the
figure that misses, or n/a with what is missing.

    python benchmarks/session_summary.py gpu-session [--out gpu-session/summary.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hwbench.paths import result_files  # noqa: E402
from hwbench.report.runs import predicted_peak  # noqa: E402
from hwbench.result.store import ResultFormatError, load_result  # noqa: E402
from hwbench.workload.flops import DEFAULT_FLOPS_FORMULA, counts_hardware_flops  # noqa: E402

# the result's own figures: the step time's median; tokens/s, TFLOP/s and MFU over the timed
# window (the mean step), as the result file and hwbench report give them; an MFU figure marked
# HFU counts the recompute's extra forward (hwbench.workload.flops.FlopsFormula.counts_recompute)
HEADERS = ("result", "status", "micro/global x seq", "rc", "median step ms", "tokens/s (mean step)",
           "TFLOP/s (mean step)", "MFU", "MFU ceil", "host waits", "W", "peak GiB", "planned GiB")


def _figure(value, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def _percent(value, label: str = "") -> str:
    return "-" if value is None else f"{value * 100:.1f}%{label}"


def _mean_power_w(telemetry) -> float | None:
    """The devices' summed mean power in the timed window, where every device reported it."""
    powers = [d.power_w_mean for d in (telemetry.devices if telemetry else None) or []]
    return sum(powers) if powers and None not in powers else None


def session_results(folder: Path) -> list[tuple[Path, Any]]:
    """Every run result under ``folder``, with its file."""
    found = []
    for path in result_files([folder]):
        try:
            found.append((path, load_result(path)))
        except ResultFormatError:
            continue  # the bare loop's figures, side_by_side.json, a calibration store: not run results
    return found


def result_rows(folder: Path) -> list[tuple[str, ...]]:
    rows = []
    for path, result in session_results(folder):
        spec, metrics = result.spec, result.metrics
        planned, _ = predicted_peak(result)
        waits = metrics.host_syncs
        # a formula that counts the recompute (megatron-deepspeed) of a run that recomputes: HFU, not MFU
        hfu = " HFU" if counts_hardware_flops(metrics.flops_formula, spec.recompute) else ""
        rows.append(
            (
                f"{path.parent.relative_to(folder)}: {spec.model} {spec.precision}"
                + (f" {spec.fp8_recipe} (MFU vs bf16 peak)" if spec.fp8_recipe else ""),
                result.status,
                f"{spec.micro_batch_size}/{spec.global_batch_size} x {spec.seq_length}",
                "y" if spec.recompute else "n",
                _figure(metrics.step_time_s.median if metrics.step_time_s else None, 1000),
                _figure(metrics.tokens_per_s, 1, 0),
                _figure(metrics.tflops_per_device),
                _percent(metrics.mfu, hfu),
                _percent(metrics.mfu_measured_ceiling, hfu),
                "-" if waits is None else str(waits.count),
                _figure(_mean_power_w(metrics.telemetry), 1, 0),
                _figure(_peak_reserved_bytes(result), 2**-30, 2),
                _figure(planned, 2**-30, 2),
            )
        )
    return rows


def markdown(rows: list[tuple[str, ...]], ratios: dict[str, float | None]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + " --- |" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if ratios:
        lines.append("")
        lines += [f"{name} = {'-' if value is None else f'{value:.3f}'}" for name, value in ratios.items()]
    return "\n".join(lines) + "\n"


# The GPU session's goals (benchmarks/README.md): bf16 MFU of Megatron's current
# formula against the data-sheet dense peak at 345M/seq 1024 and 1.3B/seq 2048 (the best point of
# each); hwbench's median step within 2 % of the bare loop's; telemetry on against off within
# 0.5 %; the planner within 10 % of every measured peak; and the correctness checks before them.
MFU_GOALS = (("345m", 1024, 0.45), ("1.3b", 2048, 0.50))
HARNESS_RATIO_MAX, TELEMETRY_RATIO_MAX, PLANNER_ERROR_MAX = 1.02, 1.005, 0.10
ENERGY_ERROR_MAX = 0.10  # energy against mean power x window: the counter and the samples agree
ENDED_WITHOUT_FAULT = {"ok", "skipped"}  # skipped: the planner said it does not fit, before it ran


def on_a_real_accelerator(result) -> bool:
    """The goals judge an accelerator's own results: a stand-in's figures describe no card, and a
    CPU (the mechanics rehearsed here) is held to none of them."""
    return result.device.backend not in (None, "cpu") and not result.stand_in  # simulated, or FP8 emulated


def _name(path: Path, folder: Path) -> str:
    return str(path.parent.relative_to(folder)) + "/" + path.stem[-6:]


def _verdict(failures: list[str], checked: int, what: str, unchecked: str) -> tuple[str, str]:
    if not checked:
        return "n/a", unchecked
    if failures:
        return "FAIL", "; ".join(failures)
    return "PASS", f"{checked} {what}"


def _model_mfu(result) -> float | None:
    """MFU by Megatron's current formula, whichever formula the run itself was reported with."""
    metrics = result.metrics
    figures = (metrics.by_formula or {}).get(DEFAULT_FLOPS_FORMULA)
    if figures and figures.mfu is not None:
        return figures.mfu
    if counts_hardware_flops(metrics.flops_formula, result.spec.recompute):
        return None  # HFU: not the goal's figure
    return metrics.mfu


def _peak_reserved_bytes(result) -> int | None:
    return result.metrics.memory.peak_reserved_bytes if result.metrics.memory else None


def goal_checks(folder: Path, ratios: dict[str, float | None]) -> list[tuple[str, str, str]]:
    """(goal, PASS/FAIL/n/a, why) for each goal, from the results under ``folder``."""
    results = [(path, result) for path, result in session_results(folder) if on_a_real_accelerator(result)]
    checks = []
    faults = [f"{_name(p, folder)}: {r.status} ({(r.error.message if r.error else None) or 'no message'})"
              for p, r in results if r.status not in ENDED_WITHOUT_FAULT]
    checks.append(("every run ends ok (or skipped by the planner)",
                   *_verdict(faults, len(results), "results", "no result of a real accelerator")))
    ok = [(p, r) for p, r in results if r.status == "ok"]

    waits, checked = [], 0
    for path, result in ok:
        if result.device.backend != "cuda" or result.spec.precision not in ("bf16", "fp16"):
            continue
        counted = result.metrics.host_syncs
        checked += 1
        if counted is None or counted.count != 0:
            waits.append(f"{_name(path, folder)}: {'not counted' if counted is None else counted.count}")
    checks.append(("no host wait in the timed loop (CUDA, bf16/fp16)",
                   *_verdict(waits, checked, "runs with 0", "no CUDA bf16/fp16 run")))

    power, energy, checked = [], [], 0
    for path, result in ok:
        telemetry = result.metrics.telemetry
        tdp, window = result.device.tdp_watts, telemetry.window_s if telemetry else None
        for device in (telemetry.devices if telemetry else None) or []:
            mean, joules = device.power_w_mean, device.energy_j
            if mean is None:
                continue
            checked += 1
            if not 0 < mean <= (tdp or float("inf")):
                limit = "no TDP in the catalog" if tdp is None else f"TDP {tdp:g} W"
                power.append(f"{_name(path, folder)} device {device.index}: {mean:.0f} W ({limit})")
            if joules and window and abs(joules - mean * window) > ENERGY_ERROR_MAX * joules:
                energy.append(f"{_name(path, folder)} device {device.index}: {joules:.0f} J against "
                              f"{mean:.0f} W x {window:.1f} s = {mean * window:.0f} J")
    checks.append(("mean power above 0 and at most the TDP",
                   *_verdict(power, checked, "device readings", "no power reading")))
    checks.append((f"energy within {ENERGY_ERROR_MAX:.0%} of mean power x window",
                   *_verdict(energy, checked, "device readings", "no power reading")))

    for model, seq, goal in MFU_GOALS:
        points = [(mfu, path) for path, result in ok
                  if (result.spec.model, result.spec.seq_length, result.spec.precision) == (model, seq, "bf16")
                  and (mfu := _model_mfu(result)) is not None]
        name = f"MFU of {model} at seq {seq}, bf16, >= {goal:.0%} ({DEFAULT_FLOPS_FORMULA}, data-sheet peak)"
        if not points:
            checks.append((name, "n/a", "no bf16 result with an MFU"))
            continue
        best, path = max(points)
        checks.append((name, "PASS" if best >= goal else "FAIL", f"best {best:.1%}: {_name(path, folder)}"))

    for key, limit, name in (("harness_ratio", HARNESS_RATIO_MAX, "hwbench's step within 2 % of the bare loop's"),
                             ("telemetry_ratio", TELEMETRY_RATIO_MAX, "telemetry costs under 0.5 %")):
        value = ratios.get(key)
        checks.append((name, "n/a", "no complete side-by-side of a real accelerator") if value is None else
                      (name, "PASS" if value <= limit else "FAIL", f"{key} {value:.3f} (median of the repeats)"))

    planner, checked = [], 0
    for path, result in ok:
        measured = _peak_reserved_bytes(result)
        planned, _ = predicted_peak(result)
        if not measured or planned is None:
            continue
        checked += 1
        error = (planned - measured) / measured
        if abs(error) > PLANNER_ERROR_MAX:
            planner.append(f"{_name(path, folder)}: planned {planned / 2**30:.2f} GiB, "
                           f"measured {measured / 2**30:.2f} ({error:+.0%})")
    checks.append((f"planner within {PLANNER_ERROR_MAX:.0%} of the measured peak",
                   *_verdict(planner, checked, "runs", "no run with a measured peak and a plan")))
    return checks


def goals_markdown(checks: list[tuple[str, str, str]]) -> str:
    lines = ["| goal | verdict | figures |", "| --- | --- | --- |"]
    return "\n".join(lines + [f"| {goal} | {verdict} | {why} |" for goal, verdict, why in checks]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the session folder (results are searched recursively)")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    folder = Path(args.folder).resolve()
    ratios = {}
    on_accelerator: dict[str, float | None] = {}
    for path in sorted(folder.rglob("side_by_side.json")):
        document = json.loads(path.read_text())
        ratios = {
            name: document.get(name) for name in ("harness_ratio", "harness_ratio_no_telemetry", "telemetry_ratio")
        }
        if any(on_a_real_accelerator(result) for _, result in session_results(path.parent)):
            on_accelerator = ratios  # its hwbench sides ran on a real accelerator: the goals judge it
    text = markdown(result_rows(folder), ratios) + "\n" + goals_markdown(goal_checks(folder, on_accelerator))
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
