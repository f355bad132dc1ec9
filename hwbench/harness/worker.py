"""One benchmark point in this process: build, warm up, measure, summarise.

run_point(spec) -> RunResult. Device and setup problems raise before anything
is built (SetupError / UsageError, exit 2, nothing written); a failure during
training is returned as a result with status oom, failed or numerics, so it is
recorded like any other figure.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from typing import Any

import torch

from hwbench.catalog import Catalog, Workload
from hwbench.device import Backend, select_backend
from hwbench.device.fingerprint import environment_fingerprint
from hwbench.engine.native import NativeEngine, StepOutcome
from hwbench.errors import UsageError
from hwbench.harness.progress import Progress
from hwbench.harness.stats import summarize
from hwbench.results import RunResult, new_run_id, utc_now
from hwbench.spec import RunSpec
from hwbench.workload.data import SyntheticTokens
from hwbench.workload.flops import FLOPS_FORMULAS, model_flops_per_iteration
from hwbench.workload.model import GPT
from hwbench.workload.params import count_parameters

NOISY_CV = 0.10  # step-time CV above which a result carries a warning
FEW_TIMED_STEPS = 10


@dataclasses.dataclass
class Measurement:
    """What the timed loop produced, read back from the device after it."""

    outcomes: list[StepOutcome]
    step_times_s: list[float]
    wall_time_s: float
    memory: dict[str, Any]
    telemetry: dict[str, Any] | None
    data: dict[str, Any]


def run_point(spec: RunSpec, catalog: Catalog, *, show_progress: bool = True) -> RunResult:
    backend = select_backend(spec.device)
    problem = backend.precision_problem(spec.precision)
    if problem:
        raise UsageError(f"--precision {spec.precision}: {problem}")
    workload = catalog.workloads[spec.model]
    result = RunResult(
        run_id=new_run_id(spec.model, backend.name), status="failed", spec=spec.to_dict(), started_at=utc_now()
    )
    progress = Progress(f"{spec.model} on {backend.name}", spec.warmup + spec.steps, spec.warmup,
                        enabled=show_progress)
    try:
        backend.prepare_process(local_rank=0, local_world_size=1)
        result.environment = environment_fingerprint(backend)
        result.device = describe_device(backend, catalog, spec.precision)
        result.workload = describe_workload(workload, spec)
        measurement = measure(spec, workload, backend, progress)
        summarise(result, spec, workload, measurement)
    except Exception as error:  # recorded as data: the run's status says what happened
        result.status = "oom" if backend.is_out_of_memory(error) else "failed"
        result.error = {
            "type": type(error).__name__,
            "message": str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
            "traceback": traceback.format_exc(),
            "rank": 0,
        }
    finally:
        progress.close()
        result.finished_at = utc_now()
    if backend.simulated:
        result.warnings.insert(0, "device simulated: a stand-in torch_npu ran the NPU code path on the host "
                                  "CPU; no figure here describes an NPU")
    return result


def describe_device(backend: Backend, catalog: Catalog, precision: str) -> dict[str, Any]:
    names = backend.device_names()
    model_name = names[0] if names else "unknown"
    entry = catalog.match_device(backend.name, model_name)
    peak, reason = (entry.peak(precision) if entry else
                    (None, f"no catalog entry matches the {backend.name} device {model_name!r}"))
    if backend.simulated:
        peak, reason = None, "the device is simulated: there is no peak to compare host-CPU work with"
    capacity = backend.memory_stats().capacity_bytes or (entry.memory_bytes if entry else None)
    return {
        "backend": backend.name,
        "dist_backend": backend.dist_backend,
        "device_model": model_name,
        "device_count": backend.device_count(),
        "torch_device": str(backend.torch_device),
        "simulated": backend.simulated,
        "catalog_entry": entry.name if entry else None,
        "catalog_path": entry.path if entry else None,
        "peak_flops": peak,
        "peak_flops_precision": precision,
        "peak_flops_source": entry.peak_flops_source if entry and peak else None,
        "peak_flops_unmeasured": reason,
        "memory_capacity_bytes": capacity,
        "tdp_watts": entry.tdp_watts if entry else None,
        "price_usd_per_hour": entry.price_usd_per_hour if entry else None,
        "tuning": backend.tuning,
    }


def describe_workload(workload: Workload, spec: RunSpec) -> dict[str, Any]:
    config = workload.model
    counts = count_parameters(config, spec.parallel.tp)
    return {
        "name": workload.name,
        "title": workload.title,
        "catalog_path": workload.path,
        **dataclasses.asdict(config),
        "padded_vocab_size": config.padded_vocab_size(spec.parallel.tp),
        "parameters": counts.total,
        "parameters_embedding": counts.embedding,
        "parameters_non_embedding": counts.non_embedding,
        "published": dataclasses.asdict(workload.published) if workload.published else None,
    }


def measure(spec: RunSpec, workload: Workload, backend: Backend, progress: Progress) -> Measurement:
    """Warm-up steps (excluded), then timed steps bracketed by device syncs."""
    backend.seed(spec.seed)
    device = backend.torch_device
    with torch.device(device):
        model = GPT(workload.model, tensor_parallel=spec.parallel.tp, recompute=spec.recompute)
    engine = NativeEngine(model, spec, backend)
    data = SyntheticTokens(workload.model.vocab_size, spec.seq_length, spec.micro_batch_size, spec.seed,
                           to_device=backend.to_device)

    outcomes: list[StepOutcome] = []
    for step in range(1, spec.warmup + 1):
        outcomes.append(engine.train_step(data.next_batch))
        progress.step(step, loss=outcomes[-1].loss.item())  # warm-up may sync freely
    backend.synchronize()

    backend.reset_peak_memory()
    sampler = backend.telemetry_sampler(spec.telemetry_interval_s) if spec.telemetry else None
    timer = backend.step_timer()
    if sampler:
        sampler.start()
    wall_start = time.perf_counter()
    with backend.measuring():
        timer.mark()
        for step in range(1, spec.steps + 1):
            outcomes.append(engine.train_step(data.next_batch))
            timer.mark()
            progress.step(spec.warmup + step)  # no loss read here: it would sync the device
    wall_time = time.perf_counter() - wall_start
    telemetry = sampler.stop() if sampler else None
    memory = dataclasses.asdict(backend.memory_stats())
    return Measurement(outcomes, timer.intervals_s(), wall_time, memory, telemetry, data.describe())


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def summarise(result: RunResult, spec: RunSpec, workload: Workload, m: Measurement) -> None:
    """Fill the result's metrics, steps and per-rank figures from a measurement."""
    losses = [o.loss.item() for o in m.outcomes]
    norms = [o.grad_norm.item() for o in m.outcomes]
    scaled = spec.precision == "fp16"
    result.steps = []
    for index, (outcome, loss, norm) in enumerate(zip(m.outcomes, losses, norms), start=1):
        timed = index > spec.warmup
        result.steps.append({
            "step": index,
            "phase": "timed" if timed else "warmup",
            "time_s": m.step_times_s[index - spec.warmup - 1] if timed else None,
            "loss": _finite(loss),
            "grad_norm": _finite(norm),
            "lr": outcome.lr,
            "loss_scale": outcome.loss_scale,
            "skipped": scaled and not math.isfinite(norm),
        })

    times = m.step_times_s
    world = spec.parallel.world_size
    total_time = sum(times)
    samples_per_s = spec.global_batch_size * len(times) / total_time
    flops = model_flops_per_iteration(workload.model, spec.global_batch_size, spec.seq_length,
                                      tensor_parallel=spec.parallel.tp, recompute=spec.recompute,
                                      formula=spec.flops_formula)
    achieved = flops * len(times) / total_time / world
    peak = result.device.get("peak_flops")
    unmeasured: dict[str, str] = {}
    if peak is None:
        unmeasured["mfu"] = result.device.get("peak_flops_unmeasured") or "no peak FLOP/s"
    memory = m.memory
    result.metrics = {
        "samples_per_s": samples_per_s,
        "tokens_per_s": samples_per_s * spec.seq_length,
        "tokens_per_s_per_device": samples_per_s * spec.seq_length / world,
        "tflops_per_device": achieved / 1e12,
        "mfu": achieved / peak if peak else None,
        "flops_per_iteration": flops,
        "flops_formula": spec.flops_formula,
        "flops_formula_expression": FLOPS_FORMULAS[spec.flops_formula].expression,
        "world_size": world,
        "timed_steps": len(times),
        "step_time_s": summarize(times),
        "timed_wall_time_s": m.wall_time_s,
        "memory": memory,
        "loss_start": _finite(losses[0]),
        "loss_end": _finite(losses[-1]),
        "loss_floor": m.data.get("entropy_nats"),
        "skipped_steps": sum(1 for s in result.steps if s["skipped"]),
        "telemetry": m.telemetry,
        "data": m.data,
        "unmeasured": unmeasured,
    }
    if m.telemetry is None:
        unmeasured["telemetry"] = "turned off with --no-telemetry"
    elif not m.telemetry.get("available"):
        unmeasured["telemetry"] = m.telemetry.get("reason", "unavailable")
    result.ranks = [{"rank": 0, "step_time_s": result.metrics["step_time_s"], "memory": memory}]

    bad = [s["step"] for s in result.steps if s["loss"] is None or (s["grad_norm"] is None and not s["skipped"])]
    all_skipped = scaled and result.metrics["skipped_steps"] == len(result.steps)
    result.status = "numerics" if bad or all_skipped else "ok"
    if bad:
        result.error = {"type": "NonFiniteLoss", "message": f"loss or gradient not finite at steps {bad[:10]}",
                        "traceback": None, "rank": 0}
    elif all_skipped:
        result.error = {"type": "LossScaleCollapse", "rank": 0, "traceback": None,
                        "message": "every fp16 step overflowed and was skipped"}
    cv = result.metrics["step_time_s"]["cv"]
    if cv > NOISY_CV:
        result.warnings.append(f"step times vary: CV {cv:.1%} over {len(times)} timed steps")
    if len(times) < FEW_TIMED_STEPS:
        result.warnings.append(f"only {len(times)} timed steps: use --steps {FEW_TIMED_STEPS} or more for stable figures")
    if result.metrics["skipped_steps"]:
        result.warnings.append(f"{result.metrics['skipped_steps']} fp16 steps overflowed and were skipped")
