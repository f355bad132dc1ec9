"""What DeepSpeed needs from the device layer before it is imported.

DeepSpeed picks its accelerator once, at import (``DS_ACCELERATOR`` overrides
its own detection), and older releases and Ascend's adaptor (``deepspeed_npu``)
import ``torch._six``, which PyTorch 2 removed. So the
patches go in before ``import deepspeed``, and each one is recorded for the
result, so a reader knows what the run changed.
"""

from __future__ import annotations

import collections.abc
import importlib
import importlib.metadata
import importlib.util
import math
import os
import re
import sys
import types
from typing import Any

from hwbench.errors import SetupError

ACCELERATOR_ENV = "DS_ACCELERATOR"
NOT_INSTALLED = ("--engine deepspeed: deepspeed is not installed (pip install 'hwbench[deepspeed]', "
                 "on Ascend too: DeepSpeed >= 0.9.3 has its own NPU accelerator)")

# The records of the first successful call: DeepSpeed is imported once per process,
# so later calls change nothing and report what the first one did.
_records: list[dict[str, Any]] | None = None


def prepare_deepspeed(backend: Any) -> list[dict[str, Any]]:
    """Patch this process for DeepSpeed on ``backend`` and import it.

    Sets DS_ACCELERATOR (unless the user did), installs a ``torch._six`` shim
    when torch lacks it, on an NPU imports ``deepspeed_npu`` only under a
    DeepSpeed without its own NPU accelerator (npu_adaptor_decision), then
    imports deepspeed. Returns one record per patch (``patch``,
    ``applied``, ``why``, sometimes ``value``); idempotent. Raises SetupError
    when deepspeed is missing or cannot be imported."""
    global _records
    if _records is not None:
        return _records
    records = [_set_accelerator(backend), _install_torch_six_shim()]
    if backend.name == "npu":
        records.append(_import_npu_adaptor(backend))
    records.append(_import_deepspeed())
    if os.environ[ACCELERATOR_ENV] == "cpu":  # only DeepSpeed's CPU accelerator builds the op
        records.append(_skip_inference_shm_op())
    _records = records
    return records


def _set_accelerator(backend: Any) -> dict[str, Any]:
    user_value = os.environ.get(ACCELERATOR_ENV)
    if user_value:
        return {"patch": ACCELERATOR_ENV, "applied": False, "value": user_value,
                "why": f"kept the user's {ACCELERATOR_ENV}={user_value}"}
    value, why = backend.deepspeed_accelerator, f"the {backend.name} backend's DeepSpeed accelerator"
    if getattr(backend, "simulated", False):
        # A stand-in computes on the host: DeepSpeed's device accelerator would call into
        # the vendor runtime (CANN, HIP, the Gaudi bridge), which is not there.
        value, why = "cpu", f"simulated {backend.name} (a stand-in computing on the host CPU): DeepSpeed runs on cpu"
    os.environ[ACCELERATOR_ENV] = value
    return {"patch": ACCELERATOR_ENV, "applied": True, "value": value, "why": why}


def torch_six_shim() -> types.ModuleType:
    """A stand-in for ``torch._six`` with the names DeepSpeed 0.6 and the Ascend
    adaptor import from it."""
    module = types.ModuleType("torch._six")
    module.__dict__.update(inf=math.inf, nan=math.nan, string_classes=(str, bytes), int_classes=int,
                           container_abcs=collections.abc)
    return module


def _install_torch_six_shim() -> dict[str, Any]:
    patch = "torch._six shim"
    try:
        importlib.import_module("torch._six")
        return {"patch": patch, "applied": False, "why": "torch provides torch._six"}
    except ImportError:
        pass
    import torch

    shim = torch_six_shim()
    sys.modules["torch._six"] = shim
    torch._six = shim  # type: ignore[attr-defined]  # `import torch._six as x` reads the attribute of the parent package
    return {"patch": patch, "applied": True,
            "why": "PyTorch 2 removed torch._six; DeepSpeed 0.6-era releases and deepspeed_npu import inf from it"}


