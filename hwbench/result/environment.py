"""Which differences of environment make two results' figures differ by themselves, and the
one rule that finds them (`hwbench report`, `hwbench compare`, the history's segments)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hwbench.result.model import RunResult

# Fields of `environment` that can change the figures by themselves: `hwbench report` and
# `hwbench compare` warn when the runs they put side by side differ in one of them.
# `tuning` is what the backend changed in the process (allocator, threads, TF32).
PERFORMANCE_ENVIRONMENT_FIELDS = ("torch_version", "driver_version", "cuda_version", "cann_version",
                                  "torch_npu_version", "nccl_version", "hccl_version", "deepspeed_version",
                                  "hwbench_version", "tuning")
# Of those, the ones that belong to a device kind: compared among runs of the same backend only.
PER_BACKEND_ENVIRONMENT_FIELDS = ("driver_version", "cuda_version", "cann_version", "torch_npu_version",
                                  "nccl_version", "hccl_version", "tuning")


def environment_differences(groups: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
                            fields: Sequence[str]) -> list[tuple[str, list[tuple[str, list[Any]]]]]:
    """Where groups of runs differ in the fields that change the figures: the one rule of
    `hwbench report` (each ok run a group) and `hwbench compare` (baseline and current).

    A group is (label, the fingerprints of its runs: field -> comparable value); a field a
    fingerprint leaves out is unknown for that run and not compared, and a group that knows
    no value of a field is left out of it. A field differs when the remaining groups do not
    all hold the same set of values; for each such field, in ``fields`` order, the result
    gives (label, the group's distinct values in first-seen order) for every remaining group."""
    found = []
    for field in fields:
        held = []
        for label, fingerprints in groups:
            values = list(dict.fromkeys(fingerprint[field] for fingerprint in fingerprints if field in fingerprint))
            if values:
                held.append((label, values))
        if any(set(values) != set(held[0][1]) for _, values in held[1:]):
            found.append((field, held))
    return found


def performance_fingerprint(result: RunResult) -> dict[str, str | None]:
    """The device model and performance fields of a result; a missing one is the value None
    (it differs from a known one), and a result with no environment or device knows none."""
    environment = result.environment
    if not (environment or result.device):
        return {}
    fingerprint: dict[str, str | None] = {"device_model": result.device.device_model
                                          or ", ".join(environment.device_models or [])}
    for field in PERFORMANCE_ENVIRONMENT_FIELDS:
        fingerprint[field] = environment.value_text(field)
    return fingerprint
