"""A run as MLPerf Training reads one: `:::MLLOG` lines and the system description JSON.

The line format is mlperf_logging.mllog's (`:::MLLOG {"namespace", "time_ms", "event_type",
"key", "value", "metadata"}`, keys from mlperf_logging.mllog.constants), so MLPerf's own parser
(mlperf_logging.compliance_checker.mlp_parser) reads the file. Only what the run measured is
written, in MLPerf's terms: `init_start`/`init_stop` only where the result records the
initialisation (`metrics.time_to_target.init_s`, a run with a target), `init_start` that long
before `init_stop`; `run_stop` status `success` only where the run reached its target quality
(MLPerf's meaning), `aborted` otherwise (a run without a target is a throughput window, not a
time to train). A simulated run (a stand-in ran the device's code path on the host) is refused:
it is no result in MLPerf's terms.

The clock: `init_stop` and `run_start` are the result's `started_at`; the blocks and validations
after it are placed by the timed steps' own durations (`steps[].time_s`), and `run_stop` at
run_start plus the time to the target (`metrics.time_to_target.time_s`) where it was reached,
else plus the timed window's wall time (`metrics.timed_wall_time_s`: the window hwbench
measured, without the untimed warm-up). A block is the timed steps up to a validation
(or to the end); `eval_accuracy` is the validation loss (log perplexity, as MLPerf's language
model benchmarks count it); `samples_count` counts the samples trained so far, warm-up
included; a validation after a warm-up step is logged before the first block. The system
description is `hwbench system`'s (hwbench.report.system) with every
field MLPerf's checker requires, written as MLPerf's files write them: every value text, an
unknown one empty, and `sw_notes` naming the fields the result does not record.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any

from hwbench.errors import UsageError
from hwbench.exports import SUBMISSION_STATUSES, ExportRequest
from hwbench.result.model import RunResult

# The fields mlperf_logging.system_desc_checker requires of a training system description.
SYSTEM_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes", "host_processors_per_node",
    "host_processor_model_name", "host_processor_core_count", "host_processor_vcpu_count", "host_processor_frequency",
    "host_processor_caches", "host_processor_interconnect", "host_memory_capacity", "host_storage_type",
    "host_storage_capacity", "host_networking", "host_networking_topology", "host_memory_configuration",
    "accelerators_per_node", "accelerator_model_name", "accelerator_host_interconnect", "accelerator_frequency",
    "accelerator_on-chip_memories", "accelerator_memory_configuration", "accelerator_memory_capacity",
    "accelerator_interconnect", "accelerator_interconnect_topology", "cooling", "hw_notes", "framework",
    "other_software_stack", "operating_system", "sw_notes")
POINT_IN_TIME, INTERVAL_START, INTERVAL_END = "POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END"


def render(fmt: str, runs: list[RunResult], files: list, request: ExportRequest) -> str:
    (run,) = runs
    if run.simulated:
        raise UsageError(f"{fmt}: run {run.run_id} ({files[0]}) ran on a simulated {run.device_model or 'device'} "
                         "(a stand-in ran its code path on the host): not a result in MLPerf's terms, so no MLPerf "
                         "file is written; export it as csv or parquet, which mark it (device.simulated)")
    if run.stand_in:
        raise UsageError(f"{fmt}: run {run.run_id} ({files[0]}) ran FP8 emulated on {run.device_model or 'its device'} "
                         "(computed without FP8 matrix units): not a result in MLPerf's terms, so no MLPerf file is "
                         "written; export it as csv or parquet, which mark it (device.fp8_emulated)")
    if fmt == "mlperf-system":
        return json.dumps(system_description(run, request), indent=2) + "\n"
    return "".join(mllog_line(*event) + "\n" for event in mllog_events(run, request))


def system_description(run: RunResult, request: ExportRequest) -> dict[str, Any]:
    from hwbench.report.system import system_description as described

    found = described(run)
    submission = {"submitter": request.submitter, "division": request.division,
                  "status": SUBMISSION_STATUSES.get(request.status) if request.status else None}
    fields = {**dict.fromkeys(SYSTEM_FIELDS), **found, **submission}
    empty = [name for name, value in fields.items() if value is None]
    fields["sw_notes"] = (f"from hwbench result {run.run_id}; empty fields are not recorded in it: "
                          + ", ".join(empty)) if empty else f"from hwbench result {run.run_id}"
    return {name: _text(value) for name, value in fields.items()}


def _text(value: Any) -> str:
    """A field as MLPerf's system descriptions write every field: text, empty when unknown."""
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def mllog_line(time_ms: int, event_type: str, key: str, value: Any, metadata: dict[str, Any]) -> str:
    """One line as mlperf_logging.mllog writes it (its keys in its order)."""
    record = {"namespace": "", "time_ms": time_ms, "event_type": event_type, "key": key, "value": value,
              "metadata": metadata}
    return ":::MLLOG " + json.dumps(record, allow_nan=False)


