"""The decision section, first in the report: for every workload (model and precision), the
device models measured side by side and against the published rows, the faster and the cheaper
named with the confidence the repeats give (the test and threshold of `hwbench compare`), and the
time and cost to train the token budget on the projection's device count (docs/reports.md,
"Decision")."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

import pandas as pd

from hwbench.harness.stand_in import STAND_IN_PROJECTION
from hwbench.judge.compare import DEFAULT_THRESHOLD, INCONCLUSIVE, PointComparison, compare_point
from hwbench.point import EMULATED, SIMULATED
from hwbench.precision import peak_precision
from hwbench.report.against_published import published_layout
from hwbench.report.cells import figure, fmt, fmt_ratio, is_number, percent, tokens_text, usd
from hwbench.report.cost import cost_per_million_tokens, token_budget, training_time_and_cost
from hwbench.report.document import Section, Table
from hwbench.report.prices import Price, device_price
from hwbench.report.projection import group_key, usable
from hwbench.report.published import table_title, tokens_per_s_per_device
from hwbench.report.scaling import ScalingFit, fit_scaling
from hwbench.report.scores import decision_target_blocks
from hwbench.result.environment import sample_environment
from hwbench.stats import NOISY_CV, throughput_statistics

# The device class of a published row -> the catalog entry its price is taken from. The tables
# name a "V100-class" GPU without its form factor: it is priced as the SXM2 card (said in the report).
# Megatron-Bridge names DGX systems, whose GPUs are the catalog's SXM and Blackwell entries; classes not
# here (torchtitan's 96 GB H100 at 500 W, an H200 of unnamed form factor, GB300) are not priced.
PUBLISHED_DEVICE_ENTRIES = {"gpu-v100": "v100-sxm2", "gpu-a100": "a100-sxm", "npu-910": "ascend-910",
                            "dgx-h100": "h100-sxm", "dgx-b200": "b200", "dgx-gb200": "gb200", "gpu-b200": "b200"}


@dataclasses.dataclass
class Candidate:
    """One device model's best measured point for a workload (or one published row)."""

    device: str
    point: str
    devices: int  # devices charged (published: the table's device count)
    per_device: list[float]  # tokens/s per device charged, one per run
    costs: list[float]  # USD per million tokens, one per run (empty without a price)
    energy: list[float]  # J per token, one per run where measured
    price: Price | None
    price_why: str | None
    fit: ScalingFit
    energy_why: str | None = None
    published: bool = False
    variant: str = ""  # what sets the point apart beyond device, layout and precision (seq 64, recompute)
    seq_length: int | None = None
    catalog: str = ""  # the catalog entry the device matched, with its title
    peak: str = ""  # its peak for the workload's precision, with the source, or why there is none
    mfu_note: str = ""  # whether the run's MFU is measured against that peak, and why not
    # a stand-in ran the vendor's code path (simulated) or FP8 ran without FP8 units (emulated): shown, never
    # named faster or cheaper, never projected
    stand_in: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.per_device)


@dataclasses.dataclass(frozen=True)
class Projection:
    tokens: float | None
    basis: str
    devices: int


def decision_section(runs: pd.DataFrame, fits: dict[tuple, ScalingFit], published: pd.DataFrame | None,
                     prices: dict[str, Price], tokens: float | None, devices: int,
                     images: dict[str, str] | None = None) -> Section:
    """``images``: where the section's charts go (by key), for the HTML report; None: no charts."""
    section = Section("Decision")
    section.blocks.append(("p", _INTRO.format(threshold=DEFAULT_THRESHOLD, devices=devices)))
    used: dict[str, str] = {}
    workloads = _workloads(runs, published)
    for model, precision in workloads:
        rows = runs[(runs["model"] == model) & (runs["precision"] == precision)] if not runs.empty else runs
        candidates = _measured(rows, fits)
        # beside measured runs every published row of the model; the published rows alone, by precision
        pub = _published_candidates(published, model, prices, None if candidates else precision)
        budget = _budget(rows, model, tokens)
        section.blocks += _workload_blocks(model, precision, candidates, pub, Projection(*budget, devices))
        chart = None
        if images is not None and candidates:
            from hwbench.report.plots import decision as decision_chart

            chart = decision_chart(f"{model}, {precision}", candidates + pub)
        if images is not None and chart:
            key = f"decision:{model}:{precision}"
            images[key] = chart
            section.blocks.append(("img", key, f"{model}, {precision}: the best point of each device model, median "
                                               "tokens/s per device with the range of its repeats"))
        section.blocks += decision_target_blocks(runs, model, precision)
        for candidate in candidates + pub:
            used[candidate.device] = candidate.price.text() if candidate.price else candidate.price_why or ""
    if not workloads:
        section.blocks.append(("p", "No ok run and no published row: nothing to decide."))
    section.blocks.append(("h", "Prices used"))
    section.blocks.append(("list", [f"{device}: {text}" for device, text in sorted(used.items())]
                           or ["none: no device priced"]))
    return section


