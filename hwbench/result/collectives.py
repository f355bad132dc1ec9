"""The result of one `hwbench collectives` run (`CollectivesResult`), typed and versioned like a
run's RunResult, with its own ``kind`` so that readers tell the two apart; written atomically,
read back with every field checked (a damaged file is named with its reason)."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hwbench import __version__
from hwbench.fields import problem_text
from hwbench.files import write_json_atomic
from hwbench.result.model import Environment

KIND: Literal["collectives"] = "collectives"
SCHEMA_VERSION: Literal[2] = 2
CollectivesStatus = Literal["ok", "failed", "timeout"]
# the names of CollectivesResult.point_key's values, in its order (a baseline file writes the key by them)
POINT_FIELDS = ("device", "device_model", "dist_backend", "world_size", "hosts", "dtype")


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class Settings(_Section):
    collectives: list[str]
    min_bytes: int = Field(ge=1)
    max_bytes: int = Field(ge=1)
    warmup: int = Field(ge=0)
    iterations: int = Field(ge=1)
    check: bool
    dtype: str = "float32"
    timeout_s: float = Field(gt=0)


class Row(_Section):
    """One line of nccl-tests' table: one collective, size and placement (in or out of place)."""

    collective: str
    in_place: bool
    size_bytes: int = Field(ge=1)
    elements: int = Field(ge=1)
    time_us: float = Field(ge=0)  # the mean over ranks of each rank's mean time per call (nccl-tests' -a 1)
    time_us_min: float = Field(ge=0)  # the fastest rank's
    time_us_max: float = Field(ge=0)  # the slowest rank's
    algbw_gbs: float | None = Field(ge=0)  # size / time_us, GB/s (10^9); None for a time of 0
    busbw_gbs: float | None = Field(ge=0)  # algbw x bus_factor
    bus_factor: float = Field(ge=0)
    wrong: int | None = Field(ge=0)  # elements wrong, all ranks together (nccl-tests' #wrong); None: not checked


class RankHost(_Section):
    rank: int = Field(ge=0)
    host: str
    pid: int | None = None


class Link(_Section):
    """One pair of the ring: ``sender`` sends to ``receiver``, who sends it back."""

    sender: int = Field(ge=0)
    receiver: int = Field(ge=0)
    sender_host: str
    receiver_host: str
    time_us: float = Field(ge=0)  # one way: half the mean round trip
    busbw_gbs: float | None = Field(ge=0)
    slowdown: float | None  # its time over the median of the other pairs', minus 1 (0.25: 25% slower)

    @property
    def inter_node(self) -> bool:
        """The pair crosses between hosts (the network), not within one (NVLink, PCIe, shared memory)."""
        return self.sender_host != self.receiver_host


class SlowLink(_Section):
    """The ring of pairwise send/recv and its verdict: every pair slower than the median of the other
    pairs by more than the threshold, in ring order."""

    size_bytes: int = Field(ge=1)
    threshold: float = Field(ge=0)
    links: list[Link]
    median_time_us: float = Field(ge=0)
    slow: list[Link]  # []: no pair is slower than the others' median by more than the threshold


class ScopeRows(_Section):
    """A multi-node run's collectives measured again on subgroups: ``intra_node`` (each node's ranks,
    every node's group at once) or ``inter_node`` (one rank per node: the network alone)."""

    scope: Literal["intra_node", "inter_node"]
    groups: list[list[int]]  # the ranks of each group; [] when not measured
    rows: list[Row] = Field(default_factory=list)  # time: the mean over every member rank; busbw by the group's size
    unmeasured: str | None = None  # why the scope has no rows


class CollectivesError(_Section):
    type: str
    message: str
    rank: int | None = None
    killed_pids: list[int] = Field(default_factory=list)


