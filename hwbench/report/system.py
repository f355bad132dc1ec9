"""An MLPerf Training style system description, from what a result recorded.

``system_description(result)`` fills the fields of MLPerf's system description JSON
(without the submitter fields) from the result's `environment`, `device`, `launch` and
`spec.launch` only: nothing is probed on the machine that reads the file.
A field the result does not record is null. The accelerator interconnect comes from
the device catalog entry the result names (`device.catalog_entry`), else null.

``hwbench system RESULT_FILE [--out FILE]`` prints it as JSON (docs/compare.md).
"""

from __future__ import annotations

from typing import Any

from hwbench.result.model import Environment, RunResult
from hwbench.units import gib


def _bytes(value: int | None) -> str | None:
    return gib(value, 1, unit=True) if value else None


def _interconnect(entry: str | None) -> str | None:
    if not entry:
        return None
    try:
        from hwbench.catalog import load_catalog

        device = load_catalog().devices.get(entry)
    except Exception:  # a catalog that cannot be read leaves the field unknown
        return None
    return device.interconnect if device else None


def system_description(source: RunResult | Environment | dict[str, Any]) -> dict[str, Any]:
    """MLPerf-style fields from a RunResult, a result's dict, or an environment (what an
    environment alone does not record, such as the nodes, is null)."""
    if isinstance(source, dict):
        source = (RunResult.from_dict(source) if "spec" in source or "environment" in source
                  else Environment.model_validate(source))
    if isinstance(source, RunResult):
        result, env = source, source.environment
    elif isinstance(source, Environment):
        result, env = None, source
    else:
        raise TypeError(f"expected a RunResult, an Environment or a dict, got {type(source).__name__}")
    device = result.device if result else None
    backend = result.backend if result else env.backend
    device_model = result.device_model if result else next(iter(env.device_models or []), None)
    memory = device.memory_capacity_bytes if device else None
    on_cpu = backend == "cpu"
    nnodes = per_node = None
    if result:
        nnodes = result.launch.nnodes or result.spec.launch.nnodes
        per_node = result.launch.nproc_per_node or result.spec.launch.nproc_per_node
    accelerators = 0 if on_cpu else per_node
    framework = [f"{name} {version}" for name, version in (("PyTorch", env.torch_version),
                                                             ("torch_npu", env.torch_npu_version),
                                                             ("DeepSpeed", env.deepspeed_version)) if version]
    git = env.hwbench_git
    name = None
    if nnodes and (accelerators or on_cpu) and device_model:
        name = f"{nnodes}x{accelerators} {device_model}" if not on_cpu else f"{nnodes}x {device_model} (CPU only)"
    return {
        "system_name": name,
        "system_type": "simulated" if ((device and device.simulated) or env.simulated) else None,
        "number_of_nodes": nnodes,
        "host_processor_model_name": device_model if on_cpu else None,  # recorded only when the CPU is the device
        "host_processors_per_node": None,  # not recorded in a result
        "host_processor_core_count": env.cpu_cores_usable if on_cpu else None,
        "host_memory_capacity": _bytes(memory) if on_cpu else None,
        "accelerator_model_name": None if on_cpu else device_model,
        "accelerators_per_node": accelerators,
        "accelerator_memory_capacity": None if on_cpu else _bytes(memory),
        "accelerator_interconnect": _interconnect(device.catalog_entry if device else None),
        "accelerator_backend": backend,
        "framework": ", ".join(framework) or None,
        "operating_system": env.os,
        "machine": env.machine,
        "python_version": env.python,
        # the software versions, under the environment's own names
        **{field: getattr(env, field) for field in ("driver_version", "cuda_version", "cudnn_version", "nccl_version",
                                                     "cann_version", "hccl_version")},
        "hwbench_version": env.hwbench_version or (result.hwbench_version if result else None),
        "hwbench_git_commit": git.commit if git else None,
        "hwbench_git_dirty": git.dirty if git else None,
    }
