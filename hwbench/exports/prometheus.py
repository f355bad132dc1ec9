"""Prometheus and OpenMetrics text of the figures, through prometheus_client: a gauge per
figure of hwbench.metrics.METRICS (its entry's `gauge`) in base units, named and labelled by
Prometheus' conventions (prometheus.io/docs/practices/naming: the `hwbench_` prefix, the unit last, `_ratio` for a
fraction); one sample per benchmark point, labelled with the point's settings (its PointKey),
the median of its repeats (`stand_in="simulated"` where a stand-in ran the device's code path
on the host, so that a query for the real device's series can leave it out); and the busbw of
`hwbench collectives` results, one sample per collective, form, size and scope, labelled with its
CollectiveKey, the median of the results that share it. Written for
node_exporter's textfile collector (Prometheus text format, no timestamps, which that collector
refuses) or pushed to a Pushgateway.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hwbench.exports import PushError, redacted, without_credentials
from hwbench.exports.figures import PointFigures, collective_figures, flops_formula, point_figures, unix_time
from hwbench.metrics import BUSBW, METRICS, Gauge
from hwbench.result.collectives import CollectiveKey, CollectivesResult

RUNS = Gauge("hwbench_point_runs", "Ok runs of the point the figures are the median of")
LAST_RUN = Gauge("hwbench_point_last_finished_timestamp_seconds", "When the point's latest run finished (Unix time)",
                 "seconds")


def _text(value: Any) -> str:
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def label_values(point: PointFigures) -> dict[str, str]:
    """The point's settings as label values (an unknown one empty, which Prometheus treats as
    absent; `stand_in` "simulated" where a stand-in ran the device's code path)."""
    return {name: _text(value) for name, value in zip(point.key.fields(), point.key.values())}


def collective_labels(key: CollectiveKey) -> dict[str, str]:
    """A busbw series' key as label values: device, device_model, dist_backend, world_size, hosts,
    dtype, scope, collective, in_place, size_bytes."""
    return {name: _text(value) for name, value in zip(key.fields(), key.values())}


class PointCollector:
    """The prometheus_client collector of the points' gauges, and of the collectives results' busbw."""

    def __init__(self, runs: list, collectives: list[CollectivesResult] | None = None) -> None:
        self.points = point_figures(runs)
        self.busbw = collective_figures(collectives or [])

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        labels = list(label_values(self.points[0])) if self.points else []
        for metric in METRICS.values():  # each figure's gauge is in its registry entry: none can be left out
            gauge = metric.gauge
            extra = ["flops_formula"] if metric.per_formula else []
            family = GaugeMetricFamily(gauge.name, gauge.help, labels=labels + extra, unit=gauge.unit)
            for point in self.points:
                figure = point.figure(metric)
                if figure is not None:
                    values = list(label_values(point).values()) + ([flops_formula()] if extra else [])
                    family.add_metric(values, figure.value * gauge.factor)
            if family.samples:  # a figure no point has (MFU without a known peak) is left out
                yield family
        runs = GaugeMetricFamily(RUNS.name, RUNS.help, labels=labels)
        last = GaugeMetricFamily(LAST_RUN.name, LAST_RUN.help, labels=labels, unit=LAST_RUN.unit)
        for point in self.points:
            runs.add_metric(list(label_values(point).values()), len(point.runs))
            finished = [unix_time(run.finished_at) for run in point.runs]
            if any(time is not None for time in finished):
                last.add_metric(list(label_values(point).values()), max(t for t in finished if t is not None))
        yield runs
        yield last
        if self.busbw:
            gauge = BUSBW.gauge
            labels = list(collective_labels(self.busbw[0].key))
            family = GaugeMetricFamily(gauge.name, gauge.help, labels=labels, unit=gauge.unit)
            for found in self.busbw:
                family.add_metric(list(collective_labels(found.key).values()), found.figure.value * gauge.factor)
            yield family


def registry_of(runs: list, collectives: list[CollectivesResult] | None = None):
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(PointCollector(runs, collectives))
    return registry


def render(fmt: str, runs: list, files: list, request: Any, collectives: list[CollectivesResult] | None = None) -> str:
    from prometheus_client import exposition
    from prometheus_client.openmetrics import exposition as openmetrics

    writer = openmetrics.generate_latest if fmt == "openmetrics" else exposition.generate_latest
    return writer(registry_of(runs, collectives)).decode("utf-8")


def push(fmt: str, runs: list, request: Any, collectives: list[CollectivesResult] | None = None) -> None:
    """The gauges to the Pushgateway at ``request.push`` under job ``request.job`` (replacing
    what that job pushed before); PushError when it cannot take them. A user and password in
    the URL go as HTTP basic auth and are never shown."""
    import functools
    import http.client

    from prometheus_client import push_to_gateway
    from prometheus_client.exposition import basic_auth_handler, default_handler

    url, user, password = without_credentials(request.push)
    handler = default_handler if user is None else functools.partial(basic_auth_handler, username=user,
                                                                     password=password)
    try:
        push_to_gateway(url, job=request.job, registry=registry_of(runs, collectives), timeout=10, handler=handler)
    except (OSError, http.client.HTTPException) as error:  # URLError, HTTPError, refused, timed out; not HTTP
        raise PushError(f"--push {redacted(request.push)}: the Pushgateway did not take the metrics "
                        f"({_reason(error, password)}); the result files are unchanged") from None


def _reason(error: Exception, secret: str | None) -> str:
    """Why the push failed, in one short line without the password: an answer that is not
    HTTP (a traceback page, another protocol) is named as such, not quoted."""
    import http.client
    import urllib.error

    if isinstance(error, urllib.error.HTTPError):
        reason = f"HTTP {error.code} {error.reason}"
    elif isinstance(error, http.client.HTTPException) and not isinstance(error, OSError):
        reason = f"its answer is not HTTP: {type(error).__name__}"
    else:
        reason = str(getattr(error, "reason", None) or getattr(error, "strerror", None) or error)
    if secret:
        reason = reason.replace(secret, "***")
    return " ".join(reason.split())[:200]
