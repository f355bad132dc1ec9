"""What hwbench knows of each device kind without touching the device: the facts that
commands planning for another machine need (`hwbench plan` for an H100 from a laptop,
`hwbench k8s` for a cluster). Importing this module imports no torch.

The Backend classes (cpu.py, cuda.py, npu.py, rocm.py, hpu.py) take their name and process-group
backend from here, so each fact is written once.
"""

from __future__ import annotations

import dataclasses

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class DeviceKind:
    name: str  # --device
    dist_backend: str  # torch.distributed backend
    deepspeed_accelerator: str  # DS_ACCELERATOR
    # Memory the framework and runtime take beside the model's tensors (CUDA context and
    # allocator fragmentation, CANN's workspace, the CPU allocator's arenas): the planner's
    # per-rank overhead. An estimate until measured on each kind (docs/planner.md).
    framework_overhead_bytes: int
    k8s_resource: str | None  # the extended resource a pod requests per device
    env_prefixes: tuple[str, ...]  # environment variables that tune this kind's collectives and runtime
    # torch has a fused AdamW kernel here (CPU since torch 2.4, CUDA); elsewhere AdamW runs
    # foreach, whose sqrt(v) temporaries the planner counts at the step.
    fused_adamw: bool
    # Slurm's generic resource for this kind (sbatch --gres=NAME:COUNT); None where sites name
    # it their own way (Ascend: give it with --sbatch-arg) or there is none (CPU)
    slurm_gres: str | None = None


_COMMUNICATION = ("NCCL_", "TORCH_NCCL_", "HCCL_")
KINDS = {
    "cpu": DeviceKind("cpu", "gloo", "cpu", GIB // 2, None, _COMMUNICATION, fused_adamw=True),
    "cuda": DeviceKind("cuda", "nccl", "cuda", 1 * GIB, "nvidia.com/gpu", _COMMUNICATION, fused_adamw=True,
                       slurm_gres="gpu"),
    "npu": DeviceKind("npu", "hccl", "npu", 2 * GIB, "huawei.com/Ascend910", (*_COMMUNICATION, "ASCEND_"),
                      fused_adamw=False),
    # AMD GPUs through PyTorch's ROCm build: torch.cuda, RCCL under the nccl name, DeepSpeed's CUDA
    # accelerator (it serves ROCm builds too); the overhead is CUDA's estimate until measured
    "rocm": DeviceKind("rocm", "nccl", "cuda", 1 * GIB, "amd.com/gpu", (*_COMMUNICATION, "RCCL_", "HIP_", "ROCR_", "HSA_"),
                       fused_adamw=True, slurm_gres="gpu"),
    # Intel Gaudi through habana_frameworks.torch; the overhead is the NPU's estimate until measured
    "hpu": DeviceKind("hpu", "hccl", "hpu", 2 * GIB, "habana.ai/gaudi", (*_COMMUNICATION, "HABANA_", "PT_HPU_", "HLS_"),
                      fused_adamw=False),
}
DEVICE_KINDS = tuple(KINDS)  # cpu, cuda, npu, rocm, hpu
DEVICE_CHOICES = ("auto", *DEVICE_KINDS)
