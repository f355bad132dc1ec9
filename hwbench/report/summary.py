"""The table printed at the end of `hwbench run`."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from hwbench.results import RunResult
from hwbench.units import flops_rate_text, human_bytes


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _why(result: RunResult, key: str) -> str:
    reason = result.metrics.get("unmeasured", {}).get(key)
    return f"null: {reason}" if reason else "-"


def run_summary_rows(result: RunResult, path: str | None = None) -> list[tuple[str, str]]:
    spec, metrics, device, workload = result.spec, result.metrics, result.device, result.workload
    rows: list[tuple[str, str]] = [
        ("status", result.status + (f" ({result.error['message']})" if result.error else "")),
        ("model", f"{workload.get('name', spec['model'])}: {workload.get('parameters', 0) / 1e6:,.1f}M parameters"),
        ("device", f"{device.get('backend', '?')}: {device.get('device_model', '?')}"
                   + (" [SIMULATED]" if device.get("simulated") else "")),
        ("batch", f"micro {spec['micro_batch_size']}, global {spec['global_batch_size']}, seq {spec['seq_length']}, "
                  f"{spec['precision']}" + (", recompute" if spec["recompute"] else "")
                  + (", compiled" if spec["compile"] else "")),
        ("layout", layout_text(result)),
    ]
    if result.status in ("failed", "timeout", "oom") and result.ranks and "last_step" in result.ranks[0]:
        rows.append(("ranks", "; ".join(f"{r['rank']}: step {r['last_step']}"
                                        + (f", {r['signal']}" if r.get("signal") else "") for r in result.ranks)))
    if not metrics:
        return rows + ([("result file", path)] if path else [])
    step = metrics["step_time_s"]
    memory = metrics["memory"]
    mfu = metrics.get("mfu")
    rows += [
        ("steps", f"{metrics['timed_steps']} timed after {spec['warmup']} warm-up"),
        ("samples/s", _number(metrics["samples_per_s"])),
        ("tokens/s", _number(metrics["tokens_per_s"], 0)),
        ("TFLOP/s per device", _number(metrics["tflops_per_device"], 3)
         + f"  (FLOPs formula: {metrics['flops_formula']})"),
        ("MFU", f"{mfu:.1%}" if mfu is not None else _why(result, "mfu")),
        ("MFU, measured ceiling", _measured_ceiling_text(result)),
        ("step time", f"median {step['median'] * 1e3:,.1f} ms, p10 {step['p10'] * 1e3:,.1f}, "
                      f"p90 {step['p90'] * 1e3:,.1f}, CV {step['cv']:.1%}"),
        ("peak memory", _memory_text(memory)),
        ("loss", f"{_number(metrics.get('loss_start'), 3)} -> {_number(metrics.get('loss_end'), 3)} "
                 f"(floor {_number(metrics.get('loss_floor'), 3)})"),
    ]
    if metrics.get("valid_ppl") is not None:
        rows.append(("validation", f"PPL {metrics['valid_ppl']:,.3f} (loss {metrics['valid_loss']:.4f}) after "
                                   f"{metrics['valid_ppl_step']} steps; lowest reachable PPL "
                                   f"{_number(metrics.get('ppl_floor'), 3)}"))
    elif "valid_ppl" in metrics.get("unmeasured", {}):
        rows.append(("validation", _why(result, "valid_ppl")))
    if spec["precision"] == "fp16":
        rows.append(("fp16 skipped steps", str(metrics["skipped_steps"])))
    rows.append(("telemetry", _telemetry_text(result)))
    for warning in result.warnings:
        rows.append(("warning", warning))
    if path:
        rows.append(("result file", path))
    return rows


def _measured_ceiling_text(result: RunResult) -> str:
    """MFU against the GEMM rate hwbench calibrate measured, with that rate and when it was measured."""
    mfu = result.metrics.get("mfu_measured_ceiling")
    ceiling = result.device.get("measured_ceiling")
    if mfu is None or not ceiling:
        return _why(result, "mfu_measured_ceiling")
    return (f"{mfu:.1%} of {flops_rate_text(ceiling['flops'])} ({ceiling['precision']} GEMM, n={ceiling['size']}, "
            f"measured {(ceiling.get('measured_at') or '?')[:10]}, driver {ceiling['driver']})")


def _memory_text(memory: dict[str, Any]) -> str:
    """Allocated and reserved peaks of capacity; a figure the device does not keep says
    why in a few words (the full reason is in the result's `memory.unmeasured`)."""
    allocated = memory.get("peak_allocated_bytes")
    reason = (memory.get("unmeasured") or {}).get("peak_allocated_bytes") or ""
    if allocated is None and "resident set" in reason:
        allocated_text = "n/a on CPU: resident set below"
    else:
        allocated_text = human_bytes(allocated) if allocated is not None or not reason else f"n/a ({reason})"
    reserved_name = "resident set" if "resident set" in reason else "reserved"
    return (f"allocated {allocated_text}, {reserved_name} {human_bytes(memory.get('peak_reserved_bytes'))} "
            f"of {human_bytes(memory.get('capacity_bytes'))}")


def layout_text(result: RunResult) -> str:
    """"TP2 PP1 DP2, native (ddp), 4 ranks on 2 nodes"."""
    spec, engine = result.spec, result.engine or {}
    parallel = spec.get("parallel") or {}
    text = f"TP{parallel.get('tp', 1)} PP{parallel.get('pp', 1)} DP{parallel.get('dp', 1)}"
    name = engine.get("name") or spec.get("engine", "native")
    if name == "deepspeed":
        text += f", deepspeed ZeRO {engine.get('zero_stage', spec.get('zero_stage'))}"
    else:
        details = [d for d in (engine.get("data_parallel"), engine.get("pipeline_schedule")) if d]
        text += ", native" + (f" ({', '.join(details)})" if details else "")
    launch = spec.get("launch") or {}
    ranks = (launch.get("nnodes", 1) or 1) * (launch.get("nproc_per_node", 1) or 1)
    if ranks > 1:
        text += f", {ranks} ranks on {launch.get('nnodes', 1)} node{'s' if launch.get('nnodes', 1) > 1 else ''}"
    straggler = (result.metrics or {}).get("straggler")
    if straggler and straggler.get("ratio"):
        text += f"; slowest rank {straggler['rank']} ({straggler['ratio']:.2f}x median)"
    return text


def _telemetry_text(result: RunResult) -> str:
    telemetry: dict[str, Any] | None = result.metrics.get("telemetry")
    if not telemetry or not telemetry.get("available"):
        return _why(result, "telemetry")
    parts = []
    for device in telemetry["devices"]:
        text = f"#{device['index']}: power {_number(device.get('power_w_mean'), 0)} W"
        text += f", energy {_number(device.get('energy_j'), 0)} J"
        text += f", temp max {_number(device.get('temperature_c_max'), 0)} C"
        if device.get("throttle_reasons"):
            text += f", throttle {'+'.join(device['throttle_reasons'])}"
        parts.append(text)
    return "; ".join(parts) or "no samples"


def run_summary_table(result: RunResult, path: str | None = None) -> str:
    return tabulate(run_summary_rows(result, path), tablefmt="simple", disable_numparse=True)


def sweep_summary_table(suite, records) -> str:
    """One row per point: its statuses, throughput (median over repeats) and why
    a point has no figures."""
    rows = []
    for record in records:
        statuses = [r.status for r in record.results]
        ok = [r for r in record.results if r.status == "ok"]
        counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
        aggregate = record.aggregate or {}
        if aggregate:
            samples = aggregate["samples_per_s"]
            throughput = f"{samples['median']:,.2f}" + (f" (CV {samples['cv']:.1%}{', noisy' if samples['noisy'] else ''})"
                                                        if samples["n"] > 1 else "")
        elif ok:
            throughput = f"{ok[0].metrics['samples_per_s']:,.2f}"
        else:
            throughput = "-"
        mfu = ok[0].metrics.get("mfu") if ok else None
        memory = max((r.metrics.get("memory", {}).get("peak_reserved_bytes") or 0 for r in ok), default=0) or None
        note = next((r.error["message"] for r in record.results if r.error), "")
        if record.reused:
            note = (f"{record.reused} kept; " + note).strip("; ")
        rows.append([record.point.name, counts, throughput, f"{mfu:.1%}" if mfu is not None else "-",
                     human_bytes(memory), note[:90]])
    title = f"sweep {suite.name}: {len(records)} points"
    return title + "\n" + tabulate(rows, headers=["point", "status", "samples/s", "MFU", "peak memory", "note"],
                                   disable_numparse=True)
