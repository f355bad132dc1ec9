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
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PlainSerializer,
    PrivateAttr,
    Strict,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hwbench.device.kinds import DEVICE_KINDS
from hwbench.errors import SetupError
from hwbench.fields import MAX_COUNT, Flag, problem_text
from hwbench.precision import FP8, PRECISIONS
from hwbench.workload.config import GPTConfig, RopeScaling

PEAK_PRECISIONS = (*PRECISIONS, FP8)  # an entry's peaks: fp8 optional (docs/catalog.md)
LR_DECAY_STYLES = ("cosine", "linear", "constant")  # Megatron-LM's --lr-decay-style choices hwbench runs
BACKENDS = DEVICE_KINDS  # an entry's backend: a kind of the registry
# dense = listed / 2 when the source lists the figure with 2:4 structured sparsity; compared
# with this relative tolerance, so that a rounded figure (835.5 for 1,671 / 2) is accepted
HALVING_TOLERANCE = 1e-3


class CatalogError(SetupError):
    """A catalog file that cannot be used; the message names the file and field."""


# --- the catalog's types, as its files give them (pydantic: each field typed where it is declared) ------


def _yaml_number(value: Any) -> Any:
    """YAML 1.1 reads 989.5e12 (no sign in the exponent) as text: take numeric text as its number."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _yaml_integer(value: Any) -> Any:
    """An integer, also written as a number with no fractional part (1e3 is 1000)."""
    value = _yaml_number(value)
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise PydanticCustomError("choice", "must be one of {expected}, not {short}",
                                      {"expected": ", ".join(choices), "short": repr(value)[:60]})
        return value
    return check


def _pattern(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as error:
        raise PydanticCustomError("pattern", "bad regular expression {pattern}: {error}",
                                  {"pattern": repr(pattern), "error": str(error)}) from None
    return pattern


def _date(value: Any) -> str:
    text = calendar_date(value)
    if text is None:
        raise PydanticCustomError("date", "must be a date written YYYY-MM-DD, not {short}", {"short": repr(value)[:60]})
    return text


def _a_list(value: Any) -> Any:
    """A YAML list, held as a tuple (a tuple would take any iterable: a mapping's keys, a text's letters)."""
    if not isinstance(value, list):
        raise PydanticCustomError("list_type", "must be a list")
    return value


Number = Annotated[float, BeforeValidator(_yaml_number), Strict(), Field(ge=0, allow_inf_nan=False)]
Peak = Annotated[float, BeforeValidator(_yaml_number), Strict(), Field(ge=1, allow_inf_nan=False)]
Wanted = Annotated[int, BeforeValidator(_yaml_integer), Strict(), Field(ge=1, le=MAX_COUNT)]
Counted = Annotated[int, BeforeValidator(_yaml_integer), Strict(), Field(ge=0, le=MAX_COUNT)]
Words = Annotated[str, Strict(), Field(min_length=1)]
Patterns = Annotated[tuple[Annotated[str, Strict(), AfterValidator(_pattern)], ...], BeforeValidator(_a_list)]
Day = Annotated[str, BeforeValidator(_date)]


class _Entry(BaseModel):
    """A mapping of a catalog file: every field typed, a field not declared refused (a typo or a field
    of another version would otherwise read as absent: a mistyped peak would make MFU null); frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PeakFigure(_Entry):
    """One precision's peak of a catalog entry: the dense figure and where it comes from,
    or None with the reason there is none."""

    dense: Peak | None = None  # FLOP/s per device, without structured sparsity
    listed: Peak | None = None  # the figure as the source lists it
    sparsity: Flag | None = None  # the source lists it with sparsity, so dense = listed / 2
    source: Words | None = None  # document name or URL
    read: Day | None = None  # the day the figure was read there (YYYY-MM-DD)
    unavailable: Words | None = None  # why dense is None

    def describe(self) -> str:
        """The figure and its provenance in one line (hwbench devices, results)."""
        if self.dense is None:
            return f"null: {self.unavailable}"
        halved = f"; listed {self.listed / 1e12:g} with sparsity, halved" if self.sparsity and self.listed else ""
        return f"{self.dense / 1e12:g} TFLOP/s dense ({self.source}, read {self.read}{halved})"


