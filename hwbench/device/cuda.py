"""The CUDA backend (NVIDIA GPUs), with NVML telemetry."""

from __future__ import annotations

import os
from typing import Any

import torch

from hwbench.device.accelerator import AcceleratorBackend
from hwbench.device.kinds import KINDS
from hwbench.device.nvml import NvmlSampler, nvml_driver_version
from hwbench.device.telemetry import TelemetrySampler
from hwbench.errors import SetupError


def turn_tf32_off(backends: Any) -> str:
    """Make fp32 matmuls (cuBLAS) and cuDNN convolutions and RNNs use full fp32, through
    ``backends`` (the ``torch.backends`` namespace, a parameter so that tests need no GPU).
    Returns the API used: "fp32_precision" or "allow_tf32".

    torch 2.9 added the per-backend ``fp32_precision`` settings and deprecated the
    ``allow_tf32`` flags: setting a legacy flag warns there, and once the two APIs are mixed
    (a library using the new one, hwbench the old) reading a legacy flag raises. So the new
    API is used wherever it exists, the legacy flags only on older torch.
    """
    matmul, cudnn = backends.cuda.matmul, backends.cudnn
    if hasattr(matmul, "fp32_precision") and hasattr(cudnn, "conv"):
        matmul.fp32_precision = "ieee"
        cudnn.fp32_precision = "ieee"  # the parent of conv and rnn
        # Set one by one as well: a setting of conv or rnn overrides their parent's.
        cudnn.conv.fp32_precision = "ieee"
        cudnn.rnn.fp32_precision = "ieee"
        return "fp32_precision"
    matmul.allow_tf32 = False
    cudnn.allow_tf32 = False
    return "allow_tf32"


class CudaBackend(AcceleratorBackend):
    name = "cuda"
    dist_backend = KINDS["cuda"].dist_backend
    deepspeed_accelerator = KINDS["cuda"].deepspeed_accelerator

    def __init__(self) -> None:
        if torch.version.cuda is None:
            raise SetupError(
                f"--device cuda: this torch build ({torch.__version__}) has no CUDA support; "
                "install a CUDA build of torch (README, 'On a GPU machine')"
            )
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            raise SetupError(
                "--device cuda: torch sees no CUDA device; check nvidia-smi, the driver "
                "and CUDA_VISIBLE_DEVICES"
            )
        super().__init__(torch.cuda)

    @staticmethod
    def installed() -> bool:
        """A CUDA build of torch on a machine with the NVIDIA driver loaded: a GPU machine."""
        return torch.version.cuda is not None and os.path.exists("/proc/driver/nvidia/version")

    @staticmethod
    def unavailable_reason() -> str | None:
        """None when torch sees a CUDA device; otherwise why not."""
        if torch.version.cuda is None:
            return f"this torch build ({torch.__version__}) has no CUDA support"
        try:
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                return None
        except Exception as error:  # a broken driver raises from is_available on some versions
            return f"CUDA failed: {type(error).__name__}: {error}"
        return "torch sees no CUDA device (check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES)"

    def prepare_process(self, local_rank: int = 0, local_world_size: int = 1,
                        threads: int | None = None) -> torch.device:
        device = super().prepare_process(local_rank, local_world_size, threads)
        # fp32 runs are measured against the non-tensor fp32 peak: keep TF32 off. The API used
        # follows from the torch version the fingerprint records, so tuning does not repeat it.
        turn_tf32_off(torch.backends)
        self.tuning = {"tf32": False}
        return device

    def to_device(self, host_tensor: torch.Tensor) -> torch.Tensor:
        # From pageable memory the copy would block the host until the stream drains,
        # serialising host and GPU once per micro-batch; pinned memory (cached by
        # torch's host allocator) lets it queue like a kernel.
        return host_tensor.pin_memory().to(self.torch_device, non_blocking=True)

    def precision_problem(self, precision: str) -> str | None:
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            return "this GPU has no bf16 support (compute capability below 8.0); use --precision fp16"
        return None

    def telemetry_sampler(self, interval_s: float) -> TelemetrySampler:
        props = torch.cuda.get_device_properties(self.local_index)
        uuid = getattr(props, "uuid", None)
        return NvmlSampler([str(uuid)] if uuid is not None else [], [self.local_index], interval_s)

    def fingerprint(self) -> dict[str, Any]:
        count = self.device_count()
        props = [torch.cuda.get_device_properties(i) for i in range(count)]
        try:
            nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
        except Exception:
            nccl = None
        return {
            "device_models": self.device_names(),
            "device_count": count,
            "compute_capability": [f"{p.major}.{p.minor}" for p in props],
            "driver_version": nvml_driver_version(),
            "cuda_version": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version(),
            "nccl_version": nccl,
        }
