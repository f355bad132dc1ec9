"""The report's sections, each a function of the runs table (and what belongs to it) that
returns a Section of the document: what each says is described in docs/reports.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from hwbench.harness.goodput import summed_goodput
from hwbench.metrics import METRICS
from hwbench.report.against_published import NORMALISATION, published_layout
from hwbench.report.cells import (
    Cell,
    device_text,
    figure,
    fmt,
    fmt_g,
    fmt_ratio,
    gib_cell,
    is_number,
    noted,
    percent,
    tokens_cell,
    usd,
)
from hwbench.report.cost import SCALING_ASSUMPTION
from hwbench.report.document import Section, Table
from hwbench.report.published import publishes_tokens, table_title, tokens_per_s_per_device
from hwbench.report.summary import wait_straggler_text
from hwbench.result.model import BREAKDOWN_CATEGORIES, GOODPUT_PHASES, Goodput, RunResult, TimeBreakdown
from hwbench.workload.flops import counts_hardware_flops, hfu_reason


def runs_section(runs: pd.DataFrame) -> Section:
    section = Section("Runs")
    statuses = runs["status"].value_counts().to_dict()
    section.blocks.append(("p", f"{len(runs)} result(s): "
                                + ", ".join(f"{n} {s}" for s, n in statuses.items())
                                + ". Only runs with status ok enter the comparisons."))
    columns: list[tuple[str, Callable[[pd.Series], Any]]] = [
        ("run", lambda run: run["run_id"]), ("status", lambda run: run["status"]), ("model", lambda run: run["model"]),
        ("device", device_text), ("layout", lambda run: run["layout"]), ("precision", lambda run: run["precision"]),
        (METRICS["samples_per_s"].label, lambda run: fmt(run[METRICS["samples_per_s"].column])), ("note", _run_note),
    ]
    section.blocks.append(("table", Table.of(columns, _rows(runs))))
    return section


def _rows(runs: pd.DataFrame, ok: bool = False) -> list[pd.Series]:
    """The runs table's rows in order; ``ok``: only the runs with status ok."""
    return [run for _, run in (runs[runs["status"] == "ok"] if ok else runs).iterrows()]


def _run_note(run: pd.Series) -> str:
    """The error of a failed run, and the mark of an oversubscribed one (with why)."""
    notes = [run["error"]] if run["error"] else []
    if run["oversubscribed"] is True:
        notes.append(f"oversubscribed ({run['oversubscribed_reason']}): left out of decisions and scaling fits")
    return "; ".join(notes)


PUBLISHED_INTRO = (
    ". A measured run is shown under every published row of its model, whatever its layout; the note names "
    "every setting that differs from the published point (layout, device count, sequence length, batch, "
    "precision and its recipe, recompute, compile, engine). Where the layout or device count differs, read the "
    "per-device ratio.")
SAMPLES_INTRO = (
    "Published samples/s is the global figure of all of a row's devices (Tables 2 and 3: 8 devices, the mean of "
    "the last 100 logged samples/sec); PPL is the lowest validation PPL.")
TOKENS_INTRO = (
    "The Llama tables publish tokens/s per GPU (torchtitan, Megatron-Bridge) or for all GPUs (DGX Cloud "
    "Benchmarking), each measured its own way (said under each table); a measured run is read against them "
    "in tokens/s per device. Megatron-Bridge's TFLOP/s per GPU is its own model FLOPs count, shown beside "
    "the run's (hwbench's formula): compare the tokens, not the FLOPs.")


