"""The report's plots as PNG bytes (matplotlib, Agg backend; no display needed).

Each function takes run rows (dicts as built by hwbench.report.runs.run_row)
and returns PNG bytes, or None when there is nothing to plot.
"""

from __future__ import annotations

import io
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from hwbench.units import GIB  # noqa: E402


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def _label(row: dict[str, Any]) -> str:
    device = str(row.get("device_model") or "?")
    if len(device) > 22:
        device = device[:21] + "…"
    flag = " (sim)" if row.get("simulated") else ""
    return f"{row['model']} {row['layout']}\n{device} x{row['world_size']}{flag}\n{row['run_id'][-6:]}"


def throughput_by_layout(rows: Sequence[dict[str, Any]]) -> bytes | None:
    rows = [r for r in rows if r.get("samples_per_s") is not None]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: (r["model"], r["world_size"], r["layout"]))
    figure, axis = plt.subplots(figsize=(max(6.0, 1.6 * len(rows) + 2), 4.2))
    bars = axis.bar(range(len(rows)), [r["samples_per_s"] for r in rows], color="#3b75af")
    axis.bar_label(bars, labels=[f"{r['samples_per_s']:.3g}" for r in rows], fontsize=8)
    axis.set_xticks(range(len(rows)), [_label(r) for r in rows], fontsize=7)
    axis.set_ylabel("samples/s (all devices)")
    axis.set_title("Throughput by layout")
    axis.grid(axis="y", alpha=0.3)
    return _png(figure)


def scaling(rows: Sequence[dict[str, Any]]) -> bytes | None:
    """samples/s against world size, one line per model measured at more than one world size."""
    by_model: dict[str, dict[int, float]] = {}
    for row in rows:
        if row.get("samples_per_s") is None:
            continue
        points = by_model.setdefault(row["model"], {})
        points[row["world_size"]] = max(points.get(row["world_size"], 0.0), row["samples_per_s"])
    by_model = {m: p for m, p in by_model.items() if len(p) > 1}
    if not by_model:
        return None
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for model, points in sorted(by_model.items()):
        sizes = sorted(points)
        axis.plot(sizes, [points[s] for s in sizes], marker="o", label=f"{model} (best per size)")
        first = sizes[0]
        axis.plot(sizes, [points[first] * s / first for s in sizes], linestyle=":", color="grey")
    axis.plot([], [], linestyle=":", color="grey", label="linear from the smallest")
    axis.set_xticks(sorted({s for p in by_model.values() for s in p}))
    axis.set_xlabel("devices (world size)")
    axis.set_ylabel("samples/s (all devices)")
    axis.set_title("Scaling with device count")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _png(figure)


def memory(rows: Sequence[dict[str, Any]]) -> bytes | None:
    rows = [r for r in rows if r.get("peak_bytes") is not None or r.get("predicted_peak_bytes") is not None]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: (r["model"], r["world_size"], r["layout"]))
    figure, axis = plt.subplots(figsize=(max(6.0, 1.9 * len(rows) + 2), 4.2))
    width = 0.27
    series = (("peak_bytes", "measured peak", "#3b75af"), ("predicted_peak_bytes", "predicted (planner)", "#ef8636"),
              ("capacity_bytes", "capacity", "#b0b0b0"))
    for offset, (key, name, color) in enumerate(series):
        values = [(r.get(key) or 0) / GIB for r in rows]
        bars = axis.bar([i + (offset - 1) * width for i in range(len(rows))], values, width, label=name, color=color)
        axis.bar_label(bars, labels=[f"{v:.2f}" if v else "-" for v in values], fontsize=7)
    axis.set_xticks(range(len(rows)), [_label(r) for r in rows], fontsize=7)
    axis.set_ylabel("GiB per device")
    axis.set_title("Peak memory against capacity")
    axis.grid(axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    return _png(figure)


def loss_curves(curves: dict[str, list[tuple[int, float]]]) -> bytes | None:
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return None
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for label, points in curves.items():
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None,
                  label=label)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("step (warm-up included)")
    axis.set_ylabel("training loss (nats)")
    axis.set_title("Loss curves")
    axis.grid(alpha=0.3)
    figure.set_size_inches(6.4, 4.2 + 0.22 * len(curves))
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1, frameon=False)
    return _png(figure)