def mllog_events(run: RunResult, request: ExportRequest) -> Iterator[tuple[int, str, str, Any, dict[str, Any]]]:
    """(time_ms, event type, key, value, metadata) of the run, in time order."""
    from hwbench.report.system import system_description as described

    spec = run.spec
    start = _epoch_ms(run.started_at) or _epoch_ms(run.finished_at) or 0
    system = described(run)
    submission = {"submission_benchmark": f"hwbench-gpt-{spec.model}", "submission_org": request.submitter,
                  "submission_division": request.division, "submission_status": request.status,
                  "submission_platform": request.platform or system["system_name"]}
    target = run.metrics.time_to_target
    init_s = target.init_s if target is not None else None  # measured only with a target: else not written
    first = start - _ms(init_s, run, "metrics.time_to_target.init_s") if init_s is not None else start
    for key, value in submission.items():
        yield first, POINT_IN_TIME, key, value, {}
    if init_s is not None:
        yield first, INTERVAL_START, "init_start", None, {}
        yield start, INTERVAL_END, "init_stop", None, {}
    yield start, INTERVAL_START, "run_start", None, {}
    for key, value in _hyperparameters(run).items():
        yield start, POINT_IN_TIME, key, value, {}
    now, block_first = start, None
    global_batch = spec.global_batch_size or 0
    validations = {v.step: v for v in run.metrics.validation or []}
    for step in run.steps or []:
        if step.phase == "timed":
            if block_first is None:
                block_first = step.step
                yield now, INTERVAL_START, "block_start", None, {"samples_count": (step.step - 1) * global_batch,
                                                                   "step_num": step.step}
            now += _ms(step.time_s or 0.0, run, f"steps[step {step.step}].time_s")
        validation = validations.get(step.step)
        last_timed = step.phase == "timed" and step is _last_timed(run)
        if block_first is not None and (validation is not None or last_timed):
            yield now, INTERVAL_END, "block_stop", None, {"samples_count": step.step * global_batch,
                                                          "step_num": step.step}
            block_first = None
        if validation is not None and validation.loss is not None:
            metadata = {"samples_count": step.step * global_batch, "step_num": step.step}
            yield now, INTERVAL_START, "eval_start", None, metadata
            yield now, POINT_IN_TIME, "eval_accuracy", validation.loss, metadata
            yield now, INTERVAL_END, "eval_stop", None, metadata
    reached = target is not None and bool(target.reached) and target.time_s is not None
    span, field = ((target.time_s, "metrics.time_to_target.time_s") if reached and target is not None
                   else (run.metrics.timed_wall_time_s, "metrics.timed_wall_time_s"))
    stop = start + _ms(span, run, field) if span is not None else (_epoch_ms(run.finished_at) or now)
    # MLPerf's "success" is the target quality reached; any other end is "aborted"
    status = "success" if reached and run.status == "ok" else "aborted"
    yield max(stop, now), INTERVAL_END, "run_stop", None, {"status": status, "hwbench_status": run.status}


def _hyperparameters(run: RunResult) -> dict[str, Any]:
    spec = run.spec
    optimizer = spec.optimizer or {}
    parallel = spec.parallel
    found = {"seed": spec.seed, "global_batch_size": spec.global_batch_size, "micro_batch_size": spec.micro_batch_size,
             "gradient_accumulation_steps": spec.gradient_accumulation_steps, "max_sequence_length": spec.seq_length,
             "opt_name": "adamw", "opt_base_learning_rate": optimizer.get("lr"),
             "opt_end_learning_rate": optimizer.get("min_lr"), "opt_adamw_weight_decay": optimizer.get("weight_decay"),
             "opt_adamw_beta_1": optimizer.get("adam_beta1"), "opt_adamw_beta_2": optimizer.get("adam_beta2"),
             "opt_adamw_epsilon": optimizer.get("adam_eps"), "opt_gradient_clip_norm": optimizer.get("clip_grad"),
             "opt_learning_rate_warmup_steps": optimizer.get("lr_warmup_iters"),
             "tensor_parallelism": parallel.tp, "pipeline_parallelism": parallel.pp,
             "train_samples": _train_samples(spec)}
    return {key: value for key, value in found.items() if value is not None}


def _last_timed(run: RunResult) -> Any:
    return next((step for step in reversed(run.steps or []) if step.phase == "timed"), None)


MAX_SPAN_MS = 1000 * 3600 * 24 * 366 * 1000  # a thousand years: any longer span is damage, not a run


def _ms(seconds: float, run: RunResult, field: str) -> int:
    """A span of the run in whole milliseconds, the log's clock; UsageError naming the field when
    it is longer than any run (a finite float such as 1e307 s has no millisecond count)."""
    if not 0 <= 1000 * seconds <= MAX_SPAN_MS:
        raise UsageError(f"run {run.run_id}: {field} {seconds:g} s is longer than any run; the MLPerf log's clock "
                         "cannot hold it (a damaged result?)")
    return round(1000 * seconds)


def _epoch_ms(text: str) -> int | None:
    try:
        return round(datetime.datetime.fromisoformat(text).timestamp() * 1000) if text else None
    except ValueError:
        return None


def _train_samples(spec: Any) -> int | None:
    """The samples the run trained on, warm-up included, or None where the spec does not say."""
    if spec.warmup is None or spec.steps is None or spec.global_batch_size is None:
        return None
    return (spec.warmup + spec.steps) * spec.global_batch_size
