"""The table printed at the end of `hwbench run`."""

from __future__ import annotations

from hwbench.harness.goodput import SweepGoodput, summed_goodput
from hwbench.metrics import METRICS
from hwbench.report.terminal import text_table
from hwbench.result.model import (
    BREAKDOWN_CATEGORIES,
    GOODPUT_PHASES,
    Checkpoints,
    Goodput,
    Memory,
    Profile,
    RunResult,
    StepTime,
    TimeBreakdown,
    TimeToTarget,
)
from hwbench.units import flops_rate_text, human_bytes
from hwbench.workload.flops import counts_hardware_flops, hfu_reason, utilisation_label


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _why(result: RunResult, key: str) -> str:
    reason = result.metrics.why(key)
    return f"null: {reason}" if reason else "-"


def fp8_layers_text(result: RunResult) -> str:
    """'12 linear layers in FP8 (blocks.*.attn.q_proj, ...); in bf16: output (the output layer ...)'."""
    fp8 = result.engine.fp8
    if fp8 is None:
        return "not recorded (the run failed before its model was built)"
    converted = ", ".join(group.layers or "?" for group in fp8.converted or [])
    kept = "; ".join(f"{group.layers} ({group.why})" for group in fp8.high_precision or [])
    return f"{fp8.converted_layers} linear layers in FP8 ({converted})" + (f"; not: {kept}" if kept else "")


def _flops_text(result: RunResult) -> str:
    """TFLOP/s per device and the formula that counted it (for a mixture of experts, that it counts
    the active parameters: metrics.flops_counts); why it is null where the formula cannot count."""
    metrics = result.metrics
    if metrics.tflops_per_device is None and metrics.why("tflops_per_device"):
        return _why(result, "tflops_per_device")
    active = ", active parameters" if (metrics.flops_counts or "").startswith("active parameters") else ""
    return _number(metrics.tflops_per_device, 3) + f"  (FLOPs formula: {metrics.flops_formula}{active})"


def run_summary_rows(result: RunResult, path: str | None = None) -> list[tuple[str, str]]:
    spec, metrics, device, workload = result.spec, result.metrics, result.device, result.workload
    rows: list[tuple[str, str]] = [
        ("status", result.status + (f" ({result.error.message})" if result.error else "")),
        ("model", f"{workload.name or spec.model}: {(workload.parameters or 0) / 1e6:,.1f}M parameters"),
        ("device", f"{device.backend or '?'}: {device.device_model or '?'}"
                   + (" [SIMULATED]" if device.simulated else "") + (" [FP8 EMULATED]" if device.fp8_emulated else "")),
        ("batch", f"micro {spec.micro_batch_size}, global {spec.global_batch_size}, seq {spec.seq_length}, "
                  f"{spec.precision}" + (f" {spec.fp8_recipe}" if spec.fp8_recipe else "")
                  + (", recompute" if spec.recompute else "")
                  + (", compiled" if spec.compile else "")),
        ("layout", layout_text(result)),
    ]
    if result.status in ("failed", "timeout", "oom") and result.ranks and result.ranks[0].last_step is not None:
        rows.append(("ranks", "; ".join(f"{r.rank}: step {r.last_step}" + (f", {r.signal}" if r.signal else "")
                                        for r in result.ranks)))
    if not metrics:
        return rows + ([("result file", path)] if path else [])
    step, memory = metrics.step_time_s or StepTime(), metrics.memory or Memory()
    kind = utilisation_label(metrics.flops_formula, spec.recompute)  # HFU: the formula counts the recompute
    rows += [
        ("steps", f"{metrics.timed_steps} timed after {spec.warmup} warm-up"),
        (METRICS["samples_per_s"].label, _number(metrics.samples_per_s)),
        (METRICS["tokens_per_s"].label, _number(metrics.tokens_per_s, 0)),
        (METRICS["tflops_per_device"].label, _flops_text(result)),
        (kind + (f" ({device.peak_flops_precision} peak)" if spec.fp8_recipe else ""),
         METRICS["mfu"].text(metrics.mfu) if metrics.mfu is not None else _why(result, "mfu")),
        *([(f"{kind}, FP8 peak", METRICS["mfu"].text(metrics.mfu_fp8_peak) if metrics.mfu_fp8_peak is not None
            else _why(result, "mfu_fp8_peak")), ("FP8 layers", fp8_layers_text(result))] if spec.fp8_recipe else []),
        (f"{kind}, measured ceiling", _measured_ceiling_text(result)),
        *([("", hfu_reason(metrics.flops_formula or ""))] if kind == "HFU" else []),
        ("step time", f"median {_ms(step.median)} ms, p10 {_ms(step.p10)}, p90 {_ms(step.p90)}, "
                      f"CV {_percent(step.cv)}"),
        (METRICS["peak_memory"].label, _memory_text(memory)),
        ("loss", f"{_number(metrics.loss_start, 3)} -> {_number(metrics.loss_end, 3)} "
                 f"(floor {_number(metrics.loss_floor, 3)})"),
    ]
    if metrics.valid_ppl is not None:
        rows.append(("validation", f"PPL {metrics.valid_ppl:,.3f} (loss {_number(metrics.valid_loss, 4)}) after "
                                   f"{metrics.valid_ppl_step} steps; lowest reachable PPL "
                                   f"{_number(metrics.ppl_floor, 3)}"))
        curve = validation_curve_text(metrics.validation or [])
        if curve:
            rows.append(("validation curve", curve))
    elif metrics.why("valid_ppl"):
        rows.append(("validation", _why(result, "valid_ppl")))
    if metrics.routing:
        rows.append(("expert routing", routing_text(result)))
    if metrics.expert_parallel:
        rows.append((METRICS["all_to_all_share"].label, all_to_all_text(result)))
    if metrics.time_to_target:
        rows.append(("time to target", time_to_target_text(metrics.time_to_target)))
    if metrics.steady_state:
        rows.append(("steady state", steady_state_text(metrics.steady_state)))
    if spec.precision == "fp16":
        rows.append(("fp16 skipped steps", str(metrics.skipped_steps)))
    rows.append(("telemetry", _telemetry_text(result)))
    if metrics.goodput is not None:
        rows.append(("goodput", goodput_text(metrics.goodput)))
    if result.checkpoint is not None:
        rows.append(("checkpoints", checkpoint_text(result.checkpoint)))
    if result.profile is not None:
        rows += profile_rows(result.profile)
    rows += [("warning", warning) for warning in result.warnings]
    return rows + ([("result file", path)] if path else [])