def published_section(
    runs: pd.DataFrame, comparison: pd.DataFrame, published: pd.DataFrame | None, note: str | None
) -> Section:
    section = Section("Against the published tables")
    if published is None:
        section.blocks.append(("p", note or "No published tables were given."))
        return section
    section.blocks.append(("p", "Published figures: " + ", ".join(sorted(set(published["file"]))) + PUBLISHED_INTRO))
    section.blocks.append(("p", NORMALISATION))
    intros = {TOKENS_INTRO if publishes_tokens(pub) else SAMPLES_INTRO for _, pub in published.iterrows()}
    section.blocks += [("p", intro) for intro in (SAMPLES_INTRO, TOKENS_INTRO) if intro in intros]
    for table_name, group in published.groupby("table", sort=True):
        section.blocks.append(("h", table_title(table_name)))
        tokens = any(publishes_tokens(pub) for _, pub in group.iterrows())
        section.blocks += _table_source(group)
        table = Table(TOKENS_HEADERS if tokens else SAMPLES_HEADERS, [])
        common = _common_notes(group)
        for _, pub in group.iterrows():
            table.rows.append(_tokens_published_row(pub, common) if tokens else _samples_published_row(pub))
            if not comparison.empty:
                matched = comparison[(comparison["table"] == pub["table"]) & (comparison["name"] == pub["name"])
                                     & (comparison["model"] == pub["model"])]
                table.rows += [_tokens_measured_row(c) if tokens else _measured_row(pub, c)
                               for _, c in matched.iterrows()]
        section.blocks.append(("table", table))
    compared = set() if comparison.empty else set(comparison["run_id"])
    unmatched = [f"{run['run_id']} ({run['model']}, {run['layout']}): not compared; no published row for model "
                 f"{run['model']}" for run in _rows(runs, ok=not runs.empty) if run["run_id"] not in compared]
    if unmatched:
        section.blocks.append(("p", "Runs without a published counterpart:"))
        section.blocks.append(("list", unmatched))
    return section


SAMPLES_HEADERS = ["NAME", "params", "PPL", "samples/s", "seq_len", "Steps", "layout", "samples/s per device",
                   "ratio", "ratio per device", "note"]
TOKENS_HEADERS = ["NAME", "model / params", "GPU", "precision", "layout", "seq_len", "micro/global batch",
                  "tokens/s per device", "TFLOP/s per device", "ratio per device", "note"]


def _table_source(group: pd.DataFrame) -> list[tuple]:
    """Where a table's figures come from, as its rows give it (the document, its address, the day
    it was read; the GPT tables give the document only), and what every row of it shares: the
    model as the source names it, engine, software and the notes common to all its rows."""
    parts = []
    for column, label in (("source", "Source:"), ("url", "at"), ("date_read", "read"),
                          ("source_model", "model as published:"), ("engine", "engine:"), ("software", "software:")):
        values = sorted({str(v) for v in group[column] if v})
        if values:
            parts.append(f"{label} {'; '.join(values)}")
    common = _common_notes(group)
    return [("p", ", ".join(parts) + "." + (f" Every row: {'; '.join(common)}." if common else ""))] if parts else []


def _note_parts(pub: pd.Series) -> list[str]:
    return [part.strip() for part in str(pub.get("notes") or "").split(";") if part.strip()]


def _common_notes(group: pd.DataFrame) -> list[str]:
    """The parts of the `notes` (separated by ";") that every row of a table has, in order."""
    rows = [_note_parts(pub) for _, pub in group.iterrows()]
    return [part for part in rows[0] if all(part in row for row in rows[1:])] if rows else []


def _samples_published_row(pub: pd.Series) -> list[Any]:
    return [pub["name"], pub["params"], fmt_g(pub["ppl"]), fmt_g(pub["samples_per_s"]),
            fmt(pub["seq_length"], 0), fmt(pub["steps"], 0), f"{published_layout(pub)} on {int(pub['devices'])}",
            fmt(pub["samples_per_s"] / pub["devices"], 3), "", "", pub.get("device_class", "")]


def _tokens_published_row(pub: pd.Series, common: list[str]) -> list[Any]:
    """A published Llama row: the figure as published (tokens/s per GPU, or the global figure
    divided by the GPUs, said so), the precision with its recipe, the power limit where given,
    and the notes that are the row's own (``common``: those of every row, said above the table)."""
    per_device = tokens_per_s_per_device(pub)
    cell = fmt_g(per_device) if not pd.isna(pub["tokens_per_s_per_device"]) else fmt(
        per_device, 0, note=f"{_published_global(pub)} on {int(pub['devices'])} GPUs, divided by them")
    power = "" if pd.isna(pub["power_limit_w"]) else f" at {fmt_g(pub['power_limit_w']).text} W"
    precision = pub["precision"] + (f" ({pub['recipe']})" if pub["recipe"] else "")
    notes = (["torch.compile"] if pub["compile"] is True else []) + [
        part for part in _note_parts(pub) if part not in common]
    return [pub["name"], pub["params"], f"{int(pub['devices'])} x {pub['device_class'] or '?'}{power}", precision,
            f"{published_layout(pub)} on {int(pub['devices'])}", fmt(pub["seq_length"], 0),
            f"{fmt(pub['micro_batch_size'], 0).text}/{fmt(pub['global_batch_size'], 0).text}", cell,
            fmt_g(pub["tflops_per_device"]), "", "; ".join(notes)]


