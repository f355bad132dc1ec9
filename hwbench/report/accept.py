"""`hwbench accept`'s page: PASS or FAIL first, then the evidence (hwbench.judge.accept judges)."""

from __future__ import annotations

import statistics
from typing import Any

from hwbench.judge.accept import (
    FAR_ABOVE,
    PROBE_FIGURES,
    PROBED,
    Acceptance,
    PointOutcome,
    _device_name,
    _ratio_text,
)
from hwbench.judge.baseline import METRIC
from hwbench.judge.compare import MISSING_EXIT
from hwbench.metrics import METRICS


def _rate_cell(probe: dict[str, Any], figure: str, text) -> str:
    rate = probe.get(figure) or {}
    if rate.get("median") is None:
        return f"- ({rate.get('reason') or probe.get('error') or 'not measured'})"
    return f"{text(rate['max'])} (median {text(rate['median'])}, min {text(rate['min'])}, n={rate['n']})"


def _training_text(probes: list[dict[str, Any]]) -> str:
    point = next((p["training_point"] for p in probes if p.get("training_point")), None)
    if point is None:
        return "not run"
    return (f"{point['model']}, seq {point['seq_length']}, {point['precision']}, {point['steps']} timed steps after "
            f"{point['warmup']} of warm-up")


def acceptance_document(acceptance: Acceptance):
    """The page as a Report (hwbench/report/document.py): PASS or FAIL first, then the evidence."""
    import pandas as pd

    from hwbench.report.document import Report, Section, Table

    a = acceptance
    word = "PASS" if a.passed else "FAIL"
    verdict = Section("Verdict", [("p", summary_text(a))])
    if a.failures:
        verdict.blocks.append(("list", a.failures))
    if a.missing:
        verdict.blocks += [("p", f"Points the baseline ({a.baseline.source}) lacks, exit {MISSING_EXIT}:"),
                           ("list", a.missing)]
    if a.preflight:
        verdict.blocks += [("p", "The machine's checks (hwbench preflight) warned; the figures were measured so:"),
                           ("list", a.preflight)]
    if a.notes:
        verdict.blocks += [("p", f"Far above the baseline ({FAR_ABOVE:.0%} of it or more):"), ("list", a.notes)]
    health = Section("Device health", [
        ("p", "Each device as its management library reported it before anything was measured (the rules: "
              "docs/accept.md). A failing device is a FAIL, and then nothing is measured: no probe, no suite point."),
        ("list", [line for node in a.health for line in node.lines()])]) if a.health else None
    devices = Section("Devices", [])
    if a.probes:
        devices.blocks.append(("p", f"Each device measured alone, one after another: {PROBED}, "
                                    f"training: {_training_text(a.probes)}. Each figure is the best of its "
                                    "repetitions (or timed steps), then their median, minimum and count. "
                                    + _peers_rule(a)))
        devices.blocks.append(("table", Table(["device", "model", *(title for _, title, _ in PROBE_FIGURES)], [
            [_device_name(p), p.get("device_model") or "-",
             *(_rate_cell(p, figure, text) for figure, _, text in PROBE_FIGURES)] for p in a.probes])))
    rows = [[p.name, p.label, METRICS[METRIC].text(statistics.median(p.values)) if p.values else "-",
             f"{min(p.values):,.0f} to {max(p.values):,.0f} (n={len(p.values)})" if p.values else "/".join(p.statuses),
             METRICS[METRIC].text(p.baseline) if p.baseline is not None else "-",
             _ratio_text(p.ratio, 1) if p.ratio is not None else "-", p.straggler or "-", _verdict_cell(p)]
            for p in a.points]
    suite = Section("Suite against the baseline", [
        ("p", f"tokens/s: the median of each point's ok repeats against the baseline's median; PASS at or above "
              f"{a.min_ratio:.0%}. Straggler: the slowest rank's median step against the median rank's (every rank "
              "waits for the slowest at each collective, so this is evidence, not a judgement)."),
        ("table", Table(["point", "what", "tokens/s", "repeats", "baseline", "ratio", "straggler", "verdict"], rows))])
    sections = [verdict, *([health] if health else []), devices, suite, *_fabric_sections(a)]
    base = a.baseline
    source = Section("Baseline", [("list", [f"source: {base.source}", f"created: {base.created_at or '-'}",
                                            *(f"{k}: {(', '.join(map(str, v)) or '-') if isinstance(v, list) else v}"
                                              for k, v in {**base.machine, **base.software}.items())])])
    return Report(f"hwbench accept: {word}", [*sections, source], pd.DataFrame(), pd.DataFrame(), [],
                  [], [], {})


