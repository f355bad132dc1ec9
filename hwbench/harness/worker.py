"""One benchmark point in this process: build, warm up, measure, summarise.

run_point(spec) -> RunResult. Device and setup problems raise before anything
is built (SetupError / UsageError, exit 2, nothing written); a failure during
training is returned as a result with status oom, failed, invalid (bad data
found while training) or numerics, so it is
recorded like any other figure.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from typing import Any


from hwbench.catalog import Catalog, Workload
from hwbench.device import Backend, select_backend
from hwbench.device.fingerprint import environment_fingerprint
from hwbench.engine.native import NativeEngine, StepOutcome
from hwbench.errors import SetupError, UsageError
from hwbench.harness.progress import Progress
from hwbench.harness.stats import summarize
from hwbench.results import RunResult, new_run_id, utc_now
from hwbench.spec import RunSpec
from hwbench.workload.data import BuiltinCorpus, SampledData, SyntheticTokens
from hwbench.workload.flops import FLOPS_FORMULAS, model_flops_per_iteration
from hwbench.workload.model import build_model
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
    validation: list[dict[str, Any]]


def run_point(spec: RunSpec, catalog: Catalog, *, show_progress: bool = True) -> RunResult:
    backend = select_backend(spec.device)
    problem = backend.precision_problem(spec.precision)
    if problem:
        raise UsageError(f"--precision {spec.precision}: {problem}")
    workload = catalog.workloads[spec.model]
    try:
        backend.prepare_process(local_rank=0, local_world_size=1)
    except Exception as error:
        raise SetupError(f"--device {backend.name}: the device could not be prepared: {error}") from error
    # Opening the data checks it (a bad .idx, a split with no training documents):
    # bad input, so it fails here, before a result exists.
    data = make_data_source(spec, workload, backend)
    result = RunResult(
        run_id=new_run_id(spec.model, backend.name), status="failed", spec=spec.to_dict(), started_at=utc_now()
    )
    progress = Progress(f"{spec.model} on {backend.name}", spec.warmup + spec.steps, spec.warmup,
                        enabled=show_progress)
    try:
        result.environment = environment_fingerprint(backend)
        result.device = describe_device(backend, catalog, spec.precision)
        result.workload = describe_workload(workload, spec)
        measurement = measure(spec, workload, backend, data, progress)
        summarise(result, spec, workload, measurement)
    except Exception as error:  # recorded as data: the run's status says what happened
        if isinstance(error, UsageError):  # bad data found while training (a token outside the vocabulary)
            result.status = "invalid"
        else:
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


def make_data_source(spec: RunSpec, workload: Workload, backend: Backend) -> SampledData:
    """The --data source: builtin corpus, synthetic tokens or a Megatron dataset."""
    batching = dict(seq_length=spec.seq_length, micro_batch_size=spec.micro_batch_size,
                    global_batch_size=spec.global_batch_size, seed=spec.seed, to_device=backend.to_device)
    if spec.data == "builtin":
        return BuiltinCorpus(**batching)
    if spec.data == "synthetic":
        return SyntheticTokens(workload.model.vocab_size, **batching)
    from hwbench.workload.gpt_dataset import MegatronData

    return MegatronData(spec.data, spec.split, train_steps=spec.warmup + spec.steps, eval_iters=spec.eval_iters,
                        vocab_size=workload.model.padded_vocab_size(spec.parallel.tp), **batching)


def validate(engine: NativeEngine, data: SampledData, spec: RunSpec, step: int) -> dict[str, Any]:
    """Validation loss over eval_iters global batches and PPL = exp(min(20, loss)), as Megatron."""
    batches = (data.valid_batch(i) for i in range(spec.eval_iters * spec.gradient_accumulation_steps))
    loss, tokens = engine.evaluate(batches)
    return {"step": step, "loss": _finite(loss), "ppl": math.exp(min(20.0, loss)) if math.isfinite(loss) else None,
            "tokens": tokens, "iters": spec.eval_iters}


def _eval_due(spec: RunSpec, data: SampledData, step: int) -> bool:
    last = spec.warmup + spec.steps
    return (spec.eval_iters > 0 and data.has_validation
            and (step == last or (spec.eval_interval > 0 and step % spec.eval_interval == 0)))


def measure(spec: RunSpec, workload: Workload, backend: Backend, data: SampledData,
            progress: Progress) -> Measurement:
    """Warm-up steps (excluded), then timed steps bracketed by device syncs.
    Validation at --eval-interval runs between timed steps, marked apart and left
    out of the step times (it does fall inside the telemetry window); the final
    validation runs after the measured window has closed."""
    backend.seed(spec.seed)
    model = build_model(workload.model, device=backend.torch_device, seed=spec.seed,
                        tensor_parallel=spec.parallel.tp, recompute=spec.recompute)
    engine = NativeEngine(model, spec, backend)
    validation: list[dict[str, Any]] = []

    outcomes: list[StepOutcome] = []
    for step in range(1, spec.warmup + 1):
        outcomes.append(engine.train_step(data.train_batch))
        progress.step(step, loss=outcomes[-1].loss.item())  # warm-up may sync freely
        if _eval_due(spec, data, step):
            validation.append(validate(engine, data, spec, step))
    backend.synchronize()

    backend.reset_peak_memory()
    sampler = backend.telemetry_sampler(spec.telemetry_interval_s) if spec.telemetry else None
    timer = backend.step_timer()
    interval_is_step: list[bool] = []  # one entry per interval between marks
    if sampler:
        sampler.start()
    wall_start = time.perf_counter()
    last = spec.warmup + spec.steps
    with backend.measuring():
        timer.mark()
        for step in range(spec.warmup + 1, last + 1):
            outcomes.append(engine.train_step(data.train_batch))
            timer.mark()
            interval_is_step.append(True)
            progress.step(step)  # no loss read here: it would sync the device
            if step < last and _eval_due(spec, data, step):
                validation.append(validate(engine, data, spec, step))
                timer.mark()
                interval_is_step.append(False)
    wall_time = time.perf_counter() - wall_start
    telemetry = sampler.stop() if sampler else None
    memory = dataclasses.asdict(backend.memory_stats())
    if _eval_due(spec, data, last):  # after the measured window
        validation.append(validate(engine, data, spec, last))
    step_times = [t for t, is_step in zip(timer.intervals_s(), interval_is_step) if is_step]
    return Measurement(outcomes, step_times, wall_time, memory, telemetry, data.describe(), validation)


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
        "validation": m.validation,
        "valid_loss": m.validation[-1]["loss"] if m.validation else None,
        "valid_ppl": m.validation[-1]["ppl"] if m.validation else None,
        "valid_ppl_step": m.validation[-1]["step"] if m.validation else None,
        "ppl_floor": m.data.get("perplexity_floor"),
        "skipped_steps": sum(1 for s in result.steps if s["skipped"]),
        "telemetry": m.telemetry,
        "data": m.data,
        "unmeasured": unmeasured,
    }
    if not m.validation:
        unmeasured["valid_ppl"] = ("no validation (--eval-iters 0)" if spec.eval_iters == 0
                                   else f"--split {spec.split} leaves no validation documents")
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
