"""`hwbench compare` of collectives results: the bus bandwidth of each collective, form and size,
baseline against current, judged by compare's rules (threshold and significance, compare_point);
busbw is higher-is-better, so a fall past the threshold is a regression (exit 3, as for runs).

Results are matched by their point key (device, device model, collective backend, ranks, hosts,
element type) and, within it, by collective, form (in or out of place) and size; several files
of one point on a side (repeats, nights) form its sample. A point whose current results are not
ok, or whose check found wrong values, is a regression whatever its bandwidth."""

from __future__ import annotations

import statistics
from typing import Any

from tabulate import tabulate

from hwbench.judge.compare import MISSING_EXIT, REGRESSION_EXIT, PointComparison, compare_point
from hwbench.metrics import BUSBW
from hwbench.result.collectives import CollectiveKey, CollectivesResult


def _samples(results: list[CollectivesResult]) -> tuple[dict[CollectiveKey, list[float]],
                                                        dict[CollectiveKey, list[str]]]:
    """Each row's busbw over the results, and each row's statuses ("wrong values" for a failed check;
    a failed or timed-out result, which has no rows, counts against every row of its point)."""
    figures: dict[CollectiveKey, list[float]] = {}
    statuses: dict[CollectiveKey, list[str]] = {}
    for result in results:
        for row in result.rows:
            key = CollectiveKey.of(result, row)
            status = "wrong values" if row.wrong else result.status
            statuses.setdefault(key, []).append(status)
            if status == "ok" and row.busbw_gbs is not None:
                figures.setdefault(key, []).append(row.busbw_gbs)
    for result in results:
        if result.status != "ok":
            for key in [k for k in statuses if k.point_key == result.point_key]:
                statuses[key].append(result.status)
    return figures, statuses


def collectives_exit(report: dict[str, Any], allow_missing: bool) -> int:
    """compare's exit status of the collectives: REGRESSION_EXIT, else MISSING_EXIT (unless allowed), else 0."""
    if any(p.regression for p in report["points"]):
        return REGRESSION_EXIT
    return MISSING_EXIT if report["only_baseline"] and not allow_missing else 0


def as_data(report: dict[str, Any]) -> dict[str, Any]:
    """The comparison as JSON-ready data (compare --format json)."""
    points = [{"point": p.label, "baseline": p.baseline, "current": p.current, "change": p.change, "p": p.p,
               "rule": p.rule, "verdict": p.verdict, "outcome": p.outcome} for p in report["points"]]
    return {**report, "points": points}


def compare_collectives(baseline: list[CollectivesResult], current: list[CollectivesResult],
                        threshold: float) -> dict[str, Any]:
    base_figures, base_statuses = _samples(baseline)
    cur_figures, cur_statuses = _samples(current)
    points = []
    for key in base_statuses:
        if key not in cur_statuses:
            continue
        comparison = PointComparison(key=None, label=key.label(), baseline=base_figures.get(key, []),
                                     current=cur_figures.get(key, []), baseline_statuses=base_statuses[key],
                                     current_statuses=cur_statuses[key])
        points.append(compare_point(comparison, threshold, BUSBW.higher_is_better))
    return {"metric": BUSBW.name, "threshold": threshold, "points": points,
            "only_baseline": [k.label() for k in base_statuses if k not in cur_statuses],
            "only_current": [k.label() for k in cur_statuses if k not in base_statuses]}


def format_collectives(report: dict[str, Any]) -> str:
    def figure(values: list[float], statuses: list[str]) -> str:
        if not values:
            return "- (" + "/".join(sorted(set(statuses))) + ")"
        return f"{BUSBW.text(statistics.median(values))} (n={len(values)})"

    rows = [[p.label, figure(p.baseline, p.baseline_statuses), figure(p.current, p.current_statuses),
             "-" if p.change is None else f"{p.change * 100:+.2f}%", p.rule, p.verdict] for p in report["points"]]
    lines = [f"collectives: busbw (higher is better), threshold {report['threshold'] * 100:g}%", "",
             tabulate(rows, headers=["collective, size, point", "baseline busbw (n)", "current busbw (n)", "change",
                                     "p or rule", "verdict"])]
    for title, entries in (("only in baseline (missing from current)", report["only_baseline"]),
                           ("only in current", report["only_current"])):
        if entries:
            lines += ["", f"{title}:"] + [f"  {entry}" for entry in entries]
    regressions = sum(p.regression for p in report["points"])
    lines += ["", f"{len(report['points'])} collective points compared: {regressions} regression(s)"]
    return "\n".join(lines)
