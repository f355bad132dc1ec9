"""The result's descriptions of what ran: the device (its catalog entry, peak and measured
ceiling) and the workload (its shape as trained, its parameter counts)."""

from __future__ import annotations

import dataclasses

from hwbench.calibration.store import default_store_path, lookup_ceiling
from hwbench.catalog import Catalog, DeviceModel, Workload
from hwbench.device import Backend
from hwbench.device_check import capacity_bytes, device_peak, identify_device
from hwbench.precision import FP8, peak_precision
from hwbench.result.model import Device, MeasuredCeiling
from hwbench.result.model import Workload as WorkloadDescription
from hwbench.spec import RunSpec
from hwbench.workload.params import count_parameters


def describe_device(backend: Backend, catalog: Catalog, precision: str) -> Device:
    """The device as the result records it, with the peak the run's MFU is stated against: the
    catalog's dense peak of ``precision``, or for FP8 the BF16 one, with the FP8 peak beside it."""
    model_name, found = identify_device(backend, catalog)
    entry = found.entry
    basis_precision = peak_precision(precision)
    peak, reason, basis = device_peak(backend, entry, basis_precision, found.why)
    figure = entry.peak_flops.get(basis_precision) if entry and peak else None
    ceiling, ceiling_reason = measured_ceiling(backend, model_name, precision)
    device = Device(
        backend=backend.name,
        dist_backend=backend.dist_backend,
        device_model=model_name,
        device_count=backend.device_count(),
        torch_device=str(backend.torch_device),
        simulated=backend.simulated,
        catalog_entry=entry.name if entry else None,
        catalog_path=entry.path if entry else None,
        catalog_match=found.why,
        peak_flops=peak,
        peak_flops_precision=basis_precision,
        peak_flops_unmeasured=reason,
        peak_flops_source=figure.source if figure else None,
        peak_flops_read=figure.read if figure else None,
        peak_flops_listed_with_sparsity=figure.sparsity if figure else None,
        peak_flops_basis=basis,
        measured_ceiling=ceiling,
        measured_ceiling_unmeasured=ceiling_reason,
        memory_capacity_bytes=capacity_bytes(backend, entry),
        tdp_watts=entry.tdp_watts if entry else None,
        **{
            name: getattr(entry, name) if entry else None
            for name in ("price_usd_per_hour", "price_source", "price_date")
        },
        tuning=backend.tuning,
        auto_passed_over=list(backend.passed_over) or None,
        **backend.device_identity(),
    )
    if precision == FP8:  # other runs leave the FP8 fields out of the file
        _set_fp8_peak(device, backend, entry, found.why)
    return device


def _set_fp8_peak(device: Device, backend: Backend, entry: DeviceModel | None, why_no_entry: str) -> None:
    """An FP8 run's device fields: whether FP8 ran emulated, and the FP8 dense peak beside the BF16
    one its MFU is stated against (metrics.mfu_fp8_peak)."""
    device.fp8_peak_flops, device.fp8_peak_flops_unmeasured, device.fp8_peak_flops_basis = device_peak(
        backend, entry, FP8, why_no_entry)
    device.fp8_emulated = backend.fp8_emulation()


def measured_ceiling(backend: Backend, model_name: str, precision: str) -> tuple[MeasuredCeiling | None, str | None]:
    """(the GEMM rate `hwbench calibrate` measured on this device model under this driver for
    ``precision``, with when, how and where it was stored; None and the reason). Read when the
    result is assembled, so the result carries the ceiling it was compared with."""
    if backend.simulated:
        return None, "the device is simulated: there is no ceiling to compare host-CPU work with"
    if precision == FP8:
        return None, ("no measured FP8 ceiling: the calibration measures fp32, bf16 and fp16 GEMMs, and an FP8 run is "
                      "not held to the 16-bit one its FP8 GEMMs may exceed")
    driver, problem = backend.driver()
    try:
        path = default_store_path()
    except (RuntimeError, KeyError) as error:  # no $HOME and no password entry to find it from
        return None, f"calibration store unreadable: its default path cannot be found ({error})"
    ceiling, reason = lookup_ceiling(path, backend.name, model_name, driver, problem, precision)
    return (None if ceiling is None else MeasuredCeiling.model_validate(ceiling)), reason


def describe_workload(workload: Workload, spec: RunSpec) -> WorkloadDescription:
    config = spec.model_config(workload.model)  # --max-positions changes the position embedding
    counts = count_parameters(config, spec.parallel.tp)
    return WorkloadDescription.model_validate(
        {
            "name": workload.name,
            "title": workload.title,
            "catalog_path": workload.path,
            **dataclasses.asdict(config),
            "padded_vocab_size": config.padded_vocab_size(spec.parallel.tp),
            "parameters": counts.total,
            "parameters_embedding": counts.embedding,
            "parameters_non_embedding": counts.non_embedding,
            "parameters_active": counts.active,
            "published": workload.published.model_dump() if workload.published else None,
        }
    )