def _tokens_measured_row(c: pd.Series) -> list[Any]:
    """A measured run under a published Llama row: its tokens/s per device against the published
    figure per GPU, and every setting that differs said in words."""
    notes = ([f"{c['stand_in']}: not a hardware figure"] if c["stand_in"]
             else ["CPU run"] if c["backend"] == "cpu" else [])
    if c["differences"]:
        notes.append("differs: " + ", ".join(c["differences"]))
    batch = f"{fmt(c['measured_micro_batch_size'], 0).text}/{fmt(c['measured_global_batch_size'], 0).text}"
    layout = ("FSDP " if c["measured_fsdp"] is True else "") + f"{c['layout']} on {c['world_size']}"
    return [f"↳ measured {c['run_id']}", c["model"], f"{c['world_size']} x {c['device_model']}",
            c["measured_precision"], layout, fmt(c["seq_length"], 0), batch,
            fmt(c["measured_tokens_per_s_per_device"], 0), fmt(c["measured_tflops_per_device"], 1),
            fmt_ratio(c["ratio_per_device"]), "; ".join(notes)]


def _published_global(pub: pd.Series) -> str:
    """A row's global figure as published: "111,054 tokens/s" (or samples/s)."""
    if pd.isna(pub["tokens_per_s"]):
        return f"published {fmt_g(pub['samples_per_s']).text} samples/s x {int(pub['seq_length'])} tokens"
    return f"published {fmt_g(pub['tokens_per_s']).text} tokens/s"


def _measured_row(pub: pd.Series, c: pd.Series) -> list[Any]:
    """A measured run's row under the published row it is compared with."""
    ppl = f"{fmt_g(c['measured_ppl'])} (step {c['measured_ppl_step']})" if is_number(c["measured_ppl"]) else "-"
    notes = ([f"{c['stand_in']}: not a hardware figure"] if c["stand_in"]
             else ["CPU run"] if c["backend"] == "cpu" else [])
    if c["differences"]:
        notes.append("differs: " + ", ".join(c["differences"]))
    return [f"↳ measured {c['run_id']}", pub["params"], ppl, fmt(c["measured_samples_per_s"], 3),
            fmt(c["seq_length"], 0), f"{c['timed_steps']} timed",
            f"{c['layout']} on {c['world_size']} ({c['device_model']})",
            fmt(c["measured_samples_per_s_per_device"], 3), fmt_ratio(c["ratio"]), fmt_ratio(c["ratio_per_device"]),
            "; ".join(notes)]


def model_section(runs: pd.DataFrame, images: dict[str, str], also_formula: str | None = None) -> Section:
    """``also_formula``: a FLOPs formula whose MFU gets a column beside each run's own. A figure of
    a formula that counts the recompute (megatron-deepspeed) for a run that recomputes is hardware
    FLOPs utilisation: it goes in a column headed HFU, with a note saying why, never under MFU."""
    section = Section("Per model")
    section.blocks.append(("p", "Every layout measured, by model. Peak memory is the allocator's peak allocated "
                                "bytes (on the CPU, the peak resident set); predicted is hwbench's planner "
                                "(`hwbench plan`) for the run's own spec and backend; capacity is the device's."))
    ok = runs[runs["status"] == "ok"]
    for model, group in ok.groupby("model", sort=True):
        section.blocks.append(("h", f"{model}"))
        ordered = [run for _, run in group.sort_values(["world_size", "layout"]).iterrows()]
        own = [_utilisation(run, run["flops_formula"], run["mfu"], run["mfu_reason"]) for run in ordered]
        ceiling = [_utilisation(run, run["flops_formula"], run["mfu_measured_ceiling"],
                                run["mfu_measured_ceiling_reason"], "against a measured ceiling ") for run in ordered]
        also = [_also_utilisation(run, also_formula) for run in ordered] if also_formula else []
        utilisation = [_utilisation_columns("", own),
                       *([_utilisation_columns(f" ({also_formula})", also)] if also_formula else []),
                       _utilisation_columns(" (measured ceiling)", ceiling)]
        moe = any(run["moe"] is True for run in ordered)
        columns = [(header, lambda item, cell=cell: cell(*item)) for header, cell in _model_columns(utilisation, moe)]
        section.blocks.append(("table", Table.of(columns, enumerate(ordered))))
        if moe:
            section.blocks.append(("p", MOE_NOTE))
        section.blocks += _model_images(str(model), images)
    if ok.empty:
        section.blocks.append(("p", "No run with status ok."))
    return section


