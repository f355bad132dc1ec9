"""The short table a device session prints last (the device tool returns the tail of the
output): one line per result under the given folders, the planner's prediction beside the
measured peak, and the side-by-side ratios when OUT/side_by_side.json exists.

    python benchmarks/session_summary.py gpu-session [--out gpu-session/summary.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hwbench.paths import result_files  # noqa: E402
from hwbench.report.runs import predicted_peak  # noqa: E402
from hwbench.result.store import ResultFormatError, load_result  # noqa: E402
from hwbench.workload.flops import counts_hardware_flops  # noqa: E402

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
    powers = [d.get("power_w_mean") for d in (telemetry or {}).get("devices") or []]
    return sum(powers) if powers and None not in powers else None


def result_rows(folder: Path) -> list[tuple[str, ...]]:
    rows = []
    for path in result_files([folder]):
        try:
            result = load_result(path)
        except ResultFormatError:
            continue  # the bare loop's figures, side_by_side.json, a calibration store: not run results
        spec, metrics = result.spec or {}, result.metrics or {}
        step = metrics.get("step_time_s") or {}
        memory = metrics.get("memory") or {}
        planned, _ = predicted_peak(result)
        waits = metrics.get("host_syncs")
        # a formula that counts the recompute (megatron-deepspeed) of a run that recomputes: HFU, not MFU
        hfu = " HFU" if counts_hardware_flops(metrics.get("flops_formula"), spec.get("recompute")) else ""
        rows.append(
            (
                f"{path.parent.relative_to(folder)}: {spec.get('model')} {spec.get('precision')}",
                result.status,
                f"{spec.get('micro_batch_size')}/{spec.get('global_batch_size')} x {spec.get('seq_length')}",
                "y" if spec.get("recompute") else "n",
                _figure(step.get("median"), 1000),
                _figure(metrics.get("tokens_per_s"), 1, 0),
                _figure(metrics.get("tflops_per_device")),
                _percent(metrics.get("mfu"), hfu),
                _percent(metrics.get("mfu_measured_ceiling"), hfu),
                "-" if waits is None else str(waits["count"]),
                _figure(_mean_power_w(metrics.get("telemetry")), 1, 0),
                _figure(memory.get("peak_reserved_bytes"), 2**-30, 2),
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the session folder (results are searched recursively)")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    folder = Path(args.folder).resolve()
    ratios = {}
    for path in sorted(folder.rglob("side_by_side.json")):
        document = json.loads(path.read_text())
        ratios = {
            name: document.get(name) for name in ("harness_ratio", "harness_ratio_no_telemetry", "telemetry_ratio")
        }
    text = markdown(result_rows(folder), ratios)
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
