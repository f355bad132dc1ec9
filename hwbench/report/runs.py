"""The runs table: result files read (the unreadable ones named with their reason) and one
row of figures per run (throughput, memory against the planner, procurement, convergence,
environment), and the warnings where the compared runs' environments differ."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from hwbench.errors import UsageError
from hwbench.report.cells import number
from hwbench.report.compare import KEY_FIELDS, point_key
from hwbench.report.cost import procurement_figures
from hwbench.report.prices import Price
from hwbench.results import (PER_BACKEND_ENVIRONMENT_FIELDS, PERFORMANCE_ENVIRONMENT_FIELDS, ResultFormatError,
                             RunResult, environment_differences, environment_value, load_result, result_files)

# What the runs of one report must agree on to be compared: the environment, the commit, the precision.
ENVIRONMENT_WARNING_FIELDS = PERFORMANCE_ENVIRONMENT_FIELDS + ("hwbench_git", "precision")


def load_inputs(paths: Sequence[str]) -> tuple[list[tuple[RunResult, str]], list[tuple[str, str]]]:
    """(result, file) pairs and (file, reason) of the files skipped."""
    files: list[Path] = []
    for path in paths:
        entry = Path(path)
        if not entry.exists():
            raise UsageError(f"RESULTS {path}: no such file or folder")
        found = result_files([entry])
        if entry.is_dir() and not found:
            raise UsageError(f"RESULTS {path}: the folder holds no result files (*.json)")
        files += found
    loaded: list[tuple[RunResult, str]] = []
    skipped: list[tuple[str, str]] = []  # the report lists them itself: no warnings
    seen: dict[str, str] = {}
    for file in files:
        try:
            result = load_result(file)
        except ResultFormatError as error:
            skipped.append((str(file), str(error)))
            continue
        first = seen.get(result.run_id)
        if first is not None:  # the same run named twice (a copy, or a file and its folder)
            skipped.append((str(file), f"{file}: run {result.run_id} is already read from {first}"))
            continue
        seen[result.run_id] = str(file)
        loaded.append((result, str(file)))
    return loaded, skipped


def predicted_peak(result: RunResult) -> tuple[int | None, str | None]:
    """The planner's predicted peak bytes for the result's spec, or (None, why)."""
    from hwbench.catalog import load_catalog
    from hwbench.planner import plan_memory
    from hwbench.spec import LaunchSpec, OptimizerSpec, ParallelDims, RunSpec

    spec = dict(result.spec)
    try:
        optimizer = dict(spec["optimizer"])
        if "betas" in optimizer:
            optimizer["betas"] = tuple(optimizer["betas"])
        names = {f.name for f in dataclasses.fields(RunSpec)}
        fields = {k: v for k, v in spec.items() if k in names}
        fields.update(parallel=ParallelDims(**spec["parallel"]), launch=LaunchSpec(**spec["launch"]),
                      optimizer=OptimizerSpec(**optimizer))
        run_spec = RunSpec(**fields)
    except (KeyError, TypeError, ValueError) as error:
        return None, f"the result's spec cannot be rebuilt ({type(error).__name__}: {error})"
    catalog = load_catalog()
    workload = catalog.workloads.get(run_spec.model)
    if workload is None:
        return None, f"workload {run_spec.model!r} is not in this catalog"
    backend = (result.device or {}).get("backend")
    try:
        return plan_memory(run_spec, workload.model, backend).total_bytes, None
    except (UsageError, KeyError, ValueError, ZeroDivisionError) as error:
        return None, f"the planner cannot plan it: {error}"


def run_row(result: RunResult, file: str, prices: dict[str, Price], tokens: float | None) -> dict[str, Any]:
    """One run's figures; ``tokens`` is the training budget of the projection (None: 20 per parameter)."""
    spec, device, metrics = result.spec, result.device or {}, result.metrics or {}
    parallel = spec.get("parallel") or {}
    tp, pp, dp = (int(parallel.get(k, 1) or 1) for k in ("tp", "pp", "dp"))
    world = int(metrics.get("world_size") or tp * pp * dp)
    environment = result.environment or {}
    memory = metrics.get("memory") or {}
    row: dict[str, Any] = {
        "run_id": result.run_id, "file": file, "status": result.status,
        "error": (result.error or {}).get("message") if result.error else None,
        "model": spec.get("model"), "parameters": (result.workload or {}).get("parameters"),
        "device_model": device.get("device_model"), "backend": device.get("backend"),
        "simulated": bool(device.get("simulated")), "catalog_entry": device.get("catalog_entry"),
        "world_size": world, "tp": tp, "pp": pp, "dp": dp, "layout": f"TP{tp} PP{pp} DP{dp}",
        "engine": spec.get("engine"), "zero_stage": spec.get("zero_stage"), "fsdp": spec.get("fsdp"),
        "precision": spec.get("precision"), "recompute": spec.get("recompute"),
        "micro_batch_size": spec.get("micro_batch_size"), "global_batch_size": spec.get("global_batch_size"),
        "seq_length": spec.get("seq_length"),
        "samples_per_s": number(metrics.get("samples_per_s")), "tokens_per_s": number(metrics.get("tokens_per_s")),
        "tokens_per_s_per_device": number(metrics.get("tokens_per_s_per_device")),
        "tflops_per_device": number(metrics.get("tflops_per_device")), "mfu": number(metrics.get("mfu")),
        "mfu_reason": (metrics.get("unmeasured") or {}).get("mfu"),
        "mfu_by_formula": mfu_by_formula(metrics),
        "mfu_measured_ceiling": number(metrics.get("mfu_measured_ceiling")),
        "mfu_measured_ceiling_reason": (metrics.get("unmeasured") or {}).get("mfu_measured_ceiling")
        or ("the result predates hwbench calibrate" if "mfu_measured_ceiling" not in metrics else None),
        "peak_allocated_bytes": number(memory.get("peak_allocated_bytes")),
        "peak_reserved_bytes": number(memory.get("peak_reserved_bytes")),
        "capacity_bytes": number(memory.get("capacity_bytes")) or number(device.get("memory_capacity_bytes")),
        "valid_ppl": number(metrics.get("valid_ppl")), "valid_ppl_step": metrics.get("valid_ppl_step"),
        "valid_ppl_reason": (metrics.get("unmeasured") or {}).get("valid_ppl"),
        "ppl_floor": number(metrics.get("ppl_floor")),
        "loss_start": number(metrics.get("loss_start")), "loss_end": number(metrics.get("loss_end")),
        "timed_steps": metrics.get("timed_steps"), "timed_wall_time_s": number(metrics.get("timed_wall_time_s")),
        "warmup": spec.get("warmup"),
        "device_count": environment.get("device_count"),
        "hwbench_git": (environment.get("hwbench_git") or {}).get("commit"),
        "hwbench_git_dirty": (environment.get("hwbench_git") or {}).get("dirty"),
    }
    for key in PERFORMANCE_ENVIRONMENT_FIELDS:
        row[key] = environment_value(environment, key)
    row["hwbench_version"] = row["hwbench_version"] or result.hwbench_version
    row["samples_per_s_per_device"] = None if row["samples_per_s"] is None else row["samples_per_s"] / world
    measured = row["peak_allocated_bytes"] if row["peak_allocated_bytes"] is not None else row["peak_reserved_bytes"]
    row["peak_bytes"] = measured
    if result.status == "ok":
        row["predicted_peak_bytes"], row["predicted_reason"] = predicted_peak(result)
    else:
        row["predicted_peak_bytes"], row["predicted_reason"] = None, f"status {result.status}"
    row["point"] = point_text(result)
    row.update(procurement_figures(result, row, prices, tokens))
    return row


def mfu_by_formula(metrics: dict[str, Any]) -> dict[str, float | None]:
    """The run's MFU by canonical FLOPs-formula name: `metrics.by_formula`, and the run's own
    formula (a result written before `by_formula` has only that one)."""
    from hwbench.workload.flops import FLOPS_FORMULA_ALIASES

    found = {name: number((entry or {}).get("mfu")) for name, entry in (metrics.get("by_formula") or {}).items()}
    own = metrics.get("flops_formula")
    if isinstance(own, str):
        found.setdefault(FLOPS_FORMULA_ALIASES.get(own, own), number(metrics.get("mfu")))
    return found


def point_text(result: RunResult) -> str | None:
    """The run's benchmark point as `hwbench compare` keys it (its repeats share it), as text."""
    key = point_key(result)
    return None if key is None else " ".join(f"{name}={value}" for name, value in zip(KEY_FIELDS, key))


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
