"""The report's plots as inline SVG (hwbench.report.svg), one per model and kind: a chart never
mixes two models. Each function takes run rows (dicts as built by hwbench.report.runs.run_row,
with the projection fields) and returns SVG text, or None when there is nothing to plot.
Oversubscribed runs are marked in every label and left out of the scaling plot."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from hwbench.report.scaling import ScalingFit
from hwbench.report.svg import Series, bar_chart, line_chart
from hwbench.units import GIB


def run_label(row: dict[str, Any]) -> str:
    """"AMD EPYC, TP1 PP1 DP2, fp32" (+ " [oversubscribed]"): device, layout and precision."""
    device = str(row.get("device_model") or "?")
    device = device if len(device) <= 24 else device[:23] + "…"
    flags = " [simulated]" if row.get("simulated") else ""
    flags += " [oversubscribed]" if row.get("oversubscribed") is True else ""
    return f"{device}, {row['layout']}, {row['precision']}{flags}"


def _points(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The runs of each benchmark point (repeats together), by point."""
    points: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        points.setdefault(row["point"] or row["run_id"], []).append(row)
    return points


def throughput(model: str, rows: Sequence[dict[str, Any]]) -> str | None:
    """tokens/s per device charged of each point (the median of its repeats; hover: every run)."""
    points = [runs for runs in _points([r for r in rows if r.get("tokens_per_s_per_device_charged")]).values()]
    if not points:
        return None
    points.sort(key=lambda runs: (str(runs[0]["device_model"]), runs[0]["world_size"], runs[0]["layout"]))
    labels, values, texts = [], [], []
    for runs in points:
        figures = [r["tokens_per_s_per_device_charged"] for r in runs]
        first = runs[0]
        labels.append(f"{first['layout']}\n{first['precision']}, {first['devices_charged']} device(s)"
                      + ("\noversubscribed" if first["oversubscribed"] is True else ""))
        values.append(statistics.median(figures))
        texts.append(f"{run_label(first)}: median {statistics.median(figures):,.1f} tokens/s per device over "
                     f"{len(figures)} run(s): " + ", ".join(f"{f:,.1f}" for f in figures))
    return bar_chart(f"{model}: throughput per device charged", "tokens/s per device (median of repeats)",
                     labels, [("tokens/s per device", values, texts)])


def scaling(model: str, fits: dict[tuple, ScalingFit]) -> str | None:
    """Measured tokens/s against devices charged, the fitted line and the ideal (linear from the
    smallest count), for each device model of ``model`` measured at two or more counts."""
    series: list[Series] = []
    for (fit_model, precision, device), fit in sorted(fits.items(), key=lambda item: str(item[0])):
        if fit_model != model or not fit.fitted:
            continue
        first = fit.points[0]
        name = f"{device}, {precision}"
        series.append(Series(f"{name}: measured", [
            (p.devices, p.tokens_per_s, f"{p.devices} devices: {p.tokens_per_s:,.1f} tokens/s (median of {p.runs}; "
                                        f"{p.layout.split(' (')[0]})") for p in fit.points]))
        series.append(Series(f"{name}: fit, {fit.efficiency_per_doubling:.0%}/doubling", [
            (p.devices, fit.fitted_tokens_per_s(p.devices), f"fitted {fit.fitted_tokens_per_s(p.devices):,.1f}")
            for p in fit.points], dashed=True, markers=False))
        series.append(Series(f"{name}: ideal (linear)", [
            (p.devices, first.tokens_per_s * p.devices / first.devices,
             f"ideal {first.tokens_per_s * p.devices / first.devices:,.1f}") for p in fit.points],
            dashed=True, markers=False, color="#a1a1aa"))
    if not series:
        return None
    return line_chart(f"{model}: scaling with devices charged (oversubscribed runs left out)", "devices (log2 axis)",
                      "tokens/s (all devices)", series, log2_x=True)


def memory(model: str, rows: Sequence[dict[str, Any]]) -> str | None:
    rows = [r for r in rows if r.get("peak_bytes") is not None or r.get("predicted_peak_bytes") is not None]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: (str(r["device_model"]), r["world_size"], r["layout"]))[:12]
    labels = [f"{r['layout']}\n{r['precision']}\n{r['run_id'][-6:]}" for r in rows]
    series = []
    for key, name in (("peak_bytes", "measured peak"), ("predicted_peak_bytes", "predicted (planner)"),
                      ("capacity_bytes", "capacity")):
        values = [None if r.get(key) is None else r[key] / GIB for r in rows]
        series.append((name, values, [f"{run_label(r)} ({r['run_id']}): {name} "
                                      + ("-" if v is None else f"{v:,.3f} GiB") for r, v in zip(rows, values)]))
    return bar_chart(f"{model}: peak memory per device", "GiB per device", labels, series)


def loss_curves(model: str, curves: Sequence[tuple[dict[str, Any], list[tuple[int, float]]]]) -> str | None:
    """Training loss per step of each run, labelled by device, layout and precision."""
    series = [Series(f"{run_label(row)} ({row['run_id'][-6:]})",
                     [(step, loss, f"{row['run_id']} step {step}: loss {loss:.4f}") for step, loss in points],
                     markers=len(points) < 40) for row, points in curves if points]
    if not series:
        return None
    return line_chart(f"{model}: training loss (warm-up steps included)", "step", "loss (nats)", series)
