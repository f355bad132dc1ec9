"""`hwbench report`: result files as Markdown, HTML, CSV or JSON, beside the
published tables, with per-device normalisation, memory against the planner,
cost and energy per token, convergence and the environments of the runs.

Formulas and sections are described in docs/reports.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from tabulate import tabulate

from hwbench.errors import UsageError
from hwbench.report.published import DEFAULT_DIR, load_published
from hwbench.results import (PER_BACKEND_ENVIRONMENT_FIELDS, PERFORMANCE_ENVIRONMENT_FIELDS, ResultFormatError, RunResult, environment_value, load_result,
                             result_files, write_text_atomic)

FORMATS = ("md", "html", "csv", "json")
DEFAULT_TOKENS = 300e9
DEFAULT_DEVICES = 8
SECTIONS = ("Runs", "Against the published tables", "Per model", "Procurement", "Convergence", "Environment",
            "Skipped input files")
NORMALISATION = ("Per-device figures divide the global samples/s by the devices that produced it: a measured "
                 "run's samples/s / its world size (tp x pp x dp ranks, one device each), a published row's "
                 "samples/s / its devices (8 for every published row). The ratio is measured / published.")
SCALING_ASSUMPTION = ("Projections assume linear scaling: N devices reach N x the run's tokens/s per device, "
                      "with no loss to communication, stragglers or a larger data-parallel degree.")


def _parser() -> argparse.ArgumentParser:
    from hwbench.cli import _Parser  # one line, exit 2, for a bad option

    parser = _Parser(prog="hwbench report", description=(
        "Report result files (files or folders) against the published tables: throughput, per-device "
        "normalisation, memory, cost and energy per token, convergence and environment."))
    parser.add_argument("results", nargs="+", metavar="RESULTS", help="result files or folders (searched recursively)")
    parser.add_argument("--against", metavar="PATH", default=None,
                        help="published table (.csv) or folder of them (default: results/published of this checkout)")
    parser.add_argument("--format", choices=FORMATS, default="md", help="md (default), html, csv or json")
    parser.add_argument("--out", metavar="FILE", help="write the report here (default: standard output)")
    parser.add_argument("--price", action="append", default=[], metavar="DEVICE=USD/h",
                        help="price of one device per hour, by catalog entry name or device model; repeatable "
                             "(overrides the price in the result and the catalog)")
    parser.add_argument("--tokens", default=str(DEFAULT_TOKENS), metavar="N",
                        help="tokens for the training projection (default: 300e9)")
    parser.add_argument("--devices", type=int, default=DEFAULT_DEVICES, metavar="N",
                        help=f"devices for the training projection (default: {DEFAULT_DEVICES})")
    return parser


# ---------------------------------------------------------------------------- inputs

def parse_prices(items: Sequence[str]) -> dict[str, float]:
    prices: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = float("nan")
        if not sep or not name.strip() or not math.isfinite(price) or price < 0:
            raise UsageError(f"--price {item!r} is not accepted; give DEVICE=USD/h with a catalog entry name or "
                             "device model and a number >= 0, e.g. --price h100-sxm=2.5")
        prices[name.strip().lower()] = price
    return prices


def parse_tokens(text: str) -> float:
    try:
        tokens = float(text)
    except ValueError:
        tokens = float("nan")
    if not math.isfinite(tokens) or tokens <= 0:
        raise UsageError(f"--tokens {text!r} is not accepted; give a number of tokens > 0, e.g. 300e9")
    return tokens


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


# ---------------------------------------------------------------------------- figures

def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


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


def _price(result: RunResult, overrides: dict[str, float]) -> tuple[float | None, str]:
    device = result.device or {}
    entry, model = device.get("catalog_entry"), device.get("device_model")
    for key in (entry, model):
        if key and key.lower() in overrides:
            return overrides[key.lower()], f"--price {key}"
    if _num(device.get("price_usd_per_hour")) is not None:
        return float(device["price_usd_per_hour"]), "catalog at run time"
    if entry:
        from hwbench.catalog import load_catalog
        catalog_entry = load_catalog().devices.get(entry)
        if catalog_entry is not None and catalog_entry.price_usd_per_hour is not None:
            return catalog_entry.price_usd_per_hour, f"catalog {entry}"
    name = entry or model or "this device"
    return None, f"no price for {name}: the catalog has none; give --price {entry or 'DEVICE'}=USD/h"


def _energy(result: RunResult, world: int) -> tuple[float | None, float | None, str | None]:
    """(energy J over the telemetry window, mean power W summed over devices, why energy is missing)."""
    metrics = result.metrics or {}
    telemetry = metrics.get("telemetry")
    if not telemetry or not telemetry.get("available"):
        reason = (telemetry or {}).get("reason") or (metrics.get("unmeasured") or {}).get("telemetry") \
            or "no telemetry in the result"
        return None, None, reason
    devices = telemetry.get("devices") or []
    power = _num(telemetry.get("power_w_mean_total"))
    if power is None and devices and all(_num(d.get("power_w_mean")) is not None for d in devices):
        power = sum(float(d["power_w_mean"]) for d in devices)
    if "energy_j" in telemetry:
        energy = _num(telemetry.get("energy_j"))
    elif devices and all(_num(d.get("energy_j")) is not None for d in devices):
        energy = sum(float(d["energy_j"]) for d in devices)
    else:
        energy = None
    if energy is None:
        reasons = [str((d.get("unmeasured") or {}).get("energy_j")) for d in devices
                   if (d.get("unmeasured") or {}).get("energy_j")]
        return None, power, "a device reported no energy" + (f" ({reasons[0]})" if reasons else "")
    if len(devices) < world:
        return None, power, f"telemetry covered {len(devices)} of {world} devices"
    return energy, power, None


def run_row(result: RunResult, file: str, prices: dict[str, float], tokens: float, devices: int) -> dict[str, Any]:
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
        "samples_per_s": _num(metrics.get("samples_per_s")), "tokens_per_s": _num(metrics.get("tokens_per_s")),
        "tokens_per_s_per_device": _num(metrics.get("tokens_per_s_per_device")),
        "tflops_per_device": _num(metrics.get("tflops_per_device")), "mfu": _num(metrics.get("mfu")),
        "mfu_reason": (metrics.get("unmeasured") or {}).get("mfu"),
        "peak_allocated_bytes": _num(memory.get("peak_allocated_bytes")),
        "peak_reserved_bytes": _num(memory.get("peak_reserved_bytes")),
        "capacity_bytes": _num(memory.get("capacity_bytes")) or _num(device.get("memory_capacity_bytes")),
        "valid_ppl": _num(metrics.get("valid_ppl")), "valid_ppl_step": metrics.get("valid_ppl_step"),
        "valid_ppl_reason": (metrics.get("unmeasured") or {}).get("valid_ppl"),
        "ppl_floor": _num(metrics.get("ppl_floor")),
        "loss_start": _num(metrics.get("loss_start")), "loss_end": _num(metrics.get("loss_end")),
        "timed_steps": metrics.get("timed_steps"), "timed_wall_time_s": _num(metrics.get("timed_wall_time_s")),
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
    # procurement
    price, price_source = _price(result, prices)
    row["price_usd_per_hour"], row["price_source"] = price, price_source
    tps = row["tokens_per_s"]
    row["cost_per_million_tokens_usd"] = (price / 3600 * world / tps * 1e6) if price is not None and tps else None
    energy, power, energy_reason = _energy(result, world) if result.status == "ok" else (None, None, f"status {result.status}")
    steps = row["timed_steps"]
    timed_tokens = (row["global_batch_size"] * row["seq_length"] * steps) if steps and row["seq_length"] else None
    row["timed_tokens"] = timed_tokens
    row["energy_j"], row["power_w_mean"], row["energy_reason"] = energy, power, energy_reason
    row["energy_per_token_j"] = energy / timed_tokens if energy is not None and timed_tokens else None
    per_device = row["tokens_per_s_per_device"]
    row["projected_days"] = tokens / (per_device * devices) / 86400 if per_device else None
    row["projected_cost_usd"] = (price * devices * row["projected_days"] * 24
                                 if price is not None and row["projected_days"] is not None else None)
    return row


def compare(runs: pd.DataFrame, published: pd.DataFrame | None) -> pd.DataFrame:
    """One row per (ok run, published row of the same model).

    Every published row of the run's model is matched, whatever the layout: a 1-device measurement
    is read against an 8-device figure through the per-device ratio. ``same_layout`` says whether
    the run's TP and PP equal the published ones (a published row that leaves them empty matches
    any), and ``differences`` names every setting that differs from the published point."""
    rows = []
    if published is None or runs.empty:
        return pd.DataFrame(rows, dtype=object)
    for _, run in runs[runs["status"] == "ok"].iterrows():
        for _, pub in published[published["model"] == run["model"]].iterrows():
            measured, published_value = run["samples_per_s"], pub["samples_per_s"]
            per_device = measured / run["world_size"] if measured is not None else None
            pub_per_device = published_value / pub["devices"]
            differences = setting_differences(run, pub)
            rows.append({
                "run_id": run["run_id"], "model": run["model"], "table": pub["table"], "name": pub["name"],
                "params": pub["params"], "published_ppl": pub["ppl"], "published_samples_per_s": published_value,
                "published_devices": int(pub["devices"]), "published_seq_length": pub["seq_length"],
                "published_steps": pub["steps"], "published_layout": _pub_layout(pub),
                "measured_samples_per_s": measured, "world_size": run["world_size"], "layout": run["layout"],
                "same_layout": all(pd.isna(pub[k]) or int(pub[k]) == run[k] for k in ("tp", "pp")),
                "differences": differences,
                "ratio": measured / published_value if measured is not None else None,
                "measured_samples_per_s_per_device": per_device,
                "published_samples_per_s_per_device": pub_per_device,
                "ratio_per_device": per_device / pub_per_device if per_device is not None else None,
                "measured_ppl": run["valid_ppl"], "measured_ppl_step": run["valid_ppl_step"],
                "seq_length": run["seq_length"], "timed_steps": run["timed_steps"],
                "device_model": run["device_model"], "simulated": run["simulated"], "backend": run["backend"],
            })
    return pd.DataFrame(rows, dtype=object)


def setting_differences(run: pd.Series, pub: pd.Series) -> list[str]:
    """The settings of a measured run that differ from a published point, e.g. 'TP 1 vs 2';
    a setting the run did not record reads '?' ('seq ? vs 1024'), one the published row
    leaves empty is not compared."""
    differences = []
    for label, run_key, pub_key in (("TP", "tp", "tp"), ("PP", "pp", "pp"), ("devices", "world_size", "devices"),
                                    ("seq", "seq_length", "seq_length"),
                                    ("global batch", "global_batch_size", "global_batch_size"),
                                    ("micro batch", "micro_batch_size", "micro_batch_size"),
                                    ("precision", "precision", "precision"),
                                    ("recompute", "recompute", "recompute")):
        published_value, measured = pub.get(pub_key), run.get(run_key)
        if published_value is None or (not isinstance(published_value, str) and pd.isna(published_value)):
            continue
        if isinstance(published_value, float) and float(published_value).is_integer():
            published_value = int(published_value)
        if measured is None or (isinstance(measured, float) and pd.isna(measured)):
            differences.append(f"{label} ? vs {_setting_text(published_value)}")
        elif measured != published_value:
            differences.append(f"{label} {_setting_text(measured)} vs {_setting_text(published_value)}")
    published_engine = pub.get("engine") or PUBLISHED_ENGINE
    if run.get("engine") and run.get("engine") != published_engine:
        differences.append(f"engine {run.get('engine')} vs {published_engine}")
    return differences


# The shipped published tables (FACTS.md §1) were all measured with Megatron-DeepSpeed, hwbench's
# --engine deepspeed; a table of other runs may name its engine in an `engine` column.
PUBLISHED_ENGINE = "deepspeed"


def _setting_text(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _pub_layout(pub: pd.Series) -> str:
    tp = "?" if pd.isna(pub["tp"]) else int(pub["tp"])
    pp = "?" if pd.isna(pub["pp"]) else int(pub["pp"])
    return f"TP{tp} PP{pp}"


def env_warnings(runs: pd.DataFrame) -> list[str]:
    """Where the compared (ok) runs differ in software versions or precision."""
    found = []
    ok = runs[runs["status"] == "ok"] if not runs.empty else runs
    if len(ok) < 2:
        return found
    for key in PERFORMANCE_ENVIRONMENT_FIELDS + ("hwbench_git", "precision"):
        groups = ok.groupby("backend") if key in PER_BACKEND_ENVIRONMENT_FIELDS else [(None, ok)]
        for backend, group in groups:
            values: dict[str, list[str]] = {}
            for _, run in group.iterrows():
                value = run.get(key)
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    continue
                values.setdefault(str(value), []).append(run["run_id"])
            if len(values) > 1:
                found.append(f"runs differ in {key}" + (f" (backend {backend})" if backend else "") + ": "
                             + "; ".join(f"{v} ({', '.join(ids)})" for v, ids in values.items()))
    return found


# ---------------------------------------------------------------------------- the document

@dataclasses.dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]


@dataclasses.dataclass
class Section:
    title: str
    # ("p", text), ("h", text), ("table", Table), ("img", key, alt) or ("list", [text])
    blocks: list[tuple] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Report:
    title: str
    sections: list[Section]
    runs: pd.DataFrame
    comparison: pd.DataFrame
    skipped: list[tuple[str, str]]
    warnings: list[str]
    notes: list[str]
    images: dict[str, bytes]


def fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    number = _num(value)
    if number is None:
        return "-" if value is None or isinstance(value, float) else str(value)
    if digits == 0:
        return f"{number:,.0f}{suffix}"
    if abs(number) >= 1 or number == 0:
        return f"{number:,.{digits}f}{suffix}"
    return f"{number:.{digits + 1}g}{suffix}"


def tokens_text(tokens: float) -> str:
    """300e9 -> "300e9": the way --tokens is usually written."""
    for power in (12, 9, 6):
        if tokens >= 10 ** power:
            return f"{tokens / 10 ** power:g}e{power}"
    return f"{tokens:g}"


def fmt_ratio(value: Any) -> str:
    number = _num(value)
    return "-" if number is None else f"{number:.3f}"


def fmt_g(value: Any) -> str:
    """A published figure as the table gave it (no added digits)."""
    number = _num(value)
    return "-" if number is None else f"{number:,.10g}" if number < 1e6 else f"{number:,.0f}"


def gib(value: Any) -> str:
    number = _num(value)
    return "-" if number is None else f"{number / 2 ** 30:,.2f} GiB"


def device_text(run: Any) -> str:
    text = f"{run['device_model']} x{run['world_size']}"
    if run["simulated"]:
        text += " [simulated]"
    elif run["backend"] == "cpu":
        text += " [CPU]"
    return text


def _is(value: Any) -> bool:
    return _num(value) is not None


def build_report(loaded: list[tuple[RunResult, str]], skipped: list[tuple[str, str]],
                 published: pd.DataFrame | None, published_note: str | None,
                 prices: dict[str, float], tokens: float, devices: int, with_plots: bool = True) -> Report:
    rows = [run_row(result, file, prices, tokens, devices) for result, file in loaded]
    runs = pd.DataFrame(rows, dtype=object)  # object: None stays None, integers stay integers
    comparison = compare(runs, published)
    notes: list[str] = []
    known = {str(x).lower() for x in runs["catalog_entry"].dropna()} | {str(x).lower() for x in runs["device_model"].dropna()}
    for key in prices:
        if key not in known:
            notes.append(f"--price {key} matched no run's catalog entry or device model")
    warnings_found = env_warnings(runs)
    images: dict[str, bytes] = {}
    if with_plots:
        from hwbench.report import plots
        ok = [r for r in rows if r["status"] == "ok"]
        curves = {result.run_id: [(s["step"], s["loss"]) for s in result.steps if s.get("loss") is not None]
                  for result, _ in loaded if result.status == "ok"}
        for key, image in (("throughput", plots.throughput_by_layout(ok)), ("scaling", plots.scaling(ok)),
                           ("memory", plots.memory(ok)), ("loss", plots.loss_curves(curves))):
            if image is not None:
                images[key] = image
    sections = [
        _runs_section(runs),
        _published_section(runs, comparison, published, published_note),
        _model_section(runs, images),
        _procurement_section(runs, tokens, devices, notes),
        _convergence_section(runs, images),
        _environment_section(runs, warnings_found),
        _skipped_section(skipped),
    ]
    return Report("hwbench report", sections, runs, comparison, skipped, warnings_found, notes, images)


def _runs_section(runs: pd.DataFrame) -> Section:
    section = Section("Runs")
    statuses = runs["status"].value_counts().to_dict()
    section.blocks.append(("p", f"{len(runs)} result(s): " + ", ".join(f"{n} {s}" for s, n in statuses.items())
                           + ". Only runs with status ok enter the comparisons."))
    table = Table(["run", "status", "model", "device", "layout", "precision", "samples/s", "note"], [])
    for _, run in runs.iterrows():
        table.rows.append([run["run_id"], run["status"], run["model"], device_text(run), run["layout"],
                           run["precision"], fmt(run["samples_per_s"]), run["error"] or ""])
    section.blocks.append(("table", table))
    return section


def _published_section(runs: pd.DataFrame, comparison: pd.DataFrame, published: pd.DataFrame | None,
                       note: str | None) -> Section:
    section = Section("Against the published tables")
    if published is None:
        section.blocks.append(("p", note or "No published tables were given."))
        return section
    section.blocks.append(("p", "Published figures: " + ", ".join(sorted(set(published["file"])))
                           + ". Published samples/s is the global figure of all 8 devices (the mean of the last "
                             "100 logged samples/sec); PPL is the lowest validation PPL. A measured run is shown under "
                             "every published row of its model, whatever its layout; the note names every setting "
                             "that differs from the published point (layout, device count, sequence length, batch, "
                             "precision, recompute). Where the layout or device count differs, read the per-device ratio."))
    section.blocks.append(("p", NORMALISATION))
    for table_name, group in published.groupby("table", sort=True):
        section.blocks.append(("h", f"Table {table_name}"))
        table = Table(["NAME", "params", "PPL", "samples/s", "seq_len", "Steps", "layout", "samples/s per device",
                       "ratio", "ratio per device", "note"], [])
        for _, pub in group.iterrows():
            table.rows.append([pub["name"], pub["params"], fmt_g(pub["ppl"]), fmt_g(pub["samples_per_s"]),
                               fmt(pub["seq_length"], 0), fmt(pub["steps"], 0),
                               f"{_pub_layout(pub)} on {int(pub['devices'])}",
                               fmt(pub["samples_per_s"] / pub["devices"], 3), "", "", pub.get("device_class", "")])
            if comparison.empty:
                continue
            matched = comparison[(comparison["table"] == pub["table"]) & (comparison["name"] == pub["name"])
                                 & (comparison["model"] == pub["model"])]
            for _, c in matched.iterrows():
                ppl = "-" if not _is(c["measured_ppl"]) else f"{fmt_g(c['measured_ppl'])} (step {c['measured_ppl_step']})"
                notes = []
                if c["simulated"]:
                    notes.append("simulated device: not a hardware figure")
                elif c["backend"] == "cpu":
                    notes.append("CPU run")
                if c["differences"]:
                    notes.append("differs: " + ", ".join(c["differences"]))
                table.rows.append([f"↳ measured {c['run_id']}", pub["params"], ppl, fmt(c["measured_samples_per_s"], 3),
                                   fmt(c["seq_length"], 0), f"{c['timed_steps']} timed", f"{c['layout']} on "
                                   f"{c['world_size']} ({c['device_model']})",
                                   fmt(c["measured_samples_per_s_per_device"], 3), fmt_ratio(c["ratio"]),
                                   fmt_ratio(c["ratio_per_device"]), "; ".join(notes)])
        section.blocks.append(("table", table))
    unmatched = []
    for _, run in runs[runs["status"] == "ok"].iterrows():
        if comparison.empty or run["run_id"] not in set(comparison["run_id"]):
            unmatched.append(f"{run['run_id']} ({run['model']}, {run['layout']}): not compared; "
                             f"no published row for model {run['model']}")
    if unmatched:
        section.blocks.append(("p", "Runs without a published counterpart:"))
        section.blocks.append(("list", unmatched))
    return section


def _model_section(runs: pd.DataFrame, images: dict[str, bytes]) -> Section:
    section = Section("Per model")
    section.blocks.append(("p", "Every layout measured, by model. Peak memory is the allocator's peak allocated "
                                "bytes (on the CPU, the peak resident set); predicted is hwbench's planner "
                                "(`hwbench plan`) for the run's own spec and backend; capacity is the device's."))
    ok = runs[runs["status"] == "ok"]
    for model, group in ok.groupby("model", sort=True):
        section.blocks.append(("h", f"{model}"))
        table = Table(["run", "device", "layout", "engine", "precision", "micro/global", "seq", "samples/s",
                       "tokens/s", "TFLOP/s per device", "MFU", "peak memory", "predicted", "capacity"], [])
        reasons: list[str] = []  # why MFU is missing, each said once under the table
        for _, run in group.sort_values(["world_size", "layout"]).iterrows():
            engine = run["engine"] + (f" ZeRO {run['zero_stage']}" if run["engine"] == "deepspeed" else "") \
                + (" FSDP" if run["fsdp"] else "")
            if _is(run["mfu"]):
                mfu = f"{run['mfu']:.1%}"
            else:
                reason = run["mfu_reason"] or "not measured"
                if reason not in reasons:
                    reasons.append(reason)
                mfu = f"- [{reasons.index(reason) + 1}]"
            predicted = gib(run["predicted_peak_bytes"]) if _is(run["predicted_peak_bytes"]) \
                else f"- ({run['predicted_reason']})"
            table.rows.append([run["run_id"], device_text(run), run["layout"], engine,
                               run["precision"] + (", recompute" if run["recompute"] else ""),
                               f"{run['micro_batch_size']}/{run['global_batch_size']}", str(run["seq_length"]),
                               fmt(run["samples_per_s"]), fmt(run["tokens_per_s"], 0),
                               fmt(run["tflops_per_device"], 3), mfu, gib(run["peak_bytes"]), predicted,
                               gib(run["capacity_bytes"])])
        section.blocks.append(("table", table))
        for index, reason in enumerate(reasons, start=1):
            section.blocks.append(("p", f"[{index}] MFU not measured: {reason}."))
    if ok.empty:
        section.blocks.append(("p", "No run with status ok."))
    for key, alt in (("throughput", "Throughput by layout"), ("scaling", "Scaling with device count"),
                     ("memory", "Peak memory against capacity")):
        if key in images:
            section.blocks.append(("img", key, alt))
    if ok.empty or ok.groupby("model")["world_size"].nunique().max() < 2:
        section.blocks.append(("p", "No scaling plot: no model was measured at more than one world size."))
    return section


def _procurement_section(runs: pd.DataFrame, tokens: float, devices: int, notes: list[str]) -> Section:
    section = Section("Procurement")
    section.blocks.append(("p", "Cost per million tokens = price per device-hour / 3600 x devices of the run / "
                                "tokens/s x 1e6. Energy per token = energy the devices used over the telemetry window "
                                "(which brackets the timed steps) / tokens of the timed steps (global batch x seq "
                                "x timed steps); average power is the devices' mean power summed."))
    section.blocks.append(("p", f"Projection: time and cost to train {tokens_text(tokens)} tokens on {devices} devices of the "
                                f"same kind (--tokens, --devices). {SCALING_ASSUMPTION}"))
    table = Table(["run", "device", "tokens/s per device", "J/token", "avg power", "price/device-h",
                   "$ per 1M tokens", f"days for {tokens_text(tokens)} tokens on {devices}", "projected cost"], [])
    for _, run in runs[runs["status"] == "ok"].iterrows():
        energy = fmt(run["energy_per_token_j"], 4) + " J" if _is(run["energy_per_token_j"]) \
            else f"not measured: {run['energy_reason']}"
        power = fmt(run["power_w_mean"], 0, " W") if _is(run["power_w_mean"]) else "not measured"
        price = f"${run['price_usd_per_hour']:,.2f} ({run['price_source']})" if _is(run["price_usd_per_hour"]) \
            else run["price_source"]
        cost = f"${run['cost_per_million_tokens_usd']:,.4f}" if _is(run["cost_per_million_tokens_usd"]) else "no price"
        projected = f"${run['projected_cost_usd']:,.0f}" if _is(run["projected_cost_usd"]) else "no price"
        table.rows.append([run["run_id"], device_text(run), fmt(run["tokens_per_s_per_device"], 1), energy, power,
                           price, cost, fmt(run["projected_days"], 1), projected])
    section.blocks.append(("table", table))
    if notes:
        section.blocks.append(("list", notes))
    return section


def _convergence_section(runs: pd.DataFrame, images: dict[str, bytes]) -> Section:
    section = Section("Convergence")
    section.blocks.append(("p", "Training loss (nats) at the first and last step and the validation PPL after "
                                "the step shown; the floor is the lowest reachable PPL of the run's data (built-in or synthetic; none for a dataset)."))
    table = Table(["run", "model", "loss first", "loss last", "validation PPL", "after step", "PPL floor"], [])
    for _, run in runs[runs["status"] == "ok"].iterrows():
        ppl = fmt(run["valid_ppl"], 3) if _is(run["valid_ppl"]) else f"- ({run['valid_ppl_reason'] or 'not measured'})"
        table.rows.append([run["run_id"], run["model"], fmt(run["loss_start"], 3), fmt(run["loss_end"], 3), ppl,
                           "-" if run["valid_ppl_step"] is None or not _is(run["valid_ppl"]) else str(run["valid_ppl_step"]),
                           fmt(run["ppl_floor"], 3)])
    section.blocks.append(("table", table))
    if "loss" in images:
        section.blocks.append(("img", "loss", "Loss curves"))
    return section


def _environment_section(runs: pd.DataFrame, found: list[str]) -> Section:
    section = Section("Environment")
    table = Table(["run", "device", "count", "driver", "CUDA", "CANN", "torch", "deepspeed", "hwbench"], [])
    for _, run in runs.iterrows():
        git = run["hwbench_git"]
        version = str(run["hwbench_version"]) + (f" ({str(git)[:10]}{', dirty' if run['hwbench_git_dirty'] else ''})"
                                                if git else "")
        table.rows.append([run["run_id"], f"{run['device_model']}" + (" [simulated]" if run["simulated"] else ""),
                           fmt(run["device_count"], 0), *(str(run[k] or "-") for k in (
                               "driver_version", "cuda_version", "cann_version", "torch_version",
                               "deepspeed_version")), version])
    section.blocks.append(("table", table))
    if found:
        section.blocks.append(("p", "Warnings: the compared runs differ."))
        section.blocks.append(("list", found))
    else:
        section.blocks.append(("p", "No differences in driver, CUDA/CANN, torch, DeepSpeed or hwbench versions, "
                                    "or precision, among the ok runs."))
    return section


def _skipped_section(skipped: list[tuple[str, str]]) -> Section:
    section = Section("Skipped input files")
    if skipped:
        section.blocks.append(("p", f"{len(skipped)} file(s) left out of this report:"))
        section.blocks.append(("list", [f"{path}: {reason.removeprefix(path + ': ')}" for path, reason in skipped]))
    else:
        section.blocks.append(("p", "None: every input file was read."))
    return section


# ---------------------------------------------------------------------------- output

def render_markdown(report: Report) -> str:
    lines = [f"# {report.title}", ""]
    for section in report.sections:
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            kind = block[0]
            if kind == "p":
                lines += [block[1], ""]
            elif kind == "h":
                lines += [f"### {block[1]}", ""]
            elif kind == "table":
                rows = [[str(c).replace("|", "\\|") for c in row] for row in block[1].rows]
                lines += [tabulate(rows, headers=block[1].headers, tablefmt="github", disable_numparse=True), ""]
            elif kind == "list":
                lines += [f"- {item}" for item in block[1]] + [""]
            elif kind == "img":
                lines += [f"_Plot: {block[2]} (in the HTML report: `--format html`)._", ""]
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def render_json(report: Report) -> str:
    data = {"runs": _records(report.runs), "comparison": _records(report.comparison),
            "skipped": [{"file": p, "reason": r} for p, r in report.skipped], "warnings": report.warnings,
            "notes": report.notes, "assumptions": {"normalisation": NORMALISATION, "scaling": SCALING_ASSUMPTION}}
    return json.dumps(data, indent=2, allow_nan=False, default=str) + "\n"


def render_csv(report: Report) -> str:
    return report.runs.to_csv(index=False)


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if args.devices < 1:
        raise UsageError(f"--devices {args.devices} is not accepted; give a number of devices >= 1")
    tokens = parse_tokens(args.tokens)
    prices = parse_prices(args.price)
    loaded, skipped = load_inputs(args.results)
    if not loaded:
        raise UsageError(f"RESULTS {' '.join(args.results)}: no readable result file "
                         f"({len(skipped)} skipped: {skipped[0][1] if skipped else 'none found'})")
    published, note = None, None
    if args.against is not None:
        published = load_published(args.against)
    elif DEFAULT_DIR.is_dir():
        published = load_published(DEFAULT_DIR)
    elif Path("results/published").is_dir():
        published = load_published("results/published")
    else:
        note = "No published tables found (results/published); give --against PATH."
    report = build_report(loaded, skipped, published, note, prices, tokens, args.devices,
                          with_plots=args.format == "html")
    if args.format == "html":
        from hwbench.report.html import render_html
        text = render_html(report)
    else:
        text = {"md": render_markdown, "csv": render_csv, "json": render_json}[args.format](report)
    if args.out:
        try:
            write_text_atomic(args.out, text)  # never a half-written report
        except OSError as error:
            raise UsageError(f"--out {args.out}: cannot be written: {error.strerror}") from None
        print(f"report written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