# A column of the per-model table: its header and its cell of the index-th run.
Column = tuple[str, Callable[[int, pd.Series], Any]]


def _model_columns(utilisation: list[tuple[list[str], list[list[Any]]]], moe: bool = False) -> list[Column]:
    """The per-model table's columns, header and cell side by side; the registry's figures under
    their registry label (hwbench.metrics.METRICS); ``utilisation``: the MFU/HFU columns' headers
    and each run's cells (_utilisation_columns), in order; ``moe``: a mixture-of-experts model's
    routing and all-to-all columns too."""
    def metric(name: str, digits: int) -> Column:
        """A registry figure under its label, read from its column of the runs table (Metric.column)."""
        return METRICS[name].label, lambda index, run: fmt(run[METRICS[name].column], digits)

    def figure_columns(headers: list[str], cells: list[list[Any]]) -> list[Column]:
        def cell_at(at: int) -> Callable[[int, pd.Series], Any]:
            return lambda index, run: cells[index][at]

        return [(header, cell_at(at)) for at, header in enumerate(headers)]

    return [
        ("run", lambda index, run: run["run_id"] + (" [oversubscribed]" if run["oversubscribed"] is True else "")),
        ("device", lambda index, run: device_text(run)),
        ("layout", lambda index, run: run["layout"]),
        ("engine", lambda index, run: _engine_text(run)),
        ("precision", lambda index, run: run["precision"] + (", recompute" if run["recompute"] else "")),
        ("micro/global", lambda index, run: f"{run['micro_batch_size']}/{run['global_batch_size']}"),
        ("seq", lambda index, run: run["seq_length"]),
        metric("samples_per_s", 2), metric("tokens_per_s", 0), metric("tflops_per_device", 3),
        *[column for headers, cells in utilisation for column in figure_columns(headers, cells)],
        # the allocator's peak allocated bytes where the device keeps them, else the reserved (resident) peak
        (METRICS["peak_memory"].label, lambda index, run: gib_cell(run["peak_bytes"])),
        ("predicted", lambda index, run: gib_cell(run["predicted_peak_bytes"], note=_predicted_note(run))),
        ("capacity", lambda index, run: gib_cell(run["capacity_bytes"])),
        *(_moe_columns() if moe else []),
    ]


def _moe_columns() -> list[Column]:
    """A mixture-of-experts model's figures: the expert imbalance (median step, worst layer), the
    assignments dropped over capacity, and expert parallelism's all-to-all share of the step."""
    imbalance, share = METRICS["moe_imbalance"], METRICS["all_to_all_share"]
    return [
        (imbalance.label, lambda index, run: figure(run[imbalance.column], ".3g")),
        ("dropped", lambda index, run: percent(run["moe_dropped_fraction"])),
        (share.label, lambda index, run: percent(run[share.column], note=None if is_number(run[share.column]) else
                                                 "no expert parallelism (EP1): no all-to-all")),
    ]


MOE_NOTE = ("Expert imbalance: the assignments of the busiest expert over the mean per expert, in the MoE layer "
            "where that is highest, over a step's global batch, the median of the timed steps (1: even); dropped: "
            "the assignments over the experts' capacity; all-to-all share: the time every rank spent in expert "
            "parallelism's dispatch and combine all-to-alls over its step time (docs/methodology.md).")


