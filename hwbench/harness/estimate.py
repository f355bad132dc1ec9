"""What a user should know before a long command starts (`hwbench run`, `sweep`, `tune`): a precision
the device runs emulated, with the precisions it runs at speed (the Backend's `slow_precision`), and
how long the command will take at least: the model FLOPs of its training steps (warm-up included)
over the rate `hwbench calibrate` measured on this device model and driver for that precision. A run
loads, starts, validates and never reaches the GEMM ceiling, so the real time is longer: the figure
is a lower bound and says so. Without a usable measured rate the estimate is unknown: said in one
short line, once for the same cause (the cause in full is in the result and its summary, under
'MFU, measured ceiling'), not again before every run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hwbench.catalog import Catalog
    from hwbench.device.base import Backend
    from hwbench.result.model import MeasuredCeiling
    from hwbench.spec import RunSpec

# A run whose measured pace projects at least this long is told so once the pace is known (its
# first micro-batch, else its first step): the estimate before it starts is a floor from the GEMM
# rate, and a step's other work can make the run many times longer (--model 345m on a
# CPU, 10 minutes at least, took two hours).
PACE_FROM_S = 300.0
# Until the first micro-batch is done, the time it has taken so far bounds the run from below
# (if every one takes as long): said after 30 s, then each time the wait doubles, so that a user
# learns within the first minute that a run is long even when one micro-batch takes minutes.
FIRST_WAIT_S = 30.0

# What a run that shows its progress says later (hwbench/harness/progress.py): a sweep's and a
# tune's runs are quiet, so only `hwbench run`'s estimate promises it.
PACE_LATER = f"a run of {PACE_FROM_S / 60:g} min or more says its measured length after its first micro-batch"


@dataclasses.dataclass(frozen=True)
class Work:
    """The training work of one run: its model FLOPs and what it runs on."""

    flops: float
    precision: str
    devices: int  # devices sharing the work: ranks on GPUs and NPUs, nodes (one CPU each) on the CPU


def run_work(spec: RunSpec, catalog: Catalog, backend: Backend) -> Work:
    """The FLOPs the device computes in ``spec``'s warm-up and timed steps: the model FLOPs of the
    formula the run reports (the default's where that one cannot count the model: the device does
    the same work whatever a formula counts), and the recomputed forward of a run that recomputes."""
    from hwbench.workload.flops import counts_hardware_flops, model_flops_per_iteration, work_formula

    config = spec.model_config(catalog.workloads[spec.model].model)
    formula, _ = work_formula(spec.flops_formula, config)
    per_step = model_flops_per_iteration(config, spec.global_batch_size, spec.seq_length,
                                         tensor_parallel=spec.parallel.tp, recompute=spec.recompute, formula=formula)
    if spec.recompute and not counts_hardware_flops(formula, spec.recompute):
        per_step *= 4 / 3  # forward 1 + backward 2, and the recompute's forward 1 more: a floor counts it
    devices = spec.launch.world_size if backend.exclusive_devices else spec.launch.nnodes
    return Work(per_step * (spec.warmup + spec.steps), spec.precision, max(1, devices))


def slow_precision_warning(backend: Backend, precision: str) -> str | None:
    """'--precision fp16: this CPU (...) has no fp16 matrix units ...; --precision fp32 runs at speed here'."""
    reason = backend.slow_precision(precision)
    if reason is None:
        return None
    instead = [p for p in backend.fast_precisions() if p != precision]
    return (f"--precision {precision}: {reason}; " + (f"--precision {' or '.join(instead)} runs at speed here"
                                                      if instead else "no precision runs at speed here"))


def estimate_text(backend: Backend, work: Iterable[Work], what: str, once: bool = False) -> str:
    """'hwbench run: at least 2 min 10 s (...)', or that the duration is unknown and where to read
    why. ``once``: '' for a duration unknown for want of a calibration when that cause was said
    before (said_before)."""
    from hwbench.device_check import device_model_name
    from hwbench.harness.describe import measured_ceiling
    from hwbench.units import flops_rate_text

    work = list(work)
    model = device_model_name(backend)
    rates: dict[str, MeasuredCeiling] = {}
    flops: dict[str, float] = {}
    for precision in sorted({w.precision for w in work}):
        ceiling, reason = measured_ceiling(backend, model, precision)
        if ceiling is None or not ceiling.flops:
            if backend.simulated or "hwbench calibrate" not in (reason or ""):  # calibrating would not help
                return f"{what}: duration unknown: {reason}"
            if once and said_before(reason or ""):
                return ""
            return f"{what}: duration unknown: no usable {precision} GEMM ceiling (hwbench calibrate --help)"
        rates[precision] = ceiling
        flops[precision] = ceiling.flops
    seconds = sum(w.flops / (flops[w.precision] * w.devices) for w in work)
    total = sum(w.flops for w in work)
    measured = ", ".join(f"{p} {flops_rate_text(c.flops)} per device (hwbench calibrate, "
                         f"{(c.measured_at or '?')[:10]})" for p, c in rates.items())
    return (f"{what}: at least {duration_text(seconds)}: {total / 1e12:,.4g} TFLOP of training steps (warm-up "
            f"and any recompute included) at the GEMM rate measured on {model}, {measured}; start-up, validation "
            "and a step's other work make it longer")


def said_before(cause: str) -> bool:
    """Whether ``cause`` (why no duration can be estimated) was said before with this calibration
    store, recording it when not: in a hidden file beside the store (.calibration.json.said), which
    a new calibration's new cause does not match. False when no record can be kept."""
    from hwbench.calibration.store import default_store_path
    from hwbench.files import write_json_atomic

    try:
        store = default_store_path()
    except (RuntimeError, KeyError):  # no $HOME to find it from
        return False
    record, key = store.with_name(f".{store.name}.said"), hashlib.sha256(cause.encode()).hexdigest()[:16]
    try:
        said = json.loads(record.read_text())
    except (OSError, ValueError):
        said = []
    said = [entry for entry in said if isinstance(entry, str)] if isinstance(said, list) else []
    if key in said:
        return True
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(record, (said + [key])[-100:], durable=False)  # the last 100 causes
    except OSError:
        pass
    return False


