"""`hwbench accept`'s judgement (its page: hwbench.report.accept): is a delivered system what it should be?

Two rules, both must hold (docs/accept.md):

- outliers: each device's figures (GEMM rate, copy bandwidth, a short training point's tokens/s;
  hwbench/acceptance/device_probe.py), each judged on its own, against the median of its peers (the
  other devices of its model, of every node probed), and each node's median against the other
  nodes'. One more than ``outlier`` below in any figure is named with that figure. A device's
  figure is the best of its repetitions: other work on a machine only ever lowers a rate, so the best one is
  the device's own; the repetitions' median and spread are shown beside it.
- baseline: every point of the suite at or above ``min_ratio`` of its baseline figure
  (tokens/s, the median of the point's ok repeats against the baseline's median). A point that
  failed is a FAIL with its cause; a point the baseline lacks is named, exit 4. A point at
  ``FAR_ABOVE`` its baseline or more passes with a note: the baseline may be stale or wrong.

The warnings and failures of the machine's checks (hwbench preflight: before the probes, and each
point's own) are shown beside the verdict: a PASS measured on a machine that warned is a PASS
with those warnings, not a clean one.

Before both, each device's health as its management library reports it (hwbench.device.health's
judgement, as `hwbench preflight` shows it): a device with uncorrectable memory errors, a pending
or failed page retirement or row remap, a link down or a PCIe link trained narrower than it
allows is a FAIL, named first.

Exit status: 0 PASS, 3 FAIL, 4 when the only fault is points missing from the baseline.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from hwbench.device.health import FAIL, NodeHealth
from hwbench.judge.baseline import METRIC, Baseline
from hwbench.judge.collectives_baseline import FabricOutcome, judge_collectives, slow_link_failures
from hwbench.judge.compare import MISSING_EXIT, REGRESSION_EXIT
from hwbench.metrics import METRICS
from hwbench.point import PointKey
from hwbench.result.collectives import CollectivesResult
from hwbench.units import bandwidth_text, flops_rate_text

DEFAULT_MIN_RATIO = 0.95
DEFAULT_OUTLIER = 0.05
# A point this far above its baseline passes, but so far above is more likely a baseline measured
# on another machine, software or settings, or in a slow moment, than a faster delivery: said.
FAR_ABOVE = 1.2
FEW_REPEATS = 3  # fewer ok repeats than this: one slow or fast run decides the point's median
FAIL_EXIT = REGRESSION_EXIT  # 3, as compare's regression
PROBED = "fp32 GEMM rate, copy bandwidth (read + written) and a short training point's tokens/s"
PROBE_FIGURES = (("gemm_flops", "GEMM rate", flops_rate_text), ("copy_bytes_per_s", "copy bandwidth", bandwidth_text),
                 ("training_tokens_per_s", "training", METRICS[METRIC].text))


@dataclasses.dataclass
class PointOutcome:
    name: str  # the suite's point name
    label: str
    values: list[float]  # tokens/s of its ok repeats
    statuses: list[str]
    baseline: float | None = None
    ratio: float | None = None
    straggler: str = ""  # the slowest rank of its multi-rank results, against the median rank
    cause: str | None = None  # why it failed
    verdict: str = ""
    note: str = ""  # far above its baseline: the baseline may be stale or wrong


@dataclasses.dataclass
class Acceptance:
    passed: bool
    exit_status: int
    failures: list[str]  # one line each: what failed and by how much
    missing: list[str]  # points of the run the baseline lacks
    probes: list[dict[str, Any]]
    outliers: list[str]
    points: list[PointOutcome]
    baseline: Baseline
    min_ratio: float
    outlier: float
    preflight: list[str] = dataclasses.field(default_factory=list)  # the checks' warnings and failures, once each
    notes: list[str] = dataclasses.field(default_factory=list)  # points far above their baseline
    fabric: FabricOutcome | None = None  # the collectives against the baseline's, when it holds them
    fabric_results: list[CollectivesResult] = dataclasses.field(default_factory=list)
    health: list[NodeHealth] = dataclasses.field(default_factory=list)  # each node's devices, read before timing

    @property
    def single_devices(self) -> list[str]:
        """The devices probed with no peer: no other device of their model to be judged against."""
        models = [p.get("device_model") for p in self.probes if not p.get("error")]
        return [_device_name(p) for p in self.probes if not p.get("error") and models.count(p.get("device_model")) == 1]


def _node(probe: dict[str, Any]) -> str:
    """The device's node: its Slurm node name when probed by a Slurm job, else its host name."""
    return probe.get("node") or probe["host"]