def routing_text(result: RunResult) -> str:
    """ "imbalance 1.12x median, 1.31x max (busiest expert / mean, worst layer); 0 dropped (0.0%); aux loss 0.0201"."""
    routing = result.metrics.routing
    assert routing is not None, "an MoE run's summary"
    imbalance = METRICS["moe_imbalance"]
    dropped = "-" if routing.dropped_fraction is None else f"{routing.dropped_fraction:.1%}"
    return (f"imbalance {imbalance.text(routing.imbalance_median)} median, {imbalance.text(routing.imbalance_max)} max "
            f"(busiest expert / mean, worst layer); {routing.dropped_tokens} assignments dropped ({dropped}); "
            f"load-balancing loss {_number(routing.aux_loss_mean, 4)}")


def all_to_all_text(result: RunResult) -> str:
    """ "27.8% of the step time (EP2; rank 1 41.2%), 141.0 ms a step"."""
    figures = result.metrics.expert_parallel
    assert figures is not None, "an expert-parallel run's summary"
    share = METRICS["all_to_all_share"]
    most = ("" if figures.all_to_all_share_max is None else
            f"; rank {figures.all_to_all_share_max_rank} {share.text(figures.all_to_all_share_max)}")
    return (f"{share.text(figures.all_to_all_share)} of the step time (EP{figures.ep}{most}), "
            f"{_ms(figures.all_to_all_s_median)} ms a step in dispatch and combine")


CURVE_POINTS = 6  # validations shown at most; the result holds them all


def validation_curve_text(points: list) -> str | None:
    """Every validation the run made, briefly: 'PPL after step 2: 48,104.2, 4: 33,885.8' (the first, the
    last and evenly spaced ones between when there are more than CURVE_POINTS); None for fewer than two."""
    measured = [p for p in points if p.ppl is not None]
    if len(measured) < 2:
        return None
    shown = sorted({round(i * (len(measured) - 1) / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)})
    text = "PPL after step " + ", ".join(f"{measured[i].step}: {measured[i].ppl:,.1f}" for i in shown)
    left = len(measured) - len(shown)
    return text + (f" ({left} more in the result's metrics.validation)" if left else "")


