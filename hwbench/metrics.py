"""The metric registry: one entry per figure that runs are compared by (``METRICS``). An entry
says where the figure is read from in a result, whether higher is better, its unit (and through
it how people read it: one formatter per unit, so compare, accept, CI output and the history
write a figure alike), its name in the report's runs table and its names in every export
(Prometheus/OpenMetrics gauge, github-action-benchmark, Bencher). The consumers loop over
``METRICS``: a figure added here reaches them all, and one an export cannot name cannot be
declared. docs/results.md lists the entries."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

from hwbench.units import human_bytes


def _number(value: float) -> str:
    """1,633 and 12.3: whole numbers from 100 up, three significant digits below; a figure of 1e15
    or more is no real rate (a damaged or hand-made result): three digits, not 300."""
    if abs(value) >= 1e15:
        return f"{value:.3g}"
    return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _binary_axis(values: Iterable[float]) -> tuple[float, str]:
    """Bytes in the binary unit of the largest figure (B ... TiB), as human_bytes writes it."""
    largest = max((abs(value) for value in values if math.isfinite(value)), default=0.0)
    power = min(4, max(0, int(math.log(largest, 1024)))) if largest >= 1 else 0
    return 1024.0 ** -power, f" {('B', 'KiB', 'MiB', 'GiB', 'TiB')[power]}"


def _seconds(value: float) -> str:
    """A step time under a second in ms (462.7 ms, not 0.4627 s), one of a second or more in s
    (1.952 s; from 1,000 s whole, as _number writes it)."""
    if abs(value) < 1:
        return f"{value * 1000:,.1f} ms"
    return f"{value:,.4g} s" if abs(value) < 1000 else f"{_number(value)} s"


def _seconds_axis(values: Iterable[float]) -> tuple[float, str]:
    """ms where every figure is under a second, else s: the unit _seconds writes the largest in."""
    largest = max((abs(value) for value in values if math.isfinite(value)), default=0.0)
    return (1000.0, " ms") if largest < 1 else (1.0, " s")


@dataclasses.dataclass(frozen=True)
class Unit:
    """A figure's unit: its name where a machine reads it (compare's JSON, github-action-benchmark),
    how people read a figure of it, and the scale a chart's axis shows it in."""

    name: str
    text: Callable[[float], str]  # a finite figure as people read it, unit included
    axis: Callable[[Iterable[float]], tuple[float, str]]  # (factor, suffix): figure x factor is the tick's number


def _rate(name: str) -> Unit:
    return Unit(name, lambda value: f"{_number(value)} {name}", lambda values: (1.0, ""))


TOKENS_PER_S = _rate("tokens/s")
SAMPLES_PER_S = _rate("samples/s")
TFLOPS = _rate("TFLOP/s")
FRACTION = Unit("fraction", lambda value: f"{value:.1%}", lambda values: (100.0, "%"))
# a ratio of two like figures, 1 at parity (an MoE layer's busiest expert over the mean: 1.23x)
TIMES = Unit("ratio", lambda value: f"{value:.3g}x", lambda values: (1.0, "x"))
SECONDS = Unit("s", _seconds, _seconds_axis)
BYTES = Unit("bytes", human_bytes, _binary_axis)


@dataclasses.dataclass(frozen=True)
class Gauge:
    """A figure's Prometheus/OpenMetrics gauge (prometheus.io/docs/practices/naming: the
    `hwbench_` prefix, the unit last, `_ratio` for a fraction)."""

    name: str
    help: str
    unit: str = ""  # OpenMetrics' UNIT; the name ends with it
    factor: float = 1.0  # to the base unit


@dataclasses.dataclass(frozen=True)
class Metric:
    """A figure compared between runs: read from ``result.metrics`` along ``path`` (also the
    dotted name the history stores it under)."""

    name: str  # compare's and history's --metric; the github-action-benchmark/Bencher names derive from it
    path: tuple[str, ...]
    higher_is_better: bool
    unit: Unit
    label: str  # how people name it: report column header, series title, CI benchmark name
    column: str  # its column in the report's runs table (hwbench.report.runs.run_row)
    gauge: Gauge
    per_formula: bool = False  # TFLOP/s and MFU: counted by a FLOPs formula (metrics.by_formula holds each)

    @property
    def stored_name(self) -> str:
        return ".".join(self.path)

    @property
    def bencher_name(self) -> str:
        """Its Bencher measure slug: the name in kebab case."""
        return self.name.replace("_", "-")

    def text(self, value: float | None) -> str:
        """A figure as people read it, unit included: 1,633 tokens/s, 462.7 ms, 1.3 GiB, 41.2%; "-" for none."""
        return "-" if value is None else self.unit.text(value)

    def read(self, result: Any, formula: str | None = None) -> float | None:
        """The figure of a RunResult, or None when it has none (not measured, not a finite number).
        ``formula``: a figure that depends on the FLOPs formula as counted by that one (from
        metrics.by_formula when the run's own formula is another), so that runs counted by
        different formulas are compared alike."""
        value = result.metrics
        if self.per_formula and formula is not None and result_formula(result) != formula:
            value = (value.by_formula or {}).get(formula) if value is not None else None
        for part in self.path:
            value = getattr(value, part, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value)