def _engine_text(run: pd.Series) -> str:
    return (run["engine"] + (f" ZeRO {run['zero_stage']}" if run["engine"] == "deepspeed" else "")
            + (" FSDP" if run["fsdp"] else ""))


def _utilisation(run: pd.Series, formula: Any, value: Any, reason: Any, against: str = "") -> tuple[Any, bool]:
    """A run's utilisation figure counted by ``formula`` as a cell, and whether it is HFU: the
    formula counts the recompute and the run recomputes (the note then says so)."""
    hardware = counts_hardware_flops(formula if isinstance(formula, str) else None, bool(run["recompute"]))
    label = "HFU" if hardware else "MFU"
    if is_number(value):
        return percent(value, note=hfu_reason(formula) if hardware else None), hardware
    return percent(value, note=f"{label} {against}not measured: {reason or 'not measured'}"), hardware


def _also_utilisation(run: pd.Series, formula: str) -> tuple[Any, bool]:
    by_formula = run["mfu_by_formula"] or {}
    if formula not in by_formula:
        hardware = counts_hardware_flops(formula, bool(run["recompute"]))
        why = f"no {formula} figures in the result (written before hwbench counted that formula)"
        return percent(None, note=why), hardware
    reason = (run["mfu_reason_by_formula"] or {}).get(formula) or run["mfu_reason"]
    return _utilisation(run, formula, by_formula[formula], reason)


def _utilisation_columns(suffix: str, figures: list[tuple[Any, bool]]) -> tuple[list[str], list[list[Any]]]:
    """The headers and each row's cells of one utilisation figure: "MFU<suffix>" for the model
    FLOPs ones and "HFU<suffix>" for the hardware FLOPs ones, each column only where a run has
    one, so that no HFU figure stands under an MFU heading; a row's cell of the other is "-"."""
    kinds = [hardware for _, hardware in figures]
    columns = [hardware for hardware in (False, True) if hardware in kinds] or [False]
    headers = [("HFU" if hardware else "MFU") + suffix for hardware in columns]
    cells = [[cell if hardware == column else "-" for column in columns] for cell, hardware in figures]
    return headers, cells


def _predicted_note(run: pd.Series) -> str | None:
    """Why there is no prediction; on the CPU, what the prediction covers and the measured peak does not."""
    if not is_number(run["predicted_peak_bytes"]):
        return f"no prediction: {run['predicted_reason']}"
    if run["backend"] == "cpu":
        return CPU_PREDICTION_NOTE
    return None


# The planner models the tensors of training; a CPU run's measured peak is the resident set of the
# whole process (docs/planner.md, 'Checking it').
CPU_PREDICTION_NOTE = (
    "on the CPU the measured peak is the process's peak resident set (VmHWM): besides the tensors "
    "the planner predicts (weights, gradients, optimizer states, activations, logits) and its fixed "
    "0.5 GiB for the runtime, it holds the Python interpreter, torch's libraries and the pages the "
    "allocator keeps, which the planner does not model; compare the two only as a bound"
)


def _model_images(model: str, images: dict[str, str]) -> list[tuple]:
    blocks: list[tuple] = [("img", f"{kind}:{model}", f"{model}: {alt}") for kind, alt in (
        ("throughput", "throughput per device charged"), ("scaling", "scaling with devices charged"),
        ("memory", "peak memory against predicted and capacity")) if f"{kind}:{model}" in images]
    if images and f"scaling:{model}" not in images:
        blocks.append(("p", f"No scaling plot for {model}: no device model of it was measured at two or more "
                            "device counts (oversubscribed runs left out)."))
    return blocks


def procurement_section(runs: pd.DataFrame, devices: int, notes: list[str]) -> Section:
    section = Section("Procurement")
    section.blocks.append(("p", "Cost per million tokens = price per device-hour / 3600 x devices charged / "
                                "tokens/s x 1e6; devices charged: ranks on one CPU socket are one CPU, a GPU or NPU "
                                "run is charged its devices (the count and its basis are shown). Energy per token = "
                                "energy the devices used over the telemetry window (which brackets the timed steps) "
                                "/ tokens of the timed steps; average power is the devices' mean power summed."))
    section.blocks.append(("p", f"Projection: time and cost to train each run's token budget on {devices} devices "
                                f"of the same kind (--tokens, default 20 per parameter; --projection-devices). "
                                f"{SCALING_ASSUMPTION}"))
    table = Table.of(_procurement_columns(devices), _rows(runs, ok=True))
    section.blocks.append(("table", table))
    if notes:
        section.blocks.append(("list", notes))
    return section


