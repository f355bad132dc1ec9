"""Prices per device-hour and where each comes from: `--price DEVICE=USD/h`, a team's own
`--prices FILE.yaml`, the price the result recorded from the catalog when it ran, and the
catalog entry now (shipped entries carry public on-demand list prices with their source and
date, docs/catalog.md). docs/reports.md, "Prices"."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml

from hwbench.catalog import calendar_date
from hwbench.errors import UsageError
from hwbench.report.cells import number
from hwbench.result.model import Device


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


MAX_PRICE_FILE_BYTES = 1 << 20  # a price list is a few lines; anything larger is not one


def load_price_file(path: str) -> dict[str, Price]:
    """A team's prices: a YAML mapping of catalog entry or device model to a number (USD per
    device-hour; the source is then the file) or to {usd_per_hour, source, date}. A bad file is a
    one-line UsageError naming the file, the entry and what is accepted."""
    try:
        loader = _PriceLoader(_read_small(path))  # a SafeLoader, below
        loader.name = path
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise UsageError(f"--prices {path}: not a YAML file: {str(error).splitlines()[0]}") from None
    except ValueError as error:  # PyYAML builds an unquoted 2026-13-01 as a date and fails
        raise UsageError(f"--prices {path}: holds a value YAML cannot read ({error}); write dates as real days, "
                         "YYYY-MM-DD") from None
    if not isinstance(data, dict) or not data:
        raise UsageError(f"--prices {path}: must be a mapping of catalog entry or device model to USD per "
                         "device-hour (a number, or {usd_per_hour, source, date})")
    prices: dict[str, Price] = {}
    for key, value in data.items():
        name = str(key).strip().lower()
        if name in prices:
            raise UsageError(f"--prices {path}: {_short(key)} is named twice (names are compared ignoring case)")
        prices[name] = _file_entry(path, str(key), value)
    return prices


def _read_small(path: str) -> str:
    """The file's text, refused beyond MAX_PRICE_FILE_BYTES (/dev/zero must not fill the memory)."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_PRICE_FILE_BYTES + 1)
    except OSError as error:
        raise UsageError(f"--prices {path}: cannot be read: {error.strerror}") from None
    if len(raw) > MAX_PRICE_FILE_BYTES:
        raise UsageError(f"--prices {path}: larger than {MAX_PRICE_FILE_BYTES >> 20} MiB; a price list is a "
                         "mapping of a few entries")
    return raw.decode("utf-8")


class _PriceLoader(yaml.SafeLoader):
    """SafeLoader without aliases (an alias bomb of a few lines expands to gigabytes) and without
    duplicate keys (YAML would keep the last one silently)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            line = self.peek_event().start_mark.line + 1
            raise UsageError(f"--prices {self.name}: line {line}: aliases (*name) are not accepted in a price list")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(key, deep=True) for key, _ in node.value]
        repeated = next((key for key in keys if keys.count(key) > 1), None)
        if repeated is not None:
            raise UsageError(f"--prices {self.name}: line {node.start_mark.line + 1}: {_short(repeated)} is named "
                             "twice")
        return super().construct_mapping(node, deep)


_ENTRY_KEYS = {"usd_per_hour", "source", "date"}
_ACCEPTED = "a number >= 0 or {usd_per_hour: number >= 0, source: text, date: YYYY-MM-DD}"


def _file_entry(path: str, key: str, value: Any) -> Price:
    if not isinstance(value, dict):
        price = _number(value, strict=True)
        if price is None:
            raise UsageError(f"--prices {path}: entry {_short(key)} is {_short(value)}; accepted: {_ACCEPTED}")
        return Price(price, f"--prices {path}", None)
    unknown = sorted(set(map(str, value)) - _ENTRY_KEYS)
    price = _number(value.get("usd_per_hour"), strict=True)
    source, date = value.get("source"), value.get("date")
    date_text, problem = calendar_date(date), None
    if unknown:
        problem = f"unknown key {_short(unknown[0])}"
    elif price is None:
        problem = f"usd_per_hour {_short(value.get('usd_per_hour'))}"
    elif source is not None and not (isinstance(source, str) and source.strip()):
        problem = f"source {_short(source)}"
    elif date is not None and date_text is None:
        problem = f"date {_short(date)}"
    if problem or price is None:
        raise UsageError(f"--prices {path}: entry {_short(key)} has {problem}; accepted: {_ACCEPTED}")
    return Price(price, source.strip() if source else f"--prices {path}", date_text)


def _short(value: Any) -> str:
    """repr() of a value from a file, cut to one short line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any, strict: bool = False) -> float | None:
    """A price >= 0, or None. ``strict`` (values from a file): a YAML number only, not text."""
    figure = None if strict and not isinstance(value, (int, float)) else number(value)
    return figure if figure is not None and figure >= 0 else None


def as_prices(given: Mapping[str, Any]) -> dict[str, Price]:
    """Prices by lower-cased name; a bare number (the Python API's form) is a --price, checked as one."""
    prices: dict[str, Price] = {}
    for key, value in given.items():
        if not isinstance(value, Price) and _number(value, strict=True) is None:
            raise UsageError(f"--price {key}={value!r} is not accepted; give USD per device-hour as a number >= 0")
        prices[str(key).lower()] = value if isinstance(value, Price) else Price(float(value), f"--price {key}", None)
    return prices


def device_price(entry: str | None, model: str | None, recorded: Device | None,
                 overrides: Mapping[str, Price]) -> tuple[Price | None, str | None]:
    """(the price of one device-hour, None) or (None, why there is none). First found: --price or
    --prices by catalog entry or device model, the price the result recorded from the catalog
    when it ran (``recorded``: the result's device), the catalog entry now."""
    for key in (entry, model):
        if key and key.lower() in overrides:
            return overrides[key.lower()], None
    if recorded is not None and recorded.price_usd_per_hour is not None:
        source = recorded.price_source or "the catalog when the run was made (no source recorded)"
        return Price(recorded.price_usd_per_hour, source, recorded.price_date), None
    catalog_entry = _catalog_entry(entry)
    if catalog_entry is not None and catalog_entry.price_usd_per_hour is not None:
        return Price(catalog_entry.price_usd_per_hour, catalog_entry.price_source or f"catalog {entry}",
                     catalog_entry.price_date), None
    name = entry or model or "this device"
    why = ("no catalog entry matches it" if catalog_entry is None
           else catalog_entry.price_unavailable or "its catalog entry has none")
    return None, f"no price for {name}: {why}; give --price {entry or 'DEVICE'}=USD/h or --prices FILE.yaml"


def _catalog_entry(entry: str | None):
    if not entry:
        return None
    from hwbench.catalog import load_catalog

    return load_catalog().devices.get(entry)