def result_formula(result: Any) -> str | None:
    """The canonical name of the FLOPs formula a result's own figures use."""
    from hwbench.workload.flops import FLOPS_FORMULA_ALIASES

    own = result.metrics.flops_formula if result.metrics is not None else None
    return FLOPS_FORMULA_ALIASES.get(own, own) if isinstance(own, str) else None


METRICS: dict[str, Metric] = {
    metric.name: metric
    for metric in (
        Metric("tokens_per_s", ("tokens_per_s",), True, TOKENS_PER_S, "tokens/s", "tokens_per_s",
               Gauge("hwbench_throughput_tokens_per_second", "Tokens trained per second, all devices")),
        Metric("samples_per_s", ("samples_per_s",), True, SAMPLES_PER_S, "samples/s", "samples_per_s",
               Gauge("hwbench_throughput_samples_per_second", "Samples trained per second, all devices")),
        Metric("tflops_per_device", ("tflops_per_device",), True, TFLOPS, "TFLOP/s per device", "tflops_per_device",
               Gauge("hwbench_model_flops_per_device_per_second",
                     "Model FLOPs per second per device (the flops_formula label's count)", factor=1e12),
               per_formula=True),
        Metric("mfu", ("mfu",), True, FRACTION, "MFU", "mfu",
               Gauge("hwbench_mfu_ratio", "Model FLOPs utilization against the device's peak (0 to 1)", "ratio"),
               per_formula=True),
        Metric("step_time_median", ("step_time_s", "median"), False, SECONDS, "median step time", "step_time_median_s",
               Gauge("hwbench_step_time_median_seconds", "Median time of a timed optimizer step", "seconds")),
        Metric("peak_memory", ("memory", "peak_reserved_bytes"), False, BYTES, "peak memory", "peak_reserved_bytes",
               Gauge("hwbench_memory_peak_bytes", "Peak memory reserved on a device in the timed steps", "bytes")),
        # a mixture-of-experts run's: more time in expert parallelism's all-to-alls, or tokens piled on
        # fewer experts (the busiest one sets the pace of its layer), is a slower run
        Metric("all_to_all_share", ("expert_parallel", "all_to_all_share"), False, FRACTION, "all-to-all share",
               "all_to_all_share",
               Gauge("hwbench_expert_parallel_all_to_all_ratio",
                     "Share of the timed steps spent in expert parallelism's all-to-alls, every rank (0 to 1)",
                     "ratio")),
        Metric("moe_imbalance", ("routing", "imbalance_median"), False, TIMES, "expert imbalance", "moe_imbalance",
               Gauge("hwbench_moe_expert_imbalance",
                     "Tokens of the busiest expert over the mean per expert (worst MoE layer, median step; 1: even)")),
    )
}

# nccl-tests' bus bandwidth of a collective (hwbench collectives, docs/collectives.md), in GB/s (10^9):
# a figure of collectives results' rows, not of a run's metrics, so apart from METRICS, whose entries
# every run reader loops over; compare, the history and the exports read it from here
GBS = Unit("GB/s", lambda value: f"{value:,.3f} GB/s", lambda values: (1.0, " GB/s"))
BUSBW = Metric("busbw", ("busbw_gbs",), True, GBS, "bus bandwidth", "busbw_gbs",
               Gauge("hwbench_collective_bus_bandwidth_bytes_per_second", "nccl-tests' busbw of a collective",
                     "bytes_per_second", factor=1e9))
COLLECTIVE_METRICS: dict[str, Metric] = {BUSBW.name: BUSBW}


def metric_named(name: str) -> Metric:
    """The registry's entry of ``name``: a run's figure or a collective's."""
    return METRICS[name] if name in METRICS else COLLECTIVE_METRICS[name]