def _procurement_columns(devices: int) -> list[tuple[str, Callable[[pd.Series], Any]]]:
    return [
        ("run", lambda run: run["run_id"] + (" [oversubscribed]" if run["oversubscribed"] is True else "")),
        ("device", device_text),
        ("devices charged",
         lambda run: figure(run["devices_charged"], "d", note=f"devices charged: {run['devices_charged_basis']}")),
        ("tokens/s per device", lambda run: fmt(run["tokens_per_s_per_device_charged"], 1)),
        ("J/token", lambda run: fmt(run["energy_per_token_j"], 4, " J", missing="not measured",
                                    note=None if is_number(run["energy_per_token_j"])
                                    else f"energy not measured: {run['energy_reason']}")),
        ("avg power", lambda run: fmt(run["power_w_mean"], 0, " W", missing="not measured")),
        ("price/device-h", _price_cell),
        ("$ per 1M tokens", lambda run: usd(run["cost_per_million_tokens_usd"], ",.4f", "no price")),
        ("token budget", lambda run: tokens_cell(run["token_budget"])),
        (f"days on {devices}", lambda run: fmt(run["projected_days"], 2)),
        ("projected cost", lambda run: usd(run["projected_cost_usd"], ",.0f", "no price")),
        ("scaling", lambda run: noted("", f"scaling: {run['projection_basis']}")),
    ]


def _price_cell(run: pd.Series) -> Any:
    if not is_number(run["price_usd_per_hour"]):
        return usd(run["price_usd_per_hour"], ",.4g", "no price", note=f"no price: {run['price_source']}")
    date = f", {run['price_date']}" if run["price_date"] else ""
    return usd(run["price_usd_per_hour"], ",.4g", "no price", note=f"price: {run['price_source']}{date}")


def convergence_section(runs: pd.DataFrame, images: dict[str, str]) -> Section:
    section = Section("Convergence")
    section.blocks.append(("p", "Training loss (nats) at the first and last step and the validation PPL after the "
                                "step shown; the floor is the lowest reachable PPL of the run's data (built-in or "
                                "synthetic; none for a dataset)."))
    table = Table.of([
        ("run", lambda run: run["run_id"]), ("model", lambda run: run["model"]),
        ("loss first", lambda run: fmt(run["loss_start"], 3)), ("loss last", lambda run: fmt(run["loss_end"], 3)),
        ("validation PPL", lambda run: fmt(run["valid_ppl"], 3) if is_number(run["valid_ppl"])
         else f"- ({run['valid_ppl_reason'] or 'not measured'})"),
        ("after step", lambda run: "-" if run["valid_ppl_step"] is None or not is_number(run["valid_ppl"])
         else run["valid_ppl_step"]),
        ("PPL floor", lambda run: fmt(run["ppl_floor"], 3)),
    ], _rows(runs, ok=True))
    section.blocks += [("table", table)] + [
        ("img", key, f"{key.removeprefix('loss:')}: loss curves by device, layout and precision (click a legend "
                     "entry to hide or show it)") for key in sorted(k for k in images if k.startswith("loss:"))]
    return section


