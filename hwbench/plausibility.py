"""Whether a run's throughput is physically possible: the one judge, called where MFU is
computed (hwbench.harness.merge).

The most frequent error in published training benchmarks is MFU against the wrong peak: a
device given another model's figure, a figure with sparsity taken for the dense one, a device
that is one die of a two-die module. Each shows as a throughput the device cannot reach. So a
run above its data sheet's dense peak, or above the GEMM rate `hwbench calibrate` measured on
it by more than that measurement's own spread, is marked invalid with the reason, and its MFU
is not given."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hwbench.result.model import Device


def implausible_throughput(achieved_flops: float, device: Device) -> str | None:
    """Why ``achieved_flops`` (model FLOP/s per device) cannot be right on ``device`` (the
    result's device section), or None when it can. An FP8 run (its device section has an FP8 peak
    or says why not) is held to the FP8 peak, which its FP8 GEMMs may approach, not the BF16 one
    its MFU is stated against; without an FP8 figure, to none."""
    fp8 = device.fp8_peak_flops is not None or device.fp8_peak_flops_unmeasured is not None
    peak, precision = (device.fp8_peak_flops, "fp8") if fp8 else (device.peak_flops, device.peak_flops_precision)
    if peak and achieved_flops > peak:
        return (f"{achieved_flops / 1e12:.4g} TFLOP/s per device is {achieved_flops / peak:.0%} of the data sheet's "
                f"dense {precision} peak ({peak / 1e12:.4g} TFLOP/s, "
                f"{device.catalog_entry}): more than the device can do, so the peak or the FLOP count is wrong")
    ceiling = device.measured_ceiling
    if ceiling is None or not ceiling.flops:
        return None
    flops, spread = ceiling.flops, ceiling.cv or 0.0
    if achieved_flops > flops * (1 + spread):
        return (f"{achieved_flops / 1e12:.4g} TFLOP/s per device is above the measured GEMM ceiling "
                f"({flops / 1e12:.4g} TFLOP/s, hwbench calibrate, {ceiling.measured_at}) by more than its "
                f"spread (CV {spread:.1%}): the ceiling is stale or the FLOP count is wrong; calibrate again")
    return None
