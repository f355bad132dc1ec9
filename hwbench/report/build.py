"""`hwbench report` assembled: the runs table, the match against the published tables, the
notes and warnings and the plots, laid out as the sections of one Report document.
Formulas and sections are described in docs/reports.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from hwbench.report.against_published import match_published
from hwbench.report.collectives import collectives_section
from hwbench.report.decision import decision_section
from hwbench.report.document import Report
from hwbench.report.prices import Price
from hwbench.report.projection import apply_projections, scaling_fits
from hwbench.report.runs import environment_warnings, run_row
from hwbench.report.scores import time_to_target_section
from hwbench.report.sections import (
    checkpoint_policy_blocks,
    checkpoint_section,
    convergence_section,
    environment_section,
    goodput_section,
    model_section,
    procurement_section,
    profile_section,
    published_section,
    runs_section,
    skipped_section,
)
from hwbench.result.collectives import CollectivesResult
from hwbench.result.model import RunResult


def build_report(loaded: list[tuple[RunResult, str]], skipped: list[tuple[str, str]],
                 published: pd.DataFrame | None, published_note: str | None,
                 prices: dict[str, Price], tokens: float | None, devices: int, with_plots: bool = True,
                 also_formula: str | None = None, references: list[RunResult] | None = None,
                 keep_different: bool = False,
                 collectives: list[tuple[CollectivesResult, str]] | None = None) -> Report:
    """The report of the ``loaded`` (result, file) pairs; ``skipped`` (file, reason) pairs are listed
    in it; ``published`` is None when no tables were found (``published_note`` says why). ``tokens``
    None: each workload's budget is 20 tokens per parameter. ``also_formula``: a FLOPs formula whose
    MFU the per-model tables show beside each run's own. ``references``: runs to check each result
    against (hwbench.judge.parity.check_against_references); a result that fails is marked
    "numerically different" and, unless ``keep_different``, left out of every comparison."""
    rows = [run_row(result, file, prices, tokens) for result, file in loaded]
    different = _mark_different(rows, [result for result, _ in loaded], references or [], keep_different)
    _point_variants(rows, [result for result, _ in loaded])
    fits = scaling_fits(rows)
    apply_projections(rows, fits, devices)
    runs = pd.DataFrame(rows, dtype=object)  # object: None stays None, integers stay integers
    comparison = match_published(runs, published)
    notes = unmatched_price_notes(runs, prices)
    warnings_found = environment_warnings(runs) + different
    images = plot_images(rows, loaded, fits) if with_plots else {}
    decision = decision_section(runs, fits, published, prices, tokens, devices, images if with_plots else None)
    decision.blocks += checkpoint_policy_blocks(runs)
    if runs.empty:  # the published tables alone
        sections = [section for section in (decision, published_section(runs, comparison, published, published_note),
                                            collectives_section(collectives or []), skipped_section(skipped))
                    if section is not None]
        return Report("hwbench report", sections, runs, comparison, skipped, warnings_found, notes, images)
    candidates = [decision, runs_section(runs), published_section(runs, comparison, published, published_note),
                  model_section(runs, images, also_formula), procurement_section(runs, devices, notes),
                  convergence_section(runs, images), time_to_target_section(runs), checkpoint_section(runs),
                  goodput_section(runs, [result for result, _ in loaded]),
                  profile_section([result for result, _ in loaded]),
                  environment_section(runs, warnings_found), collectives_section(collectives or []),
                  skipped_section(skipped)]
    sections = [section for section in candidates if section is not None]
    return Report("hwbench report", sections, runs, comparison, skipped, warnings_found, notes, images)


def _mark_different(rows: list[dict[str, Any]], results: list[RunResult], references: list[RunResult],
                    keep_different: bool) -> list[str]:
    """Mark each row whose run fails its reference's convergence check, and each that reached its
    target markedly faster than its reference; the warnings to print."""
    from hwbench.judge.parity import DIFFERENT, check_against_references
    from hwbench.report.scores import fast_convergence_flags

    different = check_against_references(results, references)
    flags = fast_convergence_flags(results, references)
    warnings = []
    for row in rows:
        row["target_flag"] = flags.get(row["run_id"])
        if row["target_flag"]:
            warnings.append(f"run {row['run_id']}: {row['target_flag']}")
    for row in rows:
        why = different.get(row["run_id"])
        if why is None:
            continue
        kept = "kept in the comparisons (--keep-different)" if keep_different else \
            "left out of the decision and every comparison (--keep-different keeps it)"
        row["error"] = f"{why}; {kept}"
        if not keep_different:
            row["status"] = DIFFERENT
        warnings.append(f"run {row['run_id']}: {row['error']}")
    return warnings


def _point_variants(rows: list[dict[str, Any]], results: list[RunResult]) -> None:
    """Each row's `point_variant`: what sets its point apart among the report's points of its model,
    the device aside (recompute, seq 64, ...), so that a chart never puts two points in one bar."""
    keys = [None if r.point_key is None else dataclasses.replace(r.point_key, backend=None, device_model=None)
            for r in results]
    for row, key in zip(rows, keys):
        row["point_variant"] = key.variant([k for k in keys if k is not None and k.model == key.model]) if key else ""


def unmatched_price_notes(runs: pd.DataFrame, prices: dict[str, Price]) -> list[str]:
    """A note for each --price or --prices entry that names no run's device: most likely a typo."""
    if runs.empty:
        return []
    known = {str(x).lower() for column in ("catalog_entry", "device_model") for x in runs[column].dropna()}
    return [f"the price of {key!r} (--price or --prices) matched no run's catalog entry or device model"
            for key in prices if key not in known]