def steady_state_text(steady) -> str:
    """ "settled after 3 timed steps; drift +1.2% last quarter vs first (threshold 5%), throttle: none"."""
    if steady.drift is None:
        return steady.why("drift") or "not measured"
    settled = (f"settled after {steady.settled_after_steps} timed steps" if steady.settled_after_steps is not None
               else steady.why("settled_after_steps"))
    flag = " DRIFTING" if steady.drifting else ""
    throttle = (", ".join(steady.throttle_reasons) if steady.throttle_reasons is not None
                else f"not known ({steady.why('throttle_reasons')})")
    return (f"{settled}; drift {steady.drift:+.1%} last quarter vs first (threshold {steady.drift_threshold:.0%})"
            f"{flag}; throttle reasons: {throttle or 'none'}")


def target_text(figures: TimeToTarget) -> str:
    """The target a time-to-target section was measured against: "PPL 5.06 (floor*1.2)"."""
    from hwbench.target import Target

    assert figures.metric is not None and figures.value is not None and figures.given is not None, \
        "harness.merge.time_to_target names the target in every section it writes"
    return Target(figures.metric, figures.value, figures.given).text()


def time_to_target_text(figures: TimeToTarget) -> str:
    """ "PPL 5.06 (floor*1.2): 41.2 s (init 3.1 s apart), step 80, 640 samples, 0.0114 device-hours"."""
    target = target_text(figures)
    if not figures.reached:
        return f"{target}: {figures.why('step')}"
    init = f"init {figures.init_s:,.1f} s apart" if figures.init_s is not None else "init not measured"
    energy = f", {figures.energy_j:,.0f} J" if figures.energy_j is not None else ""
    cost = f", ${figures.cost_usd:,.4g}" if figures.cost_usd is not None else ""
    return (f"{target}: {figures.time_s:,.1f} s ({init}), step {figures.step}, {figures.samples:,} samples, "
            f"{figures.device_hours:.3g} device-hours{energy}{cost}")


def profile_rows(profile: Profile) -> list[tuple[str, str]]:
    """--profile's lines: which steps, where the traces are, each rank's breakdown, who held the others back."""
    steps = profile.steps or []
    where = f"steps {steps[0]}-{steps[-1]}" if steps else "no step"
    rows = [("profile", f"{where}, after the timed ones (not in their figures); traces in {profile.trace_dir}")]
    rows += [(f"rank {figures.rank} time", breakdown_text(figures)) for figures in profile.ranks or []]
    if len(profile.ranks or []) > 1:
        rows.append(("waiting for", wait_straggler_text(profile)))
    return rows


def breakdown_text(figures: TimeBreakdown) -> str:
    """ "step 41.2 ms: GEMMs 52.1%, attention 8.0%, ... (communication 3.1 ms, 1.2 ms exposed)"."""
    if figures.step_s is None:
        return f"null: {figures.why('breakdown') or 'not measured'}"
    shares = figures.shares or {}
    parts = ", ".join(f"{label} {_percent(shares.get(category))}" for category, label in BREAKDOWN_CATEGORIES.items()
                      if shares.get(category))
    return (f"step {_ms(figures.step_s)} ms: {parts} (communication {_ms(figures.communication_s)} ms, "
            f"{_ms(figures.exposed_communication_s)} exposed)")


def wait_straggler_text(profile: Profile) -> str:
    """The rank the others waited for in the profiled steps, with the figures; or nobody, with the threshold."""
    threshold = _percent(profile.straggler_threshold)
    lagging = profile.straggler
    if lagging is None:
        return f"nobody: no rank's peers waited for it more than {threshold} of a step in collectives"
    return (f"rank {lagging.rank}: it waited {_ms(lagging.wait_s)} ms a step in collectives, its peers "
            f"{_ms(lagging.peers_wait_s)} ms (median): {_percent(lagging.lag_share)} of a step lost to it "
            f"(threshold {threshold})")


def goodput_text(goodput: Goodput) -> str:
    """ "62.1% of 14.2 s in training steps; init 20.3%, warm-up 9.8%, timed steps 52.3%, saves 17.0%, rest 0.6%"
    (the phases that took any time)."""
    shares = goodput.shares or {}
    phases = ", ".join(f"{label} {_percent(shares[phase])}" for phase, label in GOODPUT_PHASES.items()
                       if shares.get(phase))
    return f"{_percent(goodput.goodput)} of {_number(goodput.total_s, 1)} s in training steps; {phases}"


