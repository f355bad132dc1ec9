"""The hardware and workload catalogs: YAML files, one per accelerator model
(devices/) and one per GPT size (workloads/), shipped inside the package.

More catalog folders can be named in HWBENCH_CATALOG_PATH (separated by ':');
each may hold devices/ and workloads/, and an entry there replaces a shipped
entry of the same name. Field reference: docs/catalog.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal, overload

import yaml

from hwbench.device.kinds import DEVICE_KINDS
from hwbench.errors import SetupError
from hwbench.workload.config import GPTConfig

PRECISIONS = ("fp32", "bf16", "fp16")
BACKENDS = DEVICE_KINDS  # an entry's backend: a kind of the registry
# dense = listed / 2 when the source lists the figure with 2:4 structured sparsity; compared
# with this relative tolerance, so that a rounded figure (835.5 for 1,671 / 2) is accepted
HALVING_TOLERANCE = 1e-3


class CatalogError(SetupError):
    """A catalog file that cannot be used; the message names the file and field."""


@dataclasses.dataclass(frozen=True)
class PeakFigure:
    """One precision's peak of a catalog entry: the dense figure and where it comes from,
    or None with the reason there is none."""

    dense: float | None  # FLOP/s per device, without structured sparsity
    listed: float | None = None  # the figure as the source lists it
    sparsity: bool | None = None  # the source lists it with sparsity, so dense = listed / 2
    source: str | None = None  # document name or URL
    read: str | None = None  # the day the figure was read there (YYYY-MM-DD)
    unavailable: str | None = None  # why dense is None

    def describe(self) -> str:
        """The figure and its provenance in one line (hwbench devices, results)."""
        if self.dense is None:
            return f"null: {self.unavailable}"
        halved = f"; listed {self.listed / 1e12:g} with sparsity, halved" if self.sparsity and self.listed else ""
        return f"{self.dense / 1e12:g} TFLOP/s dense ({self.source}, read {self.read}{halved})"


@dataclasses.dataclass(frozen=True)
class PowerLimitMatch:
    """Names shared by several models (a driver that reports an H200 NVL as "NVIDIA H200
    PCIe", or as a bare "NVIDIA H200"), matched to this entry only when the power limit
    the device reports lies in (over_watts, up_to_watts]."""

    names: tuple[str, ...]
    over_watts: float
    up_to_watts: float

    def admits(self, watts: float) -> bool:
        return self.over_watts < watts <= self.up_to_watts


@dataclasses.dataclass(frozen=True)
class DeviceMatch:
    """The catalog entry a device resolved to (or None), and why, in words."""

    entry: DeviceModel | None
    why: str


@dataclasses.dataclass(frozen=True)
class DeviceModel:
    name: str
    vendor: str
    backend: str
    title: str
    match: tuple[str, ...]
    memory_bytes: int | None
    tdp_watts: float | None
    interconnect: str | None
    peak_flops: dict[str, PeakFigure]
    price_usd_per_hour: float | None  # USD per device-hour
    price_source: str | None  # provider, instance and where the figure was read
    price_date: str | None  # the date of the figure (YYYY-MM-DD)
    price_unavailable: str | None  # why there is no price
    path: str
    compute_units: int | None = None  # compute units (CUs, SMs) the peak figures count
    match_by_power_limit: PowerLimitMatch | None = None

    def peak(self, precision: str) -> tuple[float | None, str | None]:
        """(peak dense FLOP/s, None) or (None, why there is none)."""
        figure = self.peak_flops.get(precision)
        if figure is None or figure.dense is None:
            why = figure.unavailable if figure else "not listed"
            return None, f"the catalog entry {self.name!r} ({self.path}) has no {precision} peak: {why}"
        return figure.dense, None


@dataclasses.dataclass(frozen=True)
class TrainingDefaults:
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    lr: float
    min_lr: float
    precision: str
    recompute: bool
    initial_scale_power: int
    loss_scale: float | None
    weight_decay: float
    clip_grad: float
    lr_decay_style: str
    lr_decay_iters: int
    lr_warmup_iters: int
    seed: int


@dataclasses.dataclass(frozen=True)
class PublishedLayout:
    devices: int
    tp: int
    pp: int
    zero_stage: int
    tables: tuple[str, ...]
    source: str


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    title: str
    model: GPTConfig
    training: TrainingDefaults
    published: PublishedLayout | None
    path: str


class _Fields:
    """Typed access to one YAML mapping, failing with the file and field named."""

    def __init__(self, data: Any, path: str, prefix: str = "") -> None:
        if not isinstance(data, dict):
            raise CatalogError(f"{path}: {prefix or 'the file'} must be a mapping")
        self.data, self.path, self.prefix = data, path, prefix
        self.known: set[str] = set()  # every key a reader asked for
        self.sections: list[_Fields] = []

    def _fail(self, key: str, want: str) -> CatalogError:
        value = self.data.get(key, "<missing>")
        return CatalogError(f"{self.path}: field {self.prefix}{key} must be {want}, got {value!r}")

    def get(self, key: str) -> Any:
        self.known.add(key)
        return self.data.get(key)

    @overload
    def section(self, key: str, optional: Literal[False] = False) -> _Fields: ...
    @overload
    def section(self, key: str, optional: bool) -> _Fields | None: ...

    def section(self, key: str, optional: bool = False) -> _Fields | None:
        if optional and self.get(key) is None:
            return None
        fields = _Fields(self.get(key), self.path, f"{self.prefix}{key}.")
        self.sections.append(fields)
        return fields

    def no_unknown_fields(self) -> None:
        """A field nobody reads is a typo or a field of another version: fail on it,
        rather than let it read as absent (a mistyped peak would make MFU null)."""
        unknown = sorted(str(key) for key in self.data if key not in self.known)
        if unknown:
            raise CatalogError(f"{self.path}: unknown field {self.prefix}{unknown[0]}; the fields of "
                               f"{self.prefix.rstrip('.') or 'this file'} are: {', '.join(sorted(self.known))} "
                               "(docs/catalog.md)")
        for fields in self.sections:
            fields.no_unknown_fields()

    @overload
    def text(self, key: str, optional: Literal[False] = False) -> str: ...
    @overload
    def text(self, key: str, optional: bool) -> str | None: ...

    def text(self, key: str, optional: bool = False) -> str | None:
        value = self.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise self._fail(key, "a non-empty string")
        return value

    @overload
    def number(self, key: str, optional: Literal[False] = False, minimum: float = 0.0) -> float: ...
    @overload
    def number(self, key: str, optional: bool, minimum: float = 0.0) -> float | None: ...

    def number(self, key: str, optional: bool = False, minimum: float = 0.0) -> float | None:
        value = self.get(key)
        if value is None and optional:
            return None
        try:  # YAML 1.1 reads '989e12' as a string: accept numeric strings
            number = float(value)
        except (TypeError, ValueError):
            raise self._fail(key, "a number") from None
        if isinstance(value, bool) or not math.isfinite(number) or number < minimum:
            raise self._fail(key, f"a number >= {minimum:g}")
        return number

    @overload
    def integer(self, key: str, optional: Literal[False] = False, minimum: int = 1) -> int: ...
    @overload
    def integer(self, key: str, optional: bool, minimum: int = 1) -> int | None: ...

    def integer(self, key: str, optional: bool = False, minimum: int = 1) -> int | None:
        value = self.number(key, optional, minimum)
        if value is None:
            return None
        if value != int(value):
            raise self._fail(key, "an integer")
        return int(value)

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise self._fail(key, "true or false")
        return value

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.get(key)
        if value not in choices:
            raise self._fail(key, "one of " + ", ".join(choices))
        return value


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as error:
        raise CatalogError(f"{path}: cannot be read: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise CatalogError(f"{path}: not UTF-8 text at byte {error.start} ({error.reason}); save it as UTF-8") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise CatalogError(f"{path}: not valid YAML: {error}".replace("\n", " ")) from None
    except RecursionError:
        raise CatalogError(f"{path}: nested too deeply to be a catalog entry") from None


def _device_from(path: Path) -> DeviceModel:
    f = _Fields(_read_yaml(path), str(path))
    match = f.get("match")
    if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
        raise f._fail("match", "a list of regular expressions")
    _check_patterns(path, "match", match)
    peaks = f.section("peak_flops")
    device = DeviceModel(
        name=f.text("name"),
        vendor=f.text("vendor"),
        backend=f.choice("backend", BACKENDS),
        title=f.text("title"),
        match=tuple(match),
        memory_bytes=f.integer("memory_bytes", optional=True),
        tdp_watts=f.number("tdp_watts", optional=True),
        interconnect=f.text("interconnect", optional=True),
        peak_flops={p: _peak_figure(peaks, p) for p in PRECISIONS},
        compute_units=f.integer("compute_units", optional=True),
        match_by_power_limit=_power_limit_match(f),
        price_usd_per_hour=f.number("price_usd_per_hour", optional=True),
        price_source=f.text("price_source", optional=True),
        price_date=_price_date(f),
        price_unavailable=f.text("price_unavailable", optional=True),
        path=str(path),
    )
    f.no_unknown_fields()
    if device.price_usd_per_hour is not None and not (device.price_source and device.price_date):
        raise f._fail("price_source", "given with price_date wherever price_usd_per_hour is (where the price comes "
                                      "from and when)")
    return device


def _check_patterns(path: Path, field: str, patterns: list[str]) -> None:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as error:
            raise CatalogError(f"{path}: field {field}: bad regular expression {pattern!r}: {error}") from None


def _peak_figure(peaks: _Fields, precision: str) -> PeakFigure:
    """One precision of peak_flops: the dense figure with the figure as listed, whether it
    was listed with sparsity, the source and the day it was read; or null with the reason.
    A sparse figure given as dense, or a dense figure that is not the listed one (halved when
    listed with sparsity), is refused: that is the MFU-above-100% mistake."""
    if not isinstance(peaks.get(precision), dict):
        raise peaks._fail(precision, "a mapping with dense, listed, sparsity, source and read, or with dense: null "
                                     "and unavailable (docs/catalog.md)")
    f = peaks.section(precision)
    dense = f.number("dense", optional=True, minimum=1.0)
    if dense is None:
        figure = PeakFigure(None, unavailable=f.text("unavailable"))
        for key in ("listed", "sparsity", "source", "read"):
            f.get(key)  # known fields, allowed beside a null figure (a note of what was found)
        return figure
    listed = f.number("listed", minimum=1.0)
    sparsity = f.flag("sparsity")
    figure = PeakFigure(dense, listed, sparsity, f.text("source"), _date(f, "read"))
    f.get("unavailable")
    expected = listed / 2 if sparsity else listed
    if abs(dense - expected) > HALVING_TOLERANCE * expected:
        if sparsity and abs(dense - listed) <= HALVING_TOLERANCE * listed:
            raise CatalogError(f"{f.path}: field {f.prefix}dense {dense:g} is the figure the source lists with "
                               f"sparsity ({listed:g}): the dense peak is half of it, {listed / 2:g}")
        how = f"half the figure listed with sparsity, {listed / 2:g}" if sparsity else f"the listed figure, {listed:g}"
        raise CatalogError(f"{f.path}: field {f.prefix}dense {dense:g} must be {how}")
    return figure


def _power_limit_match(f: _Fields) -> PowerLimitMatch | None:
    section = f.section("match_by_power_limit", optional=True)
    if section is None:
        return None
    names = section.get("names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise section._fail("names", "a non-empty list of regular expressions")
    _check_patterns(Path(f.path), "match_by_power_limit.names", names)
    over, up_to = section.number("over_watts"), section.number("up_to_watts", minimum=1.0)
    if not over < up_to:
        raise section._fail("up_to_watts", f"greater than over_watts ({over:g})")
    return PowerLimitMatch(tuple(names), over, up_to)


def _date(f: _Fields, key: str) -> str:
    text = calendar_date(f.get(key))
    if text is None:
        raise f._fail(key, "a date written YYYY-MM-DD")
    return text


def _price_date(f: _Fields) -> str | None:
    """price_date as YYYY-MM-DD text (YAML reads an unquoted date as a date)."""
    value = f.get("price_date")
    if value is None:
        return None
    text = calendar_date(value)
    if text is None:
        raise f._fail("price_date", "a date written YYYY-MM-DD")
    return text


def calendar_date(value: Any) -> str | None:
    """A real calendar day as YYYY-MM-DD text (a date YAML read, or such text), else None."""
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value.isoformat()
    if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return None
    try:
        return datetime.date.fromisoformat(value).isoformat()
    except ValueError:  # 2026-13-45
        return None


def _workload_from(path: Path) -> Workload:
    f = _Fields(_read_yaml(path), str(path))
    m, t = f.section("model"), f.section("training")
    model = GPTConfig(
        num_layers=m.integer("num_layers"),
        hidden_size=m.integer("hidden_size"),
        num_attention_heads=m.integer("num_attention_heads"),
        max_position_embeddings=m.integer("max_position_embeddings"),
        vocab_size=m.integer("vocab_size"),
        make_vocab_size_divisible_by=m.integer("make_vocab_size_divisible_by"),
    )
    problems = model.problems()
    if problems:
        raise CatalogError(f"{path}: model: {'; '.join(problems)}")
    decay_iters = t.integer("lr_decay_iters")
    warmup_iters = t.integer("lr_warmup_iters", optional=True, minimum=0)
    warmup_fraction = t.number("lr_warmup_fraction", optional=True)  # read either way: a known field
    if warmup_iters is None:  # Megatron: warm-up = fraction x decay iterations
        if warmup_fraction is None:
            raise t._fail("lr_warmup_fraction", "a number when lr_warmup_iters is not given")
        warmup_iters = round(warmup_fraction * decay_iters)
    training = TrainingDefaults(
        seq_length=t.integer("seq_length"),
        micro_batch_size=t.integer("micro_batch_size"),
        global_batch_size=t.integer("global_batch_size"),
        lr=t.number("lr"),
        min_lr=t.number("min_lr"),
        precision=t.choice("precision", PRECISIONS),
        recompute=t.flag("recompute"),
        initial_scale_power=t.integer("initial_scale_power", minimum=0),
        loss_scale=t.number("loss_scale", optional=True, minimum=1.0),
        weight_decay=t.number("weight_decay"),
        clip_grad=t.number("clip_grad"),
        lr_decay_style=t.choice("lr_decay_style", ("cosine", "linear", "constant")),
        lr_decay_iters=decay_iters,
        lr_warmup_iters=warmup_iters,
        seed=t.integer("seed", minimum=0),
    )
    published = None
    p = f.section("published", optional=True)
    if p is not None:
        tables = p.get("tables") or []
        published = PublishedLayout(
            devices=p.integer("devices"), tp=p.integer("tp"), pp=p.integer("pp"),
            zero_stage=p.integer("zero_stage", minimum=0), tables=tuple(str(x) for x in tables),
            source=p.text("source"),
        )
    workload = Workload(f.text("name"), f.text("title"), model, training, published, str(path))
    f.no_unknown_fields()
    return workload


@dataclasses.dataclass(frozen=True)
class Catalog:
    devices: dict[str, DeviceModel]
    workloads: dict[str, Workload]

    def match_device(self, backend: str, device_name: str, power_limit_w: float | None = None) -> DeviceModel | None:
        return self.identify(backend, device_name, power_limit_w).entry

    def identify(self, backend: str, device_name: str, power_limit_w: float | None = None,
                 power_limit_basis: str = "the power limit") -> DeviceMatch:
        """The entry whose longest matching ``match`` pattern matches ``device_name`` (on a tie
        the entry loaded last: a user's folder after the shipped one); else, for a name several
        models report, the entry whose power-limit range holds ``power_limit_w``; else None.
        Each with the reason in words."""
        best: tuple[int, DeviceModel, str] | None = None
        for entry in self.devices.values():
            if entry.backend != backend:
                continue
            for pattern in entry.match:
                if re.search(pattern, device_name, re.IGNORECASE) and (best is None or len(pattern) >= best[0]):
                    best = (len(pattern), entry, pattern)
        if best:
            return DeviceMatch(best[1], f"name {device_name!r} matches {best[1].name}'s pattern {best[2]!r}")
        shared = [entry for entry in self.devices.values() if entry.backend == backend and entry.match_by_power_limit
                  and any(re.search(p, device_name, re.IGNORECASE) for p in entry.match_by_power_limit.names)]
        if not shared:
            return DeviceMatch(None, f"no catalog entry matches the {backend} device {device_name!r}")
        names = ", ".join(entry.name for entry in shared)
        if power_limit_w is None:
            return DeviceMatch(None, f"name {device_name!r} is reported by several models ({names}), told apart by "
                                     f"{power_limit_basis}, which the device did not report")
        for entry in shared:
            limits = entry.match_by_power_limit
            if limits is not None and limits.admits(power_limit_w):
                return DeviceMatch(entry, f"name {device_name!r} is reported by several models ({names}); "
                                          f"{power_limit_basis} {power_limit_w:g} W is in {entry.name}'s range "
                                          f"({limits.over_watts:g}, {limits.up_to_watts:g}] W")
        return DeviceMatch(None, f"name {device_name!r} is reported by several models ({names}), and "
                                 f"{power_limit_basis} {power_limit_w:g} W is in none of their ranges")


def catalog_dirs() -> list[Path]:
    """The shipped catalog, then each folder of HWBENCH_CATALOG_PATH."""
    dirs = [Path(str(resources.files("hwbench.catalogs")))]
    extra = os.environ.get("HWBENCH_CATALOG_PATH", "")
    for part in filter(None, extra.split(os.pathsep)):
        folder = Path(part)
        if not folder.is_dir():  # a typo would silently drop the user's entries (and their MFU peaks)
            raise CatalogError(f"HWBENCH_CATALOG_PATH names {part!r}, which is not a folder; give folders holding "
                               "devices/ and/or workloads/, separated by ':'")
        dirs.append(folder)
    return dirs


def _load(kind: str, reader) -> dict:
    entries: dict = {}
    for root in catalog_dirs():
        folder = root / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.yaml")):
            entry = reader(path)
            if entry.name != path.stem:
                raise CatalogError(f"{path}: field name {entry.name!r} must equal the file name {path.stem!r}")
            entries.pop(entry.name, None)  # a replacing entry counts as loaded last (pattern ties)
            entries[entry.name] = entry
    return entries


@functools.cache
def _cached(key: str) -> Catalog:
    return Catalog(devices=_load("devices", _device_from), workloads=_load("workloads", _workload_from))


def load_catalog() -> Catalog:
    """Read every catalog folder (cached per HWBENCH_CATALOG_PATH value)."""
    return _cached(os.environ.get("HWBENCH_CATALOG_PATH", ""))
