"""The registry of device kinds: everything hwbench knows of each kind (cpu, cuda, rocm, npu,
hpu) without touching the device, one typed entry per kind in ``KINDS``. The backends, --device
auto, preflight, calibration, the catalog, the planner, Slurm and Kubernetes read it; none keeps
its own table of kinds. Commands that plan for another machine (`hwbench plan` for an H100 from
a laptop, `hwbench k8s` for a cluster) need these facts, so importing this module imports no
torch: a kind's Backend class and preflight reader are named here and imported when used.

Adding a device kind: its entry here, its backend and telemetry modules, a catalog YAML and its
stand-in (docs/devices.md).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import MutableMapping
from typing import Any

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
class CalibrationDefaults:
    """What `hwbench calibrate` measures on a kind unless told otherwise, the probe's smaller
    measurement before a run, and the rates a measured ceiling may plausibly have."""

    sizes: tuple[int, ...]  # square GEMM sizes (--sizes)
    precisions: tuple[str, ...]  # --precisions, less those the device lacks
    copy_bytes: int  # the copy measuring bandwidth (--copy-size)
    # The dense GEMM rates one device of a kind can plausibly reach, in the precisions the store
    # keeps (fp32, bf16, fp16): (lowest, highest) FLOP/s. A stored ceiling outside them is no
    # measurement of one device: a corrupted or hand-edited store, or a measurement that went wrong,
    # and an MFU against it would be enormous (too low) or ~0 (too high) instead of null.
    # - highest, accelerators: the fastest accelerator announced today reaches about 2.5e15 dense
    #   bf16/fp16 FLOP/s (B200/MI355X class; fp32 far less); 1e17 leaves a 40x margin for devices to come.
    # - highest, CPU: a two-socket server of today's largest AMX CPUs (2 x 128 cores, 2,048 bf16
    #   FLOP per core and cycle at about 2 GHz) reaches about 1e15; 1e16 leaves a 10x margin.
    # - lowest, accelerators: the slowest CUDA device torch still builds for (a Jetson Nano, 0.24
    #   TFLOP/s fp32) and every Ascend, Instinct and Gaudi device reach more than 1e11; 1e10 is 20x below.
    # - lowest, CPU: bf16 without native support, emulated on this project's busy 2-vCPU machine,
    #   still reached 4e8 FLOP/s at n=512, and fp32 there 1.4e10; 1e7 is 40x below the slowest.
    plausible_flops: tuple[float, float]
    probe_gemm_size: int  # the device probe's GEMM (acceptance/device_probe.py)
    probe_copy_bytes: int  # the device probe's copy


# Calibration defaults: the CPU's sizes finish in seconds on a laptop; the accelerators share
# the GPU's (a GEMM of 4096 and more reaches the matrix units' rate, a 1 GiB copy the memory's).
_CPU_CALIBRATION = CalibrationDefaults(sizes=(512, 1024, 2048), precisions=("fp32", "bf16"), copy_bytes=256 * 2**20,
                                       plausible_flops=(1e7, 1e16), probe_gemm_size=512, probe_copy_bytes=64 * 2**20)
_ACCELERATOR_CALIBRATION = CalibrationDefaults(sizes=(4096, 8192, 16384), precisions=("fp32", "bf16", "fp16"),
                                               copy_bytes=2**30, plausible_flops=(1e10, 1e17), probe_gemm_size=8192,
                                               probe_copy_bytes=2**30)
_COMMUNICATION = ("NCCL_", "TORCH_NCCL_", "HCCL_")


@dataclasses.dataclass(frozen=True)
class PreflightReader:
    """How `hwbench preflight` reads a kind's devices without torch (device/health.py says why)."""

    source: str  # the tool or library read, as the report names it
    reader: str  # "module:function", called with the environment: (list of DeviceHealth, why none)