def checkpoint_text(checkpoint: Checkpoints) -> str:
    """The saves (size, rate, stall, the --save-interval policy's stall per hour), the load and the restarts."""
    parts = []
    saves, loads, restarts = checkpoint.saves or [], checkpoint.loads or [], checkpoint.restarts or []
    if saves:
        rate = "-" if checkpoint.save_gb_per_s is None else f"{checkpoint.save_gb_per_s:,.3g} GB/s"
        policy = "" if checkpoint.stall_s_per_hour is None else \
            f" ({checkpoint.stall_s_per_hour:,.1f} s per hour at --save-interval {checkpoint.save_interval})"
        parts.append(f"{len(saves)} saved, {human_bytes(checkpoint.save_bytes)} each at {rate}, stall "
                     f"{_ms(checkpoint.save_stall_s)} ms per save{policy}")
    for load in loads[-1:]:
        rate = "-" if load.gb_per_s is None else f"{load.gb_per_s:,.3g} GB/s"
        parts.append(f"loaded step {load.iteration} ({human_bytes(load.bytes)} at {rate})")
    if restarts:
        lost = sum(r.time_lost_s or 0.0 for r in restarts)
        parts.append(f"{len(restarts)} restart(s), {sum(r.steps_lost or 0 for r in restarts)} steps and {lost:,.1f} s "
                     "lost")
    return "; ".join(parts) or "none"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.1f}"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.1%}"


def _measured_ceiling_text(result: RunResult) -> str:
    """MFU against the GEMM rate hwbench calibrate measured, with that rate and when it was measured."""
    mfu, ceiling = result.metrics.mfu_measured_ceiling, result.device.measured_ceiling
    if mfu is None or not ceiling or ceiling.flops is None:
        return _why(result, "mfu_measured_ceiling")
    return (f"{mfu:.1%} of {flops_rate_text(ceiling.flops)} ({ceiling.precision} GEMM, n={ceiling.size}, "
            f"measured {(ceiling.measured_at or '?')[:10]}, driver {ceiling.driver})")


def _memory_text(memory: Memory) -> str:
    """Allocated and reserved peaks of capacity; a figure the device does not keep says
    why in a few words (the full reason is in the result's `memory.unmeasured`)."""
    allocated, reason = memory.peak_allocated_bytes, memory.why("peak_allocated_bytes") or ""
    if allocated is None and "resident set" in reason:
        allocated_text = "n/a on CPU: resident set below"
    else:
        allocated_text = human_bytes(allocated) if allocated is not None or not reason else f"n/a ({reason})"
    reserved_name = "resident set" if "resident set" in reason else "reserved"
    return (f"allocated {allocated_text}, {reserved_name} {human_bytes(memory.peak_reserved_bytes)} "
            f"of {human_bytes(memory.capacity_bytes)}")


def layout_text(result: RunResult) -> str:
    """ "TP2 PP1 DP2, native (ddp), 4 ranks on 2 nodes"."""
    spec, engine = result.spec, result.engine
    text = spec.parallel.layout
    if (engine.name or spec.engine) == "deepspeed":
        text += f", deepspeed ZeRO {engine.zero_stage if engine.zero_stage is not None else spec.zero_stage}"
    else:
        details = [d for d in (engine.data_parallel, engine.pipeline_schedule) if d]
        text += ", native" + (f" ({', '.join(details)})" if details else "")
    nodes = spec.launch.nnodes
    ranks = nodes * spec.launch.nproc_per_node
    if ranks > 1:
        text += f", {ranks} ranks on {nodes} node{'s' if nodes > 1 else ''}"
    straggler = result.metrics.straggler
    if straggler and straggler.ratio:
        text += f"; slowest rank {straggler.rank} ({straggler.ratio:.2f}x median)"
    return text


def _telemetry_text(result: RunResult) -> str:
    telemetry = result.metrics.telemetry
    if not telemetry or not telemetry.available:
        return _why(result, "telemetry")
    parts = []
    for device in telemetry.devices or []:
        text = (f"#{device.index}: power {_number(device.power_w_mean, 0)} W, energy {_number(device.energy_j, 0)} J, "
                f"temp max {_number(device.temperature_c_max, 0)} C")
        if device.throttle_reasons:
            text += f", throttle {'+'.join(device.throttle_reasons)}"
        parts.append(text)
    return "; ".join(parts) or "no samples"


def run_summary_table(result: RunResult, path: str | None = None) -> str:
    return text_table(run_summary_rows(result, path), tablefmt="simple", disable_numparse=True)