def _device_name(probe: dict[str, Any]) -> str:
    """A device, or a node when the record is a node's (its probe job failed: no device index)."""
    return f"node {_node(probe)}" if probe.get("index") is None else f"device {probe['index']} of {_node(probe)}"


def _best(probe: dict[str, Any], figure: str) -> float | None:
    rate = probe.get(figure) or {}
    return rate.get("max") if rate.get("median") is not None else None


def device_outliers(probes: list[dict[str, Any]], threshold: float) -> list[str]:
    """Each device, then each node, more than ``threshold`` below the median of its peers, named."""
    named = []
    for figure, title, text in PROBE_FIGURES:
        best = {index: value for index, probe in enumerate(probes) if (value := _best(probe, figure)) is not None}
        for index, value in best.items():
            probe = probes[index]
            peers = [v for i, v in best.items() if i != index and probes[i]["device_model"] == probe["device_model"]]
            if not peers:
                continue
            typical = statistics.median(peers)
            if value < (1 - threshold) * typical:
                rate = probe[figure]
                named.append(f"{_device_name(probe)} ({probe['device_model']}): {title} {text(value)}, "
                             f"{1 - value / typical:.1%} below its peers' median {text(typical)} (repeats: median "
                             f"{text(rate['median'])}, {text(rate['min'])} to {text(rate['max'])}, n={rate['n']})")
        hosts = sorted({_node(probes[i]) for i in best})
        node_figure = {host: statistics.median(v for i, v in best.items() if _node(probes[i]) == host)
                       for host in hosts}
        for host in hosts if len(hosts) > 1 else ():
            typical = statistics.median(v for h, v in node_figure.items() if h != host)
            if node_figure[host] < (1 - threshold) * typical:
                named.append(f"node {host}: {title} {text(node_figure[host])} (median of its devices), "
                             f"{1 - node_figure[host] / typical:.1%} below the other nodes' median {text(typical)}")
    return named


def _straggler(results: list[Any]) -> str:
    stragglers = [r.metrics.straggler for r in results if r.status == "ok" and r.metrics.straggler
                  and r.metrics.straggler.ratio]
    if not stragglers:
        return ""
    worst = max(stragglers, key=lambda s: s.ratio)
    return f"rank {worst.rank}: x{worst.ratio:.3f} of the median rank's step"


def _cause(results: list[Any]) -> str:
    for result in results:
        if result.status != "ok":
            message = (result.error.message if result.error else None) or "no message"
            return f"{result.status}: {message.strip().splitlines()[-1] if message.strip() else message}"
    return "no tokens/s figure"


def judge_points(records: list[tuple[str, list[Any]]], baseline: Baseline, min_ratio: float
                 ) -> tuple[list[PointOutcome], list[str]]:
    """Each suite point (its name and results) against the baseline; the labels the baseline lacks."""
    from hwbench.judge.compare import point_label

    keys = [r.point_key for _, results in records for r in results if r.point_key is not None]
    outcomes, missing = [], []
    for name, results in records:
        key: PointKey | None = next((r.point_key for r in results if r.point_key is not None), None)
        label = point_label(key, set(), keys) if key else name
        values = [v for r in results if r.status == "ok" and (v := r.metrics.tokens_per_s) is not None]
        outcome = PointOutcome(name, label, values, [r.status for r in results], straggler=_straggler(results))
        if not values:
            outcome.cause = _cause(results) if results else "no result"
            outcome.verdict = "FAIL"
        entry = baseline.figure(key) if key else None
        if entry is None:
            if values:
                outcome.verdict = "no baseline"
                missing.append(f"{name}: {label}")
        else:
            outcome.baseline = entry.median
            if values:
                outcome.ratio = statistics.median(values) / entry.median
                outcome.verdict = "PASS" if outcome.ratio >= min_ratio else "FAIL"
                outcome.note = _far_above(outcome, entry.n)
        outcomes.append(outcome)
    return outcomes, missing


