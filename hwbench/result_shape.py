"""The shape of a result file: the type of every field hwbench writes and reads back.

A result file is data from another process, another machine or another night; it
may be truncated, edited by hand or produced by a buggy tool. The loader
(hwbench.results.load_result) checks it against this shape once, so that report,
compare, parity, system and history can trust the type of every field they read,
and a bad file is skipped with its reason instead of a traceback somewhere below.

Rules: a field that is absent is accepted (unless marked Required) (records of points that never ran,
older writers); a field that is present must have its type; keys not named here
are kept and not checked. Numbers must be finite (hwbench writes null for what it
did not measure), and throughput and memory figures must not be negative.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

STATUSES = ("ok", "oom", "failed", "timeout", "invalid", "numerics", "skipped")


@dataclasses.dataclass(frozen=True)
class Number:
    minimum: float | None = None

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, not {_kind(value)}"
        if not math.isfinite(value):
            return f"must be a finite number, not {value!r}"
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {self.minimum:g}, not {value!r}"
        return None


@dataclasses.dataclass(frozen=True)
class Integer:
    minimum: int | None = None

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, not {_kind(value)}"
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {self.minimum}, not {value!r}"
        return None


@dataclasses.dataclass(frozen=True)
class OneOf:
    values: tuple[Any, ...]

    def problem(self, value: Any) -> str | None:
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value in self.values:
            return None
        return f"must be one of {', '.join(map(str, self.values))}, not {value!r}"[:200]


@dataclasses.dataclass(frozen=True)
class Nullable:
    shape: Any


@dataclasses.dataclass(frozen=True)
class Required:
    """A field that must be present wherever its mapping is (what readers index by)."""

    shape: Any


@dataclasses.dataclass(frozen=True)
class ListOf:
    shape: Any


@dataclasses.dataclass(frozen=True)
class MapOf:
    """A mapping with free keys whose values all have one shape."""

    shape: Any


class Anything:
    """Any JSON value (kept as it is, read by nobody that needs its type)."""


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "text", bool: "true/false", type(None): "null"}.get(
        type(value), type(value).__name__)


COUNT = Integer(minimum=0)
BYTES = Nullable(Integer(minimum=0))
FIGURE = Nullable(Number())  # a measured figure, or null when not measured
RATE = Nullable(Number(minimum=0))  # samples/s, tokens/s, FLOP/s, watts, joules: never negative
TEXT = Nullable(str)
SCALAR = Nullable((str, int, float, bool))
REASONS = MapOf(Nullable(Anything))  # `unmeasured`: figure name -> reason (text, or a nested map)

STEP_TIME = {key: RATE for key in ("mean", "median", "p10", "p90", "min", "max", "stdev", "cv")} | {"n": COUNT}
MEMORY = {"peak_allocated_bytes": BYTES, "peak_reserved_bytes": BYTES, "capacity_bytes": BYTES,
          "alloc_retries": Nullable(COUNT), "ooms": Nullable(COUNT), "heap_trims": Nullable(COUNT),
          "source": TEXT, "unmeasured": REASONS}
TELEMETRY_DEVICE = {"index": Nullable(COUNT), "host": TEXT, "uuid": TEXT, "energy_j": RATE, "energy_method": TEXT,
                    "power_w_mean": RATE, "power_w_max": RATE, "temperature_c_mean": FIGURE,
                    "temperature_c_max": FIGURE, "utilization_percent_mean": FIGURE,
                    "memory_used_mb_mean": FIGURE, "throttle_reasons": Nullable(ListOf(str)),
                    "name": TEXT, "package": Nullable(COUNT), "energy_scope": TEXT, "pci_bus_id": TEXT,
                    "chip": Nullable(COUNT), "identified_by": TEXT, "power_method": TEXT, "energy_warning": TEXT}
TELEMETRY = {"source": TEXT, "available": Nullable(bool), "reason": TEXT, "devices": Nullable(ListOf(TELEMETRY_DEVICE)),
             "energy_j": RATE, "power_w_mean_total": RATE, "interval_s": RATE, "window_s": RATE,
             "samples": Nullable(COUNT), "ranks": Nullable(COUNT), "ranks_available": Nullable(COUNT),
             "errors": Nullable(ListOf(Anything))}
HOST_SYNCS = {"count": Required(COUNT), "where": Nullable(ListOf(str)), "rank": Nullable(COUNT),
              "ranks_counted": Nullable(COUNT)}
VALIDATION_POINT = {"step": Required(COUNT), "loss": FIGURE, "ppl": FIGURE, "tokens": Nullable(COUNT), "iters": Nullable(COUNT)}
METRICS = {
    "samples_per_s": RATE, "tokens_per_s": RATE, "tokens_per_s_per_device": RATE, "tflops_per_device": RATE,
    "mfu": RATE, "mfu_measured_ceiling": RATE, "flops_per_iteration": RATE, "flops_formula": TEXT,
    "flops_formula_expression": TEXT,
    "world_size": Nullable(Integer(minimum=1)), "timed_steps": Nullable(COUNT), "step_time_s": Nullable(STEP_TIME),
    "timed_wall_time_s": RATE, "memory": Nullable(MEMORY), "loss_start": FIGURE, "loss_end": FIGURE,
    "loss_floor": FIGURE, "validation": Nullable(ListOf(VALIDATION_POINT)), "valid_loss": FIGURE,
    "valid_ppl": FIGURE, "valid_ppl_step": Nullable(COUNT), "ppl_floor": FIGURE, "skipped_steps": Nullable(COUNT),
    "straggler": Nullable(MapOf(SCALAR)), "host_syncs": Nullable(HOST_SYNCS), "telemetry": Nullable(TELEMETRY), "data": Nullable(MapOf(Anything)),
    "unmeasured": REASONS,
}
PARALLEL = {"tp": Integer(minimum=1), "pp": Integer(minimum=1), "dp": Integer(minimum=1), "source": TEXT}
LAUNCH_SPEC = {"nnodes": Integer(minimum=1), "nproc_per_node": Integer(minimum=1), "node_rank": COUNT,
               "master_addr": TEXT, "master_port": Nullable(COUNT), "rdzv_endpoint": TEXT, "timeout_s": RATE,
               "under_torchrun": Nullable(bool)}
SPEC = {
    "model": str, "device": str, "micro_batch_size": Integer(minimum=1), "global_batch_size": Integer(minimum=1),
    "seq_length": Integer(minimum=1), "precision": str, "recompute": bool, "compile": bool,
    "steps": Integer(minimum=1), "warmup": COUNT, "seed": COUNT, "parallel": PARALLEL, "engine": str,
    "zero_stage": COUNT, "fsdp": bool, "pp_schedule": TEXT, "launch": LAUNCH_SPEC, "optimizer": MapOf(Anything),
    "initial_scale_power": Nullable(COUNT), "loss_scale": FIGURE, "data": TEXT, "split": TEXT,
    "eval_interval": Nullable(COUNT), "eval_iters": Nullable(COUNT), "telemetry": Nullable(bool),
    "telemetry_interval_s": RATE, "flops_formula": TEXT, "out_dir": TEXT, "run_args": ListOf(str),
    "threads_per_rank": Nullable(Integer(minimum=1)), "max_positions": Nullable(Integer(minimum=1)),
    "settings": TEXT, "settings_choice": TEXT, "device_memory_bytes": BYTES, "cross_entropy": TEXT,
    "fused_qkv": Nullable(bool),
}
MEASURED_CEILING = {"flops": RATE, "precision": TEXT, "size": Nullable(COUNT), "cv": RATE, "measured_at": TEXT,
                    "device_model": TEXT, "driver": TEXT, "torch_version": TEXT, "hwbench_version": TEXT,
                    "copy_bytes_per_s": RATE, "store": TEXT}
DEVICE = {"backend": TEXT, "dist_backend": TEXT, "device_model": TEXT, "device_count": Nullable(COUNT),
          "torch_device": TEXT, "simulated": Nullable(bool), "catalog_entry": TEXT, "catalog_path": TEXT,
          "peak_flops": RATE, "peak_flops_precision": TEXT, "peak_flops_source": TEXT,
          "peak_flops_unmeasured": TEXT, "measured_ceiling": Nullable(MEASURED_CEILING),
          "measured_ceiling_unmeasured": TEXT, "memory_capacity_bytes": BYTES, "tdp_watts": RATE,
          "price_usd_per_hour": RATE, "price_source": TEXT, "price_date": TEXT, "tuning": Nullable(MapOf(Anything)),
          "auto_passed_over": Nullable(ListOf(str))}
SLURM_JOB = {"job_id": TEXT, "step_id": TEXT, "nodelist": TEXT, "nnodes": Nullable(COUNT), "ntasks": Nullable(COUNT),
             "partition": TEXT, "cluster": TEXT, "account": TEXT}
ENVIRONMENT = {"device_models": Nullable(ListOf(str)), "device_count": Nullable(COUNT), "host": TEXT,
               "backend": TEXT, "simulated": Nullable(bool), "cpu_cores_usable": Nullable(COUNT),
               "tuning": Nullable(MapOf(Anything)), "hwbench_git": Nullable(MapOf(Anything)),
               "oversubscribed": Nullable(bool), "oversubscribed_reason": TEXT,
               "threads_per_rank": Nullable(Integer(minimum=1)), "devices_used": Nullable(COUNT),
               "devices_used_basis": TEXT, "slurm": Nullable(SLURM_JOB)}
STEP = {"step": Required(COUNT), "phase": TEXT, "time_s": RATE, "loss": FIGURE, "grad_norm": FIGURE, "lr": FIGURE,
        "loss_scale": FIGURE, "skipped": Nullable(bool)}
RANK_PLACEMENT = {"threads": Nullable(Integer(minimum=1)), "usable_cores": Nullable(COUNT), "cpus": TEXT,
                  "devices": Nullable(ListOf(str))}
NODE_PLACEMENT = {"threads_per_rank": Nullable(ListOf(Integer(minimum=1))), "usable_cores": Nullable(COUNT),
                  "devices": Nullable(ListOf(str)), "oversubscribed": Nullable(bool), "oversubscribed_reason": TEXT}
RANK = {"rank": Required(COUNT), "local_rank": Nullable(COUNT), "node_rank": Nullable(COUNT), "host": TEXT,
        "coordinates": Nullable(MapOf(Nullable(COUNT))), "memory": Nullable(MEMORY),
        "step_time_s": Nullable(STEP_TIME), "telemetry": Nullable(MapOf(Anything)), "last_step": Nullable(COUNT),
        "placement": Nullable(RANK_PLACEMENT)}
NODE = {"node_rank": Required(COUNT), "host": TEXT, "ranks": ListOf(COUNT), "environment": Nullable(ENVIRONMENT),
        "placement": Nullable(NODE_PLACEMENT)}
ERROR = {"type": TEXT, "message": TEXT, "traceback": TEXT, "rank": Nullable(COUNT), "signal": TEXT,
         "log_tail": TEXT, "slurm_state": TEXT, "slurm_job_id": TEXT}
SWEEP = {"suite": TEXT, "suite_path": TEXT, "point": TEXT, "repeat": Nullable(COUNT), "repeats": Nullable(COUNT),
         "key": TEXT}
RESULT = {
    "schema_version": Integer(), "run_id": str, "status": OneOf(STATUSES), "spec": SPEC,
    "workload": MapOf(Anything), "device": DEVICE, "metrics": METRICS, "steps": ListOf(STEP), "ranks": ListOf(RANK),
    "engine": MapOf(Anything), "launch": MapOf(Anything), "environment": ENVIRONMENT, "nodes": ListOf(NODE),
    "sweep": Nullable(SWEEP), "error": Nullable(ERROR), "warnings": ListOf(str), "started_at": str,
    "finished_at": str, "hwbench_version": str,
}


def shape_problem(value: Any, shape: Any = RESULT, where: str = "") -> str | None:
    """The first place where ``value`` departs from ``shape``, as "field: what is wrong",
    or None when it fits."""
    if shape is Anything:
        return None
    if isinstance(shape, Required):
        return shape_problem(value, shape.shape, where)
    if isinstance(shape, Nullable):
        return None if value is None else shape_problem(value, shape.shape, where)
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where or 'the file'}: must be a mapping, not {_kind(value)}"
        for key, field_shape in shape.items():
            if key not in value and isinstance(field_shape, Required):
                return f"{where}.{key}: is missing"
            if key in value:
                problem = shape_problem(value[key], field_shape, f"{where}.{key}" if where else key)
                if problem:
                    return problem
        return None
    if isinstance(shape, MapOf):
        if not isinstance(value, dict):
            return f"{where}: must be a mapping, not {_kind(value)}"
        for key, item in value.items():
            problem = shape_problem(item, shape.shape, f"{where}.{key}")
            if problem:
                return problem
        return None
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            return f"{where}: must be a list, not {_kind(value)}"
        for index, item in enumerate(value):
            problem = shape_problem(item, shape.shape, f"{where}[{index}]")
            if problem:
                return problem
        return None
    if isinstance(shape, (Number, Integer, OneOf)):
        problem = shape.problem(value)
        return f"{where}: {problem}" if problem else None
    types = shape if isinstance(shape, tuple) else (shape,)
    if isinstance(value, bool) and bool not in types:
        return f"{where}: must be {_names(types)}, not true/false"
    if not isinstance(value, types):
        return f"{where}: must be {_names(types)}, not {_kind(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: must be a finite number, not {value!r}"
    return None


def _names(types: tuple[type, ...]) -> str:
    return " or ".join({str: "text", int: "an integer", float: "a number", bool: "true/false", dict: "a mapping",
                        list: "a list"}.get(t, t.__name__) for t in types)
