"""The device a spec asks for, checked before anything runs, and what the catalog knows of
it: shared by the run, sweep, tune and calibrate paths, so a sweep or a command can ask
without importing the training loop."""

from __future__ import annotations

from hwbench.catalog import Catalog
from hwbench.device import Backend, select_backend
from hwbench.errors import UsageError
from hwbench.spec import RunSpec


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
    return capacity_bytes(backend, catalog_entry(backend, catalog)[1])


def capacity_bytes(backend: Backend, entry) -> int | None:
    return backend.memory_stats().capacity_bytes or (entry.memory_bytes if entry else None)
