"""`hwbench compare BASELINE CURRENT`: did performance change between two sets of results?

BASELINE and CURRENT are result files or folders (searched recursively). Results are
grouped into points by the spec fields that define what was measured (hwbench.point.PointKey);
the results of one point on one side (the repeats of a sweep, or several nights in a
folder) form a sample. For every point on both sides the change of the median figure
is tested:

- a change counts only when it is larger than ``--threshold`` AND significant (asv's rule);
- significant: Mann-Whitney U two-sided p < 0.05, or, with 3 or more values on each side,
  complete separation (every current value beyond every baseline value, U = 0 or U = n1 x n2).
  With 3 repeats each the smallest exact two-sided p is 0.1, so the test alone could never
  flag anything; complete separation of 3 vs 3 happens by chance with probability 2/20 = 10%
  in either direction, 5% in the bad one, and the threshold must be passed as well;
- with a single value on a side only the threshold applies ("no repeats: threshold only");
- a point that is ok in the baseline and has no ok result in the current set is a regression;
- a point with fewer ok repeats in the current set than were asked for (its sweep's ``repeats``,
  at least the results it has, skipped ones aside) or than its baseline had is a failure of the
  gate of its own, "repeats failed" (unless it regressed: that verdict is the stronger);
- a baseline point with no result at all in the current set (never run, or its file
  unreadable) is missing: the gate fails unless --allow-missing.

A file that cannot be read on either side is named with its reason on stderr and in
the output; it never silently turns a point into "only in baseline".

Exit status: 3 on any regression, 5 when a point's repeats failed (and none regressed), 4 when
a baseline point is missing from CURRENT (and neither of those), 0 otherwise, 2 on unusable
input (UsageError).
docs/compare.md has the rules in full.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from hwbench.errors import UsageError
from hwbench.metrics import METRICS, result_formula
from hwbench.point import PointKey
from hwbench.result.environment import PERFORMANCE_ENVIRONMENT_FIELDS, environment_differences, performance_fingerprint
from hwbench.result.model import RunResult
from hwbench.result.store import ResultFiles
from hwbench.stats import mann_whitney_u
from hwbench.workload.flops import counts_hardware_flops, hfu_reason

ALPHA = 0.05
SEPARATION_MIN_N = 3  # complete separation counts as significant from 3 values a side
DEFAULT_THRESHOLD = 0.05
REGRESSION_EXIT = 3
MISSING_EXIT = 4  # a baseline point with no readable result in CURRENT: the gate cannot vouch for it
REPEATS_EXIT = 5  # a point with fewer ok repeats than asked or than its baseline had: neither can it
REPEATS_FAILED = "repeats failed"  # that verdict's first word
INCONCLUSIVE = "inconclusive"  # the verdict's first word when a change passes the threshold but is not significant


def parse_threshold(text: str, option: str = "--threshold", below: float = 1.0) -> float:
    """``5%`` or ``0.05`` -> 0.05, from 0 up to (not including) ``below`` (a regression threshold: 1,
    all of the figure; a slowdown's: more); anything else is a UsageError naming ``option``."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"{option} {text!r}: not a number; give a percentage (5%) or a fraction (0.05)") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{option} {text!r}: must be 0 or more; give a percentage (5%) or a fraction (0.05)")
    if value >= below:
        raise UsageError(f"{option} {text!r}: must be below {below:.0%}; give a percentage (5%) or a fraction "
                         f"below {below:g} (0.05)")
    return value


# --- points ------------------------------------------------------------------


def _sweep_point(result: RunResult) -> tuple | None:
    sweep = result.sweep
    return (sweep.suite, sweep.point) if sweep and sweep.point else None


def point_label(key: PointKey, names: set, keys: list[PointKey]) -> str:
    """The sweep points that measured ``key`` and its label among ``keys``."""
    text = key.label(keys)
    named = sorted(f"{suite}/{point}" if suite else str(point) for suite, point in names)
    return (", ".join(named) + f" ({text})") if named else text


def group(results: list[RunResult]) -> tuple[dict[PointKey, list[RunResult]], dict[PointKey, set], list[RunResult]]:
    """Results by point key; the sweep point names seen for each key; results without a
    key that no sweep point name could place."""
    by_key: dict[PointKey, list[RunResult]] = defaultdict(list)
    names: dict[PointKey, set] = defaultdict(set)
    keyless = []
    for result in results:
        key = result.point_key
        if key is None:
            keyless.append(result)
            continue
        by_key[key].append(result)
        if _sweep_point(result):
            names[key].add(_sweep_point(result))
    return by_key, names, keyless


def _place_keyless(keyless: list[RunResult], names: dict[PointKey, set], by_key: dict[PointKey, list[RunResult]]):
    """A sweep's own record of a point without a resolved spec (timeout, invalid) joins
    the key that results of the same sweep point have (on either side)."""
    unplaced = []
    for result in keyless:
        point = _sweep_point(result)
        owners = [key for key, seen in names.items() if point and point in seen]
        if len(owners) == 1:
            by_key[owners[0]].append(result)
        else:
            unplaced.append(result)
    return unplaced


# --- comparison --------------------------------------------------------------


@dataclasses.dataclass
class PointComparison:
    key: PointKey | None
    label: str
    baseline: list[float]
    current: list[float]
    baseline_statuses: list[str]
    current_statuses: list[str]
    change: float | None = None
    p: float | None = None
    u: float | None = None
    rule: str = ""
    verdict: str = ""

    @property
    def regression(self) -> bool:
        return self.verdict.startswith("regression")

    @property
    def repeats_failed(self) -> bool:
        return self.outcome == REPEATS_FAILED

    @property
    def outcome(self) -> str:
        """The verdict's kind, for machines: regression, improvement, inconclusive, within noise, no repeats,
        no baseline figure, ..."""
        return self.verdict.split(":")[0]


def compare_point(comparison: PointComparison, threshold: float, higher_is_better: bool) -> PointComparison:
    base, cur = comparison.baseline, comparison.current
    if not cur and base:
        bad = sorted(set(s for s in comparison.current_statuses if s != "ok")) or ["no figure"]
        comparison.verdict = f"regression: {'/'.join(bad)} in current"
        comparison.rule = "ok in baseline, not in current"
        return comparison
    if not base:
        comparison.verdict = "no baseline figure" if cur else "no figure on either side"
        comparison.rule = "statuses: " + "/".join(sorted(set(comparison.baseline_statuses)))
        return comparison
    base_median, cur_median = statistics.median(base), statistics.median(cur)
    if base_median == 0:
        comparison.verdict, comparison.rule = "no figure", "baseline median is 0"
        return comparison
    change = (cur_median - base_median) / abs(base_median)
    comparison.change = change
    worse = -change if higher_is_better else change  # > 0: worse by that fraction
    beyond = abs(change) > threshold
    no_repeats = len(base) < 2 or len(cur) < 2
    if no_repeats:
        comparison.rule = "no repeats: threshold only"
        significant = True
    else:
        u, p, method = mann_whitney_u(base, cur)
        comparison.u, comparison.p = u, p
        separated = u in (0, len(base) * len(cur))
        comparison.rule = f"p={p:.3g} ({method} U={u:g})"
        significant = p < ALPHA
        if not significant and separated and min(len(base), len(cur)) >= SEPARATION_MIN_N:
            significant = True
            comparison.rule += ", separated"
    if beyond and significant:
        comparison.verdict = "regression" if worse > 0 else "improvement"
    elif no_repeats:
        comparison.verdict = "no repeats"
    elif beyond:  # a change past the threshold that the repeats cannot tell from noise: not "no change"
        comparison.verdict = f"{INCONCLUSIVE}: not significant with {len(base)} and {len(cur)} runs"
    else:
        comparison.verdict = "within noise"
    return comparison


def _repeats_asked(results: list[RunResult]) -> int:
    """How many runs of a point were asked for: its sweep's ``repeats`` (the largest recorded), and at
    least as many as there are results (each was a run someone started)."""
    recorded = [r.sweep.repeats for r in results if r.sweep is not None and r.sweep.repeats]
    return max([len(results), *recorded])


def repeat_shortfall(baseline: list[RunResult], current: list[RunResult]) -> str | None:
    """"1 of 3 repeats ok; baseline had 3" when CURRENT has fewer ok runs of a point than were asked
    for (a skipped run, one the planner predicted would not fit, was not asked to run) or than the
    baseline had; None when it has enough."""
    ok = sum(r.status == "ok" for r in current)
    asked = _repeats_asked(current)
    wanted = asked - sum(r.status == "skipped" for r in current)
    had = sum(r.status == "ok" for r in baseline)
    if any(r.sweep is not None and r.sweep.repeats for r in baseline):  # several nights in one folder: one night's
        had = min(had, max(r.sweep.repeats or 0 for r in baseline if r.sweep is not None))
    if ok >= max(wanted, had):
        return None
    return f"{ok} of {asked} repeats ok; baseline had {had}"


def environment_warnings(base: list[RunResult], cur: list[RunResult]) -> list[str]:
    """One line per fingerprint field whose values differ between the two sides."""
    groups = [("baseline", [performance_fingerprint(r) for r in base]),
              ("current", [performance_fingerprint(r) for r in cur])]
    lines = []
    for field, held in environment_differences(groups, ("device_model",) + PERFORMANCE_ENVIRONMENT_FIELDS):
        (_, a), (_, b) = held  # a difference needs both sides
        lines.append(f"environments differ: {field} {_listed(a)} (baseline) vs {_listed(b)} (current)")
    return lines


def stand_in_notes(base_keys: list[PointKey], cur_keys: list[PointKey], labels: dict[PointKey, str]) -> list[str]:
    """A line for each point that one side ran on the device and the other through a stand-in
    (or two kinds of stand-in): such keys differ, so the point is not compared, and this says why."""
    lines = []
    for base in (key for key in base_keys if key not in cur_keys):
        for cur in (key for key in cur_keys if key not in base_keys):
            if dataclasses.replace(base, stand_in=None) == dataclasses.replace(cur, stand_in=None):
                lines.append(f"not compared: {labels[base]} (baseline) with {labels[cur]} (current): "
                             f"{_stand_in_text(base.stand_in)} in baseline, {_stand_in_text(cur.stand_in)} in "
                             "current; a stand-in's figures are not the device's own (simulated: this host's; "
                             "emulated: FP8 computed without FP8 units)")
    return lines


def _stand_in_text(stand_in: str | None) -> str:
    return stand_in or "measured on the device"


def _listed(values: list) -> str:
    return ", ".join(sorted(map(str, values)))


def load_side(name: str, path: str, files: ResultFiles) -> tuple[list[RunResult], list[tuple[Path, str]]]:
    """The runs of ``files`` (read from ``path``) and the (file, reason) of every unreadable one."""
    results, skipped = [result for result, _file in files.runs], files.skipped_runs
    if not results:
        extra = f" ({len(skipped)} unreadable: {skipped[0][1]})" if skipped else ""
        raise UsageError(f"{name} {path!r}: no hwbench result files found{extra}; give a result file or a folder "
                         "of them")
    return results, skipped


def compare(baseline: list[RunResult], current: list[RunResult], threshold: float = DEFAULT_THRESHOLD,
            metric: str = "tokens_per_s", unreadable: Sequence[tuple[str, Path, str]] = ()) -> dict[str, Any]:
    """The comparison as data: points compared, points on one side only, the unreadable
    files as (side, path, reason), warnings."""
    figure = METRICS[metric]
    base_by, _, base_keyless = group(baseline)
    cur_by, _, cur_keyless = group(current)
    _, names, _ = group(baseline + current)  # the sweep point names of each key, on either side
    unplaced = _place_keyless(base_keyless, names, base_by) + _place_keyless(cur_keyless, names, cur_by)
    keys = list(dict.fromkeys([*base_by, *cur_by]))
    labels = {key: point_label(key, names[key], keys) for key in keys}
    common = [key for key in base_by if key in cur_by]
    points = []
    hfu: dict[str, str] = {}  # point label -> the formula whose figure of it is HFU (it counts the recompute)
    for key in sorted(common, key=labels.__getitem__):
        b, c = base_by[key], cur_by[key]
        # TFLOP/s and MFU under the baseline's formula: a new default formula is no regression
        formula = next((f for r in b if r.status == "ok" and (f := result_formula(r))), None)
        if metric == "mfu" and formula is not None and counts_hardware_flops(formula, key.recompute):
            hfu[labels[key]] = formula
        comparison = PointComparison(
            key=key, label=labels[key],
            baseline=[v for r in b if r.status == "ok" and (v := figure.read(r, formula)) is not None],
            current=[v for r in c if r.status == "ok" and (v := figure.read(r, formula)) is not None],
            baseline_statuses=[r.status for r in b], current_statuses=[r.status for r in c])
        compare_point(comparison, threshold, figure.higher_is_better)
        shortfall = repeat_shortfall(b, c)
        if shortfall and not comparison.regression:  # the figure may look fine; the gate cannot vouch for it
            comparison.verdict = f"{REPEATS_FAILED}: {shortfall}"
        points.append(comparison)
    matched_base = [r for k in common for r in base_by[k]]
    matched_cur = [r for k in common for r in cur_by[k]]
    return {
        "metric": metric, "higher_is_better": figure.higher_is_better, "threshold": threshold, "points": points,
        "only_baseline": [labels[k] for k in base_by if k not in cur_by],
        "only_current": [labels[k] for k in cur_by if k not in base_by],
        "unplaced": [r.run_id for r in unplaced],
        "unreadable": [{"side": side, "path": str(path), "reason": reason} for side, path, reason in unreadable],
        "warnings": stand_in_notes(list(base_by), list(cur_by), labels)
        + environment_warnings(matched_base, matched_cur),
        "hfu_points": hfu,
    }


def exit_status(report: dict[str, Any], allow_missing: bool = False) -> int:
    """REGRESSION_EXIT on a regression; REPEATS_EXIT when a point's repeats failed; MISSING_EXIT when
    a baseline point has no result in CURRENT (unless allowed); 0 otherwise."""
    if any(p.regression for p in report["points"]):
        return REGRESSION_EXIT
    if any(p.repeats_failed for p in report["points"]):
        return REPEATS_EXIT
    if report["only_baseline"] and not allow_missing:
        return MISSING_EXIT
    return 0


def _figure(metric: str, values: list[float], statuses: list[str]) -> str:
    if not values:
        return "- (" + "/".join(sorted(set(statuses))) + ")"
    failed = len(statuses) - len(values)
    return (f"{METRICS[metric].text(statistics.median(values))} (n={len(values)}"
            + (f", {failed} not ok" if failed else "") + ")")


def format_report(report: dict[str, Any]) -> str:
    direction = "higher is better" if report["higher_is_better"] else "lower is better"
    lines = [f"metric {report['metric']} ({direction}), threshold {report['threshold'] * 100:g}%, "
             f"significance: Mann-Whitney U p<{ALPHA:g} or complete separation with >={SEPARATION_MIN_N} "
             "values a side", ""]
    metric = report["metric"]
    rows = [[p.label, _figure(metric, p.baseline, p.baseline_statuses), _figure(metric, p.current, p.current_statuses),
             "-" if p.change is None else f"{p.change * 100:+.2f}%", p.rule, p.verdict] for p in report["points"]]
    lines.append(tabulate(rows, headers=["point", "baseline median (n)", "current median (n)", "change",
                                         "p or rule", "verdict"]))
    unreadable = [f"{u['side']} {u['path']}: {u['reason']}" for u in report.get("unreadable", [])]
    for title, entries in (("only in baseline (missing from current)", report["only_baseline"]),
                           ("only in current", report["only_current"]),
                           ("results without a spec that no point could take", report["unplaced"]),
                           ("unreadable files (left out)", unreadable)):
        if entries:
            lines += ["", f"{title}:"] + [f"  {entry}" for entry in entries]
    counts = outcome_counts(report)
    lines += ["", f"{len(report['points'])} points compared: {counts['regression']} regression(s), "
                  f"{counts['improvement']} improvement(s), {counts[INCONCLUSIVE]} inconclusive, "
                  f"{counts[REPEATS_FAILED]} with failed repeats"]
    if counts[REPEATS_FAILED]:
        lines.append(f"{REPEATS_FAILED}: fewer ok repeats tonight than were asked for or than the baseline had; "
                     "the figure of the ok ones is shown, but the gate fails (exit 5): see why in the failed "
                     "runs' result files")
    if counts[INCONCLUSIVE]:
        lines.append(f"inconclusive: the median moved by more than {report['threshold'] * 100:g}%, but the repeats "
                     "cannot tell that from run-to-run noise; more repeats a side (hwbench sweep --repeats) judge it")
    lines += _threshold_only_note(report)
    lines += _hfu_note(report)
    return "\n".join(lines)


def _hfu_note(report: dict[str, Any]) -> list[str]:
    """Name the points whose mfu is HFU: counted by a formula that adds the recompute, for a point that recomputes."""
    hfu = report.get("hfu_points") or {}
    return [line for formula in dict.fromkeys(hfu.values())
            for line in ("", f"{hfu_reason(formula)}. Its figures here are HFU for: "
                             + ", ".join(label for label, f in hfu.items() if f == formula))]


def outcome_counts(report: dict[str, Any]) -> dict[str, int]:
    """Points by the kind of their verdict (regression, improvement, inconclusive, ...); every kind
    the summary names is present."""
    counts = dict.fromkeys(("regression", "improvement", INCONCLUSIVE, REPEATS_FAILED), 0)
    for point in report["points"]:
        kind = "regression" if point.regression else point.outcome
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def report_data(report: dict[str, Any], allow_missing: bool = False) -> dict[str, Any]:
    """The comparison as JSON holds it (`hwbench compare --format json`): every point with its
    key, both sides' figures in the metric's unit, the test and the verdict; the exit status."""
    def side(values: list[float], statuses: list[str]) -> dict[str, Any]:
        return {"n": len(values), "median": statistics.median(values) if values else None,
                "min": min(values, default=None), "max": max(values, default=None), "values": values,
                "statuses": statuses}

    metric = METRICS[report["metric"]]
    points = [{"label": p.label, "key": dict(zip(PointKey.fields(), p.key.values())) if p.key else None,
               "baseline": side(p.baseline, p.baseline_statuses), "current": side(p.current, p.current_statuses),
               "change": p.change, "p": p.p, "u": p.u, "rule": p.rule, "verdict": p.verdict, "outcome": p.outcome}
              for p in report["points"]]
    return {"metric": report["metric"], "unit": metric.unit.name, "higher_is_better": report["higher_is_better"],
            "threshold": report["threshold"], "alpha": ALPHA, "points": points,
            "only_baseline": report["only_baseline"], "only_current": report["only_current"],
            "unplaced": report["unplaced"], "unreadable": report["unreadable"], "warnings": report["warnings"],
            "hfu_points": report.get("hfu_points") or {},
            "counts": outcome_counts(report), "exit_status": exit_status(report, allow_missing)}


def key_differences(baseline: PointKey, current: PointKey) -> list[str]:
    """The point-key fields in which two keys differ: "seq_length 128 (baseline) vs 64 (current)"."""
    return [f"{name} {a} (baseline) vs {b} (current)" if name != "stand_in" else
            f"{_stand_in_text(a)} in baseline, {_stand_in_text(b)} in current (a stand-in's figures are never "
            "compared with the device's)"
            for name, a, b in zip(PointKey.fields(), baseline.values(), current.values()) if a != b]


def nearest_mismatch(baseline: list[RunResult], current: list[RunResult]) -> list[str]:
    """Where the closest pair of points of two sides with nothing in common differ (the fewest
    fields): what to fix for them to match. Empty when a side has no point key."""
    base_keys = {r.point_key for r in baseline if r.point_key is not None}
    cur_keys = {r.point_key for r in current if r.point_key is not None}
    pairs = [key_differences(b, c) for b in base_keys for c in cur_keys]
    return min(pairs, key=lambda found: (len(found), found), default=[])


def _threshold_only_note(report: dict[str, Any]) -> list[str]:
    """Say plainly what decided the points with one run on a side: the threshold alone."""
    alone = [p for p in report["points"] if p.rule == "no repeats: threshold only"]
    if not alone:
        return []
    decided = (f"{sum(p.regression for p in alone)} regression(s), {sum(p.verdict == 'improvement' for p in alone)} "
               f"improvement(s), {sum(p.verdict == 'no repeats' for p in alone)} within it")
    return ["", f"{len(alone)} point(s) have a single run on a side: with one run per side significance cannot be "
                f"judged, so the {report['threshold'] * 100:g}% threshold alone decided them ({decided}). One run "
                "differs from the next by more than that on a busy machine (docs/compare.md measured it); give "
                "each side repeats (hwbench sweep --repeats 3) for a judged verdict."]