def duration_text(seconds: float) -> str:
    """45 s, 12 min, 3.4 h, 2.1 days."""
    if seconds < 60:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.1f} days"


def size_notes(options) -> list[str]:
    """'note: --device-memory 80GB is read as 80 x 10^9 bytes = 74.5 GiB ...' for a size given in a
    decimal unit (said, since a memory size is usually meant in binary units)."""
    from hwbench.units import decimal_size_note

    note = decimal_size_note(options.device_memory, "--device-memory")
    return [f"note: {note}"] if note else []


def before_run(options, estimate: bool = True) -> list[str]:
    """The lines `hwbench run` says before it starts, each "warning: ..." or "note: ..." (none in a
    rank torchrun or srun started: the launcher said them); the estimate only with ``estimate``."""
    import os

    from hwbench.catalog import load_catalog
    from hwbench.device import select_backend
    from hwbench.engine.distributed import RankEnvironment
    from hwbench.spec import build_run_spec

    if RankEnvironment.from_environ() is not None or os.environ.get("SLURM_PROCID", "0") != "0":
        return []
    catalog = load_catalog()
    spec = build_run_spec(options, catalog)
    backend = select_backend(spec.device)
    warning = slow_precision_warning(backend, spec.precision)
    note = estimate_text(backend, [run_work(spec, catalog, backend)], "this run", once=True) if estimate else ""
    if note and "duration unknown" not in note:  # a floor: the run says its measured length later
        note += f"; {PACE_LATER}"
    return size_notes(options) + ([f"warning: {warning}"] if warning else []) + ([f"note: {note}"] if note else [])