_INTRO = ("Per workload (model and precision): each device model's best measured point (the layout with the "
          "highest median tokens/s per device; its repeats are the runs of that point in one environment, as the "
          "history keeps them apart), its throughput per device charged, $ per million tokens, J per "
          "token where energy was measured, and the time and cost to train the token budget on {devices} devices. "
          "A device is named faster or cheaper only when its repeats show the difference: the change of the median "
          "must pass {threshold:.0%} and be significant (Mann-Whitney U p < 0.05, or complete separation with 3 or "
          "more runs a side), the rule of `hwbench compare`. Published rows are one figure each: they are compared, "
          "never with a confidence. Oversubscribed runs are left out.")


def _workloads(runs: pd.DataFrame, published: pd.DataFrame | None) -> list[tuple[str, str]]:
    measured = [] if runs.empty else [(m, p) for m, p in runs[runs["status"] == "ok"][["model", "precision"]]
                                      .drop_duplicates().itertuples(index=False)]
    if measured or published is None:
        return sorted(measured)
    return sorted({(row.model, row.precision or "precision not published") for row in published.itertuples()})


def _budget(rows: pd.DataFrame, model: str, tokens: float | None) -> tuple[float | None, str]:
    parameters = min((r for r in rows["parameters"] if is_number(r)), default=None) if not rows.empty else None
    if parameters is None and tokens is None:
        from hwbench.catalog import load_catalog
        from hwbench.workload.params import count_parameters

        workload = load_catalog().workloads.get(model)
        parameters = count_parameters(workload.model, 1).total if workload else None
    return token_budget(tokens, parameters)


def _measured(rows: pd.DataFrame, fits: dict[tuple, ScalingFit]) -> list[Candidate]:
    candidates = []
    ok = [row for row in rows.to_dict(orient="records") if usable(row)]
    for device in sorted({_device(row) for row in ok}):
        samples = _samples([row for row in ok if _device(row) == device])
        best = max(samples, key=lambda sample: statistics.median(r["tokens_per_s_per_device_charged"]
                                                                 for r in samples[sample]))
        runs = samples[best]
        first = runs[0]
        catalog, peak, mfu_note = _peak_texts(first)
        price = Price(first["price_usd_per_hour"], first["price_source"], first["price_date"]) \
            if is_number(first["price_usd_per_hour"]) else None  # a stand-in's run has none (report.cost)
        energy = [row["energy_per_token_j"] for row in runs if is_number(row["energy_per_token_j"])]
        candidates.append(Candidate(
            device=device,
            point=f"{first['layout']} x{first['world_size']} ranks" + (
                f", {first['point_variant']}" if first.get("point_variant") else "") + _environment_text(best, samples),
            devices=first["devices_charged"], per_device=[row["tokens_per_s_per_device_charged"] for row in runs],
            costs=[row["cost_per_million_tokens_usd"] for row in runs if is_number(row["cost_per_million_tokens_usd"])],
            energy=energy, price=price, price_why=None if price else first["price_source"],
            stand_in=first["stand_in"], fit=fits.get(group_key(first)) or fit_scaling([]),
            energy_why=None if energy else first["energy_reason"], variant=first.get("point_variant") or "",
            seq_length=first.get("seq_length"), catalog=catalog, peak=peak, mfu_note=mfu_note))
    return candidates


def _device(row: dict[str, Any]) -> str:
    """The device model a candidate stands for; a stand-in's runs are a candidate of their own."""
    return str(row["device_model"]) + (f" [{row['stand_in']}]" if row["stand_in"] else "")


Sample = tuple[str, tuple[tuple[str, str], ...]]


