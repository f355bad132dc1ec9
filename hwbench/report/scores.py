"""Time to a target quality in the report: the runs of one point with one target scored as
MLPerf Training scores them (hwbench.stats.olympic_score: the fastest and slowest dropped, the
mean of the rest), with steps, samples, device-hours, energy and cost to the target beside the
score, each measured, never projected (docs/scores.md)."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import pandas as pd

from hwbench.harness.stand_in import STAND_IN_ENERGY
from hwbench.report.cells import fmt, is_number, number, usd
from hwbench.report.document import Section, Table
from hwbench.report.summary import target_text
from hwbench.result.model import RunResult
from hwbench.stats import olympic_score

TARGET_STATUSES = ("ok", "not_converged")  # a run that missed its target still counts in the score


def target_figures(result: RunResult, price_usd_per_hour: float | None) -> dict[str, Any]:
    """A run's time-to-target columns of the report's runs table (None without a target); the
    cost at the report's price (--price, --prices, the result's, the catalog's)."""
    figures = result.metrics.time_to_target
    if not figures:
        return dict.fromkeys(("target", "target_given", "target_reached", "time_to_target_s", "steps_to_target",
                              "samples_to_target", "device_hours_to_target", "energy_to_target_j",
                              "energy_to_target_reason", "cost_to_target_usd"))
    hours, price = figures.device_hours, number(price_usd_per_hour)
    energy, energy_why = (None, STAND_IN_ENERGY[result.stand_in]) if result.stand_in \
        else (figures.energy_j, figures.why("energy_j"))
    return {"target": target_text(figures), "target_given": figures.given,
            "target_reached": figures.reached, "time_to_target_s": figures.scored_time_s,
            "steps_to_target": figures.step, "samples_to_target": figures.samples, "device_hours_to_target": hours,
            "energy_to_target_j": energy, "energy_to_target_reason": energy_why,
            "cost_to_target_usd": hours * price if hours is not None and price is not None else None}


# A run reaching its target in this much fewer samples than the reference run of its workload,
# global batch and target is flagged, as MLPerf Training's reference convergence points keep a
# submission from converging suspiciously fast ("Reference Convergence Points", MLPerf Training
# rules). The 20% is hwbench's own bound, said beside the flag.
FAST_CONVERGENCE_MARGIN = 0.20
REFERENCE_TARGET_MATCH = ("model", "global_batch_size", "seq_length", "data", "target_given")


def fast_convergence_flags(results: list[RunResult], references: list[RunResult]) -> dict[str, str]:
    """run_id -> the flag, for each run that reached its target in markedly fewer samples than
    the first reference (hwbench report --reference) of its workload, global batch, sequence
    length, data and target that reached it too."""
    flags: dict[str, str] = {}
    for result in results:
        mine = _samples_to_target(result)
        if mine is None:
            continue
        reference = _reference_samples(result, references)
        if reference is None:
            continue
        reference_id, theirs = reference
        if mine < theirs * (1 - FAST_CONVERGENCE_MARGIN):
            flags[result.run_id] = (f"reached the target in {mine:,} samples, {1 - mine / theirs:.0%} "
                                    f"fewer than the reference {reference_id} ({theirs:,}; flagged beyond "
                                    f"{FAST_CONVERGENCE_MARGIN:.0%}, as MLPerf's reference convergence points)")
    return flags


def _samples_to_target(result: RunResult) -> int | None:
    """The samples a run took to reach its target; None when it did not reach one."""
    figures = result.metrics.time_to_target if result.metrics else None
    return figures.samples if figures and figures.reached else None


def _reference_samples(result: RunResult, references: list[RunResult]) -> tuple[str, int] | None:
    """(run_id, samples to target) of the first reference of the run's workload, global batch,
    sequence length, data and target that reached it, other than the run itself."""
    for reference in references:
        samples = _samples_to_target(reference)
        if samples is not None and reference.run_id != result.run_id and all(
                getattr(reference.spec, key) == getattr(result.spec, key) for key in REFERENCE_TARGET_MATCH):
            return reference.run_id, samples
    return None


