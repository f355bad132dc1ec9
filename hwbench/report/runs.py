"""The runs table: result files read (the unreadable ones named with their reason) and one
row of figures per run (throughput, memory against the planner, procurement, convergence,
environment), and the warnings where the compared runs' environments differ."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from hwbench.errors import UsageError
from hwbench.metrics import METRICS
from hwbench.report.cost import procurement_figures
from hwbench.report.prices import Price
from hwbench.report.scores import target_figures
from hwbench.result.environment import (
    PER_BACKEND_ENVIRONMENT_FIELDS,
    PERFORMANCE_ENVIRONMENT_FIELDS,
    environment_differences,
    performance_fingerprint,
)
from hwbench.result.model import GOODPUT_PHASES, Memory, Metrics, RunResult
from hwbench.workload.flops import FLOPS_FORMULA_ALIASES, utilisation_label

# What the runs of one report must agree on to be compared: the environment, the commit, the precision.
ENVIRONMENT_WARNING_FIELDS = PERFORMANCE_ENVIRONMENT_FIELDS + ("hwbench_git", "precision")


def predicted_peak(result: RunResult) -> tuple[int | None, str | None]:
    """The planner's predicted peak bytes for the result's spec, or (None, why)."""
    from hwbench.catalog import load_catalog
    from hwbench.planner import plan_memory

    try:
        run_spec = result.spec.run_spec()
    except (KeyError, TypeError, ValueError) as error:
        return None, f"the result's spec cannot be rebuilt ({type(error).__name__}: {error})"
    workload = load_catalog().workloads.get(run_spec.model)
    if workload is None:
        return None, f"workload {run_spec.model!r} is not in this catalog"
    backend = result.backend
    if backend is None:
        return None, "the result names no backend"
    try:
        return plan_memory(run_spec, workload.model, backend).total_bytes, None
    except (UsageError, KeyError, ValueError, ZeroDivisionError) as error:
        return None, f"the planner cannot plan it: {error}"


def run_row(result: RunResult, file: str, prices: dict[str, Price], tokens: float | None) -> dict[str, Any]:
    """One run's figures; ``tokens`` is the training budget of the projection (None: 20 per parameter)."""
    spec, device, metrics, environment = result.spec, result.device, result.metrics, result.environment
    tp, pp, dp = spec.parallel.tp, spec.parallel.pp, spec.parallel.dp
    memory = metrics.memory or Memory()
    git = environment.hwbench_git
    row: dict[str, Any] = {
        "run_id": result.run_id, "file": file, "status": result.status,
        "error": result.error.message if result.error else None,
        "model": spec.model, "parameters": result.workload.parameters,
        "device_model": device.device_model, "backend": device.backend,
        "stand_in": result.stand_in, "catalog_entry": device.catalog_entry,
        "peak_flops": device.peak_flops, "peak_flops_basis": device.peak_flops_basis,
        "world_size": result.world_size, "tp": tp, "pp": pp, "dp": dp, "ep": spec.parallel.ep,
        "layout": spec.parallel.layout,
        "engine": spec.engine, "zero_stage": spec.zero_stage, "fsdp": spec.fsdp,
        "precision": spec.precision, "recompute": spec.recompute, "compile": spec.compile,
        "micro_batch_size": spec.micro_batch_size, "global_batch_size": spec.global_batch_size,
        "seq_length": spec.seq_length,
        # every figure of the metric registry, in its column (hwbench.metrics.Metric.column)
        **{metric.column: metric.read(result) for metric in METRICS.values()},
        "tokens_per_s_per_device": metrics.tokens_per_s_per_device,
        "mfu_reason": metrics.why("mfu"),
        "flops_formula": own_formula(metrics),
        # what `mfu` and `mfu_measured_ceiling` are: HFU where the run's formula counts the recompute
        # (megatron-deepspeed) and the run recomputes, else MFU
        "mfu_kind": utilisation_label(own_formula(metrics), spec.recompute),
        "mfu_by_formula": mfu_by_formula(metrics),
        # why a formula's MFU is null where it is its own (a mixture of experts it has no term for)
        "mfu_reason_by_formula": {name: entry.why("mfu") for name, entry in (metrics.by_formula or {}).items()},
        "mfu_measured_ceiling": metrics.mfu_measured_ceiling,
        "mfu_measured_ceiling_reason": metrics.why("mfu_measured_ceiling"),
        "peak_allocated_bytes": memory.peak_allocated_bytes,
        "capacity_bytes": memory.capacity_bytes or device.memory_capacity_bytes,
        "valid_ppl": metrics.valid_ppl, "valid_ppl_step": metrics.valid_ppl_step,
        "valid_ppl_reason": metrics.why("valid_ppl"),
        "ppl_floor": metrics.ppl_floor,
        "loss_start": metrics.loss_start, "loss_end": metrics.loss_end,
        "timed_steps": metrics.timed_steps, "timed_wall_time_s": metrics.timed_wall_time_s,
        # a mixture-of-experts run's routing beside the registry's imbalance (None for a dense model)
        "moe": result.workload.num_experts is not None,
        "moe_dropped_fraction": metrics.routing.dropped_fraction if metrics.routing else None,
        "warmup": spec.warmup,
        "device_count": environment.device_count,
        "hwbench_git": git.commit if git else None,
        "hwbench_git_dirty": git.dirty if git else None,
    }
    fingerprint = performance_fingerprint(result)
    for key in PERFORMANCE_ENVIRONMENT_FIELDS:
        row[key] = fingerprint.get(key)
    row["hwbench_version"] = row["hwbench_version"] or result.hwbench_version
    row["samples_per_s_per_device"] = None if row["samples_per_s"] is None else row["samples_per_s"] / row["world_size"]
    measured = row["peak_allocated_bytes"] if row["peak_allocated_bytes"] is not None else row["peak_reserved_bytes"]
    row["peak_bytes"] = measured
    if result.status == "ok":
        row["predicted_peak_bytes"], row["predicted_reason"] = predicted_peak(result)
    else:
        row["predicted_peak_bytes"], row["predicted_reason"] = None, f"status {result.status}"
    point_key = result.point_key
    row["point"] = None if point_key is None else point_key.text()  # as `hwbench compare` keys it: its repeats share it
    row.update(procurement_figures(result, row, prices, tokens))
    row.update(target_figures(result, row["price_usd_per_hour"]))
    row.update(checkpoint_figures(result))
    row.update(goodput_columns(result))
    return row


