"""Measured runs against the published tables: every ok run under every published row of
its model, with the per-device ratio and the settings that differ (docs/reports.md).
Not `hwbench compare` (compare.py), which compares two sets of runs."""

from __future__ import annotations

from typing import Any

import pandas as pd

NORMALISATION = ("Per-device figures divide the global samples/s by the devices that produced it: a measured "
                 "run's samples/s / its world size (tp x pp x dp ranks, one device each), a published row's "
                 "samples/s / its devices (8 for every published row). The ratio is measured / published.")


def match_published(runs: pd.DataFrame, published: pd.DataFrame | None) -> pd.DataFrame:
    """One row per (ok run, published row of the same model).

    Every published row of the run's model is matched, whatever the layout: a 1-device measurement
    is read against an 8-device figure through the per-device ratio. ``same_layout`` says whether
    the run's TP and PP equal the published ones (a published row that leaves them empty matches
    any), and ``differences`` names every setting that differs from the published point."""
    rows: list[dict[str, Any]] = []
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
                "published_steps": pub["steps"], "published_layout": published_layout(pub),
                "measured_samples_per_s": measured, "world_size": run["world_size"], "layout": run["layout"],
                "same_layout": all(pd.isna(pub[k]) or int(pub[k]) == run[k] for k in ("tp", "pp")),
                "differences": differences,
                "ratio": measured / published_value if measured is not None else None,
                "measured_samples_per_s_per_device": per_device,
                "published_samples_per_s_per_device": pub_per_device,
                "ratio_per_device": per_device / pub_per_device if per_device is not None else None,
                "measured_ppl": run["valid_ppl"], "measured_ppl_step": run["valid_ppl_step"],
                "seq_length": run["seq_length"], "timed_steps": run["timed_steps"],
                "device_model": run["device_model"], "stand_in": run["stand_in"], "backend": run["backend"],
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


# The shipped published tables (the Ascend ModelZoo GPT-2 README) were all measured with Megatron-DeepSpeed, hwbench's
# --engine deepspeed; a table of other runs may name its engine in an `engine` column.
PUBLISHED_ENGINE = "deepspeed"


def _setting_text(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def published_layout(pub: pd.Series) -> str:
    """A published row's layout, "TP2 PP1"; "?" for what the table leaves empty."""
    tp = "?" if pd.isna(pub["tp"]) else int(pub["tp"])
    pp = "?" if pd.isna(pub["pp"]) else int(pub["pp"])
    return f"TP{tp} PP{pp}"