class _DensePeak(PeakFigure):
    """A figure as a file gives it: every field but unavailable."""

    dense: Peak
    listed: Peak
    sparsity: Flag
    source: Words
    read: Day
    unavailable: Any = None  # ignored

    @model_validator(mode="after")
    def _dense_is_the_listed_figure(self) -> _DensePeak:
        """A sparse figure given as dense, or a dense figure that is not the listed one (halved when
        listed with sparsity), is the MFU-above-100% mistake."""
        dense, listed = self.dense, self.listed
        expected = listed / 2 if self.sparsity else listed
        if abs(dense - expected) > HALVING_TOLERANCE * expected:
            if self.sparsity and abs(dense - listed) <= HALVING_TOLERANCE * listed:
                raise PydanticCustomError("sparse_as_dense", f"dense {dense:g} is the figure the source lists with "
                                          f"sparsity ({listed:g}): the dense peak is half of it, {listed / 2:g}")
            how = (f"half the figure listed with sparsity, {listed / 2:g}" if self.sparsity
                   else f"the listed figure, {listed:g}")
            raise PydanticCustomError("dense_not_listed", f"dense {dense:g} must be {how}")
        return self


class _NullPeak(PeakFigure):
    """No figure, as a file gives it: dense null (or left out) and the reason."""

    dense: None = None
    unavailable: Words
    listed: Any = None  # allowed beside a null figure: a note of what was found (not kept)
    sparsity: Any = None
    source: Any = None
    read: Any = None


def _peak(value: Any) -> PeakFigure:
    if not isinstance(value, dict):
        raise PydanticCustomError("peak_mapping", "must be a mapping with dense, listed, sparsity, source and read, "
                                  "or with dense: null and unavailable (docs/catalog.md), not {short}",
                                  {"short": repr(value)[:60]})
    if value.get("dense") is None:
        return PeakFigure(unavailable=_NullPeak.model_validate(value).unavailable)
    return PeakFigure(**_DensePeak.model_validate(value).model_dump(exclude={"unavailable"}))


class _PeakTable(_Entry):
    """peak_flops as a file gives it; an entry holds it as {precision: PeakFigure}, in PEAK_PRECISIONS'
    order. fp8 may be left out (an entry written before it): its peak is then not listed."""

    bf16: Annotated[PeakFigure, BeforeValidator(_peak)]
    fp16: Annotated[PeakFigure, BeforeValidator(_peak)]
    fp32: Annotated[PeakFigure, BeforeValidator(_peak)]
    fp8: Annotated[PeakFigure | None, BeforeValidator(_peak)] = None

    def by_precision(self) -> dict[str, PeakFigure]:
        return {p: getattr(self, p) for p in PEAK_PRECISIONS if getattr(self, p) is not None}


class PowerLimitMatch(_Entry):
    """Names shared by several models (a driver that reports an H200 NVL as "NVIDIA H200
    PCIe", or as a bare "NVIDIA H200"), matched to this entry only when the power limit
    the device reports lies in (over_watts, up_to_watts]."""

    names: Annotated[Patterns, Field(min_length=1)]
    over_watts: Number
    up_to_watts: Peak

    @model_validator(mode="after")
    def _a_range(self) -> PowerLimitMatch:
        if not self.over_watts < self.up_to_watts:
            raise PydanticCustomError("range", f"up_to_watts {self.up_to_watts:g} must be greater than over_watts "
                                      f"{self.over_watts:g}")
        return self

    def admits(self, watts: float) -> bool:
        return self.over_watts < watts <= self.up_to_watts


