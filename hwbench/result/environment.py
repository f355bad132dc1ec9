"""Which differences of environment make two results' figures differ by themselves, and the
one rule that finds them (`hwbench report`, `hwbench compare`, the history's segments)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hwbench.result.model import RunResult

# Readings of the machine check before a run (`environment.preflight`, hwbench/harness/preflight.py)
# that change the figures by themselves, named `preflight.<check>`: other processes on the device,
# clocks locked or not, persistence mode, the CPU governor, NUMA balancing, transparent huge pages,
# the cgroup CPU quota, the collective libraries' settings. (Free memory, disk, swap and ECC
# counts say whether a run can be trusted at all: each run's own check warns of them.)
PREFLIGHT_FIELDS = tuple(f"preflight.{check}" for check in (
    "other_processes", "clocks", "persistence_mode", "cpu_governor", "numa_balancing", "transparent_hugepages",
    "cpu_quota", "collective_settings"))
# Fields of `environment` that can change the figures by themselves: `hwbench report` and
# `hwbench compare` warn when the runs they put side by side differ in one of them, and the history
# starts a new segment. `tuning` is what the backend changed in the process (allocator, threads, TF32).
PERFORMANCE_ENVIRONMENT_FIELDS = ("torch_version", "driver_version", "cuda_version", "cann_version",
                                  "torch_npu_version", "nccl_version", "hccl_version", "deepspeed_version",
                                  "hwbench_version", "tuning") + PREFLIGHT_FIELDS
# Of those, the ones in which runs of one point must agree to be repeats of one sample: the history
# cuts a series where they change (hwbench.history.series) and the report's decision pools only runs
# that agree in them (hwbench.report.decision). hwbench's own version is left out: a change of
# hwbench is what the history judges, not a new environment.
SAMPLE_ENVIRONMENT_FIELDS = tuple(field for field in PERFORMANCE_ENVIRONMENT_FIELDS if field != "hwbench_version")
# Of those, the ones that belong to a device kind: compared among runs of the same backend only.
PER_BACKEND_ENVIRONMENT_FIELDS = ("driver_version", "cuda_version", "cann_version", "torch_npu_version",
                                  "nccl_version", "hccl_version", "tuning", "preflight.other_processes",
                                  "preflight.clocks", "preflight.persistence_mode")


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


def sample_environment(fingerprint: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A fingerprint's SAMPLE_ENVIRONMENT_FIELDS that it knows, as (field, text): the runs of one
    point whose sample environments are equal are one sample (one thread per rank and two are not)."""
    return tuple((field, value) for field in SAMPLE_ENVIRONMENT_FIELDS
                 if isinstance(value := fingerprint.get(field), str))


def performance_fingerprint(result: RunResult) -> dict[str, str | None]:
    """The device model and performance fields of a result; a missing one is the value None
    (it differs from a known one), and a result with no environment or device knows none. A
    preflight reading is there only where the run's check read it: a run without the check (an
    older hwbench, --no-preflight) or a reading not taken on its machine is not compared."""
    environment = result.environment
    if not (environment or result.device):
        return {}
    fingerprint: dict[str, str | None] = {"device_model": result.device.device_model
                                          or ", ".join(environment.device_models or [])}
    for field in PERFORMANCE_ENVIRONMENT_FIELDS:
        if field not in PREFLIGHT_FIELDS:
            fingerprint[field] = environment.value_text(field)
    fingerprint.update(preflight_readings(result))
    return fingerprint


def preflight_readings(result: RunResult) -> dict[str, str]:
    """The result's PREFLIGHT_FIELDS that its check read, as compared text."""
    checks = result.environment.preflight.checks if result.environment.preflight else None
    readings = {f"preflight.{check.name}": check.value for check in checks or [] if check.value is not None}
    return {field: readings[field] for field in PREFLIGHT_FIELDS if field in readings}
