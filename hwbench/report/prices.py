"""Prices per device-hour and where each comes from: `--price DEVICE=USD/h`, a team's own
`--prices FILE.yaml`, the price the result recorded from the catalog when it ran, and the
catalog entry now (shipped entries carry public on-demand list prices with their source and
date, docs/catalog.md). docs/reports.md, "Prices"."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Mapping

from hwbench.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Price:
    usd_per_hour: float  # one device for one hour
    source: str  # who charges it, for what, and where the figure was read
    date: str | None  # the date of the figure, when the source gives one

    def text(self) -> str:
        """"$6.88/device-h (AWS ..., 2026-08-26)"."""
        when = f", {self.date}" if self.date else ""
        return f"${self.usd_per_hour:,.4g}/device-h ({self.source}{when})"


def parse_price_options(items: list[str]) -> dict[str, Price]:
    """``["h100-sxm=2.5"]`` -> {"h100-sxm": Price(2.5, "--price h100-sxm", None)}; a UsageError otherwise."""
    prices: dict[str, Price] = {}
    for item in items:
        name, sep, value = item.partition("=")
        price = _number(value)
        if not sep or not name.strip() or price is None:
            raise UsageError(f"--price {item!r} is not accepted; give DEVICE=USD/h with a catalog entry name or "
                             "device model and a number >= 0, e.g. --price h100-sxm=2.5")
        prices[name.strip().lower()] = Price(price, f"--price {name.strip()}", None)
    return prices


def load_price_file(path: str) -> dict[str, Price]:
    """A team's prices: a YAML mapping of catalog entry or device model to a number (USD per
    device-hour; the source is then the file) or to {usd_per_hour, source, date}. A bad file is a
    one-line UsageError naming the file, the entry and what is accepted."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"--prices {path}: cannot be read: {error.strerror}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise UsageError(f"--prices {path}: not a YAML file: {str(error).splitlines()[0]}") from None
    if not isinstance(data, dict) or not data:
        raise UsageError(f"--prices {path}: must be a mapping of catalog entry or device model to USD per "
                         "device-hour (a number, or {usd_per_hour, source, date})")
    return {str(key).strip().lower(): _file_entry(path, str(key), value) for key, value in data.items()}


_ENTRY_KEYS = {"usd_per_hour", "source", "date"}


def _file_entry(path: str, key: str, value: Any) -> Price:
    accepted = "a number >= 0 or {usd_per_hour: number >= 0, source: text, date: YYYY-MM-DD}"
    if not isinstance(value, dict):
        price = _number(value)
        if price is None:
            raise UsageError(f"--prices {path}: entry {key!r} is {value!r}; accepted: {accepted}")
        return Price(price, f"--prices {path}", None)
    unknown = set(map(str, value)) - _ENTRY_KEYS
    price = _number(value.get("usd_per_hour"))
    if unknown or price is None:
        what = f"unknown key {sorted(unknown)[0]!r}" if unknown else f"usd_per_hour {value.get('usd_per_hour')!r}"
        raise UsageError(f"--prices {path}: entry {key!r} has {what}; accepted: {accepted}")
    date = value.get("date")
    return Price(price, str(value.get("source") or f"--prices {path}"), None if date is None else str(date))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        figure = float(value)
    except (TypeError, ValueError):
        return None
    return figure if math.isfinite(figure) and figure >= 0 else None


def as_prices(given: Mapping[str, Any]) -> dict[str, Price]:
    """Prices by lower-cased name; a bare number (the Python API's form) is a --price."""
    return {key.lower(): value if isinstance(value, Price) else Price(float(value), f"--price {key}", None)
            for key, value in given.items()}


def device_price(entry: str | None, model: str | None, recorded: Mapping[str, Any] | None,
                 overrides: Mapping[str, Price]) -> tuple[Price | None, str | None]:
    """(the price of one device-hour, None) or (None, why there is none). First found: --price or
    --prices by catalog entry or device model, the price the result recorded from the catalog
    when it ran, the catalog entry now."""
    for key in (entry, model):
        if key and key.lower() in overrides:
            return overrides[key.lower()], None
    recorded = recorded or {}
    if _number(recorded.get("price_usd_per_hour")) is not None:
        source = recorded.get("price_source") or "the catalog when the run was made (no source recorded)"
        return Price(float(recorded["price_usd_per_hour"]), source, recorded.get("price_date")), None
    catalog_entry = _catalog_entry(entry)
    if catalog_entry is not None and catalog_entry.price_usd_per_hour is not None:
        return Price(catalog_entry.price_usd_per_hour, catalog_entry.price_source or f"catalog {entry}",
                     catalog_entry.price_date), None
    name = entry or model or "this device"
    why = catalog_entry.price_unavailable if catalog_entry is not None and catalog_entry.price_unavailable else \
        ("its catalog entry has none" if catalog_entry is not None else "no catalog entry matches it")
    return None, f"no price for {name}: {why}; give --price {entry or 'DEVICE'}=USD/h or --prices FILE.yaml"


def _catalog_entry(entry: str | None):
    if not entry:
        return None
    from hwbench.catalog import load_catalog

    return load_catalog().devices.get(entry)