def _far_above(outcome: PointOutcome, baseline_n: int | None) -> str:
    """The note of a point at FAR_ABOVE its baseline or more, else ''."""
    if outcome.ratio is None or outcome.ratio < FAR_ABOVE:
        return ""
    few = len(outcome.values) < FEW_REPEATS or (baseline_n is not None and baseline_n < FEW_REPEATS)
    counted = f"n={baseline_n} in the baseline" if baseline_n is not None else "the baseline gives no count"
    times = _ratio_text(outcome.ratio, 0) + (" its" if outcome.ratio >= 100 else " of its")
    return (f"point {outcome.name}: {times} baseline (n={len(outcome.values)} here, "
            f"{counted}): the baseline may be stale or wrong "
            "(another machine, software or settings, or a slow moment); check it or save one from runs you trust"
            + (f", and give --repeats {FEW_REPEATS} or more: one run decides a median of so few" if few else ""))


def _ratio_text(ratio: float, decimals: int) -> str:
    """126%; a ratio against a baseline of next to nothing in three digits, not three hundred."""
    return f"{ratio:.{decimals}%}" if ratio < 100 else f"{ratio:,.3g} times"


def preflight_findings(checked_first: Any, records: list[tuple[str, list[Any]]]) -> list[str]:
    """The warnings and failures of the machine's checks: ``checked_first`` (a PreflightReport,
    before the probes; None: not checked) and each point's own (its results' environment.preflight),
    each check and cause once (its first reading; how many others it had), with where it was found."""
    from hwbench.harness.preflight import findings

    found: dict[tuple, tuple[str, list[str], set[str]]] = {}  # (status, name, reason): text, places, readings
    checks = [("before the probes", checked_first.checks if checked_first is not None else [])]
    checks += [(f"at point {name}", (r.environment.preflight.checks or []) if r.environment.preflight else [])
               for name, results in records for r in results]
    for place, point_checks in checks:
        for check in point_checks:
            for finding in findings([check]):
                text, places, readings = found.setdefault((check.status, check.name, check.reason),
                                                          (finding, [], set()))
                readings.add(str(check.reading))
                if place not in places:
                    places.append(place)
    return [text + (f" (and {len(readings) - 1} other reading(s))" if len(readings) > 1 else "")
            + f"; found {', '.join(places)}" for text, places, readings in found.values()]


def judge(probes: list[dict[str, Any]], records: list[tuple[str, list[Any]]],
          baseline: Baseline, min_ratio: float = DEFAULT_MIN_RATIO, outlier: float = DEFAULT_OUTLIER,
          checked_first: Any = None, fabric: list[CollectivesResult] | None = None,
          health: list[NodeHealth] | None = None) -> Acceptance:
    """The acceptance of ``probes``, the suite's ``records`` and the ``fabric``'s collectives results
    against ``baseline``; ``checked_first``: the machine's check before the probes (a PreflightReport), when made;
    ``health``: each node's devices as their management library read them before any timing (a failing
    device is a FAIL, named first)."""
    outliers = device_outliers(probes, outlier)
    points, missing = judge_points(records, baseline, min_ratio)
    failures = [node.where(finding) for node in health or [] for finding in node.findings if finding.severity == FAIL]
    failures += [f"{_device_name(p)}: its probe failed: {p['error']}" for p in probes if p.get("error")]
    failures += outliers
    for point in points:
        if point.cause:
            failures.append(f"point {point.name}: {point.cause}")
        elif point.verdict == "FAIL" and point.baseline is not None and point.ratio is not None:
            failures.append(f"point {point.name}: {point.ratio:.1%} of its baseline "
                            f"({METRICS[METRIC].text(statistics.median(point.values))} against "
                            f"{METRICS[METRIC].text(point.baseline)}), below {min_ratio:.0%}")
    fabric_outcome = judge_collectives(fabric, baseline.collectives, min_ratio) if fabric else None
    if fabric_outcome is not None:
        failures += fabric_outcome.failures + slow_link_failures(fabric or [])
        missing = missing + fabric_outcome.missing
    exit_status = FAIL_EXIT if failures else MISSING_EXIT if missing else 0
    return Acceptance(exit_status == 0, exit_status, failures, missing, probes, outliers, points,
                      baseline, min_ratio, outlier, preflight_findings(checked_first, records),
                      [point.note for point in points if point.note], fabric_outcome, fabric or [], health or [])