def checkpoint_section(runs: pd.DataFrame) -> Section:
    """What each run's checkpoints cost: size, storage rate, the stall per save, and what a
    --save-interval policy costs in stall time per hour of training; restarts and their cost."""
    section = Section("Checkpoints")
    saved = runs[runs["checkpoint_saves"].fillna(0).astype(int) > 0] if "checkpoint_saves" in runs else runs.iloc[:0]
    if saved.empty:
        section.blocks.append(("p", "No run saved a checkpoint (`hwbench run --save DIR --save-interval N` measures "
                                    "them; docs/checkpoints.md)."))
        return section
    section.blocks.append(("p", "One checkpoint's size (every rank's files), the storage's rate for it (all ranks "
                                "together: bytes / the slowest rank's time), how long training stalled per save, and "
                                "the policy's price: seconds of every hour of training spent stalled at the run's "
                                "--save-interval and step time. Restarts: torchrun restarts (--max-restarts) and the "
                                "steps and seconds they lost, left out of the throughput."))
    section.blocks.append(("table", Table.of([
        ("run", lambda run: run["run_id"]), ("model", lambda run: run["model"]), ("layout", lambda run: run["layout"]),
        ("checkpoint", lambda run: gib_cell(run["checkpoint_save_bytes"])),
        ("save GB/s", lambda run: fmt(run["checkpoint_save_gb_per_s"], 3)),
        ("stall per save", lambda run: fmt(run["checkpoint_save_stall_s"], 3, " s")),
        ("every", lambda run: (f"{run['checkpoint_save_interval']} steps" if run["checkpoint_save_interval"]
                               else "end only") + (", async" if run["checkpoint_async"] else "")),
        ("stall s/hour", lambda run: fmt(run["checkpoint_stall_s_per_hour"], 1)
         if is_number(run["checkpoint_stall_s_per_hour"])
         else f"- ({run['checkpoint_stall_reason'] or 'not measured'})"),
        ("load GB/s", lambda run: fmt(run["checkpoint_load_gb_per_s"], 3)
         if is_number(run["checkpoint_load_gb_per_s"]) else "-"),
        ("restarts (lost)", lambda run: f"{run['restarts']} ({run['restart_steps_lost']} steps, "
         f"{fmt(run['restart_time_lost_s'], 1)} s)" if run["restarts"] else "-"),
    ], _rows(saved))))
    return section


def goodput_section(runs: pd.DataFrame, results: list[RunResult]) -> Section | None:
    """Where each run's wall time went: the share in training steps against initialisation, loads,
    validation, saves, restarts and the rest; None when no run kept a phase clock."""
    measured = runs[runs["goodput"].notna()] if "goodput" in runs else runs.iloc[:0]
    if measured.empty:
        return None
    section = Section("Goodput")
    section.blocks.append(("p", "Each run's wall time on rank 0's host clock, from the start of the run to the end of "
                                "its measurement, charged phase by phase (docs/methodology.md, Goodput): goodput is "
                                "the share in training steps, warm-up included. The shares of a run sum to 1. A "
                                "sweep's row sums its runs' clocks (the time between them, process starts and "
                                "imports, is in the sweep's own summary, not in result files)."))
    section.blocks.append(("table", Table.of([
        ("run", lambda run: run["run_id"]), ("model", lambda run: run["model"]), ("layout", lambda run: run["layout"]),
        ("wall s", lambda run: fmt(run["goodput_total_s"], 1)),
        ("goodput", lambda run: percent(run["goodput"])),
        *[(label, _share_cell(phase)) for phase, label in GOODPUT_PHASES.items()],
    ], _rows(measured) + _sweep_goodput_rows(results))))
    return section


def _sweep_goodput_rows(results: list[RunResult]) -> list[pd.Series]:
    """A row per sweep with more than one run here: its runs' clocks summed (harness.goodput's
    summed_goodput; the time between the runs is in no result file, so none is added)."""
    by_suite: dict[str, list[Goodput]] = {}
    for result in results:
        if result.sweep is not None and result.sweep.suite and result.metrics.goodput is not None:
            by_suite.setdefault(result.sweep.suite, []).append(result.metrics.goodput)
    rows = []
    for suite, clocks in by_suite.items():
        summed = summed_goodput(clocks, None) if len(clocks) > 1 else None
        if summed is None:
            continue
        rows.append(pd.Series({"run_id": f"sweep {suite} ({summed.runs} runs)", "model": "", "layout": "",
                               "goodput_total_s": summed.total_s, "goodput": summed.goodput,
                               **{f"goodput_share_{phase}": summed.share(seconds)
                                  for phase, seconds in summed.phases_s.items()}}))
    return rows


def _share_cell(phase: str) -> Callable[[dict[str, Any]], Cell]:
    return lambda run: percent(run[f"goodput_share_{phase}"])


