"""AMD Instinct GPUs through PyTorch's ROCm build, with AMD SMI telemetry.

A ROCm build of torch drives AMD GPUs through the torch.cuda API (``torch.version.hip`` set,
``torch.version.cuda`` None) and RCCL under the ``nccl`` process-group name, so this backend is
the CUDA backend where the two agree (events, memory statistics, sync counting, TF32 off) and
its own where ROCm differs: which build it needs, the device's identity (gfx architecture,
compute units), telemetry (AMD SMI), the driver and the fingerprint (ROCm, HIP, RCCL).

Without an AMD GPU it is exercised through a stand-in (tests/fakes/rocm) that makes a CPU
build of torch look like a ROCm build and marks ``torch.cuda.__hwbench_stand_in__``: results
are then simulated and computed on the host CPU."""

from __future__ import annotations

import os
from typing import Any

import torch

from hwbench.device.accelerator import AcceleratorBackend
from hwbench.device.amd_smi import AmdSmiSampler, amdgpu_driver_version
from hwbench.device.base import Backend
from hwbench.device.cuda import CudaBackend, nccl_version
from hwbench.device.kinds import KINDS
from hwbench.device.telemetry import TelemetrySampler
from hwbench.errors import SetupError

ROCM_WHEELS = "pip install torch --index-url https://download.pytorch.org/whl/rocm6.4"


def _gfx_arch(props: Any) -> str | None:
    """'gfx942' from HIP's gcnArchName ('gfx942:sramecc+:xnack-')."""
    name = getattr(props, "gcnArchName", None)
    return str(name).split(":")[0] if name else None


def _rocm_version() -> str | None:
    """ROCm's release from its install folder ($ROCM_PATH, else /opt/rocm): .info/version."""
    root = os.environ.get("ROCM_PATH", "/opt/rocm")
    try:
        return open(os.path.join(root, ".info", "version")).read().strip() or None
    except OSError:
        return None


class RocmBackend(CudaBackend):
    name = "rocm"
    dist_backend = KINDS["rocm"].dist_backend  # RCCL, under the nccl name
    deepspeed_accelerator = KINDS["rocm"].deepspeed_accelerator

    def __init__(self) -> None:
        problem = self.unavailable_reason()
        if problem:
            raise SetupError(f"--device rocm: {problem}")
        self.allocator_settings = self._choose_allocator_setting()  # none for ROCm: its allocator is not checked
        self._mark_stand_in(torch.cuda)
        AcceleratorBackend.__init__(self, torch.cuda)  # CudaBackend's checks are for CUDA builds

    @staticmethod
    def installed() -> bool:
        """A ROCm build of torch on a machine with the amdgpu driver loaded."""
        return torch.version.hip is not None and os.path.exists("/sys/module/amdgpu")

    @staticmethod
    def unavailable_reason() -> str | None:
        """None when a ROCm build of torch sees an AMD GPU; otherwise why not."""
        if torch.version.hip is None:
            kind = "is a CUDA build" if torch.version.cuda else "has no ROCm support"
            return (f"this torch build ({torch.__version__}) {kind} (torch.version.hip is None); install a ROCm "
                    f"build of torch ({ROCM_WHEELS})")
        try:
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                return None
        except Exception as error:
            return f"HIP failed: {type(error).__name__}: {error}"
        return "torch sees no AMD GPU (check amd-smi, the amdgpu driver and HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES)"

    def precision_problem(self, precision: str) -> str | None:
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            return f"this GPU ({self.gfx_arch()}) has no bf16 support; use --precision fp16"
        return None

    def slow_precision(self, precision: str) -> str | None:
        return None  # the CUDA backend's compute capabilities are NVIDIA's; AMD GPUs run fp16 in their matrix cores

    def fp8_units(self, block_scaled: bool) -> tuple[bool | None, str]:
        # FP8 matrix cores from CDNA 3 (gfx942: MI300X, MI325X); the MX formats from CDNA 4 (gfx950: MI355X)
        arch = self.gfx_arch()
        has = (arch == "gfx950") if block_scaled else arch in ("gfx942", "gfx950")
        kind = "MXFP8" if block_scaled else "FP8"
        return has, f"this GPU ({arch}) {'has' if has else 'has no'} {kind} matrix cores"

    def power_limit_watts(self) -> tuple[float | None, str]:
        return Backend.power_limit_watts(self)  # not NVML's: no AMD name is shared between models

    def other_processes(self) -> tuple[list[dict[str, Any]] | None, str | None]:
        return Backend.other_processes(self)  # not NVML's, which sees no AMD GPU

    def gfx_arch(self) -> str | None:
        return _gfx_arch(torch.cuda.get_device_properties(self.local_index))

    def device_identity(self) -> dict[str, Any]:
        return {"gfx_arch": self.gfx_arch()}

    def telemetry_sampler(self, interval_s: float) -> TelemetrySampler:
        bus = self.bus_id()
        sampler = AmdSmiSampler([bus] if bus else [], interval_s)
        if bus is None:
            sampler._reason = "HIP reports no PCI address for this GPU, so AMD SMI cannot find it"
        return sampler

    def driver(self) -> tuple[str | None, str | None]:
        if self.simulated:
            return None, "the device is simulated (a stand-in ROCm build on the host CPU)"
        version = amdgpu_driver_version(self.bus_id())
        if version is None:
            return None, "neither AMD SMI nor /sys/module/amdgpu/version names the amdgpu driver"
        return version, None

    def fingerprint(self) -> dict[str, Any]:
        count = self.device_count()
        props = [torch.cuda.get_device_properties(i) for i in range(count)]
        return {
            "device_models": self.device_names(),
            "device_count": count,
            "simulated": self.simulated,
            "gfx_arch": [_gfx_arch(p) for p in props],
            "compute_units": [getattr(p, "multi_processor_count", None) for p in props],
            "driver_version": self.driver()[0],
            "rocm_version": _rocm_version(),
            "hip_version": torch.version.hip,
            "rccl_version": nccl_version(),
        }