def sweep_summary_table(suite, records) -> str:
    """One row per point: its statuses, throughput (median over repeats) and why
    a point has no figures. A figure of a formula that counts the recompute, of a point that
    recomputes, is marked HFU, and a line under the table says why."""
    rows = []
    hfu_formula: str | None = None
    for record in records:
        statuses = [r.status for r in record.results]
        ok = [r for r in record.results if r.status == "ok"]
        counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
        aggregate = record.aggregate or {}
        if aggregate:
            samples = aggregate["samples_per_s"]
            spread = f" (CV {samples['cv']:.1%}{', noisy' if samples['noisy'] else ''})" if samples["n"] > 1 else ""
            throughput = f"{samples['median']:,.2f}{spread}"
        elif ok and ok[0].metrics.samples_per_s is not None:
            throughput = f"{ok[0].metrics.samples_per_s:,.2f}"
        else:
            throughput = "-"
        mfu = ok[0].metrics.mfu if ok else None
        hardware = bool(ok) and counts_hardware_flops(ok[0].metrics.flops_formula, ok[0].spec.recompute)
        if hardware and mfu is not None:
            hfu_formula = ok[0].metrics.flops_formula
        memory = max((r.metrics.memory.peak_reserved_bytes or 0 for r in ok if r.metrics.memory), default=0) or None
        note = next((r.error.message or "" for r in record.results if r.error), "")
        if record.reused:
            note = (f"{record.reused} kept; " + note).strip("; ")
        rows.append([record.point.name, counts, throughput,
                     METRICS["mfu"].text(mfu) + (" HFU" if hardware and mfu is not None else ""),
                     METRICS["peak_memory"].text(memory), note[:90]])
        if any(r.metrics.time_to_target for r in record.results if r.metrics):
            rows[-1].insert(3, _sweep_time_to_target(record))
    headers = ["point", "status", METRICS["samples_per_s"].label, METRICS["mfu"].label, METRICS["peak_memory"].label,
               "note"]
    if any(len(row) > len(headers) for row in rows):
        headers.insert(3, "time to target")
        rows = [row if len(row) == len(headers) else row[:3] + ["-"] + row[3:] for row in rows]
    title = f"sweep {suite.name}: {len(records)} points"
    table = text_table(rows, headers=headers, disable_numparse=True)
    lines = [title, table] + ([hfu_reason(hfu_formula)] if hfu_formula else [])
    goodput = sweep_goodput(records)
    if goodput is not None:
        lines.append(sweep_goodput_text(goodput))
    return "\n".join(lines)


def sweep_goodput(records) -> SweepGoodput | None:
    """The goodput of the runs this sweep made (kept results left out: their time was an earlier sweep's)."""
    clocks = [result.metrics.goodput for record in records for result in record.fresh
              if result.metrics is not None and result.metrics.goodput is not None]
    walls = [record.wall_s for record in records]
    return summed_goodput(clocks, None if None in walls else sum(walls))


def sweep_goodput_text(goodput: SweepGoodput) -> str:
    """ "goodput over the sweep's 4 runs: 48.2% of 61.0 s in training steps; init 9.1%, ...; outside the
    runs' clocks 21.0% (process starts, imports, preflight, writing results, runs that kept no clock)"."""
    phases = ", ".join(f"{label} {_percent(goodput.share(goodput.phases_s[phase]))}"
                       for phase, label in GOODPUT_PHASES.items() if goodput.phases_s[phase])
    outside = ("; outside the runs' clocks not measured (the runs ran as jobs elsewhere)" if goodput.outside_s is None
               else f"; outside the runs' clocks {_percent(goodput.share(goodput.outside_s))} (process starts, "
                    "imports, preflight, writing results, runs that kept no clock)")
    return (f"goodput over the sweep's {goodput.runs} run{'s' if goodput.runs != 1 else ''}: "
            f"{_percent(goodput.goodput)} of {_number(goodput.total_s, 1)} s in training steps; {phases}{outside}")


def _sweep_time_to_target(record) -> str:
    """The point's time to target: MLPerf's olympic score of its repeats, said as such, or one run's."""
    score = (record.aggregate or {}).get("time_to_target_s")
    if score and score["score"] is not None:
        return f"{score['score']:,.1f} s (olympic mean of {score['runs']}: fastest and slowest dropped)"
    reached = [r.metrics.time_to_target for r in record.results
               if r.metrics and r.metrics.time_to_target and r.metrics.time_to_target.reached]
    if len(reached) == 1 and len(record.results) == 1:
        return f"{reached[0].scored_time_s:,.1f} s"
    return score["why"] if score else "not reached"