class LinkBandwidth(_Entry):
    """The device's own link to its peers (NVLink, Infinity Fabric, HCCS, PCIe) as a figure: the
    total both ways per device as its data sheet lists it, where it comes from and when it was read;
    or null with the reason. A collective's busbw (nccl-tests) moves each way at once, so it is held
    against half of it (``per_direction_bytes_per_s``)."""

    bidirectional_bytes_per_s: Peak | None = None  # bytes/s per device, both directions together
    link: Words | None = None  # which link: "NVLink 4 (18 links)"
    source: Words | None = None  # document name or URL
    read: Day | None = None  # the day the figure was read there (YYYY-MM-DD)
    unavailable: Words | None = None  # why there is no figure

    @model_validator(mode="after")
    def _a_figure_says_where_and_when(self) -> LinkBandwidth:
        if self.bidirectional_bytes_per_s is None and not self.unavailable:
            raise PydanticCustomError("link_unavailable", "bidirectional_bytes_per_s is null: give unavailable, "
                                      "the reason")
        if self.bidirectional_bytes_per_s is not None and not (self.source and self.read and self.link):
            raise PydanticCustomError("link_provenance", "bidirectional_bytes_per_s must be given with link, source "
                                      "and read (what link, where the figure comes from and when)")
        return self

    @property
    def per_direction_bytes_per_s(self) -> float | None:
        return None if self.bidirectional_bytes_per_s is None else self.bidirectional_bytes_per_s / 2


class _FromFile(_Entry):
    """A catalog entry: one file, named as its file is, whose path it keeps (not a field of the file)."""

    name: Words
    _path: str = PrivateAttr("")

    @property
    def path(self) -> str:
        return self._path


