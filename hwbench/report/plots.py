"""The report's plots as inline SVG (hwbench.report.svg), one per model and kind: a chart never
mixes two models. Each function takes run rows (dicts as built by hwbench.report.runs.run_row,
with the projection fields) and returns the SVG, or None when there is nothing to plot.
Oversubscribed runs are marked in every label and left out of the throughput and scaling plots."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from hwbench.report.scaling import ScalingFit
from hwbench.report.svg import Point, Series, bar_chart, line_chart
from hwbench.units import GIB


def run_label(row: dict[str, Any]) -> str:
    """"AMD EPYC, TP1 PP1 DP2, fp32" (+ ", seq 64" + " [oversubscribed]"): device, layout, precision
    and what else sets the run's point apart."""
    device = str(row.get("device_model") or "?")
    device = device if len(device) <= 24 else device[:23] + "…"
    variant = f", {row['point_variant']}" if row.get("point_variant") else ""
    flags = f" [{row['stand_in']}]" if row.get("stand_in") else ""
    flags += " [oversubscribed]" if row.get("oversubscribed") is True else ""
    return f"{device}, {row['layout']}, {row['precision']}{variant}{flags}"


def _by_device(rows: Sequence[dict[str, Any]]) -> tuple[list[str], dict[str, dict[str, list[dict[str, Any]]]]]:
    """(the categories: layout, devices and precision of each point, in order; for each device
    model, the runs of each of its categories). A chart then has one series (colour, legend
    entry) per device model, so two devices never share a bar's label."""
    categories: list[str] = []
    by_device: dict[str, dict[str, list[dict[str, Any]]]] = {}
    ordered = sorted(rows, key=lambda r: (r["devices_charged"], r["world_size"], r["layout"], str(r["precision"])))
    for row in ordered:
        category = (f"{row['layout']}\n{row['devices_charged']} device(s), {row['precision']}"
                    + (f"\n{row['point_variant']}" if row.get("point_variant") else "")
                    + ("\noversubscribed" if row["oversubscribed"] is True else ""))
        if category not in categories:
            categories.append(category)
        device = str(row["device_model"]) + (f" [{row['stand_in']}]" if row.get("stand_in") else "")
        by_device.setdefault(device, {}).setdefault(category, []).append(row)
    return categories, by_device


def throughput(model: str, rows: Sequence[dict[str, Any]]) -> str | None:
    """tokens/s per device charged of each point (the median of its repeats, a whisker from the
    slowest to the fastest; hover: every run), one series per device model. Oversubscribed runs
    are left out: their throughput measures the contention, not the device (their memory still
    counts, in the memory plot)."""
    measured = [r for r in rows if r.get("tokens_per_s_per_device_charged")]
    rows = [r for r in measured if r["oversubscribed"] is not True]
    if not rows:
        return None
    left_out = len(measured) - len(rows)
    categories, by_device = _by_device(rows)
    series = []
    for device, runs_by_category in sorted(by_device.items()):
        bars = []
        for index, category in enumerate(categories):
            figures = [r["tokens_per_s_per_device_charged"] for r in runs_by_category.get(category, [])]
            if figures:
                text = (f"{device}, {category.replace(chr(10), ', ')}: median {statistics.median(figures):,.1f} "
                        f"tokens/s per device over {len(figures)} run(s): " + ", ".join(f"{f:,.1f}" for f in figures))
                spread = (min(figures), max(figures)) if len(figures) > 1 else (None, None)
                bars.append(Point(index, statistics.median(figures), text, *spread))
        series.append(Series(device, bars))
    title = f"{model}: throughput per device charged" + (
        f" ({left_out} oversubscribed run(s) left out)" if left_out else "")
    return bar_chart(title, "tokens/s per device (median and range of repeats)", categories, series)