@dataclasses.dataclass
class TargetScore:
    """The runs of one point (PointKey) that had one target."""

    model: str
    precision: str
    device: str
    point: str  # the layout, for the tables
    target: str
    rows: list[dict[str, Any]]

    @property
    def reached(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["target_reached"]]

    @property
    def olympic(self) -> dict[str, Any]:
        return olympic_score([row["time_to_target_s"] for row in self.reached], len(self.rows) - len(self.reached))

    def time_text(self) -> str:
        """The figure and how it was scored, said beside it."""
        score, times = self.olympic, [row["time_to_target_s"] for row in self.reached]
        if score["score"] is not None:
            missed = ", the run that did not converge dropped as the slowest" if score["not_converged"] else ""
            return (f"{score['score']:,.1f} s: olympic mean of {score['runs']} runs (fastest and slowest dropped"
                    f"{missed})")
        if len(times) == 1 and len(self.rows) == 1:
            return f"{times[0]:,.1f} s (1 run: no olympic score)"
        if times and score["not_converged"] <= 1:
            return f"median {statistics.median(times):,.1f} s of {len(times)} runs ({score['why']})"
        return f"no score: {score['why'] or 'no run reached the target'}"

    def reference_text(self) -> str:
        """The fast-convergence flags of its runs (report --reference), or what was checked."""
        flagged = [f"FLAGGED: run {row['run_id']} {row['target_flag']}" for row in self.rows if row.get("target_flag")]
        return "; ".join(flagged) if flagged else "-"

    def median(self, column: str) -> float | None:
        values = [row[column] for row in self.reached if is_number(row[column])]
        return statistics.median(values) if values else None

    def cost(self) -> float | None:
        """The cost of the scored time (olympic, else the median) at the runs' price."""
        time_s = self.olympic["score"] if self.olympic["score"] is not None else self.median("time_to_target_s")
        first = self.rows[0]
        if time_s is None or not is_number(first["price_usd_per_hour"]):
            return None
        return time_s * first["devices_charged"] * first["price_usd_per_hour"] / 3600


def target_scores(runs: pd.DataFrame) -> list[TargetScore]:
    """Every (point, target) of the report's runs that had a target, in a stable order."""
    if runs.empty or "target" not in runs:
        return []
    groups: dict[tuple, TargetScore] = {}
    for row in runs.to_dict(orient="records"):
        if not row.get("target") or row["status"] not in TARGET_STATUSES:
            continue
        key = (row["point"], row["target_given"])
        if key not in groups:
            device = str(row["device_model"]) + (f" [{row['stand_in']}]" if row["stand_in"] else "")
            groups[key] = TargetScore(row["model"], row["precision"], device, row["layout"], row["target"], [])
        groups[key].rows.append(row)
    return sorted(groups.values(), key=lambda s: (s.model, s.precision, s.target, s.device, s.point))


def target_table(scores: list[TargetScore]) -> Table:
    table = Table(["device", "point", "target", "runs (reached)", "time to target", "steps (median)",
                   "samples (median)", "device-hours (median)", "J (median)", "cost", "against the reference"], [])
    for score in scores:
        first = score.rows[0]
        priced = is_number(first["price_usd_per_hour"])
        energy = score.median("energy_to_target_j")
        why = next((row["energy_to_target_reason"] for row in score.rows if row["energy_to_target_reason"]), None)
        table.rows.append([score.device, score.point, score.target, f"{len(score.rows)} ({len(score.reached)})",
                           score.time_text(), fmt(score.median("steps_to_target"), 0),
                           fmt(score.median("samples_to_target"), 0), fmt(score.median("device_hours_to_target"), 4),
                           fmt(energy, 0, " J", missing=f"not measured ({why})" if why else None),
                           usd(score.cost(), ",.4g", "no price", note=None if priced else
                               f"no price: {first['price_source']}"), score.reference_text()])
    return table


def time_to_target_section(runs: pd.DataFrame) -> Section | None:
    """The report's "Time to target" section; None when no run had a target."""
    scores = target_scores(runs)
    if not scores:
        return None
    section = Section("Time to target")
    section.blocks.append(("p", "Runs with --target-ppl or --target-loss, by point and target: wall-clock time from "
                                "the first training step to the validation that reached the target (initialisation "
                                "apart, counted only beyond 30 minutes), measured, not projected. With 3 or more runs "
                                "the figure is MLPerf Training's score: the fastest and slowest runs dropped, the mean "
                                "of the rest; one run that did not converge is dropped as the slowest, two or more "
                                "make the score invalid. Cost = the scored time x devices charged x the price per "
                                "device-hour."))
    section.blocks.append(("table", target_table(scores)))
    return section


def decision_target_blocks(runs: pd.DataFrame, model: str, precision: str) -> list[tuple]:
    """The decision's "time and cost to reach the target" of one workload, per device."""
    scores = [s for s in target_scores(runs) if s.model == model and s.precision == precision]
    if not scores:
        return []
    targets = sorted({s.target for s in scores})
    return [("p", f"Time and cost to reach {', '.join(targets)}, measured (not projected): each device's runs to "
                  "the target, scored as MLPerf Training scores them (olympic mean of 3 or more runs)."),
            ("table", target_table(scores))]
