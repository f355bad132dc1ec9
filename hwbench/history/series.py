"""Series: the nights of one benchmark point and one metric, cut into segments where the
environment changed.

A series is identified by the point (hwbench.report.compare.point_key: workload, device
model, layout, precision, batch, engine, ...) and the metric. Its observations are
nights: the ok runs of the point that started on the same UTC date under the same commit
and environment (a sweep's repeats), summarised by their median. A segment ends where
the environment fingerprint changes in a field that moves figures by itself (driver,
CUDA/CANN, NCCL/HCCL, torch, torch_npu, DeepSpeed, the backend's tuning): such a change
is named, and change points are looked for inside segments only.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from typing import Any

from hwbench.history.store import StoredRun, utc_instant
from hwbench.report.compare import METRICS
from hwbench.results import PERFORMANCE_ENVIRONMENT_FIELDS, environment_differences
from hwbench.units import human_bytes

# hwbench's own version is left out: a change of hwbench is what the history judges, not
# a new environment. The device model is part of the series key already.
SEGMENT_FIELDS = tuple(field for field in PERFORMANCE_ENVIRONMENT_FIELDS if field != "hwbench_version")

METRIC_LABELS = {"tokens_per_s": "tokens/s", "samples_per_s": "samples/s", "tflops_per_device": "TFLOP/s per device",
                 "mfu": "MFU", "step_time_median": "median step time", "peak_memory": "peak memory"}


def stored_name(metric: str) -> str:
    """The dotted name a metric of `hwbench compare` is stored under (store.flat_metrics)."""
    return ".".join(METRICS[metric][0])


@dataclasses.dataclass
class Night:
    """One observation of a series: the ok runs of one night, commit and environment."""

    night: str
    commit: str | None
    started_at: str  # of its first run
    values: list[float]
    run_ids: list[str]
    fingerprint: dict[str, str | None]

    @property
    def value(self) -> float:
        return statistics.median(self.values)


@dataclasses.dataclass
class Segment:
    nights: list[Night]
    # (field, values before, values from here on) where this segment's environment differs
    # from the previous segment's; empty for the first
    environment_change: list[tuple[str, list[Any], list[Any]]]


@dataclasses.dataclass
class Series:
    metric: str
    point: dict[str, Any]
    label: str
    segments: list[Segment]

    @property
    def nights(self) -> list[Night]:
        return [night for segment in self.segments for night in segment.nights]


def series_of(runs: list[StoredRun], metric: str) -> list[Series]:
    """Every series with at least one ok value of ``metric`` (compare's name), in label order."""
    by_point: dict[tuple, list[StoredRun]] = defaultdict(list)
    for run in runs:
        if run.status == "ok" and run.value is not None:
            by_point[tuple(run.point.values())].append(run)
    labels = _labels([runs[0].point for runs in by_point.values()])
    found = [Series(metric, point_runs[0].point, f"{METRIC_LABELS[metric]} of {label}",
                    segments_of(nights_of(point_runs)))
             for point_runs, label in zip(by_point.values(), labels)]
    return sorted(found, key=lambda series: series.label)


def nights_of(runs: list[StoredRun]) -> list[Night]:
    """Runs (oldest first) grouped into nights: same UTC date, commit and fingerprint."""
    grouped: dict[tuple, Night] = {}
    for run in runs:
        group = (run.night, run.commit, tuple(sorted(run.fingerprint.items())))
        if group not in grouped:
            grouped[group] = Night(run.night, run.commit, run.started_at, [], [], run.fingerprint)
        grouped[group].values.append(run.value)
        grouped[group].run_ids.append(run.run_id)
    return sorted(grouped.values(), key=lambda night: utc_instant(night.started_at))



def segments_of(nights: list[Night]) -> list[Segment]:
    """Nights cut where the environment changes in a SEGMENT_FIELDS field (a field one of two
    fingerprints does not know is not compared: hwbench.results.environment_differences)."""
    segments: list[Segment] = []
    for night in nights:
        change = []
        if segments:
            before = segments[-1].nights[-1].fingerprint
            change = [(field, held[0][1], held[1][1]) for field, held in
                      environment_differences([("before", [before]), ("after", [night.fingerprint])], SEGMENT_FIELDS)]
        if not segments or change:
            segments.append(Segment([night], change))
        else:
            segments[-1].nights.append(night)
    return segments


def point_label(point: dict[str, Any]) -> str:
    """'1.3b on NVIDIA H100 TP2 PP2 bf16': what a reader needs to recognise the point."""
    layout = " ".join(f"{name.upper()}{point[name]}" for name in ("tp", "pp", "dp") if (point.get(name) or 1) > 1)
    text = f"{point['model']} on {point['device_model'] or point['backend']}"
    text += f" {layout}" if layout else ""
    text += f" {point['precision']}"
    if point.get("engine") not in (None, "native"):
        text += f" {point['engine']} ZeRO-{point.get('zero_stage')}"
    for flag in ("fsdp", "recompute", "compile"):
        if point.get(flag):
            text += f" {flag}"
    return text


def _labels(points: list[dict[str, Any]]) -> list[str]:
    """point_label, with batch, sequence, data and steps added where two points would
    otherwise read the same."""
    short = [point_label(point) for point in points]
    repeated = {label for label in short if short.count(label) > 1}
    return [label + (f" (mb{point['micro_batch_size']} gb{point['global_batch_size']} s{point['seq_length']}, "
                     f"{point['data']}, {point['steps']} steps, nodes {point['nnodes']})" if label in repeated else "")
            for label, point in zip(short, points)]


def format_value(metric: str, value: float | None) -> str:
    """A figure of ``metric`` as people read it: 1,633 tokens/s, 462.7 ms, 1.3 GiB, 41.2%."""
    if value is None:
        return "-"
    if metric == "step_time_median":
        return f"{value * 1000:,.1f} ms"
    if metric == "peak_memory":
        return human_bytes(value)
    if metric == "mfu":
        return f"{value * 100:.1f}%"
    return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"


def short_commit(commit: str | None) -> str:
    return commit[:7] if commit else "unknown commit"