def _samples(rows: list[dict[str, Any]]) -> dict[Sample, list[dict[str, Any]]]:
    """Runs by sample, as `hwbench compare` and the history key them: the point (hwbench.point.PointKey)
    and the environment fields that move figures by themselves (threads per rank, versions)."""
    samples: dict[Sample, list[dict[str, Any]]] = {}
    for row in rows:
        samples.setdefault((row["point"], sample_environment(row)), []).append(row)
    return samples


def _environment_text(best: Sample, samples: dict[Sample, list[dict[str, Any]]]) -> str:
    """', tuning intra_op_threads=2 (3 runs of this point in another environment left out)' when the
    device ran the best point in more than one environment; '' otherwise."""
    point, environment = best
    others = [env for (other_point, env) in samples if other_point == point and env != environment]
    if not others:
        return ""
    mine, theirs = dict(environment), [dict(env) for env in others]
    differing = [field for field in dict.fromkeys(name for env in [environment, *others] for name, _ in env)
                 if any(env.get(field) != mine.get(field) for env in theirs)]
    left_out = sum(len(samples[(point, env)]) for env in others)
    return ("".join(f", {field} {_own_part(mine.get(field), [env.get(field) for env in theirs])}"
                    for field in differing)
            + f" ({left_out} run(s) of this point in another environment: a sample of their own, not pooled)")


def _own_part(text: str | None, others: list[str | None]) -> str:
    """Of a field's text ('allocator=..., intra_op_threads=2'), the comma-separated parts that the
    others do not all hold ('intra_op_threads=2'): the difference, not the whole mapping."""
    if text is None:
        return "unknown"
    held = [set((other or "").split(", ")) for other in others]
    return ", ".join(part for part in text.split(", ") if any(part not in parts for parts in held)) or text


def _peak_texts(row: dict[str, Any]) -> tuple[str, str, str]:
    """The catalog entry of a run's device and its peak for the run's precision with the source:
    the figure the run was measured against (the result's), else the entry's as the catalog has
    it (a simulated run, or one without a figure), and whether MFU was measured against it, or why not."""
    from hwbench.catalog import load_catalog

    precision = peak_precision(row["precision"])  # an FP8 run's MFU is against the BF16 peak
    entry = load_catalog().devices.get(row["catalog_entry"] or "")
    mfu = "MFU measured against this peak" if is_number(row["mfu"]) else f"no MFU: {row['mfu_reason']}"
    if entry is None:
        named = row["catalog_entry"]
        catalog = f"{named} (not in this catalog)" if named else "none: no catalog entry matches this device"
        return catalog, row["peak_flops_basis"] or "no catalog entry", mfu
    figure = entry.peak_flops.get(precision)
    peak = row["peak_flops_basis"] or (f"{entry.name} {precision}: {figure.describe()}" if figure
                                       else f"{entry.name} lists no {precision} peak")
    return f"{entry.name} ({entry.title})", peak, mfu


def _published_candidates(published: pd.DataFrame | None, model: str, prices: dict[str, Price],
                          precision: str | None = None) -> list[Candidate]:
    """The published rows of ``model`` as candidates; ``precision``: only the rows of that precision
    (as _workloads names it), for the published tables alone, where each precision is its own workload."""
    if published is None:
        return []
    candidates = []
    for _, pub in published[published["model"] == model].iterrows():
        if precision is not None and (pub["precision"] or "precision not published") != precision:
            continue
        seq = None if pd.isna(pub["seq_length"]) else int(pub["seq_length"])
        devices = int(pub["devices"])
        entry = PUBLISHED_DEVICE_ENTRIES.get(pub["device_class"] or "")
        price, why = device_price(entry, pub["device_class"] or None, None, prices)
        per_device = tokens_per_s_per_device(pub)
        cost = cost_per_million_tokens(price, devices, per_device * devices)
        source = f"; priced as catalog {entry}" if entry else ""
        candidates.append(Candidate(
            device=f"published {pub['name']} ({pub['device_class'] or 'device not named'}, {pub['precision'] or '?'}, "
                   f"{table_title(pub['table'])}{source})",
            point=f"{published_layout(pub)} on {devices}, seq {seq or '?'}",
            devices=devices, per_device=[per_device], costs=[cost] if cost is not None else [], energy=[],
            price=price, price_why=why, fit=fit_scaling([]), energy_why="not published", published=True,
            seq_length=seq))
    return candidates


