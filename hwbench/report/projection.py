"""The training projection of every run: the scaling of its workload on its device model
(fitted where several device counts were measured, linear otherwise) applied to the run's own
throughput, to the projection's device count and token budget (docs/reports.md, "Projection")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hwbench.harness.stand_in import STAND_IN_PROJECTION
from hwbench.report.cells import number
from hwbench.report.cost import training_time_and_cost
from hwbench.report.prices import Price
from hwbench.report.scaling import ScalingFit, best_per_count, fit_scaling

# A workload on a device model: what a scaling fit is about. The sequence length is part of the
# workload (its FLOPs per token differ): runs at seq 64 and at seq 128 are never fitted as one curve;
# a stand-in's runs (simulated, emulated) are never fitted with the device's.
GROUP_FIELDS = ("model", "precision", "device_model", "seq_length", "stand_in")


def group_key(row: dict[str, Any]) -> tuple:
    return tuple(row.get(field) for field in GROUP_FIELDS)


def usable(row: dict[str, Any]) -> bool:
    """An ok run with a throughput that did not share its cores or devices: it enters fits and decisions."""
    throughput = number(row["tokens_per_s"])  # 0 is a valid figure, but nothing to fit or divide by
    return row["status"] == "ok" and throughput is not None and throughput > 0 and row["oversubscribed"] is not True


def scaling_fits(rows: Iterable[dict[str, Any]]) -> dict[tuple, ScalingFit]:
    """The scaling of each (model, precision, device model, sequence length) over the devices charged."""
    samples: dict[tuple, list[tuple[int, str, float]]] = {}
    for row in rows:
        if usable(row):
            samples.setdefault(group_key(row), []).append(
                (row["devices_charged"], f"{row['layout']} ({row['point']})", row["tokens_per_s"]))
    return {key: fit_scaling(best_per_count(values)) for key, values in samples.items()}


def apply_projections(rows: list[dict[str, Any]], fits: dict[tuple, ScalingFit], devices: int) -> None:
    """Adds to each row the tokens/s, days and cost projected to ``devices`` devices for its token
    budget, and the sentence of the scaling assumption."""
    _one_budget_per_model(rows)
    for row in rows:
        if row["stand_in"]:
            row["projected_tokens_per_s"] = row["projected_days"] = row["projected_cost_usd"] = None
            row["projection_basis"] = STAND_IN_PROJECTION[row["stand_in"]]
            continue
        fit = fits.get(group_key(row))
        tps = number(row["tokens_per_s"])
        if fit is None or tps is None:
            fit = fit_scaling([])
        projected = fit.project(tps, row["devices_charged"], devices) if tps else None
        price = Price(row["price_usd_per_hour"], row["price_source"], row["price_date"]) \
            if number(row["price_usd_per_hour"]) is not None else None
        days, cost = training_time_and_cost(row["token_budget"], projected, devices, price)
        row["projected_tokens_per_s"], row["projected_days"], row["projected_cost_usd"] = projected, days, cost
        row["projection_basis"] = fit.assumption(devices) if fit.points else \
            f"projected linearly from this run's {row['devices_charged']} device(s) (not in a scaling fit)"


def _one_budget_per_model(rows: list[dict[str, Any]]) -> None:
    """Runs of one model at TP > 1 count a few more parameters (the vocabulary is padded to a
    multiple of 128 x TP): the default budget is that of the smallest count, the same for every run."""
    smallest: dict[Any, tuple[float, str]] = {}
    for row in rows:
        if number(row["token_budget"]) is not None and row["token_budget_basis"] != "--tokens":
            key = row["model"]
            if key not in smallest or row["token_budget"] < smallest[key][0]:
                smallest[key] = (row["token_budget"], row["token_budget_basis"])
    for row in rows:
        if row["model"] in smallest and row["token_budget_basis"] != "--tokens":
            row["token_budget"], row["token_budget_basis"] = smallest[row["model"]]
