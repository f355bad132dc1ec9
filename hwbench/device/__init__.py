"""The device layer: the only part of hwbench that names a vendor.

``select_backend("auto" | "cpu" | "cuda" | "npu")`` returns a Backend; auto
prefers an NPU, then a CUDA GPU, then the CPU.
"""

from __future__ import annotations

from hwbench.device.base import PRECISION_DTYPES, Backend, MemoryStats
from hwbench.errors import UsageError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "npu")


def select_backend(requested: str) -> Backend:
    """The backend for ``--device``; SetupError when the machine lacks it."""
    if requested not in DEVICE_CHOICES:
        raise UsageError(f"--device {requested!r} is not known; accepted: {', '.join(DEVICE_CHOICES)}")
    if requested == "auto":
        requested = detect_device()
    if requested == "npu":
        from hwbench.device.npu import NpuBackend

        return NpuBackend()
    if requested == "cuda":
        from hwbench.device.cuda import CudaBackend

        return CudaBackend()
    from hwbench.device.cpu import CpuBackend

    return CpuBackend()


def detect_device() -> str:
    from hwbench.device.cuda import CudaBackend
    from hwbench.device.npu import NpuBackend

    if NpuBackend.available():
        return "npu"
    if CudaBackend.available():
        return "cuda"
    return "cpu"


__all__ = ["Backend", "DEVICE_CHOICES", "MemoryStats", "PRECISION_DTYPES", "detect_device", "select_backend"]
