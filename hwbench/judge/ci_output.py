"""Machine-readable verdicts for CI: `hwbench compare` and `hwbench history changes` as JSON
(`--format json`) and as a JUnit XML file (`--junit FILE`), which CI systems (GitLab, Jenkins,
GitHub's test reporters) show as test results: every compared point or series is a test case; a
regression, a point whose repeats failed or a baseline point missing from CURRENT a failure; a
change the repeats cannot judge (inconclusive) a skipped case with the reason, so that it is seen
and not taken for a pass.

The XML is written with the standard library's ElementTree in the shape of the JUnit schema most
consumers read (a <testsuites> root, one <testsuite> with tests/failures/errors/skipped counts,
<testcase name classname time> with <failure message type>, <skipped message> and <system-out>)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Sequence
from typing import Any

from hwbench.judge.compare import INCONCLUSIVE, REGRESSION_EXIT, REPEATS_FAILED
from hwbench.metrics import METRICS

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclasses.dataclass(frozen=True)
class CiCase:
    """One verdict as a test case: what was judged, passed/failed/skipped, why."""

    name: str
    classname: str  # the metric (JUnit consumers group cases by it)
    status: str  # PASSED, FAILED or SKIPPED
    message: str  # the verdict in one line
    details: str = ""  # the figures behind it
    kind: str = "regression"  # a failure's type: regression, repeats failed, missing


def junit_xml(suite: str, cases: Sequence[CiCase]) -> str:
    """``cases`` as one JUnit test suite named ``suite``."""
    counts = {status: sum(case.status == status for case in cases) for status in (FAILED, SKIPPED)}
    totals = {"name": suite, "tests": str(len(cases)), "failures": str(counts[FAILED]), "errors": "0",
              "skipped": str(counts[SKIPPED]), "time": "0"}  # the suites' and the suite's alike
    root = ElementTree.Element("testsuites", totals)
    element = ElementTree.SubElement(root, "testsuite", totals, timestamp=datetime.datetime.now(
        datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"))
    for case in cases:
        node = ElementTree.SubElement(element, "testcase", name=case.name, classname=case.classname, time="0")
        if case.status == FAILED:
            ElementTree.SubElement(node, "failure", message=case.message, type=case.kind).text = case.details
        elif case.status == SKIPPED:
            ElementTree.SubElement(node, "skipped", message=case.message)
        if case.details and case.status != FAILED:
            ElementTree.SubElement(node, "system-out").text = case.details
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def as_json(data: Any) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


# --- hwbench compare --------------------------------------------------------------


def compare_cases(report: dict[str, Any], allow_missing: bool = False) -> list[CiCase]:
    """A case per compared point (a regression or failed repeats fail, an inconclusive change is skipped) and per
    baseline point missing from CURRENT (a failure, skipped with --allow-missing)."""
    metric = report["metric"]

    def figures(values: list[float]) -> str:
        return ", ".join(METRICS[metric].text(value) for value in values) or "none"

    cases = []
    for point in report["points"]:
        failed = point.regression or point.repeats_failed
        status = FAILED if failed else SKIPPED if point.outcome == INCONCLUSIVE else PASSED
        change = "" if point.change is None else f"change {point.change * 100:+.2f}%; "
        cases.append(CiCase(point.label, metric, status, f"{point.verdict} ({change}{point.rule})",
                            f"baseline: {figures(point.baseline)}\ncurrent: {figures(point.current)}",
                            REPEATS_FAILED if point.repeats_failed else "regression"))
    for label in report["only_baseline"]:
        cases.append(CiCase(label, metric, SKIPPED if allow_missing else FAILED,
                            "missing from CURRENT: no result of this baseline point" +
                            (" (--allow-missing)" if allow_missing else ""), kind="missing"))
    return cases


# --- hwbench history changes -------------------------------------------------------


def history_cases(analyses: Iterable[Any], since: str, describe: Any) -> list[CiCase]:
    """A case per series of `hwbench history changes` (hwbench.history.changes.SeriesChanges):
    failed while it has an open regression from ``since`` on; the change points listed
    (``describe`` writes one) as its output."""
    cases = []
    for analysis in analyses:
        series = analysis.series
        listed = [describe(change) for change in analysis.changes if change.night.night >= since]
        regression = analysis.open_regression
        if regression is not None and regression.night.night >= since:
            status, message = FAILED, (f"open regression: {abs(analysis.open_change) * 100:.1f}% worse than before "
                                       f"{regression.night.night} (commit {regression.night.commit or 'unknown'})")
        else:
            status, message = PASSED, f"{len(listed)} change point(s), no open regression"
        cases.append(CiCase(series.label, series.metric, status, message, "\n".join(listed)))
    return cases


def history_data(analyses: Iterable[Any], since: str, threshold: float, describe: Any,
                 describe_environment: Any) -> dict[str, Any]:
    """`hwbench history changes --format json`: every series with its change points (size, 95% CI, p,
    nights, commits), environment changes and open regression."""
    series_list = []
    for analysis in analyses:
        series = analysis.series
        changes = [{"night": c.night.night, "commit": c.night.commit, "previous_commit": c.previous.commit,
                    "kind": c.kind, "change": c.change, "ci95_low": c.ci95_low, "ci95_high": c.ci95_high,
                    "p": c.p, "before": c.before, "after": c.after, "later_nights": c.later_nights,
                    "text": describe(c)} for c in analysis.changes if c.night.night >= since]
        environment = [describe_environment(series, segment) for segment in series.segments[1:]
                       if segment.nights[0].night >= since]
        regression = analysis.open_regression
        is_open = regression is not None and regression.night.night >= since
        series_list.append({
            "label": series.label, "metric": series.metric, "nights": len(series.nights),
            "last_night": series.nights[-1].night, "last_value": series.nights[-1].value,
            "changes": changes, "environment_changes": environment,
            "open_regression": {"night": regression.night.night, "commit": regression.night.commit,
                                "change": analysis.open_change} if is_open else None})
    open_count = sum(s["open_regression"] is not None for s in series_list)
    return {"since": since or None, "threshold": threshold, "series": series_list,
            "open_regressions": open_count, "exit_status": REGRESSION_EXIT if open_count else 0}



def history_junit(analyses: Iterable[Any], since: str, describe: Any) -> str:
    """`hwbench history changes --junit FILE`: a test case per series."""
    return junit_xml("hwbench history changes", history_cases(analyses, since, describe))


def write_output(path: str, option: str, text: str) -> None:
    """An output file written whole or not at all; one line (UsageError) when it cannot be."""
    from hwbench.errors import UsageError
    from hwbench.files import write_text_atomic

    try:
        write_text_atomic(path, text)
    except OSError as error:
        raise UsageError(f"{option} {path}: cannot be written: {error.strerror}") from None
