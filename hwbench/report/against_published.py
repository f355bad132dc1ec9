"""Measured runs against the published tables: every ok run under every published row of
its model, with the per-device ratio and the settings that differ (docs/reports.md).
Not `hwbench compare` (compare.py), which compares two sets of runs."""

from __future__ import annotations

from typing import Any

import pandas as pd

from hwbench.report.published import publishes_tokens, tokens_per_s_per_device

NORMALISATION = ("Per-device figures divide a global figure by the devices that produced it: a measured "
                 "run's samples/s / its world size (tp x pp x dp ranks, one device each), a published row's "
                 "samples/s / its devices (8 for every row of Tables 2 and 3). A table that publishes tokens/s "
                 "per GPU (torchtitan, Megatron-Bridge) is read as published, one that publishes the global "
                 "tokens/s (DGX Cloud Benchmarking) divided by its GPUs; a run's tokens/s per device is its "
                 "tokens/s / its world size. The ratio is measured / published.")


def match_published(runs: pd.DataFrame, published: pd.DataFrame | None) -> pd.DataFrame:
    """One row per (ok run, published row of the same model).

    Every published row of the run's model is matched, whatever the layout: a 1-device measurement
    is read against an 8-device figure through the per-device ratio. ``same_layout`` says whether
    the run's TP and PP equal the published ones (a published row that leaves them empty matches
    any), and ``differences`` names every setting that differs from the published point. A row
    of a table that publishes tokens/s (``basis`` "tokens/s") is compared in tokens/s per device."""
    rows: list[dict[str, Any]] = []
    if published is None or runs.empty:
        return pd.DataFrame(rows, dtype=object)
    for _, run in runs[runs["status"] == "ok"].iterrows():
        for _, pub in published[published["model"] == run["model"]].iterrows():
            rows.append({
                "run_id": run["run_id"], "model": run["model"], "table": pub["table"], "name": pub["name"],
                "params": pub["params"], "published_ppl": pub["ppl"], "published_devices": int(pub["devices"]),
                "published_seq_length": pub["seq_length"], "published_steps": pub["steps"],
                "published_layout": published_layout(pub),
                "measured_samples_per_s": run["samples_per_s"], "world_size": run["world_size"],
                "layout": run["layout"],
                "same_layout": all(pd.isna(pub[k]) or int(pub[k]) == run[k] for k in ("tp", "pp")),
                "differences": setting_differences(run, pub),
                "measured_ppl": run["valid_ppl"], "measured_ppl_step": run["valid_ppl_step"],
                "seq_length": run["seq_length"], "timed_steps": run["timed_steps"],
                "measured_precision": run["precision"], "measured_micro_batch_size": run["micro_batch_size"],
                "measured_global_batch_size": run["global_batch_size"], "measured_fsdp": run["fsdp"],
                "device_model": run["device_model"], "stand_in": run["stand_in"], "backend": run["backend"],
                **(_tokens_figures(run, pub) if publishes_tokens(pub) else _samples_figures(run, pub)),
            })
    return pd.DataFrame(rows, dtype=object)


def _samples_figures(run: pd.Series, pub: pd.Series) -> dict[str, Any]:
    """A row of a table that publishes the global samples/s (Tables 2 and 3)."""
    measured, published_value = run["samples_per_s"], pub["samples_per_s"]
    per_device = measured / run["world_size"] if measured is not None else None
    pub_per_device = published_value / pub["devices"]
    return {"basis": "samples/s", "published_samples_per_s": published_value,
            "ratio": measured / published_value if measured is not None else None,
            "measured_samples_per_s_per_device": per_device,
            "published_samples_per_s_per_device": pub_per_device,
            "ratio_per_device": per_device / pub_per_device if per_device is not None else None}


