"""Procurement figures of one run: its price per device-hour, the energy it used, cost per
million tokens, energy per token and the projection of a whole training job
(docs/reports.md, "Procurement")."""

from __future__ import annotations

import math
from typing import Any

from hwbench.errors import UsageError
from hwbench.harness.stand_in import STAND_IN_ENERGY, STAND_IN_PRICE
from hwbench.report.cells import number
from hwbench.report.prices import Price, device_price
from hwbench.result.model import RunResult

# Hoffmann et al. 2022 ("Chinchilla"): about 20 training tokens per parameter is compute-optimal.
TOKENS_PER_PARAMETER = 20
SCALING_ASSUMPTION = ("Projections use the scaling fitted to the device counts measured (efficiency per doubling, "
                      "never above linear); a workload measured at one device count is projected linearly: N devices "
                      "reach N x the tokens/s per device, with no loss to communication or stragglers.")


# Why a simulated run (a stand-in ran the device's code path on this host) has no price, energy
# or projection: its throughput and its sensors are this host's and the stand-in's, not the device's.

MAX_TOKENS = 1e18  # far beyond any training run: the largest published ones are about 1.5e13 tokens


def parse_tokens(text: str) -> float:
    """The projection's token count from text such as "300e9"; a UsageError unless a whole number
    from 1 to MAX_TOKENS."""
    try:
        tokens = float(text)
    except ValueError:
        tokens = float("nan")
    checked, _devices = check_projection(tokens, 1, shown=repr(text))
    assert checked is not None  # None is returned only for None
    return checked


def check_projection(tokens: float | None, devices: Any, shown: str | None = None) -> tuple[float | None, int]:
    """(tokens, devices) of the training projection, checked wherever they come from (the command
    line, the Python API): tokens None (20 per parameter) or a whole number from 1 to MAX_TOKENS,
    devices a whole number >= 1; a one-line UsageError otherwise."""
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, (int, float))
                               or not math.isfinite(tokens) or not 1 <= tokens <= MAX_TOKENS or tokens != int(tokens)):
        raise UsageError(f"--tokens {shown or repr(tokens)} is not accepted; give a whole number of tokens from 1 to "
                         "1e18, e.g. 300e9")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise UsageError(f"--projection-devices {devices!r} is not accepted; give a number of devices >= 1")
    return tokens, devices


def token_budget(tokens: float | None, parameters: Any) -> tuple[float | None, str]:
    """(tokens to train, why that many): --tokens, else 20 tokens per parameter."""
    if tokens is not None:
        return tokens, "--tokens"
    count = number(parameters)
    if count is None:
        return None, "no parameter count in the result and no --tokens"
    return TOKENS_PER_PARAMETER * count, (f"{TOKENS_PER_PARAMETER} tokens per parameter x {count / 1e6:,.2f}M "
                                          "parameters (compute-optimal, Hoffmann et al. 2022)")


def cost_per_million_tokens(price: Price | None, devices: int, tokens_per_s: float | None) -> float | None:
    """USD per million tokens: the price of ``devices`` devices for the time a million tokens take."""
    if price is None or not tokens_per_s:
        return None
    return price.usd_per_hour / 3600 * devices / tokens_per_s * 1e6


def training_time_and_cost(tokens: float | None, tokens_per_s: float | None, devices: int,
                           price: Price | None) -> tuple[float | None, float | None]:
    """(days, USD) to train ``tokens`` at ``tokens_per_s`` on ``devices`` devices of ``price``."""
    if tokens is None or not tokens_per_s:
        return None, None
    days = tokens / tokens_per_s / 86400
    return days, (price.usd_per_hour * devices * days * 24 if price is not None else None)


def measured_energy(result: RunResult, world: int) -> tuple[float | None, float | None, str | None]:
    """(energy J over the telemetry window, mean power W summed over devices, why energy is missing).
    ``world``: the devices the telemetry must cover (the devices charged: one CPU socket reads for
    all the ranks on it)."""
    telemetry = result.metrics.telemetry
    if not telemetry or not telemetry.available:
        reason = (telemetry.reason if telemetry else None) or result.metrics.why("telemetry") \
            or "no telemetry in the result"
        return None, None, reason
    devices = telemetry.devices or []
    power, energy = telemetry.total_power_w, telemetry.total_energy_j
    if energy is None:
        reasons = [why for device in devices if (why := device.why("energy_j"))]
        return None, power, "a device reported no energy" + (f" ({reasons[0]})" if reasons else "")
    if len(devices) < world:
        return None, power, f"telemetry covered {len(devices)} of {world} devices"
    return energy, power, None


def procurement_figures(result: RunResult, row: dict[str, Any], prices: dict[str, Price],
                        tokens: float | None) -> dict[str, Any]:
    """The procurement columns of a run's row (``row`` holds its throughput and batch figures):
    devices charged, price, cost per million tokens, energy per token and the token budget. The
    projection to a device count is added by the report, once the scaling is known (build.py).
    The key order is the column order of the report."""
    figures: dict[str, Any] = {}
    charged = result.devices_charged
    figures["devices_charged"], figures["devices_charged_basis"] = charged, result.devices_charged_basis
    figures["oversubscribed"], figures["oversubscribed_reason"] = result.oversubscribed, result.oversubscribed_reason
    tps = row["tokens_per_s"]
    figures["tokens_per_s_per_device_charged"] = tps / charged if tps else None
    price, why = device_price(result.device.catalog_entry, result.device.device_model, result.device, prices) \
        if not result.stand_in else (None, STAND_IN_PRICE[result.stand_in])
    figures["price_usd_per_hour"] = price.usd_per_hour if price else None
    figures["price_source"] = price.source if price else why
    figures["price_date"] = price.date if price else None
    figures["cost_per_million_tokens_usd"] = cost_per_million_tokens(price, charged, tps)
    energy, power, energy_reason = (None, None, STAND_IN_ENERGY[result.stand_in]) if result.stand_in \
        else measured_energy(result, charged) if result.status == "ok" else (None, None, f"status {result.status}")
    steps = row["timed_steps"]
    timed_tokens = (row["global_batch_size"] * row["seq_length"] * steps) \
        if steps and row["seq_length"] and row["global_batch_size"] else None
    figures["timed_tokens"] = timed_tokens
    figures["energy_j"], figures["power_w_mean"], figures["energy_reason"] = energy, power, energy_reason
    figures["energy_per_token_j"] = energy / timed_tokens if energy is not None and timed_tokens else None
    figures["token_budget"], figures["token_budget_basis"] = token_budget(tokens, row["parameters"])
    return figures