class CollectivesResult(_Section):
    kind: Literal["collectives"] = KIND
    schema_version: Literal[2] = SCHEMA_VERSION
    run_id: str = Field(min_length=1)
    status: CollectivesStatus
    hwbench_version: str = __version__
    started_at: str | None = None
    finished_at: str | None = None
    device: str  # the device kind: cpu, cuda, npu, ...
    device_model: str | None = None
    dist_backend: str  # gloo, nccl, hccl, ...
    world_size: int = Field(ge=1)
    settings: Settings
    ranks: list[RankHost] = Field(default_factory=list)
    rows: list[Row] = Field(default_factory=list)
    check_passed: bool | None = None  # None: --no-check
    scopes: list[ScopeRows] = Field(default_factory=list)  # several hosts only: intra_node, then inter_node
    slow_link: SlowLink | None = None
    environment: Environment | None = None
    error: CollectivesError | None = None

    @property
    def point_key(self) -> tuple:
        """What two results must share for their figures to be compared: the device, the number of
        ranks, how they are spread over hosts, and the element type."""
        return (self.device, self.device_model, self.dist_backend, self.world_size, self.hosts, self.settings.dtype)

    @property
    def hosts(self) -> int:
        """How many hosts the ranks ran on (1 when no rank is known)."""
        return len({rank.host for rank in self.ranks}) or 1


SCOPE_ALL = "all"  # CollectiveKey.scope of a result's own rows: every rank of the run
SCOPE_TEXT = {SCOPE_ALL: "", "intra_node": " within each node", "inter_node": " between nodes"}


@dataclasses.dataclass(frozen=True, order=True)
class CollectiveKey:
    """One busbw figure's identity, the one key of a collectives row that compare, baselines, the
    history and the exports read: a result's point key (POINT_FIELDS), the ranks measured (``scope``:
    all of them, or a multi-node run's intra_node or inter_node groups), the collective, its form and
    size. The history stores the point key of the run, the rest in the figure's name (``figure_name``)."""

    device: str
    device_model: str | None
    dist_backend: str
    world_size: int
    hosts: int
    dtype: str
    scope: str
    collective: str
    in_place: bool
    size_bytes: int

    @classmethod
    def of(cls, result: CollectivesResult, row: Row, scope: str = SCOPE_ALL) -> CollectiveKey:
        return cls(**dict(zip(POINT_FIELDS, result.point_key, strict=True)), scope=scope,
                   collective=row.collective, in_place=row.in_place, size_bytes=row.size_bytes)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    def values(self) -> tuple:
        return dataclasses.astuple(self)

    @property
    def point_key(self) -> tuple:
        """CollectivesResult.point_key of the result the figure is of."""
        return self.values()[:len(POINT_FIELDS)]

    def figure_name(self) -> str:
        """The history's name of this key's busbw: busbw_gbs/SCOPE/COLLECTIVE/FORM/SIZE."""
        form = "in_place" if self.in_place else "out_of_place"
        return f"{BUSBW_PREFIX}/{self.scope}/{self.collective}/{form}/{self.size_bytes}"

    @classmethod
    def from_figure(cls, point: list, name: str) -> CollectiveKey | None:
        """The key of a stored point key and figure name; None when they are not one's."""
        parts = name.split("/")
        if (len(parts) != 5 or parts[0] != BUSBW_PREFIX or parts[1] not in SCOPE_TEXT or not parts[4].isdigit()
                or parts[3] not in ("in_place", "out_of_place") or len(point) != len(POINT_FIELDS)):
            return None
        return cls(**dict(zip(POINT_FIELDS, point, strict=True)), scope=parts[1], collective=parts[2],
                   in_place=parts[3] == "in_place", size_bytes=int(parts[4]))

    def label(self) -> str:
        """'all_reduce in place 1048576 B between nodes, 16 ranks on 2 hosts (cuda NVIDIA H100, nccl,
        float32)': every field, so two keys never share a label (the CI exports name a series by it).
        The size in bytes, as nccl-tests' table and ours write it: exact, where one decimal of KiB
        would spell 2000 B and 2048 B alike."""
        where = f"{self.device} {self.device_model}" if self.device_model else self.device
        return (f"{self.collective} {'in' if self.in_place else 'out of'} place {self.size_bytes} B"
                f"{SCOPE_TEXT[self.scope]}, {self.world_size} ranks on {self.hosts} "
                f"host{'s' if self.hosts != 1 else ''} ({where}, {self.dist_backend}, {self.dtype})")


BUSBW_PREFIX = "busbw_gbs"


