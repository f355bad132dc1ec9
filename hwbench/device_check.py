"""The device a spec asks for, checked before anything runs, and what the catalog knows of
it: shared by the run, sweep, tune and calibrate paths, so a sweep or a command can ask
without importing the training loop."""

from __future__ import annotations

import importlib.util

from hwbench.catalog import Catalog, DeviceMatch, DeviceModel, load_catalog
from hwbench.device import Backend, select_backend
from hwbench.errors import SetupError, UsageError
from hwbench.precision import BLOCK_SCALED_RECIPES, DEFAULT_FP8_RECIPE, FP8
from hwbench.spec import RunSpec


def checked_backend(spec: RunSpec) -> Backend:
    """The run's device backend, once it is known to run the spec's precision."""
    backend = select_backend(spec.device)
    problem = backend.precision_problem(spec.precision)
    if problem:
        raise UsageError(f"--precision {spec.precision}: {problem}")
    if spec.precision == FP8:
        if importlib.util.find_spec("torchao") is None:
            raise SetupError("--precision fp8 trains through torchao, which is not installed: pip install "
                             "'hwbench[fp8]' (torchao 0.18 or later, built for this torch)")
        problem = fp8_problem(backend, spec.fp8_recipe or DEFAULT_FP8_RECIPE)
        if problem:
            raise UsageError(f"--precision fp8 --fp8-recipe {spec.fp8_recipe}: {problem}; accepted here: "
                             "--precision bf16")
    return backend


def fp8_problem(backend: Backend, recipe: str, catalog: Catalog | None = None) -> str | None:
    """Why this device cannot train with FP8 ``recipe``, or None: it has the matrix units, or it
    emulates FP8 (the CPU). The backend says where it can tell (a GPU's compute capability or
    architecture); elsewhere the device's catalog entry does: an entry without an fp8 peak
    lists no FP8 units, and neither does a device without an entry."""
    if backend.fp8_emulation():
        return None
    has, why = backend.fp8_units(block_scaled=recipe in BLOCK_SCALED_RECIPES)
    if has is not None:
        return None if has else why
    _, found = identify_device(backend, catalog or load_catalog())
    if found.entry is None:
        return f"nothing says this device has FP8 matrix units ({why}; {found.why})"
    figure = found.entry.peak_flops.get(FP8)
    if figure is None or figure.dense is None:
        listed = f"null: {figure.unavailable}" if figure else "not listed"
        return (f"nothing says this device has FP8 matrix units ({why}; its catalog entry {found.entry.name!r} has "
                f"no fp8 peak, {listed})")
    return None


def device_model_name(backend: Backend) -> str:
    """The model of the backend's first device, as results and the calibration store name it."""
    names = backend.device_names()
    return names[0] if names else "unknown"


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
    return device_memory(backend, catalog)[0]


def device_memory(backend: Backend, catalog: Catalog) -> tuple[int | None, str]:
    """(memory per device, where the figure comes from): what the device reports, else its
    catalog entry's; (None, why) when neither knows."""
    model_name, found = identify_device(backend, catalog)
    entry = found.entry
    reported = backend.memory_stats().capacity_bytes
    if reported:
        return reported, f"what the {backend.name} device {model_name!r} reports"
    if entry is not None and entry.memory_bytes:
        return entry.memory_bytes, f"the catalog entry {entry.name!r} ({entry.path})"
    return None, (f"the {backend.name} device {model_name!r} reports no memory size and no catalog entry with one "
                  "matches it")


def capacity_bytes(backend: Backend, entry) -> int | None:
    return backend.memory_stats().capacity_bytes or (entry.memory_bytes if entry else None)
