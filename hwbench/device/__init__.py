"""The device layer: the only part of hwbench that names a vendor.

``select_backend("auto" | "cpu" | "cuda" | "npu")`` returns a Backend; auto
prefers an NPU, then a CUDA GPU, then the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.errors import UsageError

if TYPE_CHECKING:
    from hwbench.device.base import Backend

_FROM_BASE = ("Backend", "MemoryStats", "PRECISION_DTYPES")


def __getattr__(name: str) -> Any:
    """Backend, MemoryStats and PRECISION_DTYPES come from device.base, which imports
    torch: only when asked for, so that commands that never touch a device start fast."""
    if name in _FROM_BASE:
        from hwbench.device import base

        return getattr(base, name)
    raise AttributeError(f"module 'hwbench.device' has no attribute {name!r}")


def select_backend(requested: str) -> "Backend":
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