def plot_images(rows: list[dict], loaded: list[tuple[RunResult, str]], fits: dict) -> dict[str, str]:
    """The plots of the ok runs as SVG text by "kind:model" (throughput, scaling, memory, loss),
    one chart per model; a plot with nothing to show is left out."""
    from hwbench.report import plots

    ok = [r for r in rows if r["status"] == "ok"]
    results = {result.run_id: result for result, _ in loaded}
    images: dict[str, str] = {}
    for model in sorted({str(r["model"]) for r in ok}):
        mine = [r for r in ok if str(r["model"]) == model]
        curves = [(r, [(s.step, s.loss) for s in results[r["run_id"]].steps if s.loss is not None]) for r in mine]
        for kind, image in (("throughput", plots.throughput(model, mine)), ("scaling", plots.scaling(model, fits)),
                            ("memory", plots.memory(model, mine)), ("loss", plots.loss_curves(model, curves))):
            if image is not None:
                images[f"{kind}:{model}"] = image
    return images


def published_tables(against: str | None) -> tuple[pd.DataFrame | None, str | None]:
    """The published tables to report against: ``against``, else results/published of
    this checkout (or of the working folder); else None and a note saying so."""
    from pathlib import Path

    from hwbench.report.published import DEFAULT_DIR, load_published

    if against is not None:
        return load_published(against), None
    for folder in (DEFAULT_DIR, Path("results/published")):
        if folder.is_dir():
            return load_published(folder), None
    return None, "No published tables found (results/published); give --against PATH."


def make_report(paths: Sequence[str], format: str, against: str | None, prices: Mapping[str, Any],
                tokens: float | None, projection_devices: int, also_formula: str | None = None,
                references: Sequence[str] = (), keep_different: bool = False) -> tuple[str, list[tuple[str, str]]]:
    """The report over the result files under ``paths`` (none: the published tables alone) as
    text in ``format`` (md, csv, json, html), and the (file, reason) of each file left out.
    ``prices``: Price or USD per device-hour by catalog entry or device model. UsageError when
    no file could be read."""
    from hwbench.errors import UsageError
    from hwbench.report.cost import check_projection
    from hwbench.report.prices import as_prices
    from hwbench.report.render import render_csv, render_json, render_markdown
    from hwbench.result.store import read_input_files

    tokens, projection_devices = check_projection(tokens, projection_devices)
    checked_prices = as_prices(prices)
    files = read_input_files(paths, "RESULTS")  # the report lists the skipped files itself
    loaded = [(result, str(path)) for result, path in files.runs]
    collectives = [(result, str(path)) for result, path in files.collectives]
    skipped = [(str(path), reason) for path, reason in files.skipped]
    if paths and not loaded and not collectives:
        raise UsageError(f"RESULTS {' '.join(map(str, paths))}: no readable result file "
                         f"({len(skipped)} skipped: {skipped[0][1] if skipped else 'none found'})")
    reference_results = _load_references(references)
    published, note = published_tables(None if against is None else str(against))
    if not loaded and not collectives and published is None:
        raise UsageError(f"RESULTS: none given and no published tables: {note}")
    report = build_report(loaded, skipped, published, note, checked_prices, tokens, projection_devices,
                          with_plots=format == "html", also_formula=also_formula, references=reference_results,
                          keep_different=keep_different, collectives=collectives)
    if format == "html":
        from hwbench.report.html import render_html

        return render_html(report), skipped
    return {"md": render_markdown, "csv": render_csv, "json": render_json}[format](report), skipped


def _load_references(paths: Sequence[str]) -> list[RunResult]:
    """The --reference result files; UsageError naming one that cannot be read."""
    from hwbench.errors import UsageError
    from hwbench.result.store import ResultFormatError, load_result

    loaded = []
    for path in paths:
        if not str(path).strip():  # load_result would read "" as the current folder
            raise UsageError(f"--reference {str(path)!r} is not accepted; give a result file (RESULT.json)")
        try:
            loaded.append(load_result(path))
        except (ResultFormatError, OSError) as error:
            raise UsageError(f"--reference {path}: {error}") from None
    return loaded