def busbw_figures(result: CollectivesResult) -> list[tuple[CollectiveKey, float]]:
    """Every busbw of an ok result, its own rows' and its scopes', each with its key; a row whose
    check found wrong values is no figure (nor is a failed result's, which has no rows)."""
    if result.status != "ok":
        return []
    tables = [(SCOPE_ALL, result.rows), *((scope.scope, scope.rows) for scope in result.scopes)]
    return [(CollectiveKey.of(result, row, scope), row.busbw_gbs)
            for scope, rows in tables for row in rows if row.busbw_gbs is not None and not row.wrong]


class CollectivesFormatError(ValueError):
    """A file that is not a readable collectives result; the message names it and why."""


def is_collectives_file(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == KIND


def from_data(data: object, where: str) -> CollectivesResult:
    if not is_collectives_file(data):
        raise CollectivesFormatError(f"{where}: not a collectives result (its kind is not {KIND!r})")
    assert isinstance(data, dict)
    version = data.get("schema_version")
    if version not in UPGRADES and version != SCHEMA_VERSION:
        raise CollectivesFormatError(f"{where}: collectives schema_version {version!r} is not one this hwbench "
                                     f"{__version__} reads (it reads 1 to {SCHEMA_VERSION}); upgrade hwbench")
    try:
        while data["schema_version"] != SCHEMA_VERSION:
            data = UPGRADES[data["schema_version"]](data)
        return CollectivesResult.model_validate(data, strict=False)
    except ValidationError as error:
        raise CollectivesFormatError(f"{where}: {problem_text(error)}") from None
    except (KeyError, TypeError, ValueError) as error:  # an old file too damaged to upgrade
        raise CollectivesFormatError(f"{where}: its schema_version {version} ring cannot be read ({error!r})") from None


# The ring's verdict, which a result's slow_link holds (`slow`) and an older file's upgrade judges again:
# here, beside the file it describes, so that reading a file needs nothing of fabric/.
@dataclasses.dataclass(frozen=True)
class RingVerdict:
    """Each pair's slowdown against the median of the other pairs (its time over that median,
    minus 1; None with one pair or a median of 0), the pairs named slow, the median of all pairs."""

    slowdowns: list[float | None]
    slow: list[int]
    median_s: float


def judge_pairs(times_s: list[float], threshold: float) -> RingVerdict:
    """Every pair slower than the median of the other pairs by more than ``threshold`` named. Against
    the others' median, not all pairs': two slow pairs of four do not lift the figure they are held
    against. A ring of two ranks has two pairs between the same two ranks: a slow rank slows both
    alike, and neither is named (its devices are judged by `hwbench accept`'s probes instead)."""
    slowdowns: list[float | None] = []
    for index, seconds in enumerate(times_s):
        others = [t for i, t in enumerate(times_s) if i != index]
        typical = statistics.median(others) if others else 0.0
        slowdowns.append(seconds / typical - 1 if typical > 0 else None)
    slow = [i for i, slowdown in enumerate(slowdowns) if slowdown is not None and slowdown > threshold]
    return RingVerdict(slowdowns, slow, statistics.median(times_s))


def _v1_to_v2(data: dict) -> dict:
    """Version 1's ring named only its slowest pair (``slowest``, ``slowdown``); version 2 names every
    slow pair, each link with its own slowdown: judged again from the times version 1 recorded, by
    the rule `hwbench collectives` now applies (``judge_pairs`` above)."""
    data = {**data, "schema_version": 2}
    ring = data.get("slow_link")
    if isinstance(ring, dict) and isinstance(ring.get("links"), list):
        ring = {key: value for key, value in ring.items() if key not in ("slowest", "slowdown")}
        links = [dict(link) for link in ring["links"]]
        verdict = judge_pairs([float(link["time_us"]) for link in links], float(ring["threshold"]))
        for link, slowdown in zip(links, verdict.slowdowns, strict=True):
            link["slowdown"] = slowdown
        data["slow_link"] = {**ring, "links": links, "slow": [links[index] for index in verdict.slow]}
    return data


UPGRADES = {1: _v1_to_v2}  # schema_version -> the step to the next: old files still load


def load_collectives(path: str | os.PathLike) -> CollectivesResult:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise CollectivesFormatError(f"{path}: unreadable ({error})") from None
    return from_data(data, str(path))


def write_collectives(result: CollectivesResult, out_dir: str | os.PathLike) -> Path:
    """``out_dir/<run_id>.json``, whole or not at all."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(folder / f"{result.run_id}.json", result.model_dump(mode="json", exclude_none=False))
