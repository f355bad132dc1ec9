"""What one benchmark point is: ``PointKey``, the settings that define what was measured (results
with the same key are repeats of one point; keys that differ in any field are never merged into
one figure by compare, the history or the report; seed, output folder, ports, timeouts, telemetry
and evaluation settings are not part of it; whether a stand-in ran it is, ``stand_in``);
``resume_key``, a sweep's key of one run of a point, by which
an interrupted sweep finds what it already ran."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from pathlib import PurePath
from typing import Any

from hwbench import __version__


def data_kind(data: Any) -> Any:
    """`builtin`, `synthetic`, or `megatron:<name>`: the dataset, not where this machine keeps it."""
    if data in (None, "builtin", "synthetic") or str(data).startswith("megatron:"):
        return data
    return f"megatron:{PurePath(str(data)).name}"


SIMULATED = "simulated"  # PointKey.stand_in of a point a stand-in device ran (hwbench/device/base.py)
EMULATED = "emulated"  # PointKey.stand_in of an FP8 point computed without FP8 units (the CPU: Backend.fp8_emulation)


# The key is a projection of the run spec: each field below that the spec holds, where the
# spec holds it (hwbench.spec.RunSpec, whose type the field has, None allowed:
# tests/test_run_spec_declaration.py holds them equal). The others say what ran the point, read from
# the rest of the result (hwbench.result.model.RunResult.point_key reads this table).
FROM_SPEC = {name: name for name in (
    "model", "precision", "micro_batch_size", "global_batch_size", "seq_length", "max_positions", "recompute",
    "compile", "engine", "zero_stage", "fsdp", "pp_schedule", "data", "steps", "fused_qkv", "cross_entropy",
    "fp8_recipe",
)} | {"tp": "parallel.tp", "pp": "parallel.pp", "dp": "parallel.dp", "ep": "parallel.ep", "nnodes": "launch.nnodes"}
FROM_RUN = ("backend", "device_model", "stand_in")


@dataclasses.dataclass(frozen=True)
class PointKey:
    """The settings that define a benchmark point, in this order (stored in this order too):
    FROM_SPEC's and FROM_RUN's fields; fp8_recipe last, as the field added last (the history
    stores keys as lists)."""

    model: str
    backend: str | None
    device_model: str | None
    precision: str | None
    micro_batch_size: int | None
    global_batch_size: int | None
    seq_length: int | None
    max_positions: int | None
    recompute: bool | None
    compile: bool | None
    tp: int
    pp: int
    dp: int
    nnodes: int
    engine: str | None
    zero_stage: int | None
    fsdp: bool | None
    pp_schedule: str | None  # None without pipelining, where it is unused
    data: str | None  # data_kind()
    steps: int | None
    fused_qkv: bool = False
    cross_entropy: str = "standard"
    # None: the device itself ran the point; SIMULATED: a stand-in ran its code path on the host;
    # EMULATED: FP8 computed on a device without FP8 units (RunResult.stand_in).
    stand_in: str | None = None
    fp8_recipe: str | None = None  # --precision fp8's recipe; None for every other precision
    ep: int = 1  # expert parallelism, within dp (1: keys stored before it, none could have had more)

    def __post_init__(self) -> None:
        if not (isinstance(self.pp, int) and self.pp > 1):
            object.__setattr__(self, "pp_schedule", None)
        object.__setattr__(self, "data", data_kind(self.data))

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    def values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.fields())

    def text(self) -> str:
        """Every field as name=value: the point spelled out in full."""
        return " ".join(f"{name}={value}" for name, value in zip(self.fields(), self.values()))

    def label(self, among: Iterable[PointKey] = ()) -> str:
        """'1.3b on NVIDIA H100 TP2 PP2 bf16 recompute', then this key's value of every other field
        in which the keys ``among`` differ (', seq 64'), so that no two of them read the same."""
        layout = "".join(
            f" {name.upper()}{getattr(self, name)}" for name in ("tp", "pp", "dp", "ep") if getattr(self, name) > 1
        )
        flags, details = self._flags(), self._details(among)
        return (
            f"{self.model} on {self.device_model or self.backend}{self.stand_in_mark()}{layout} {self.precision_text()}"
            + (f" {flags}" if flags else "")
            + "".join(f", {detail}" for detail in details)
        )

    def precision_text(self) -> str:
        """'bf16', or 'fp8 tensorwise': an FP8 point's recipe is part of its precision."""
        return f"{self.precision} {self.fp8_recipe}" if self.fp8_recipe else str(self.precision)

    def stand_in_mark(self) -> str:
        """' [simulated]' for a point a stand-in ran, '' for the device's own."""
        return f" [{self.stand_in}]" if self.stand_in else ""

    def variant(self, among: Iterable[PointKey] = ()) -> str:
        """What sets the point apart beyond workload, device, layout and precision ('recompute, seq 64')."""
        return ", ".join(filter(None, [self._flags(), *self._details(among)]))

    def _flags(self) -> str:
        flags = [f"{self.engine} ZeRO-{self.zero_stage}"] if self.engine not in (None, "native") else []
        return " ".join(flags + [flag for flag in ("fsdp", "recompute", "compile") if getattr(self, flag)])

    def _details(self, among: Iterable[PointKey]) -> list[str]:
        keys = [*among, self]
        details = [_detail(name, getattr(self, name)) for name in _DETAILS if len({getattr(k, name) for k in keys}) > 1]
        return [detail for detail in details if detail]


# The fields label() leaves out unless keys differ in them, and how it shows each (a flag: "no ..." when off;
# a value that is not set: _UNSET's words, else the field's name and "not set"; "": left out).
_DETAILS = {
    "backend": "backend {}",
    "micro_batch_size": "micro batch {}",
    "global_batch_size": "global batch {}",
    "seq_length": "seq {}",
    "max_positions": "{} positions",
    "data": "data {}",
    "steps": "{} steps",
    "nnodes": "{} node(s)",
    "pp_schedule": "schedule {}",
    "cross_entropy": "{} cross entropy",
    "fused_qkv": "fused qkv",
}


# A point without pipelining has no schedule: its layout (no PP) says so already.
_UNSET = {"pp_schedule": "", "max_positions": "the workload's positions", "steps": "steps not set"}


def _detail(name: str, value: Any) -> str:
    if value is None:  # never "schedule None"
        return _UNSET.get(name, f"{name.replace('_', ' ')} not set")
    if isinstance(value, bool):
        return _DETAILS[name] if value else f"no {_DETAILS[name]}"
    return _DETAILS[name].format(value)


def resume_key(args: list[str], repeat: int, env: dict[str, str], machine: dict[str, Any]) -> str:
    """A sweep's key of one run of a point: same options, repeat, environment variables,
    hwbench version and machine (a host and its torch, or a Slurm sweep's cluster), same key;
    a resumed sweep keeps the result of a run whose key it finds."""
    payload = json.dumps(
        {"args": args, "repeat": repeat, "env": env or {}, "hwbench": __version__, "machine": machine}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