def _workload_blocks(model: str, precision: str, measured: list[Candidate], published: list[Candidate],
                     projection: Projection) -> list[tuple]:
    blocks: list[tuple] = [("h", f"{model}, {precision}")]
    budget = f"{tokens_text(projection.tokens)} tokens ({projection.basis})" if projection.tokens else projection.basis
    blocks.append(("p", f"Token budget: {budget}; projected on {projection.devices} devices."))
    everyone = measured + published
    if not everyone:
        return blocks + [("p", "No usable run (all oversubscribed or without a throughput).")]
    fastest = max([c for c in everyone if not c.stand_in] or everyone, key=lambda c: c.median)
    blocks.append(("table", _candidates_table(everyone, fastest, projection)))
    if measured:
        blocks.append(("table", _peaks_table(measured, precision)))
    if len({c.variant for c in measured}) > 1:  # the devices' best points are not the same workload settings
        variants = [f"{c.device}: {c.variant or 'the defaults (native engine, no fsdp, recompute or compile)'}"
                    for c in measured]
        blocks.append(("p", "The best points differ in more than device and layout: " + "; ".join(variants)
                       + ". Each device is compared at its own best settings, not at the same ones."))
    blocks += [("p", sentence) for sentence in _verdicts(measured, published)]
    blocks += [("p", _projection_sentence(c, projection)) for c in measured]
    blocks += _fit_tables(measured)
    return blocks


def _candidates_table(candidates: list[Candidate], fastest: Candidate, projection: Projection) -> Table:
    def spread(c: Candidate) -> tuple[float | None, float | None]:
        return (min(c.per_device), max(c.per_device)) if len(c.per_device) > 1 else (None, None)

    return Table.of([
        ("device", lambda c: c.device), ("best point", lambda c: c.point), ("devices charged", lambda c: c.devices),
        ("runs", lambda c: "published" if c.published else len(c.per_device)),
        ("tokens/s per device (median, min-max)", lambda c: fmt(c.median, 1, low=spread(c)[0], high=spread(c)[1])),
        ("CV of repeats", _cv_cell), ("ratio to fastest", lambda c: fmt_ratio(c.median / fastest.median)),
        ("price/device-h", lambda c: usd(c.price.usd_per_hour if c.price else None, ",.4g", "no price")),
        ("$ per 1M tokens", lambda c: usd(statistics.median(c.costs) if c.costs else None, ",.4g", "no price")),
        ("J/token", lambda c: figure(statistics.median(c.energy) if c.energy else None, ".4g", "J", "not measured",
                                     note=None if c.energy else f"energy not measured: {c.energy_why}")),
        (f"days on {projection.devices}", lambda c: fmt(_train(c, projection)[0], 2)),
        (f"cost on {projection.devices}", lambda c: usd(_train(c, projection)[1], ",.0f", "no price")),
        ("scaling", _scaling_cell),
    ], candidates)


def _peaks_table(measured: list[Candidate], precision: str) -> Table:
    """Each measured device's catalog entry and its peak with the source, side by side."""
    return Table(["device", "catalog entry", f"peak per device ({precision}) and its source", "MFU"],
                 [[c.device, c.catalog, c.peak, c.mfu_note] for c in measured])


def _cv_cell(candidate: Candidate) -> Any:
    """The repeats' coefficient of variation (stdev / mean of tokens/s per device), 'noisy' past NOISY_CV."""
    if candidate.published:
        return "published: one figure"
    if len(candidate.per_device) < 2:
        return "one run"
    cv = throughput_statistics(candidate.per_device)["cv"]
    return percent(cv, missing=None) if cv <= NOISY_CV else f"{cv:.1%} noisy"


def _scaling_cell(candidate: Candidate) -> str:
    if candidate.published:
        return "one published count: linear"
    if candidate.fit.fitted:
        return f"fitted: {candidate.fit.efficiency_per_doubling:.0%} per doubling"
    return "one device count: linear"


def _train(candidate: Candidate, projection: Projection) -> tuple[float | None, float | None]:
    if candidate.stand_in:  # a stand-in's throughput is this host's, an emulated one no FP8 device's
        return None, None
    tokens_per_s = candidate.fit.project(candidate.median * candidate.devices, candidate.devices, projection.devices)
    return training_time_and_cost(projection.tokens, tokens_per_s, projection.devices, candidate.price)


