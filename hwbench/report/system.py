"""An MLPerf Training style system description, from what a result recorded.

``system_description(result)`` fills the fields of MLPerf's system description JSON
(without the submitter fields) from the result's `environment`, `device`, `nodes`,
`launch` and `spec.launch` only: nothing is probed on the machine that reads the file.
A field the result does not record is null. The accelerator interconnect comes from
the device catalog entry the result names (`device.catalog_entry`), else null.

``hwbench system RESULT_FILE [--out FILE]`` prints it as JSON (docs/compare.md).
"""

from __future__ import annotations

from typing import Any

from hwbench.results import RunResult
from hwbench.units import gib


def _bytes(value: Any) -> str | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        return None
    return gib(value, 1, unit=True)


def _interconnect(entry: str | None) -> str | None:
    if not entry:
        return None
    try:
        from hwbench.catalog import load_catalog

        device = load_catalog().devices.get(entry)
    except Exception:  # a catalog that cannot be read leaves the field unknown
        return None
    return device.interconnect if device else None


def system_description(source: RunResult | dict[str, Any]) -> dict[str, Any]:
    """MLPerf-style fields from a RunResult, a result's dict, or an environment dict."""
    if isinstance(source, RunResult):
        data = source.to_dict()
    elif isinstance(source, dict) and ("spec" in source or "environment" in source):
        data = source
    elif isinstance(source, dict):
        data = {"environment": source}  # a bare environment fingerprint
    else:
        raise TypeError(f"expected a RunResult or a dict, got {type(source).__name__}")
    env = data.get("environment") or {}
    device = data.get("device") or {}
    launch = data.get("launch") or {}
    spec_launch = (data.get("spec") or {}).get("launch") or {}
    nodes = data.get("nodes") or []
    backend = device.get("backend") or env.get("backend")
    device_model = device.get("device_model") or ((env.get("device_models") or [None])[0])
    on_cpu = backend == "cpu"

    nnodes = launch.get("nnodes") or spec_launch.get("nnodes") or (len(nodes) if nodes else None)
    per_node = launch.get("nproc_per_node") or spec_launch.get("nproc_per_node")
    accelerators = 0 if on_cpu else per_node
    framework = []
    if env.get("torch_version"):
        framework.append(f"PyTorch {env['torch_version']}")
    if env.get("torch_npu_version"):
        framework.append(f"torch_npu {env['torch_npu_version']}")
    if env.get("deepspeed_version"):
        framework.append(f"DeepSpeed {env['deepspeed_version']}")
    git = env.get("hwbench_git") or {}
    name = None
    if nnodes and (accelerators or on_cpu) and device_model:
        name = f"{nnodes}x{accelerators} {device_model}" if not on_cpu else f"{nnodes}x {device_model} (CPU only)"
    return {
        "system_name": name,
        "system_type": "simulated" if (device.get("simulated") or env.get("simulated")) else None,
        "number_of_nodes": nnodes,
        "host_processor_model_name": device_model if on_cpu else None,  # recorded only when the CPU is the device
        "host_processors_per_node": None,  # not recorded in a result
        "host_processor_core_count": env.get("cpu_cores_usable") if on_cpu else None,
        "host_memory_capacity": _bytes(device.get("memory_capacity_bytes")) if on_cpu else None,
        "accelerator_model_name": None if on_cpu else device_model,
        "accelerators_per_node": accelerators,
        "accelerator_memory_capacity": None if on_cpu else _bytes(device.get("memory_capacity_bytes")),
        "accelerator_interconnect": _interconnect(device.get("catalog_entry")),
        "accelerator_backend": backend,
        "framework": ", ".join(framework) or None,
        "operating_system": env.get("os"),
        "machine": env.get("machine"),
        "python_version": env.get("python"),
        "driver_version": env.get("driver_version"),
        "cuda_version": env.get("cuda_version"),
        "cudnn_version": env.get("cudnn_version"),
        "nccl_version": env.get("nccl_version"),
        "cann_version": env.get("cann_version"),
        "hccl_version": env.get("hccl_version"),
        "hwbench_version": env.get("hwbench_version") or data.get("hwbench_version"),
        "hwbench_git_commit": git.get("commit"),
        "hwbench_git_dirty": git.get("dirty"),
    }
