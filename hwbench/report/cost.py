"""Procurement figures of one run: its price per device-hour, the energy it used, cost per
million tokens, energy per token and the projection of a whole training job
(docs/reports.md, "Procurement")."""

from __future__ import annotations

import math
from typing import Any, Sequence

from hwbench.errors import UsageError
from hwbench.report.cells import number
from hwbench.results import RunResult

SCALING_ASSUMPTION = ("Projections assume linear scaling: N devices reach N x the run's tokens/s per device, "
                      "with no loss to communication, stragglers or a larger data-parallel degree.")


def parse_prices(items: Sequence[str]) -> dict[str, float]:
    """``["h100-sxm=2.5"]`` -> ``{"h100-sxm": 2.5}`` (names lower-cased); a UsageError otherwise."""
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
    """The projection's token count from text such as "300e9"; a UsageError unless > 0."""
    try:
        tokens = float(text)
    except ValueError:
        tokens = float("nan")
    if not math.isfinite(tokens) or tokens <= 0:
        raise UsageError(f"--tokens {text!r} is not accepted; give a number of tokens > 0, e.g. 300e9")
    return tokens


def price_per_hour(result: RunResult, overrides: dict[str, float]) -> tuple[float | None, str]:
    """(USD per device-hour, where it came from): --price, then the result, then the catalog now;
    (None, why) without any."""
    device = result.device or {}
    entry, model = device.get("catalog_entry"), device.get("device_model")
    for key in (entry, model):
        if key and key.lower() in overrides:
            return overrides[key.lower()], f"--price {key}"
    if number(device.get("price_usd_per_hour")) is not None:
        return float(device["price_usd_per_hour"]), "catalog at run time"
    if entry:
        from hwbench.catalog import load_catalog
        catalog_entry = load_catalog().devices.get(entry)
        if catalog_entry is not None and catalog_entry.price_usd_per_hour is not None:
            return catalog_entry.price_usd_per_hour, f"catalog {entry}"
    name = entry or model or "this device"
    return None, f"no price for {name}: the catalog has none; give --price {entry or 'DEVICE'}=USD/h"


def measured_energy(result: RunResult, world: int) -> tuple[float | None, float | None, str | None]:
    """(energy J over the telemetry window, mean power W summed over devices, why energy is missing)."""
    metrics = result.metrics or {}
    telemetry = metrics.get("telemetry")
    if not telemetry or not telemetry.get("available"):
        reason = (telemetry or {}).get("reason") or (metrics.get("unmeasured") or {}).get("telemetry") \
            or "no telemetry in the result"
        return None, None, reason
    devices = telemetry.get("devices") or []
    power = number(telemetry.get("power_w_mean_total"))
    if power is None and devices and all(number(d.get("power_w_mean")) is not None for d in devices):
        power = sum(float(d["power_w_mean"]) for d in devices)
    if "energy_j" in telemetry:
        energy = number(telemetry.get("energy_j"))
    elif devices and all(number(d.get("energy_j")) is not None for d in devices):
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


def procurement_figures(result: RunResult, row: dict[str, Any], prices: dict[str, float], tokens: float,
                        devices: int) -> dict[str, Any]:
    """The procurement columns of a run's row (``row`` holds its throughput and batch figures):
    price, cost per million tokens, energy per token, and the time and cost to train ``tokens``
    tokens on ``devices`` devices of the same kind. The key order is the column order of the report."""
    world = row["world_size"]
    figures: dict[str, Any] = {}
    price, price_source = price_per_hour(result, prices)
    figures["price_usd_per_hour"], figures["price_source"] = price, price_source
    tps = row["tokens_per_s"]
    figures["cost_per_million_tokens_usd"] = (price / 3600 * world / tps * 1e6) if price is not None and tps else None
    energy, power, energy_reason = measured_energy(result, world) if result.status == "ok" \
        else (None, None, f"status {result.status}")
    steps = row["timed_steps"]
    timed_tokens = (row["global_batch_size"] * row["seq_length"] * steps) if steps and row["seq_length"] else None
    figures["timed_tokens"] = timed_tokens
    figures["energy_j"], figures["power_w_mean"], figures["energy_reason"] = energy, power, energy_reason
    figures["energy_per_token_j"] = energy / timed_tokens if energy is not None and timed_tokens else None
    per_device = row["tokens_per_s_per_device"]
    # linear scaling (SCALING_ASSUMPTION): N devices reach N x the run's tokens/s per device
    figures["projected_days"] = tokens / (per_device * devices) / 86400 if per_device else None
    figures["projected_cost_usd"] = (price * devices * figures["projected_days"] * 24
                                     if price is not None and figures["projected_days"] is not None else None)
    return figures
