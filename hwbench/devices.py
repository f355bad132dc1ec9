"""Device lookups shared by the run, sweep, tune and plan paths: the backend a spec
asks for (checked against its precision), the catalog entry of the device, its
memory, and the result's `device` and `workload` descriptions. Kept apart from the
worker so that a sweep or a command can ask without importing the training loop."""

from __future__ import annotations

import dataclasses
from typing import Any

from hwbench.calibration.store import default_store_path, lookup_ceiling
from hwbench.catalog import Catalog, Workload
from hwbench.device import Backend, select_backend
from hwbench.errors import UsageError
from hwbench.spec import RunSpec
from hwbench.workload.params import count_parameters


def checked_backend(spec: RunSpec) -> Backend:
    """The run's device backend, once it is known to run the spec's precision."""
    backend = select_backend(spec.device)
    problem = backend.precision_problem(spec.precision)
    if problem:
        raise UsageError(f"--precision {spec.precision}: {problem}")
    return backend


def device_model_name(backend: Backend) -> str:
    """The model of the backend's first device, as results and the calibration store name it."""
    names = backend.device_names()
    return names[0] if names else "unknown"


def catalog_entry(backend: Backend, catalog: Catalog):
    """(device model name, the catalog entry that matches it or None)."""
    model_name = device_model_name(backend)
    return model_name, catalog.match_device(backend.name, model_name)


def device_capacity_bytes(backend: Backend, catalog: Catalog) -> int | None:
    """Memory per device: what the device reports, else its catalog entry's."""
    return device_memory(backend, catalog)[0]


def device_memory(backend: Backend, catalog: Catalog) -> tuple[int | None, str]:
    """(memory per device, where the figure comes from): what the device reports, else its
    catalog entry's; (None, why) when neither knows."""
    model_name, entry = catalog_entry(backend, catalog)
    reported = backend.memory_stats().capacity_bytes
    if reported:
        return reported, f"what the {backend.name} device {model_name!r} reports"
    if entry is not None and entry.memory_bytes:
        return entry.memory_bytes, f"the catalog entry {entry.name!r} ({entry.path})"
    return None, (f"the {backend.name} device {model_name!r} reports no memory size and no catalog entry with one "
                  "matches it")


def _capacity_bytes(backend: Backend, entry) -> int | None:
    return backend.memory_stats().capacity_bytes or (entry.memory_bytes if entry else None)


def describe_device(backend: Backend, catalog: Catalog, precision: str) -> dict[str, Any]:
    model_name, entry = catalog_entry(backend, catalog)
    peak, reason = (entry.peak(precision) if entry else
                    (None, f"no catalog entry matches the {backend.name} device {model_name!r}"))
    if backend.simulated:
        peak, reason = None, "the device is simulated: there is no peak to compare host-CPU work with"
    capacity = _capacity_bytes(backend, entry)
    ceiling, ceiling_reason = measured_ceiling(backend, model_name, precision)
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
        "measured_ceiling": ceiling,
        "measured_ceiling_unmeasured": ceiling_reason,
        "memory_capacity_bytes": capacity,
        "tdp_watts": entry.tdp_watts if entry else None,
        "price_usd_per_hour": entry.price_usd_per_hour if entry else None,
        "price_source": entry.price_source if entry else None,
        "price_date": entry.price_date if entry else None,
        "tuning": backend.tuning,
        "auto_passed_over": list(backend.passed_over) or None,
    }


def measured_ceiling(backend: Backend, model_name: str, precision: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the GEMM rate `hwbench calibrate` measured on this device model under this driver for
    ``precision``, with when, how and where it was stored; None and the reason). Read when the
    result is assembled, so the result carries the ceiling it was compared with."""
    if backend.simulated:
        return None, "the device is simulated: there is no ceiling to compare host-CPU work with"
    driver, problem = backend.driver()
    try:
        path = default_store_path()
    except (RuntimeError, KeyError) as error:  # no $HOME and no password entry to find it from
        return None, f"calibration store unreadable: its default path cannot be found ({error})"
    return lookup_ceiling(path, backend.name, model_name, driver, problem, precision)


def describe_workload(workload: Workload, spec: RunSpec) -> dict[str, Any]:
    config = spec.model_config(workload.model)  # --max-positions changes the position embedding
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
