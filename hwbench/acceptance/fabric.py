"""`hwbench accept`'s fabric: when the baseline holds collectives (`hwbench baseline save` of
`hwbench collectives` results), the same collectives measured between the ranks of this node,
small sizes by default, with the ring of send/recv pairs that names a slow link; each result
written to OUT/collectives/ and judged against the baseline (hwbench/judge/collectives_baseline.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from hwbench.errors import UsageError
from hwbench.fabric.collectives import (
    COLLECTIVES,
    MAX_SLOW_THRESHOLD,
    CollectiveSettings,
    check_message_bytes,
    check_sizes,
)
from hwbench.judge.collectives_baseline import CollectivesBaselinePoint
from hwbench.result.collectives import CollectivesResult
from hwbench.units import human_bytes

DEFAULT_MIN_BYTES = 4 * 2 ** 10  # small: a fabric check of seconds, not nccl-tests' sweep to 64 MiB
DEFAULT_MAX_BYTES = 2 ** 20
DEFAULT_RING_BYTES = 2 ** 20
DEFAULT_SLOW_THRESHOLD = 0.25  # as `hwbench collectives --slow-threshold`
WARMUP, ITERATIONS = 2, 10
TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class FabricOptions:
    min_bytes: int = DEFAULT_MIN_BYTES
    max_bytes: int = DEFAULT_MAX_BYTES
    ring_bytes: int = DEFAULT_RING_BYTES
    slow_threshold: float = DEFAULT_SLOW_THRESHOLD

    def __post_init__(self) -> None:  # the checks and words of `hwbench collectives`' own options
        check_sizes(self.min_bytes, self.max_bytes, "--fabric-min-bytes", "--fabric-max-bytes")
        check_message_bytes(self.ring_bytes, "--ring-bytes")
        if not isinstance(self.slow_threshold, (int, float)) or not 0 <= self.slow_threshold < MAX_SLOW_THRESHOLD:
            raise UsageError(f"--slow-threshold {self.slow_threshold!r} is not accepted; give a fraction such as "
                             f"25% or 0.25, below {MAX_SLOW_THRESHOLD:.0%}")


def fabric_jobs(entries: list[CollectivesBaselinePoint], device: str | None, options: FabricOptions) -> list:
    """One CollectivesJob per number of ranks the baseline's collectives were measured on (this node's
    only: a baseline of several hosts is refused before anything is measured); none without collectives."""
    from hwbench.fabric.launch import CollectivesJob
    from hwbench.fabric.ring import RingSettings

    if not entries:
        return []
    local = [entry for entry in entries if entry.key.hosts == 1]
    if not local:
        raise UsageError("--baseline: its collectives were measured across several hosts; hwbench accept measures "
                         "the collectives between the ranks of this node: give a baseline of one host's")
    jobs = []
    for world in sorted({entry.key.world_size for entry in local}):
        ours = [entry for entry in local if entry.key.world_size == world]
        names = tuple(name for name in COLLECTIVES if any(entry.collective == name for entry in ours))
        settings = CollectiveSettings(names, options.min_bytes, options.max_bytes, WARMUP, ITERATIONS, True,
                                      TIMEOUT_S)
        ring = RingSettings(options.ring_bytes, WARMUP, ITERATIONS, options.slow_threshold)
        jobs.append(CollectivesJob(device or ours[0].key.device, world, settings, ring))
    return jobs


def measure_fabric(jobs: list, out_dir: Path, say: Callable[[str], None]) -> list[CollectivesResult]:
    """Each job run and its result written under ``out_dir``/collectives/."""
    from hwbench.fabric.launch import run_collectives
    from hwbench.result.collectives import write_collectives

    results = []
    for job in jobs:
        say(f"collectives: {', '.join(job.settings.collectives)} on {job.nproc_per_node} ranks, "
            f"{human_bytes(job.settings.min_bytes)} to {human_bytes(job.settings.max_bytes)}, and the ring")
        result = run_collectives(job)
        write_collectives(result, out_dir / "collectives")
        results.append(result)
    return results
