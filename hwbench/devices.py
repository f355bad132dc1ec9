"""Device lookups shared by the run, sweep, tune and plan paths: the backend a spec
asks for (checked against its precision), the catalog entry of the device, its
memory, and the result's `device` and `workload` descriptions. Kept apart from the
worker so that a sweep or a command can ask without importing the training loop."""

from __future__ import annotations

import dataclasses
from typing import Any

from hwbench.calibration.store import default_store_path, lookup_ceiling
from hwbench.catalog import Catalog, DeviceMatch, DeviceModel, Workload
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
    model_name, found = identify_device(backend, catalog)
    return model_name, found.entry


def identify_device(backend: Backend, catalog: Catalog) -> tuple[str, DeviceMatch]:
    """(device model name, the catalog entry it resolves to and why): by name, and where
    several models report one name, by the power limit the device reports."""
    model_name = device_model_name(backend)
    watts, basis = backend.power_limit_watts()
    return model_name, catalog.identify(backend.name, model_name, watts, basis if watts is not None else
                                        f"the power limit ({basis})")


def device_peak(backend: Backend, entry: DeviceModel | None, precision: str,
                why_no_entry: str) -> tuple[float | None, str | None, str | None]:
    """(peak dense FLOP/s of this device, None, how it follows from the catalog) or (None, why
    not, None). A device with fewer compute units than the data sheet's figure counts (one
    die of a two-die module, a partitioned GPU) gets the figure scaled by its share of them."""
    if backend.simulated:
        return None, "the device is simulated: there is no peak to compare host-CPU work with", None
    if entry is None:
        return None, why_no_entry, None
    peak, reason = entry.peak(precision)
    if peak is None:
        return None, reason, None
    basis = f"{entry.name} {precision}: {entry.peak_flops[precision].describe()}"
    units = backend.compute_units()
    if entry.compute_units and units and units != entry.compute_units:
        if units > entry.compute_units:
            return None, (f"the device reports {units} compute units, more than the {entry.compute_units} of "
                          f"{entry.name}'s figures: not that model"), None
        peak = peak * units / entry.compute_units
        basis += f"; scaled by the {units} of {entry.compute_units} compute units this device reports"
    return peak, None, basis


def device_capacity_bytes(backend: Backend, catalog: Catalog) -> int | None:
    """Memory per device: what the device reports, else its catalog entry's."""
    return _capacity_bytes(backend, catalog_entry(backend, catalog)[1])


def _capacity_bytes(backend: Backend, entry) -> int | None:
    return backend.memory_stats().capacity_bytes or (entry.memory_bytes if entry else None)


def describe_device(backend: Backend, catalog: Catalog, precision: str) -> dict[str, Any]:
    model_name, found = identify_device(backend, catalog)
    entry = found.entry
    peak, reason, basis = device_peak(backend, entry, precision, found.why)
    figure = entry.peak_flops.get(precision) if entry and peak else None
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
        "catalog_match": found.why,
        "peak_flops": peak,
        "peak_flops_precision": precision,
        "peak_flops_source": figure.source if figure else None,
        "peak_flops_read": figure.read if figure else None,
        "peak_flops_listed_with_sparsity": figure.sparsity if figure else None,
        "peak_flops_basis": basis,
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
        **backend.device_identity(),
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