def _tokens_figures(run: pd.Series, pub: pd.Series) -> dict[str, Any]:
    """A row of a table that publishes tokens/s (per GPU, or global): compared per device only,
    the figure such tables are read by; the published TFLOP/s per GPU where the table gives it."""
    measured = run["tokens_per_s_per_device"]
    published_value = tokens_per_s_per_device(pub)
    return {"basis": "tokens/s", "published_tokens_per_s_per_device": published_value,
            "published_tokens_per_s_per_device_is_derived": pd.isna(pub["tokens_per_s_per_device"]),
            "measured_tokens_per_s_per_device": measured,
            "ratio_per_device": measured / published_value if measured is not None else None,
            "published_tflops_per_device": None if pd.isna(pub["tflops_per_device"]) else pub["tflops_per_device"],
            "measured_tflops_per_device": run.get("tflops_per_device"),
            "published_precision": pub["precision"] or None, "published_recipe": pub["recipe"] or None,
            "published_device_class": pub["device_class"] or None,
            "published_power_limit_w": None if pd.isna(pub["power_limit_w"]) else pub["power_limit_w"],
            "published_engine": pub["engine"] or None, "published_software": pub["software"] or None}


# (label, the run's column, the published column) of every setting compared, in the order named
SETTINGS = (("TP", "tp", "tp"), ("PP", "pp", "pp"), ("CP", "cp", "cp"), ("FSDP", "fsdp", "fsdp"),
            ("devices", "world_size", "devices"), ("seq", "seq_length", "seq_length"),
            ("global batch", "global_batch_size", "global_batch_size"),
            ("micro batch", "micro_batch_size", "micro_batch_size"), ("precision", "precision", "precision"),
            ("recompute", "recompute", "recompute"), ("compile", "compile", "compile"))
# hwbench has no context parallelism: every run is CP 1, whether or not its row says so
RUN_DEFAULTS = {"cp": 1}


def setting_differences(run: pd.Series, pub: pd.Series) -> list[str]:
    """The settings of a measured run that differ from a published point, e.g. 'TP 1 vs 2';
    a setting the run did not record reads '?' ('seq ? vs 1024'), one the published row
    leaves empty is not compared. A published precision recipe is named beside the precision
    ('precision bf16 vs fp8 (FP8-CS ...)')."""
    differences = []
    for label, run_key, pub_key in SETTINGS:
        published_value, measured = pub.get(pub_key), run.get(run_key, RUN_DEFAULTS.get(run_key))
        if _empty(published_value):
            continue
        if isinstance(published_value, float) and float(published_value).is_integer():
            published_value = int(published_value)
        if _empty(measured):
            differences.append(f"{label} ? vs {_setting_text(published_value)}")
        elif measured != published_value:
            recipe = pub.get("recipe") if label == "precision" else None
            differences.append(f"{label} {_setting_text(measured)} vs {_setting_text(published_value)}"
                               + (f" ({recipe})" if recipe else ""))
    published_engine = pub.get("engine") or PUBLISHED_ENGINE
    if run.get("engine") and run.get("engine") != published_engine:
        differences.append(f"engine {run.get('engine')} vs {published_engine}")
    return differences


# Tables 2 and 3 (the Ascend ModelZoo GPT-2 README) were measured with Megatron-DeepSpeed, hwbench's
# --engine deepspeed; every other shipped table names its engine in its `engine` column.
PUBLISHED_ENGINE = "deepspeed"


def _empty(value: Any) -> bool:
    return value is None or value == "" or (not isinstance(value, str) and pd.isna(value))


def _setting_text(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def published_layout(pub: pd.Series) -> str:
    """A published row's layout, "TP2 PP1", with its context parallelism and data parallelism
    where the table gives them ("FSDP TP1 PP1 CP1", "DDP TP4 PP8 CP1"); "?" for what it leaves empty."""
    tp = "?" if pd.isna(pub["tp"]) else int(pub["tp"])
    pp = "?" if pd.isna(pub["pp"]) else int(pub["pp"])
    layout = f"TP{tp} PP{pp}"
    if not pd.isna(pub.get("cp")):
        layout += f" CP{int(pub['cp'])}"
    fsdp = pub.get("fsdp")
    if fsdp is True or fsdp is False:
        layout = ("FSDP " if fsdp else "DDP ") + layout
    return layout
