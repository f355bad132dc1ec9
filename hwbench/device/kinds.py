"""What hwbench knows of each device kind without touching the device: the facts that
commands planning for another machine need (`hwbench plan` for an H100 from a laptop,
`hwbench k8s` for a cluster). Importing this module imports no torch.

The Backend classes (cpu.py, cuda.py, npu.py, rocm.py, hpu.py) take their name and process-group
backend from here, so each fact is written once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping

GIB = 2 ** 30

# Exported beside a setting hwbench made, with the value it set: ranks that inherit the
# setting from hwbench's launcher record it as hwbench's, not the user's.
SET_BY_HWBENCH_PREFIX = "HWBENCH_SET_"


@dataclasses.dataclass(frozen=True)
class AllocatorSetting:
    """A setting of the device's caching allocator that hwbench makes through the environment,
    which the allocator reads once, when the device is initialised."""

    variable: str
    value: str
    user_variables: tuple[str, ...]  # the names a user may have set it under: then it is left alone
    why: str


def choose_allocator_setting(setting: AllocatorSetting, environ: MutableMapping[str, str],
                             device_initialised: bool) -> str:
    """Make ``setting`` in ``environ`` unless the user set one of its variables; the text the
    result's tuning records. Must run before the device is initialised."""
    marker = SET_BY_HWBENCH_PREFIX + setting.variable
    for name in setting.user_variables:
        value = environ.get(name, "")
        if value.strip() and not (name == setting.variable and environ.get(marker) == value):
            return f"{name}={value} (the user's, left as it is)"
    if device_initialised and environ.get(setting.variable) != setting.value:
        return (f"unchanged: the device was initialised before hwbench's backend, so {setting.variable} would not "
                "be read; the allocator's defaults")
    environ[setting.variable] = environ[marker] = setting.value
    return f"{setting.variable}={setting.value} (set by hwbench: {setting.why})"


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
    allocator: AllocatorSetting | None = None  # set before the device is initialised, unless the user set it


_COMMUNICATION = ("NCCL_", "TORCH_NCCL_", "HCCL_")
# torch reads PYTORCH_CUDA_ALLOC_CONF (and, since 2.9, PYTORCH_ALLOC_CONF) once, when CUDA is
# initialised; the older name is the one set, since torch 2.9.1 ignored expandable_segments given
# under the new one for CUDA (newer torch warns that the old name is deprecated, and honours it).
# Expandable segments let a segment grow in place rather than leave freed blocks of the wrong
# size behind, so a run near the card's capacity neither fails on fragmentation nor thrashes
# (free the cache, retry) (PyTorch's CUDA semantics notes, "Optimizing memory usage with
# PYTORCH_CUDA_ALLOC_CONF").
_CUDA_EXPANDABLE_SEGMENTS = AllocatorSetting("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True",
                                             ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"),
                                             "fewer out-of-memory failures and retries from fragmentation")
KINDS = {
    "cpu": DeviceKind("cpu", "gloo", "cpu", GIB // 2, None, _COMMUNICATION, fused_adamw=True),
    "cuda": DeviceKind(
        "cuda",
        "nccl",
        "cuda",
        1 * GIB,
        "nvidia.com/gpu",
        _COMMUNICATION,
        fused_adamw=True,
        slurm_gres="gpu",
        allocator=_CUDA_EXPANDABLE_SEGMENTS,
    ),
    "npu": DeviceKind(
        "npu", "hccl", "npu", 2 * GIB, "huawei.com/Ascend910", (*_COMMUNICATION, "ASCEND_"), fused_adamw=False
    ),
    # AMD GPUs through PyTorch's ROCm build: torch.cuda, RCCL under the nccl name, DeepSpeed's CUDA
    # accelerator (it serves ROCm builds too); the overhead is CUDA's estimate until measured
    "rocm": DeviceKind(
        "rocm",
        "nccl",
        "cuda",
        1 * GIB,
        "amd.com/gpu",
        (*_COMMUNICATION, "RCCL_", "HIP_", "ROCR_", "HSA_"),
        fused_adamw=True,
        slurm_gres="gpu",
    ),
    # Intel Gaudi through habana_frameworks.torch; the overhead is the NPU's estimate until measured
    "hpu": DeviceKind(
        "hpu",
        "hccl",
        "hpu",
        2 * GIB,
        "habana.ai/gaudi",
        (*_COMMUNICATION, "HABANA_", "PT_HPU_", "HLS_"),
        fused_adamw=False,
    ),
}
DEVICE_KINDS = tuple(KINDS)  # cpu, cuda, npu, rocm, hpu
DEVICE_CHOICES = ("auto", *DEVICE_KINDS)