def _projection_sentence(candidate: Candidate, projection: Projection) -> str:
    if candidate.stand_in:
        return f"{candidate.device}: {STAND_IN_PROJECTION[candidate.stand_in]}."
    days, cost = _train(candidate, projection)
    if days is None or projection.tokens is None:  # no tokens: no days either
        return f"{candidate.device}: no projection ({projection.basis})."
    money = f" and costs ${cost:,.0f}" if cost is not None else f"; its cost is unknown ({candidate.price_why})"
    return (f"Time to train on {projection.devices} x {candidate.device}: {tokens_text(projection.tokens)} tokens "
            f"take {fmt(days, 2)} days{money}, {candidate.fit.assumption(projection.devices)}.")


def _verdicts(measured: list[Candidate], published: list[Candidate]) -> list[str]:
    """The faster, the cheaper and the published comparison; a simulated device is left out of
    each (its figures are this host's, not the device's), and so is an emulated FP8 run."""
    simulated = [c.device for c in measured if c.stand_in == SIMULATED]
    emulated = [c.device for c in measured if c.stand_in == EMULATED]
    measured = [c for c in measured if not c.stand_in]
    lines = _measured_verdicts(measured, published)
    if simulated:
        lines.append(f"Left out of every verdict: {', '.join(simulated)}: a stand-in ran the vendor's code path on "
                     "this host, so its figures measure this host, not the device.")
    if emulated:
        lines.append(f"Left out of every verdict: {', '.join(emulated)}: FP8 ran emulated (computed without FP8 "
                     "matrix units), so its speed describes no FP8 device.")
    return lines


def _measured_verdicts(measured: list[Candidate], published: list[Candidate]) -> list[str]:
    if not measured:
        lines = ["No device was measured on its own hardware for this workload: the published rows are compared "
                 "with each other."]
    elif len(measured) < 2:
        against = "compared with the published rows only" if published else "and no published row exists for it"
        lines = [f"Only one device model was measured for this workload ({measured[0].device}): no measured "
                 f"comparison, {against}."]
    else:
        lines = [_faster(measured), _cheaper(measured)]
    if measured and published:
        lines.append(_against_published(measured, published))
    elif not measured and len(published) > 1:
        lines.append(_published_only(published))
    return lines


def _faster(candidates: list[Candidate]) -> str:
    ranked = sorted(candidates, key=lambda c: c.median, reverse=True)
    verdict = _significance(ranked[0].per_device, ranked[1].per_device, higher_is_better=True)
    ratio = ranked[0].median / ranked[1].median
    what = f"{ratio:.2f}x the tokens/s per device of {ranked[1].device}"
    spread = _spread(ranked[:2], lambda c: c.per_device, "tokens/s per device", lambda v: f"{v:,.1f}")
    return _named("Faster", ranked[0].device, what, verdict, ranked[0], ranked[1], spread)


def _cheaper(candidates: list[Candidate]) -> str:
    unpriced = [c for c in candidates if not c.costs]
    if unpriced:
        return f"Cheaper: cannot say: {unpriced[0].price_why}."
    ranked = sorted(candidates, key=lambda c: statistics.median(c.costs))
    verdict = _significance(ranked[0].costs, ranked[1].costs, higher_is_better=False)
    low, high = statistics.median(ranked[0].costs), statistics.median(ranked[1].costs)
    what = f"${low:,.4g} per million tokens against ${high:,.4g} on {ranked[1].device} ({low / high:.2f}x)"
    spread = _spread(ranked[:2], lambda c: c.costs, "$ per million tokens", lambda v: f"${v:,.4g}")
    return _named("Cheaper", ranked[0].device, what, verdict, ranked[0], ranked[1], spread)


def _named(kind: str, winner: str, what: str, verdict: PointComparison, first: Candidate, second: Candidate,
           spread: str) -> str:
    """The verdict sentence: the winner only when the repeats show it, and always how widely the
    repeats of each side spread (``spread``), so that a noisy sample is seen where the verdict is read."""
    counts = f"{len(first.per_device)} and {len(second.per_device)} runs"
    if verdict.verdict == "improvement":
        return f"{kind}: {winner}, {what}; shown by the repeats ({counts}; {verdict.rule}). {spread}"
    if verdict.outcome == INCONCLUSIVE:  # past the threshold, but the repeats cannot tell it from noise
        return f"{kind}: {verdict.verdict} ({winner} leads: {what}; {verdict.rule}). {spread}"
    reason = ("fewer than 2 runs a side" if verdict.verdict == "no repeats"
              else f"{verdict.rule}, within {DEFAULT_THRESHOLD:.0%}")
    return f"{kind}: not distinguishable with {counts} ({winner} leads: {what}; {reason}). {spread}"


