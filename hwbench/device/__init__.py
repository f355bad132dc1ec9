"""The device layer: the only part of hwbench that names a vendor.

``select_backend("auto" | "cpu" | "cuda" | "rocm" | "npu" | "hpu")`` returns a Backend; auto
prefers an NPU, then a CUDA GPU, an AMD GPU (ROCm), a Gaudi (HPU), then the CPU (the registry's
order, device/kinds.py). An accelerator whose software is
installed but unusable (torch_npu without CANN sourced, a CUDA build of torch
whose driver sees no GPU) is passed over, and the Backend auto chose keeps the
reasons in ``passed_over``: the result records them and ``hwbench run`` prints
them, so a CPU figure is never taken for an accelerator's by mistake.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from hwbench.device.kinds import AUTO_ORDER, DEVICE_CHOICES, FALLBACK_KIND, KINDS, import_named
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


def select_backend(requested: str) -> Backend:
    """The backend for ``--device``; SetupError when the machine lacks it."""
    if requested not in DEVICE_CHOICES:
        raise UsageError(f"--device {requested!r} is not known; accepted: {', '.join(DEVICE_CHOICES)}")
    passed_over: tuple[str, ...] = ()
    if requested == "auto":
        requested, passed_over = detect_device_explained()
    backend: Backend = _backend_class(requested)()
    backend.passed_over = passed_over
    return backend


class AcceleratorClass(Protocol):
    """An accelerator backend's class: asked whether its software is installed and its device
    usable before an instance (which binds the device) is made."""

    def __call__(self) -> Backend: ...
    def installed(self) -> bool: ...
    def unavailable_reason(self) -> str | None: ...


def _accelerator_classes() -> dict[str, AcceleratorClass]:
    """The accelerator backends in --device auto's order (imported here: each imports torch)."""
    return {kind: _backend_class(kind) for kind in AUTO_ORDER if kind != FALLBACK_KIND}


def _backend_class(kind: str) -> Any:
    return import_named(KINDS[kind].backend_class)


def unavailable_reason(kind: str) -> str | None:
    """None when this machine can run on ``kind`` (a kind of DEVICE_CHOICES, not auto); otherwise
    why not, as select_backend would refuse it."""
    if kind == FALLBACK_KIND:  # the CPU needs nothing
        return None
    return _accelerator_classes()[kind].unavailable_reason()


def detect_device() -> str:
    """The device kind --device auto uses on this machine."""
    return detect_device_explained()[0]


def detect_device_explained() -> tuple[str, tuple[str, ...]]:
    """(the kind auto uses, why each accelerator whose software is installed was passed over)."""
    passed_over: list[str] = []
    for kind, backend in _accelerator_classes().items():
        reason = backend.unavailable_reason()
        if reason is None:
            return kind, tuple(passed_over)
        if backend.installed():
            passed_over.append(f"{kind}: {reason}")
    return FALLBACK_KIND, tuple(passed_over)


__all__ = ["DEVICE_CHOICES", "PRECISION_DTYPES", "Backend", "MemoryStats", "detect_device", "detect_device_explained",
           "select_backend", "unavailable_reason"]