def goodput_columns(result: RunResult) -> dict[str, Any]:
    """The run's goodput (metrics.goodput) as report columns: the training share, the total and each
    phase's share; None where the run kept no phase clock."""
    goodput = result.metrics.goodput
    shares = (goodput.shares if goodput else None) or {}
    return {"goodput": goodput.goodput if goodput else None, "goodput_total_s": goodput.total_s if goodput else None,
            **{f"goodput_share_{phase}": shares.get(phase) for phase in GOODPUT_PHASES}}


def checkpoint_figures(result: RunResult) -> dict[str, Any]:
    """The run's checkpoint figures (result.checkpoint) as report columns; None where it saved or loaded nothing."""
    checkpoint = result.checkpoint
    saves, loads, restarts = (getattr(checkpoint, name, None) or [] for name in ("saves", "loads", "restarts"))
    return {**{f"checkpoint_{name}": getattr(checkpoint, name, None)
               for name in ("save_bytes", "save_gb_per_s", "save_stall_s", "save_interval", "stall_s_per_hour")},
            "checkpoint_stall_reason": checkpoint.why("stall_s_per_hour") if checkpoint else None,
            "checkpoint_async": bool(checkpoint.async_save) if checkpoint else None,
            "checkpoint_saves": len(saves), "checkpoint_load_gb_per_s": loads[-1].gb_per_s if loads else None,
            "restarts": len(restarts),
            "restart_time_lost_s": sum(r.time_lost_s or 0.0 for r in restarts) if restarts else None,
            "restart_steps_lost": sum(r.steps_lost or 0 for r in restarts) if restarts else None}


def own_formula(metrics: Metrics) -> str | None:
    """The canonical name of the FLOPs formula of the run's own figures (an alias resolved)."""
    own = metrics.flops_formula
    return None if own is None else FLOPS_FORMULA_ALIASES.get(own, own)


def mfu_by_formula(metrics: Metrics) -> dict[str, float | None]:
    """The run's MFU by canonical FLOPs-formula name: `metrics.by_formula`, and the run's own
    formula (a result written before `by_formula` has only that one)."""
    found = {name: entry.mfu for name, entry in (metrics.by_formula or {}).items()}
    own = metrics.flops_formula
    if own is not None:
        found.setdefault(FLOPS_FORMULA_ALIASES.get(own, own), metrics.mfu)
    return found


def environment_warnings(runs: pd.DataFrame) -> list[str]:
    """Where the compared (ok) runs differ in software versions or precision; the fields of
    one device kind (PER_BACKEND_ENVIRONMENT_FIELDS) among runs of the same backend only."""
    found: list[str] = []
    ok = runs[runs["status"] == "ok"] if not runs.empty else runs
    if len(ok) < 2:
        return found
    for key in ENVIRONMENT_WARNING_FIELDS:
        groups = ok.groupby("backend") if key in PER_BACKEND_ENVIRONMENT_FIELDS else [(None, ok)]
        for backend, group in groups:
            each_run = [(run["run_id"], [_fingerprint(run)]) for _, run in group.iterrows()]
            for _, held in environment_differences(each_run, (key,)):
                ids_by_value: dict[str, list[str]] = {}
                for run_id, (value,) in held:
                    ids_by_value.setdefault(value, []).append(run_id)
                found.append(f"runs differ in {key}" + (f" (backend {backend})" if backend else "") + ": "
                             + "; ".join(f"{v} ({', '.join(ids)})" for v, ids in ids_by_value.items()))
    return found


def _fingerprint(run: pd.Series) -> dict[str, str]:
    """A run row's warning fields as text; a field it did not record is left out (not compared)."""
    fingerprint = {}
    for key in ENVIRONMENT_WARNING_FIELDS:
        value = run.get(key)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            fingerprint[key] = str(value)
    return fingerprint
