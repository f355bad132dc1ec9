"""The JSON that CI benchmark actions chart and gate on.

github-action-benchmark (`tool: customBiggerIsBetter` / `customSmallerIsBetter`): a list of
``{"name", "unit", "value", "range", "extra"}``, all higher-is-better or all lower-is-better
figures (the action's src/extract.ts `BenchmarkResult`); Bencher Metric Format: ``{benchmark:
{measure: {"value", "lower_value", "upper_value"}}}`` (bencher.dev/docs/reference/
bencher-metric-format). One benchmark per point, its value the median of the repeats, the range
or bounds their lowest and highest (hwbench.exports.figures). A simulated point's benchmark name
ends with ` [simulated]` (an emulated FP8 point's with ` [emulated]`), so each tool keeps it in a series
of its own, never in the real device's. `hwbench collectives` results give a benchmark per
collective, form, size and scope, its busbw (higher is better).
"""

from __future__ import annotations

import json
from typing import Any

from hwbench.errors import UsageError
from hwbench.exports.figures import CollectiveFigure, Figure, collective_figures, flops_formula, point_figures
from hwbench.metrics import BUSBW, METRICS
from hwbench.result.collectives import CollectivesResult


def render(fmt: str, runs: list, files: list, request: Any, collectives: list[CollectivesResult] | None = None) -> str:
    figures = collective_figures(collectives or [])
    if fmt == "bencher":
        document: Any = {**bencher_metrics(runs), **bencher_busbw(figures)}
    else:
        higher = fmt == "customBiggerIsBetter"
        document = action_benchmarks(runs, higher_is_better=higher) + action_busbw(figures, higher_is_better=higher)
    if not document:
        raise UsageError(f"the ok runs have no figure {fmt} takes (each is null: see the results' "
                         "metrics.unmeasured); nothing to export")
    return json.dumps(document, indent=2) + "\n"


def action_benchmarks(runs: list, higher_is_better: bool) -> list[dict[str, Any]]:
    """github-action-benchmark's entries of the figures that are better higher (or lower)."""
    entries = []
    for point in point_figures(runs):
        for metric in METRICS.values():
            figure = point.figure(metric) if metric.higher_is_better == higher_is_better else None
            if figure is None:
                continue
            extra = [f"runs: {', '.join(point.run_ids)}", f"point: {point.key.text()}"]
            if metric.per_formula:
                extra.append(f"FLOPs formula: {flops_formula()}")
            if point.stand_in_note:
                extra.append(point.stand_in_note)
            entry = {"name": f"{point.name}: {metric.label}", "unit": metric.unit.name, "value": figure.value}
            if figure.runs > 1:
                entry["range"] = f"{figure.lower:.6g} to {figure.upper:.6g} over {figure.runs} runs"
            entries.append({**entry, "extra": "\n".join(extra)})
    return entries


def bencher_metrics(runs: list) -> dict[str, dict[str, dict[str, float]]]:
    """Bencher's benchmarks (a point each) and measures (a figure each, its registry entry's
    bencher_name), with lower and upper values where there are repeats."""
    document: dict[str, dict[str, dict[str, float]]] = {}
    for point in point_figures(runs):
        measures = {}
        for metric in METRICS.values():
            figure = point.figure(metric)
            if figure is None:
                continue
            measures[metric.bencher_name] = _measure(figure)
        if measures:
            document[point.name] = measures
    return document


def _measure(figure: Figure) -> dict[str, float]:
    measure = {"value": figure.value}
    if figure.runs > 1:
        measure.update(lower_value=figure.lower, upper_value=figure.upper)
    return measure


def action_busbw(figures: list[CollectiveFigure], higher_is_better: bool) -> list[dict[str, Any]]:
    """github-action-benchmark's entries of the collectives' busbw (higher is better), one per series."""
    if higher_is_better != BUSBW.higher_is_better:
        return []
    entries = []
    for found in figures:
        entry = {"name": f"{found.key.label()}: {BUSBW.label}", "unit": BUSBW.unit.name, "value": found.figure.value}
        if found.figure.runs > 1:
            entry["range"] = f"{found.figure.lower:.6g} to {found.figure.upper:.6g} over {found.figure.runs} runs"
        entries.append({**entry, "extra": f"runs: {', '.join(found.run_ids)}"})
    return entries


def bencher_busbw(figures: list[CollectiveFigure]) -> dict[str, dict[str, dict[str, float]]]:
    """Bencher's benchmarks of the collectives' busbw: one per series, its measure busbw."""
    return {found.key.label(): {BUSBW.bencher_name: _measure(found.figure)} for found in figures}