def _spread(candidates: list[Candidate], values: Callable[[Candidate], list[float]], what: str,
            write: Callable[[float], str]) -> str:
    """'Spread of the repeats (tokens/s per device): A 186.0-651.0, CV 55.5%, noisy (CV above 5%); B one run.'"""
    parts = []
    for candidate in candidates:
        figures = values(candidate)
        if len(figures) < 2:
            parts.append(f"{candidate.device} one run, no spread measured")
            continue
        statistics_ = throughput_statistics(figures)
        noisy = f", noisy (CV above {NOISY_CV:.0%})" if statistics_["noisy"] else ""
        parts.append(f"{candidate.device} {write(min(figures))}-{write(max(figures))}, "
                     f"CV {statistics_['cv']:.1%}{noisy}")
    return f"Spread of the repeats ({what}): " + "; ".join(parts) + "."


def _significance(best: list[float], other: list[float], higher_is_better: bool) -> PointComparison:
    """`hwbench compare`'s verdict of ``best`` (as current) against ``other`` (as baseline): a
    single run a side is "no repeats", never a winner."""
    comparison = PointComparison(key=None, label="", baseline=list(other), current=list(best),
                                 baseline_statuses=["ok"] * len(other), current_statuses=["ok"] * len(best))
    if len(best) < 2 or len(other) < 2:
        comparison.verdict, comparison.rule = "no repeats", "no repeats"
        return comparison
    return compare_point(comparison, DEFAULT_THRESHOLD, higher_is_better)


def _against_published(measured: list[Candidate], published: list[Candidate]) -> str:
    best = max(measured, key=lambda c: c.median)
    parts = [f"{best.median / p.median:.3g}x {p.device.removeprefix('published ')}"
             + (f" (at seq {best.seq_length} against its {p.seq_length}: not the same workload)"
                if best.seq_length and p.seq_length and best.seq_length != p.seq_length else "")
             for p in published]
    return (f"Against the published tables (tokens/s per device): {best.device} reaches " + "; ".join(parts)
            + ". Each published row is one figure without repeats: no confidence can be stated.")


def _published_only(published: list[Candidate]) -> str:
    ranked = sorted(published, key=lambda c: c.median, reverse=True)
    faster = (f"On the published figures alone, {ranked[0].device} has {ranked[0].median / ranked[1].median:.2f}x "
              f"the tokens/s per device of {ranked[1].device}; one figure each, no repeats: no confidence can be "
              "stated.")
    unpriced = [c for c in published if not c.costs]
    if unpriced:
        return faster + f" Cheaper: cannot say: {unpriced[0].price_why}."
    cheap = sorted(published, key=lambda c: c.costs[0])
    return faster + (f" Cheaper on the published figures: {cheap[0].device}, ${cheap[0].costs[0]:,.4g} per million "
                     f"tokens against ${cheap[1].costs[0]:,.4g} (one figure each: no confidence).")


def _fit_tables(measured: list[Candidate]) -> list[tuple]:
    blocks: list[tuple] = []
    for c in (c for c in measured if c.fit.fitted):
        blocks += [("p", f"Scaling of {c.device}: fitted points (least squares of log2 tokens/s on log2 devices; "
                         f"{c.fit.efficiency_per_doubling:.0%} efficiency per doubling)."),
                   ("table", _fit_table(c.fit))]
    return blocks


def _fit_table(fit: ScalingFit) -> Table:
    return Table.of([
        ("devices", lambda p: p.devices), ("point", lambda p: p.layout.split(" (")[0]), ("runs", lambda p: p.runs),
        ("tokens/s measured", lambda p: fmt(p.tokens_per_s, 1)),
        ("tokens/s fitted", lambda p: fmt(fit.fitted_tokens_per_s(p.devices), 1)),
        ("ideal (linear)", lambda p: fmt(fit.ideal_tokens_per_s(p.devices), 1)),
        ("efficiency vs ideal", lambda p: percent(p.tokens_per_s / fit.ideal_tokens_per_s(p.devices), 0)),
    ], fit.points)