@dataclasses.dataclass(frozen=True)
class DeviceKind:
    name: str  # --device; the catalog's backend field
    backend_class: str  # "module:Class" of its Backend, imported only when the kind is used (it imports torch)
    auto_order: int  # --device auto tries the kinds in this order, lowest first; the last (the CPU) needs nothing
    preflight: PreflightReader
    dist_backend: str  # torch.distributed backend
    deepspeed_accelerator: str  # DS_ACCELERATOR
    # Memory the framework and runtime take beside the model's tensors (CUDA context and
    # allocator fragmentation, CANN's workspace, the CPU allocator's arenas): the planner's
    # per-rank overhead. An estimate until measured on each kind (docs/planner.md).
    framework_overhead_bytes: int
    # torch has a fused AdamW kernel here (CPU since torch 2.4, CUDA); elsewhere AdamW runs
    # foreach, whose sqrt(v) temporaries the planner counts at the step.
    fused_adamw: bool
    # torch.nn.RMSNorm runs a fused kernel here that keeps only its input and the per-token
    # rstd for the backward (aten's _fused_rms_norm: CUDA and ROCm builds); elsewhere torch's
    # composite keeps the fp32 input and the normalised output too (the CPU: measured,
    # tests/test_planner.py). Kinds not yet checked on the device say False: the larger figure.
    fused_rms_norm: bool = False
    calibration: CalibrationDefaults = _ACCELERATOR_CALIBRATION
    k8s_resource: str | None = None  # the extended resource a pod requests per device
    # environment variables that tune this kind's collectives and runtime
    env_prefixes: tuple[str, ...] = _COMMUNICATION
    # Slurm's generic resource for this kind (sbatch --gres=NAME:COUNT); None where sites name
    # it their own way (Ascend: give it with --sbatch-arg) or there is none (CPU)
    slurm_gres: str | None = None
    allocator: AllocatorSetting | None = None  # set before the device is initialised, unless the user set it
    # set in each pod by the operator or the device plugin: never copied from the launching shell, refused in --env
    device_plugin_env: tuple[str, ...] = ()


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
# The order of the kinds is the order --device's choices, the catalog's backends and the pods'
# devices are named in; --device auto's order is each entry's auto_order.
KINDS = {
    "cpu": DeviceKind(
        "cpu",
        "hwbench.device.cpu:CpuBackend",
        auto_order=5,
        preflight=PreflightReader("/proc, /sys", "hwbench.device.health:cpu_readings"),
        calibration=_CPU_CALIBRATION,
        dist_backend="gloo",
        deepspeed_accelerator="cpu",
        framework_overhead_bytes=GIB // 2,
        fused_adamw=True,
    ),
    "cuda": DeviceKind(
        "cuda",
        "hwbench.device.cuda:CudaBackend",
        auto_order=2,
        preflight=PreflightReader("nvml", "hwbench.device.nvml:nvml_health"),
        dist_backend="nccl",
        deepspeed_accelerator="cuda",
        framework_overhead_bytes=1 * GIB,
        k8s_resource="nvidia.com/gpu",
        fused_adamw=True,
        fused_rms_norm=True,
        slurm_gres="gpu",
        allocator=_CUDA_EXPANDABLE_SEGMENTS,
        device_plugin_env=("CUDA_VISIBLE_DEVICES",),
    ),
    # AMD GPUs through PyTorch's ROCm build: torch.cuda, RCCL under the nccl name, DeepSpeed's CUDA
    # accelerator (it serves ROCm builds too); the overhead is CUDA's estimate until measured
    "rocm": DeviceKind(
        "rocm",
        "hwbench.device.rocm:RocmBackend",
        auto_order=3,
        preflight=PreflightReader("amdsmi", "hwbench.device.amd_smi:amdsmi_health"),
        dist_backend="nccl",
        deepspeed_accelerator="cuda",
        framework_overhead_bytes=1 * GIB,
        k8s_resource="amd.com/gpu",
        env_prefixes=(*_COMMUNICATION, "RCCL_", "HIP_", "ROCR_", "HSA_"),
        fused_adamw=True,
        fused_rms_norm=True,
        slurm_gres="gpu",
    ),
    # Ascend through torch_npu; auto tries it first
    "npu": DeviceKind(
        "npu",
        "hwbench.device.npu:NpuBackend",
        auto_order=1,
        preflight=PreflightReader("npu-smi", "hwbench.device.npu_smi:npu_smi_health"),
        dist_backend="hccl",
        deepspeed_accelerator="npu",
        framework_overhead_bytes=2 * GIB,
        k8s_resource="huawei.com/Ascend910",
        env_prefixes=(*_COMMUNICATION, "ASCEND_"),
        fused_adamw=False,
        device_plugin_env=("ASCEND_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"),
    ),
    # Intel Gaudi through habana_frameworks.torch; the overhead is the NPU's estimate until measured
    "hpu": DeviceKind(
        "hpu",
        "hwbench.device.hpu:HpuBackend",
        auto_order=4,
        preflight=PreflightReader("hlml", "hwbench.device.hlml:hlml_health"),
        dist_backend="hccl",
        deepspeed_accelerator="hpu",
        framework_overhead_bytes=2 * GIB,
        k8s_resource="habana.ai/gaudi",
        env_prefixes=(*_COMMUNICATION, "HABANA_", "PT_HPU_", "HLS_"),
        fused_adamw=False,
    ),
}
DEVICE_KINDS = tuple(KINDS)
DEVICE_CHOICES = ("auto", *DEVICE_KINDS)
AUTO_ORDER = tuple(sorted(DEVICE_KINDS, key=lambda name: KINDS[name].auto_order))  # npu, cuda, rocm, hpu, cpu
FALLBACK_KIND = AUTO_ORDER[-1]  # what auto uses when no accelerator can be: the CPU, which needs nothing


def import_named(target: str) -> Any:
    """The object a registry entry names as "module:attribute" (a Backend class, a preflight
    reader), imported now: the modules import torch or a vendor library, so only when used."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
