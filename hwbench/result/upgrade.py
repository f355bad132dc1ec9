"""Older result files brought to the current schema before they are validated.

``UPGRADES[v]`` takes the mapping of a version-v file to version v + 1; ``upgrade`` runs the
chain from the file's version to RESULT_SCHEMA_VERSION, so every file an earlier hwbench wrote
still loads, and readers never branch on a file's age. A step runs before validation, on
whatever the file holds: it changes only what has the shape it expects and leaves the rest for
validation to name. A version newer than this hwbench's is refused (UpgradeError), never guessed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hwbench import RESULT_SCHEMA_VERSION


class UpgradeError(ValueError):
    """A schema version this hwbench cannot bring to its own: newer, or not a version at all."""


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` (a result file's mapping) at RESULT_SCHEMA_VERSION; a mapping without a
    schema_version (one built in code; the loader refuses such a file) is of this version."""
    version = data.get("schema_version", RESULT_SCHEMA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise UpgradeError(f"schema_version must be an integer, not {str(version)[:40]!r}")
    if version > RESULT_SCHEMA_VERSION:
        raise UpgradeError(f"schema_version {version} is newer than this hwbench reads ({RESULT_SCHEMA_VERSION}); "
                           "upgrade hwbench")
    if version < min(UPGRADES, default=RESULT_SCHEMA_VERSION):
        raise UpgradeError(f"schema_version {version} was never written by hwbench (it reads 1 to "
                           f"{RESULT_SCHEMA_VERSION})")
    data = copy.deepcopy(data)
    for step in range(version, RESULT_SCHEMA_VERSION):
        data = UPGRADES[step](data)
        data["schema_version"] = step + 1
    return data


# --- 1 -> 2 ------------------------------------------------------------------------------------

RENAMED_FORMULAS = {"megatron-lm": "megatron-core-v0.7"}  # the same count, named by the code it follows
PREDATES_CALIBRATION = "the result predates hwbench calibrate"


def v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 names telemetry memory in its unit (MiB) and the FLOPs formula by the
    Megatron-Core version it follows, and records what version 1 left for readers to guess:
    the positions of runs written before --max-positions, and why an older run has no MFU
    against a measured ceiling."""
    spec, metrics, workload = (_held(data, key, dict) for key in ("spec", "metrics", "workload"))
    for section in (spec, metrics):
        formula = section.get("flops_formula")
        if isinstance(formula, str) and formula in RENAMED_FORMULAS:
            section["flops_formula"] = RENAMED_FORMULAS[formula]
    telemetries = [metrics.get("telemetry")] + [rank.get("telemetry") for rank in _held(data, "ranks", list)
                                               if isinstance(rank, dict)]
    for telemetry in telemetries:
        for device in _held(telemetry, "devices", list):
            _rename_memory_used(device)
    if spec.get("model") is not None and spec.get("max_positions") is None:
        # before --max-positions a run had its workload's positions, which the file records
        if workload.get("max_position_embeddings") is not None:
            spec["max_positions"] = workload["max_position_embeddings"]
    if metrics.get("samples_per_s") is not None and "mfu_measured_ceiling" not in metrics:
        metrics["mfu_measured_ceiling"] = None
        reasons = metrics.setdefault("unmeasured", {})
        if isinstance(reasons, dict):
            reasons.setdefault("mfu_measured_ceiling", PREDATES_CALIBRATION)
    return data


def _rename_memory_used(device: Any) -> None:
    """memory_used_mb_mean/_max (MiB, under a name that said MB) -> memory_used_mib_*."""
    if not isinstance(device, dict):
        return
    for suffix in ("_mean", "_max"):
        if f"memory_used_mb{suffix}" in device:
            device[f"memory_used_mib{suffix}"] = device.pop(f"memory_used_mb{suffix}")
    reasons = device.get("unmeasured")
    if isinstance(reasons, dict) and "memory_used_mb" in reasons:
        reasons["memory_used_mib"] = reasons.pop("memory_used_mb")


def _held(data: Any, key: str, kind: type[dict] | type[list]) -> Any:
    """data[key] when it is a ``kind`` (a dict or a list), else an empty one (changes to it go nowhere)."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, kind) else kind()


# --- 2 -> 3 ------------------------------------------------------------------------------------


def v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3 names AdamW's constants in spec.optimizer as the run options that set them
    (Megatron-LM's --adam-beta1, --adam-beta2, --adam-eps): betas [b1, b2] -> adam_beta1,
    adam_beta2; eps -> adam_eps."""
    optimizer = _held(_held(data, "spec", dict), "optimizer", dict)
    betas = optimizer.get("betas")
    if isinstance(betas, list) and len(betas) == 2:
        optimizer["adam_beta1"], optimizer["adam_beta2"] = optimizer.pop("betas")
    if "eps" in optimizer:
        optimizer["adam_eps"] = optimizer.pop("eps")
    return data


# --- 3 -> 4 ------------------------------------------------------------------------------------


def v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """Version 4 adds --profile: the spec's profile and profile_steps and the result's profile
    section (hwbench.result.model.Profile). A file before it was never profiled: profile false,
    no steps, and a null section, so that readers tell "not profiled" from a profile that failed."""
    spec = _held(data, "spec", dict)
    if spec.get("model") is not None:  # a resolved spec, not a refused point's run_args
        spec.setdefault("profile", False)
        spec.setdefault("profile_steps", None)
    if isinstance(data, dict):
        data.setdefault("profile", None)
    return data


UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: v1_to_v2, 2: v2_to_v3, 3: v3_to_v4}