# DeepSpeed has had its own NPU accelerator since 0.9.3 (its release notes). Ascend's
# adaptor pins one DeepSpeed release (its branches v0.6.0 and v0.9.2: "目前仅支持 deepspeed
# 版本 0.9.2") and its README now says DeepSpeed supports NPUs natively, to uninstall
# deepspeed_npu and install the newest DeepSpeed. So the adaptor is loaded only under a
# DeepSpeed older than its own NPU accelerator; with the DeepSpeed hwbench asks for
# (>= 0.14) it never is, even when installed: its patches target 0.9.2's code.
NATIVE_NPU_DEEPSPEED = (0, 9, 3)
ADAPTOR_DEEPSPEED_RELEASES = ("0.6.0", "0.9.2")


def _installed_deepspeed_version() -> str | None:
    """The installed deepspeed's version from its metadata, without importing it
    (the import picks the accelerator, so it must come after the patches)."""
    try:
        return importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def npu_adaptor_decision(deepspeed_version: str | None, found: bool) -> tuple[bool, str]:
    """Whether to import deepspeed_npu under this DeepSpeed, and why."""
    if deepspeed_version is None:
        return False, "deepspeed is not installed"
    if _release(deepspeed_version) >= NATIVE_NPU_DEEPSPEED:
        return False, (f"DeepSpeed {deepspeed_version} has its own NPU accelerator (since 0.9.3); "
                       f"deepspeed_npu patches only DeepSpeed {' and '.join(ADAPTOR_DEEPSPEED_RELEASES)}"
                       + (" and is left unloaded" if found else ""))
    if not found:
        return False, (f"DeepSpeed {deepspeed_version} predates its NPU accelerator and deepspeed_npu "
                       "is not installed")
    return True, f"DeepSpeed {deepspeed_version} predates its NPU accelerator: Ascend's adaptor patches it"


def _import_npu_adaptor(backend: Any) -> dict[str, Any]:
    patch = "deepspeed_npu"
    found = importlib.util.find_spec("deepspeed_npu") is not None
    if getattr(backend, "simulated", False):
        return {"patch": patch, "applied": False, "found": found,
                "why": "simulated NPU: the adaptor patches DeepSpeed for real NPUs only"}
    version = _installed_deepspeed_version()
    load, why = npu_adaptor_decision(version, found)
    record = {"patch": patch, "applied": load, "found": found, "deepspeed_version": version, "why": why}
    if not load:
        return record
    try:
        importlib.import_module("deepspeed_npu")
    except Exception as error:  # the adaptor patches DeepSpeed at import; any failure leaves it half-patched
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise SetupError(f"--engine deepspeed: deepspeed_npu cannot be imported under DeepSpeed {version}: "
                         f"{type(error).__name__}: {first_line} (or pip install 'deepspeed>=0.14', "
                         "which needs no adaptor)") from None
    return record


def _import_deepspeed() -> dict[str, Any]:
    try:
        deepspeed = importlib.import_module("deepspeed")
    except ImportError as error:
        if error.name == "deepspeed" or not error.name:
            raise SetupError(NOT_INSTALLED) from None
        raise SetupError(f"--engine deepspeed: deepspeed cannot import {error.name}: {error}") from None
    version = getattr(deepspeed, "__version__", None)
    return {"patch": "import deepspeed", "applied": True, "version": version,
            "why": "imported after the patches above"}


def _skip_inference_shm_op() -> dict[str, Any]:
    """DeepSpeed's communication backend builds a shared-memory all-reduce op with the C++
    compiler when it starts on its CPU accelerator (a minute of gcc on a cold cache, and no
    run at all without a compiler); the op serves ``inference_all_reduce`` only, which
    training never calls: its all-reduce is torch.distributed's (deepspeed/comm/torch.py)."""
    patch = "deepspeed.comm.torch.build_shm_op"
    try:
        comm = importlib.import_module("deepspeed.comm.torch")
    except ImportError as error:
        return {"patch": patch, "applied": False, "why": f"deepspeed.comm.torch cannot be imported: {error}"}
    if not hasattr(comm, "build_shm_op"):
        return {"patch": patch, "applied": False, "why": "this DeepSpeed builds no shared-memory op"}
    setattr(comm, "build_shm_op", lambda: None)  # noqa: B010  (a module mypy reads without the attribute)
    return {"patch": patch, "applied": True,
            "why": "its shared-memory op serves inference all-reduce only; building it took a minute of gcc"}


def deepspeed_version() -> str | None:
    """The version of the deepspeed prepare_deepspeed imported, or None before it."""
    for record in _records or []:
        if record["patch"] == "import deepspeed":
            return record.get("version")
    return None