def profile_section(results: list[RunResult]) -> Section | None:
    """Where the time goes: each profiled run's ranks, a row each (seconds per profiled step and each
    category's share), and the rank the others waited for; None when no run was profiled (--profile)."""
    profiled = [(result.run_id, result.profile) for result in results
                if result.profile is not None and result.profile.ranks]
    if not profiled:
        return None
    section = Section("Where the time goes")
    section.blocks.append(("p", "--profile's extra steps after the timed window, each rank's timeline charged category "
                                "by category (docs/methodology.md, 'Where the time goes'): the shares of a rank sum to "
                                "its step; communication counts all of it, exposed the part nothing else hid."))
    rows = [(run_id, figures) for run_id, profile in profiled for figures in profile.ranks or []]
    section.blocks.append(("table", Table.of([
        ("run", lambda row: row[0]), ("rank", lambda row: row[1].rank),
        ("step ms", lambda row: fmt(_ms(row[1].step_s), 1)),
        *[(label, _category_cell(category)) for category, label in BREAKDOWN_CATEGORIES.items()],
        ("comm. ms", lambda row: fmt(_ms(row[1].communication_s), 1)),
        ("timeline", lambda row: row[1].timeline or row[1].why("breakdown") or "-"),
    ], rows)))
    for run_id, profile in profiled:
        if len(profile.ranks or []) > 1:
            section.blocks.append(("p", f"{run_id}: waiting for {wait_straggler_text(profile)}."))
    return section


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _category_cell(category: str) -> Callable[[tuple[str, TimeBreakdown]], Cell]:
    return lambda row: percent((row[1].shares or {}).get(category))


def checkpoint_policy_blocks(runs: pd.DataFrame) -> list[tuple]:
    """For the decision section: what each measured --save-interval policy costs, in seconds of
    every training hour spent stalled and, where the device is priced, in dollars per hour."""
    if "checkpoint_stall_s_per_hour" not in runs:
        return []
    lines = []
    for run in _rows(runs, ok=True):
        per_hour = run["checkpoint_stall_s_per_hour"]
        if not is_number(per_hour):
            continue
        line = (f"{run['run_id']} ({run['model']}, {run['device_model']}, {run['layout']}): a save every "
                f"{run['checkpoint_save_interval']} steps stalls {per_hour:,.1f} s of every hour of training "
                f"({per_hour / 3600:.2%})")
        if is_number(run["price_usd_per_hour"]) and is_number(run["devices_charged"]):
            line += (f", ${per_hour / 3600 * run['price_usd_per_hour'] * run['devices_charged']:,.2f} per hour on "
                     f"{run['devices_charged']} devices")
        lines.append(line)
    return [("h", "Checkpoint policy"), ("list", lines)] if lines else []


def environment_section(runs: pd.DataFrame, found: list[str]) -> Section:
    section = Section("Environment")
    versions = ("driver_version", "cuda_version", "cann_version", "torch_version", "deepspeed_version")
    section.blocks.append(("table", Table.of([
        ("run", lambda run: run["run_id"]),
        ("device", lambda run: f"{run['device_model']}" + (f" [{run['stand_in']}]" if run["stand_in"] else "")),
        ("count", lambda run: fmt(run["device_count"], 0)),
        *((header, lambda run, key=key: str(run[key] or "-"))
          for header, key in zip(("driver", "CUDA", "CANN", "torch", "deepspeed"), versions)),
        ("hwbench", _version_text),
    ], _rows(runs))))
    if found:
        section.blocks.append(("p", "Warnings: the compared runs differ."))
        section.blocks.append(("list", found))
    else:
        section.blocks.append(("p", "No differences in driver, CUDA/CANN, torch, DeepSpeed or hwbench versions, "
                                    "or precision, among the ok runs."))
    return section


def _version_text(run: pd.Series) -> str:
    git = run["hwbench_git"]
    dirty = ", dirty" if run["hwbench_git_dirty"] else ""
    return str(run["hwbench_version"]) + (f" ({str(git)[:10]}{dirty})" if git else "")


def skipped_section(skipped: list[tuple[str, str]]) -> Section:
    section = Section("Skipped input files")
    if skipped:
        section.blocks.append(("p", f"{len(skipped)} file(s) left out of this report:"))
        section.blocks.append(("list", [f"{path}: {reason.removeprefix(path + ': ')}" for path, reason in skipped]))
    else:
        section.blocks.append(("p", "None: every input file was read."))
    return section
