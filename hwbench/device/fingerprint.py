"""The environment fingerprint stored with every result: what would have to be
the same for two results to be comparable."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import hwbench

# Variables that change how collectives and runtimes behave: NCCL/RCCL and HCCL settings (their
# documentation), the devices a process sees (CUDA, HIP, ROCr, Ascend and Habana visibility lists),
# Gaudi's execution mode (PT_HPU_LAZY_MODE) and the allocators' settings.
# hwbench's own plumbing between its processes (a temporary folder, the sweep's
# point record, which the result holds as `sweep`): not part of the environment.
INTERNAL_ENV = ("HWBENCH_RUN_DIR", "HWBENCH_SWEEP", "HWBENCH_PARENT_PID")
RECORDED_ENV_PREFIXES = ("HWBENCH_", "NCCL_", "HCCL_", "TORCH_NCCL_", "ASCEND_", "CUDA_VISIBLE_DEVICES",
                         "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TASK_QUEUE_ENABLE", "DS_ACCELERATOR",
                         "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF", "RCCL_", "HIP_VISIBLE_DEVICES",
                         "ROCR_VISIBLE_DEVICES", "HSA_", "PYTORCH_HIP_ALLOC_CONF", "HABANA_", "PT_HPU_")


def package_version(name: str) -> str | None:
    """Installed version of a distribution, without importing it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def hwbench_git_commit() -> dict[str, Any]:
    """Commit and dirtiness of the hwbench checkout, when run from one."""
    source = Path(hwbench.__file__).resolve().parent.parent
    if not (source / ".git").exists():
        return {"commit": None, "dirty": None, "reason": "hwbench is not running from a git checkout"}
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=5, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=5, check=True).stdout
        return {"commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError) as error:
        return {"commit": None, "dirty": None, "reason": f"git failed: {error}"}


def environment_fingerprint(backend) -> dict[str, Any]:
    """Shared part plus the backend's vendor part (driver, runtime, devices)."""
    return {
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "hwbench_version": hwbench.__version__,
        "hwbench_git": hwbench_git_commit(),
        "torch_version": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "torch_npu_version": package_version("torch-npu") or package_version("torch_npu"),
        "deepspeed_version": package_version("deepspeed"),
        "numpy_version": package_version("numpy"),
        "backend": backend.name,
        "simulated": backend.simulated,
        "tuning": backend.tuning,
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(RECORDED_ENV_PREFIXES) and k not in INTERNAL_ENV},
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **backend.fingerprint(),
    }