def _fabric_sections(a: Acceptance) -> list:
    """The collectives against the baseline's busbw and each ring's pairs: none without a fabric baseline."""
    from hwbench.fabric.table import ring_lines
    from hwbench.report.document import Section, Table

    if a.fabric is None:
        return []
    rows = [[label, f"{busbw:,.3f}", f"{base:,.3f}", _ratio_text(ratio, 1), "PASS" if ratio >= a.min_ratio else "FAIL"]
            for label, busbw, base, ratio in a.fabric.compared]
    blocks: list = [("p", f"busbw (GB/s) of each collective, form and size on this node against the baseline's "
                          f"median; PASS at or above {a.min_ratio:.0%}. Results in OUT/collectives/."),
                    ("table", Table(["collective, size, ranks", "busbw", "baseline", "ratio", "verdict"], rows))]
    for result in a.fabric_results:
        if result.slow_link is not None:
            blocks.append(("list", ring_lines(result)))
    return [Section("Fabric against the baseline", blocks)]


def _verdict_cell(point: PointOutcome) -> str:
    return point.verdict + (f": {point.cause}" if point.cause else "") + (
        " (the baseline may be wrong: see the verdict)" if point.note else "")


def _peers_rule(a: Acceptance) -> str:
    """How the devices were judged against each other, or why one was not."""
    alone = a.single_devices
    if alone and len(alone) == len(a.probes):
        return (f"{'This device is' if len(alone) == 1 else 'Each device is'} the only one of its model probed: "
                "it has no peers to be judged against, its figures are evidence only.")
    rule = (f"A device more than {a.outlier:.0%} below the median of its peers (the other devices of its model) in "
            "any of them, or a node more than that below the other nodes, is named above.")
    return rule + (f" Not judged, as the only device of its model: {', '.join(alone)}." if alone else "")


def summary_text(a: Acceptance) -> str:
    """The verdict's first line: PASS or FAIL and what it rests on."""
    if not a.passed:
        return f"FAIL: {len(a.failures) + len(a.missing)} finding(s) below"
    alone = a.single_devices
    devices = ("its one device probed, with no peers to judge it against" if len(alone) == len(a.probes) == 1
               else "no device with a peer of its model to judge it against" if alone and len(alone) == len(a.probes)
               else f"every device within {a.outlier:.0%} of its peers" + (f" ({len(alone)} without one)"
                                                                           if alone else ""))
    cautions = ([f"{len(a.preflight)} warning(s) of the machine's checks"] if a.preflight else []) + (
        [f"{len(a.notes)} point(s) so far above the baseline that it may be wrong"] if a.notes else [])
    fabric = ", every collective too, and no slow link" if a.fabric is not None else ""
    return (f"PASS: {devices}, and every point at or above {a.min_ratio:.0%} of its baseline{fabric}"
            + (f"; with {' and '.join(cautions)} (below)" if cautions else ""))


def render(acceptance: Acceptance, fmt: str) -> str:
    document = acceptance_document(acceptance)
    if fmt == "html":
        from hwbench.report.html import render_html

        return render_html(document)
    from hwbench.report.render import render_markdown

    return render_markdown(document)