def decision(title: str, candidates: Sequence[Any]) -> str | None:
    """The decision's best point of each device model (median tokens/s per device charged, a whisker
    from the slowest to the fastest repeat) beside the published rows (one figure each, no whisker)."""
    if not candidates:
        return None
    categories = [(c.device if len(c.device) <= 40 else c.device[:39] + "…") + (f"\n{c.variant}" if c.variant else "")
                  for c in candidates]  # a bar names the settings that set its point apart
    series = []
    for name, published in (("measured: median and range of repeats", False), ("published: one figure", True)):
        bars = []
        for index, c in enumerate(candidates):
            if c.published != published:
                continue
            spread = (min(c.per_device), max(c.per_device)) if len(c.per_device) > 1 else (None, None)
            text = (f"{c.device}, {c.point}: median {c.median:,.1f} tokens/s per device over {len(c.per_device)} "
                    "run(s): " + ", ".join(f"{v:,.1f}" for v in c.per_device))
            bars.append(Point(index, c.median, text, *spread))
        if bars:
            series.append(Series(name, bars, color="#a1a1aa" if published else None))
    return bar_chart(f"{title}: best point per device model", "tokens/s per device charged", categories, series)


def scaling(model: str, fits: dict[tuple, ScalingFit]) -> str | None:
    """Measured tokens/s against devices charged, the fitted line and the ideal (linear from the
    smallest count), for each device model of ``model`` measured at two or more counts."""
    series: list[Series] = []
    lengths = {key[3] for key in fits if key[0] == model}
    for (fit_model, precision, device, seq, stand_in), fit in sorted(fits.items(), key=lambda item: str(item[0])):
        if fit_model != model or not fit.fitted:
            continue
        name = f"{device}{f' [{stand_in}]' if stand_in else ''}, {precision}" + (f", seq {seq}" if len(lengths) > 1
                                                                                else "")
        series += [
            Series(f"{name}: measured", [Point(p.devices, p.tokens_per_s, f"{p.devices} devices: {p.tokens_per_s:,.1f} "
                                               f"tokens/s (median of {p.runs}; {p.layout.split(' (')[0]})")
                                         for p in fit.points]),
            Series(f"{name}: fit, {fit.efficiency_per_doubling:.0%}/doubling",
                   [Point(p.devices, fitted, f"fitted {fitted:,.1f}") for p in fit.points
                    if (fitted := fit.fitted_tokens_per_s(p.devices)) is not None], dashed=True, markers=False),
            Series(f"{name}: ideal (linear)",
                   [Point(p.devices, fit.ideal_tokens_per_s(p.devices),
                          f"ideal {fit.ideal_tokens_per_s(p.devices):,.1f}") for p in fit.points],
                   dashed=True, markers=False, color="#a1a1aa"),
        ]
    if not series:
        return None
    return line_chart(f"{model}: scaling with devices charged (oversubscribed runs left out)", "devices (log2 axis)",
                      "tokens/s (all devices)", series, log2_x=True)


def memory(model: str, rows: Sequence[dict[str, Any]]) -> str | None:
    """Measured peak, planner prediction and capacity per device of each point (the highest
    over its repeats), one group of bars per point and device model."""
    rows = [r for r in rows if r.get("peak_bytes") is not None or r.get("predicted_peak_bytes") is not None]
    if not rows:
        return None
    categories, by_device = _by_device(rows)
    groups = [(device, category, runs) for device, found in sorted(by_device.items())
              for category, runs in found.items()][:12]
    labels = [f"{device[:22]}\n{category}" for device, category, _ in groups]
    series = []
    for key, name in (("peak_bytes", "measured peak"), ("predicted_peak_bytes", "predicted (planner)"),
                      ("capacity_bytes", "capacity")):
        values = [max((r[key] for r in runs if r.get(key) is not None), default=None) for _, _, runs in groups]
        series.append(Series(name, [
            Point(index, v / GIB, f"{device}, {category.replace(chr(10), ', ')}: {name} {v / GIB:,.3f} GiB")
            for index, ((device, category, _), v) in enumerate(zip(groups, values)) if v is not None]))
    return bar_chart(f"{model}: peak memory per device", "GiB per device", labels, series)


def loss_curves(model: str, curves: Sequence[tuple[dict[str, Any], list[tuple[int, float]]]]) -> str | None:
    """Training loss per step of each run, labelled by device, layout, precision and what else sets
    its point apart (seq 64)."""
    series = [Series(f"{run_label(row)} ({row['run_id'][-6:]})",
                     [Point(step, loss, f"{row['run_id']} step {step}: loss {loss:.4f}") for step, loss in points],
                     markers=len(points) < 40) for row, points in curves if points]
    if not series:
        return None
    return line_chart(f"{model}: training loss (warm-up steps included)", "step", "loss (nats)", series)