class DeviceModel(_FromFile):
    vendor: Words
    backend: Annotated[str, Strict(), AfterValidator(_one_of(BACKENDS))]
    title: Words
    match: Patterns
    memory_bytes: Wanted | None = None
    tdp_watts: Number | None = None
    interconnect: Words | None = None  # in words, as entries have always had it
    link_bandwidth: LinkBandwidth | None = None  # the same as a figure, with its source
    if TYPE_CHECKING:
        peak_flops: dict[str, PeakFigure]
    else:  # the file's table, held as {precision: PeakFigure}
        peak_flops: Annotated[_PeakTable, AfterValidator(_PeakTable.by_precision),
                              PlainSerializer(lambda peaks: {p: figure.model_dump() for p, figure in peaks.items()})]
    compute_units: Wanted | None = None  # compute units (CUs, SMs) the peak figures count
    match_by_power_limit: PowerLimitMatch | None = None
    price_usd_per_hour: Number | None = None  # USD per device-hour
    price_date: Day | None = None  # the date of the figure (YYYY-MM-DD)
    # provider, instance and where the figure was read
    price_source: Words | None = Field(default=None, validate_default=True)
    price_unavailable: Words | None = None  # why there is no price

    @field_validator("price_source")
    @classmethod
    def _a_price_says_where_and_when(cls, source: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("price_usd_per_hour") is not None and not (source and info.data.get("price_date")):
            raise PydanticCustomError("price_provenance", "must be given with price_date wherever price_usd_per_hour "
                                      "is (where the price comes from and when)")
        return source

    @model_validator(mode="wrap")
    @classmethod
    def _figures_last(cls, data: Any, handler: ModelWrapValidatorHandler[DeviceModel]) -> DeviceModel:
        """A file with several problems is refused for the same one as ever: the entry's, with each
        figure checked to be a mapping, before any inside a figure."""
        table = data.get("peak_flops") if isinstance(data, dict) else None
        if isinstance(table, dict):
            stand_in = {"unavailable": "checked next"}
            handler({**data, "peak_flops": {k: stand_in if isinstance(v, dict) else v for k, v in table.items()}})
        return handler(data)

    def peak(self, precision: str) -> tuple[float | None, str | None]:
        """(peak dense FLOP/s, None) or (None, why there is none)."""
        figure = self.peak_flops.get(precision)
        if figure is None or figure.dense is None:
            why = figure.unavailable if figure else "not listed"
            return None, f"the catalog entry {self.name!r} ({self.path}) has no {precision} peak: {why}"
        return figure.dense, None


@dataclasses.dataclass(frozen=True)
class DeviceMatch:
    """The catalog entry a device resolved to (or None), and why, in words."""

    entry: DeviceModel | None
    why: str


class _RopeScaling(_Entry):
    factor: Annotated[float, BeforeValidator(_yaml_number), Strict(), Field(ge=1, allow_inf_nan=False)]
    low_freq_factor: Annotated[float, BeforeValidator(_yaml_number), Strict(), Field(gt=0, allow_inf_nan=False)]
    high_freq_factor: Annotated[float, BeforeValidator(_yaml_number), Strict(), Field(gt=0, allow_inf_nan=False)]
    original_max_position_embeddings: Wanted

    @model_validator(mode="after")
    def _high_above_low(self) -> _RopeScaling:
        if not self.high_freq_factor > self.low_freq_factor:
            raise PydanticCustomError("range", f"high_freq_factor {self.high_freq_factor:g} must be greater than "
                                      f"low_freq_factor {self.low_freq_factor:g}")
        return self


def _shape_field(field: dataclasses.Field) -> tuple[Any, Any]:
    """A workload file's type of one GPTConfig field: an integer >= 1, a switch, a name of the
    field's choices, a positive number (or one at least the field's ``minimum``), or the rope
    scaling mapping; ``| None`` fields may be null; a field with a default may be left out
    (Megatron GPT-2's)."""
    kind = str(field.type)
    optional = kind.endswith("| None")
    if kind.startswith("RopeScaling"):
        typed: Any = Annotated[_RopeScaling | None, AfterValidator(lambda given: given and RopeScaling(
            **given.model_dump()))]
    elif kind.startswith("int"):
        typed = Wanted | None if optional else Wanted
    elif kind == "bool":
        typed = Flag
    elif kind.startswith("float"):
        bound = Field(ge=field.metadata["minimum"], allow_inf_nan=False) if "minimum" in field.metadata else Field(
            gt=0, allow_inf_nan=False)
        typed = Annotated[float, BeforeValidator(_yaml_number), Strict(), bound]
        typed = typed | None if optional else typed
    else:
        typed = Annotated[str, Strict(), AfterValidator(_one_of(field.metadata["choices"]))]
    required = field.default is dataclasses.MISSING
    return typed, (... if required else field.default)


# the model mapping of a workload file: GPTConfig's fields, each typed by its declaration
_GPT_FIELDS: dict[str, Any] = {field.name: _shape_field(field) for field in dataclasses.fields(GPTConfig)}
_GPTShape = create_model("_GPTShape", __base__=_Entry, **_GPT_FIELDS)


def _gpt_config(shape: BaseModel) -> GPTConfig:
    return GPTConfig(**{name: getattr(shape, name) for name in _GPT_FIELDS})


class TrainingDefaults(_Entry):
    seq_length: Wanted
    micro_batch_size: Wanted
    global_batch_size: Wanted
    lr: Number
    min_lr: Number
    precision: Annotated[str, Strict(), AfterValidator(_one_of(PRECISIONS))]
    recompute: Flag
    initial_scale_power: Counted
    loss_scale: Peak | None = None
    weight_decay: Number
    clip_grad: Number
    lr_decay_style: Annotated[str, Strict(), AfterValidator(_one_of(LR_DECAY_STYLES))]
    lr_decay_iters: Wanted
    if TYPE_CHECKING:  # held resolved: the count given, else Megatron's fraction x decay iterations
        lr_warmup_iters: int
    else:
        lr_warmup_iters: Counted | None = None
    lr_warmup_fraction: Number | None = Field(default=None, validate_default=True)
    seed: Counted

    @field_validator("lr_warmup_fraction")
    @classmethod
    def _one_warmup_given(cls, fraction: float | None, info: ValidationInfo) -> float | None:
        if fraction is None and info.data.get("lr_warmup_iters") is None and "lr_warmup_iters" in info.data:
            raise PydanticCustomError("warmup", "must be a number when lr_warmup_iters is not given")
        return fraction

    @model_validator(mode="after")
    def _warmup_iters(self) -> TrainingDefaults:
        # frozen: set once, here, as it is validated. A fraction beside a count is unused (the count
        # wins): held as None, so lr_warmup_fraction says whether the warm-up is one, and a run's
        # --lr-decay-iters scales it as Megatron-LM's does (hwbench.spec)
        if self.lr_warmup_iters is None:
            object.__setattr__(self, "lr_warmup_iters", round((self.lr_warmup_fraction or 0.0) * self.lr_decay_iters))
        else:
            object.__setattr__(self, "lr_warmup_fraction", None)
        return self


class PublishedLayout(_Entry):
    devices: Wanted
    tp: Wanted
    pp: Wanted
    zero_stage: Counted
    tables: Annotated[tuple[Annotated[str, BeforeValidator(str)], ...],
                      BeforeValidator(lambda tables: [] if tables is None else _a_list(tables))] = ()
    source: Words


class Workload(_FromFile):
    title: Words
    if TYPE_CHECKING:
        model: GPTConfig
    else:  # the file's mapping, typed field by field, held as the GPTConfig it gives
        model: Annotated[_GPTShape, AfterValidator(_gpt_config), PlainSerializer(dataclasses.asdict)]
    training: TrainingDefaults
    published: PublishedLayout | None = None


_EntryT = TypeVar("_EntryT", bound=_FromFile)


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
    except ValueError as error:  # PyYAML builds an unquoted 2026-13-01 as a date and fails
        raise CatalogError(f"{path}: holds a value YAML cannot read ({error}); write dates as real days, "
                           "YYYY-MM-DD") from None


def _entry(kind: type[_EntryT], path: Path) -> _EntryT:
    """The file at ``path`` as a ``kind``, else the CatalogError naming the file and field, as every
    file's refusal reads."""
    try:
        entry = kind.model_validate(_read_yaml(path))
    except ValidationError as error:
        field = "field " if error.errors()[0]["loc"] else ""
        raise CatalogError(f"{path}: {field}{problem_text(error, '', kind)}") from None
    except RecursionError:
        raise CatalogError(f"{path}: nested too deeply to be a catalog entry") from None
    problems = entry.model.problems() if isinstance(entry, Workload) else []
    if problems:
        raise CatalogError(f"{path}: model: {'; '.join(problems)}")
    entry._path = str(path)
    return entry


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



@dataclasses.dataclass(frozen=True)
class Catalog:
    devices: dict[str, DeviceModel]
    workloads: dict[str, Workload]

    def match_device(self, backend: str, device_name: str) -> DeviceModel | None:
        return self.identify(backend, device_name).entry

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


def _load(folder_name: str, kind: type[_EntryT]) -> dict[str, _EntryT]:
    entries: dict[str, _EntryT] = {}
    for root in catalog_dirs():
        folder = root / folder_name
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.yaml")):
            entry = _entry(kind, path)
            if entry.name != path.stem:
                raise CatalogError(f"{path}: field name {entry.name!r} must equal the file name {path.stem!r}")
            entries.pop(entry.name, None)  # a replacing entry counts as loaded last (pattern ties)
            entries[entry.name] = entry
    return entries


@functools.cache
def _cached(key: str) -> Catalog:
    return Catalog(devices=_load("devices", DeviceModel), workloads=_load("workloads", Workload))


def load_catalog() -> Catalog:
    """Read every catalog folder (cached per HWBENCH_CATALOG_PATH value)."""
    return _cached(os.environ.get("HWBENCH_CATALOG_PATH", ""))
