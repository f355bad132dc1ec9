"""`--settings fast`: what fits and is fastest on the device at hand, beside the
workload's published settings (kept for comparison with the published tables).

build_run_spec (hwbench.spec) gives fast's device-independent values where the engine
and layout can run them: `--compile`, `--cross-entropy chunked`, `--fused-qkv`. This
module chooses the two that depend on the device's memory, with the memory planner
(hwbench.planner) against the memory per device:

    recompute   off when some micro batch fits without it, else on
    micro batch the largest that divides the global batch per data-parallel replica and
                fits (the global batch is kept, so fewer accumulation steps); with
                pipeline parallelism the micro batch is kept, since a larger one leaves
                fewer microbatches to fill the pipeline

An option the user gave is never changed. The memory per device is `--device-memory`,
else what the device reports, else its catalog entry's; the resolved values, the memory
planned for (spec.device_memory_bytes) and why (spec.settings_choice) are in the spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hwbench.catalog import Catalog
from hwbench.options import RunOptions
from hwbench.planner import DEFAULT_HEADROOM, plan_memory
from hwbench.spec import RunSpec
from hwbench.units import gib


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """The memory per device fast plans for: ``kind`` is the planner's device kind (cpu,
    cuda, npu), ``source`` where the figure comes from (or why there is none)."""

    kind: str
    capacity_bytes: int | None
    source: str


def given_options(options: RunOptions | Mapping[str, Any]) -> set[str]:
    """The names of the options the user gave (build_run_spec's input, either form)."""
    values = dataclasses.asdict(options) if isinstance(options, RunOptions) else dict(options)
    return {name for name, value in values.items() if value is not None}


def resolve_settings(spec: RunSpec, options: RunOptions | Mapping[str, Any], catalog: Catalog) -> RunSpec:
    """``spec`` as it runs: unchanged under the published settings; under fast, with the
    memory-dependent values chosen for this machine's device (--device-memory when given:
    then the device is not asked, as a rank of a launched job must not be)."""
    if spec.settings != "fast":
        return spec
    return choose_fast(spec, given_options(options), catalog, memory_of_device(spec, catalog))


def rank_options(options: RunOptions, spec: RunSpec) -> RunOptions:
    """The options every rank of a launched job runs with: under fast, the memory this
    process planned for as --device-memory, so each rank makes the same choice without
    asking its device before it is bound to it."""
    if spec.settings == "fast" and spec.device_memory_bytes is not None:
        return options.merged(device_memory=str(spec.device_memory_bytes))
    return options


def memory_of_device(spec: RunSpec, catalog: Catalog) -> DeviceMemory:
    from hwbench.device import detect_device, select_backend

    if spec.device_memory_bytes is not None:
        kind = detect_device() if spec.device == "auto" else spec.device
        return DeviceMemory(kind, spec.device_memory_bytes, "--device-memory")
    from hwbench.device_check import device_memory

    backend = select_backend(spec.device)
    capacity, source = device_memory(backend, catalog)
    return DeviceMemory(backend.name, capacity, source)


def choose_fast(spec: RunSpec, given: set[str], catalog: Catalog, memory: DeviceMemory) -> RunSpec:
    """The fast spec for ``memory``: recompute and micro batch chosen (unless in ``given``),
    settings_choice saying what and why. Torch-free: the planner predicts every candidate."""
    config = spec.model_config(catalog.workloads[spec.model].model)
    usable = None if memory.capacity_bytes is None else DEFAULT_HEADROOM * memory.capacity_bytes

    def planned(recompute: bool, micro: int) -> int:
        candidate = dataclasses.replace(spec, recompute=recompute, micro_batch_size=micro)
        return plan_memory(candidate, config, memory.kind).total_bytes

    recomputes = [spec.recompute] if "recompute" in given else [False, True]
    micros = _micro_candidates(spec, given)
    fitting = [] if usable is None else [(recompute, micro, peak) for recompute in recomputes for micro in micros
                                         if (peak := planned(recompute, micro)) <= usable]
    where = (f"fast for {memory.kind} with {gib(memory.capacity_bytes, 1, unit=True)} per device ({memory.source}), "
             f"{gib(usable, 1, unit=True)} usable at headroom {DEFAULT_HEADROOM:g}" if usable is not None else
             f"fast for {memory.kind}, memory per device unknown ({memory.source}; give --device-memory)")
    if fitting:
        recompute, micro, peak = fitting[0]  # recompute off first, then the largest micro batch
        memory_part = _memory_choice(spec, given, recompute, micro, peak, micros, planned)
    else:
        recompute, micro = spec.recompute, spec.micro_batch_size
        peak = planned(recompute, micro)
        reason = ("memory per device unknown" if usable is None else
                  "no candidate is predicted to fit")
        memory_part = (f"{reason}: recompute {_on(recompute)} and micro batch {micro} kept as given or published "
                       f"(planned {gib(peak, 1, unit=True)})")
    chosen = dataclasses.replace(spec, recompute=recompute, micro_batch_size=micro,
                                 device_memory_bytes=memory.capacity_bytes)
    text = "; ".join([where, memory_part, *_device_independent_parts(chosen, given)])
    return dataclasses.replace(chosen, settings_choice=text)


def _micro_candidates(spec: RunSpec, given: set[str]) -> list[int]:
    """Micro batches to try, largest first: the given or kept one, or every divisor of the
    per-replica batch (so the global batch stays what it is)."""
    if "micro_batch_size" in given or spec.parallel.pp > 1:
        return [spec.micro_batch_size]
    per_replica = spec.global_batch_size // spec.parallel.dp
    return [m for m in range(per_replica, 0, -1) if per_replica % m == 0]


def _memory_choice(spec: RunSpec, given: set[str], recompute: bool, micro: int, peak: int, micros: list[int],
                   planned) -> str:
    per_replica = spec.global_batch_size // spec.parallel.dp
    steps = per_replica // micro
    if "micro_batch_size" in given:
        micro_text = f"micro batch {micro} (given)"
    elif spec.parallel.pp > 1:
        micro_text = (f"micro batch {micro} (kept under pipeline parallelism: a larger one leaves fewer "
                      "microbatches to fill the pipeline)")
    else:
        micro_text = (f"micro batch {micro}, the largest that divides the {per_replica}-sample batch per replica "
                      "and fits")
        larger = [m for m in micros if m > micro]
        if larger:  # the next one up, to show how close it came
            micro_text += f" ({larger[-1]} would need {gib(planned(recompute, larger[-1]), 1, unit=True)})"
    micro_text += f": {steps} accumulation step{'s' if steps != 1 else ''}, planned {gib(peak, 1, unit=True)}"
    if "recompute" in given:
        recompute_text = f"recompute {_on(recompute)} (given)"
    elif recompute:
        recompute_text = f"recompute on (no micro batch fits without it: micro batch {micros[-1]} would need " \
                         f"{gib(planned(False, micros[-1]), 1, unit=True)})"
    else:
        recompute_text = "recompute off (it fits without)"
    return f"{recompute_text}; {micro_text}"


def _device_independent_parts(spec: RunSpec, given: set[str]) -> list[str]:
    """compile, cross-entropy and fused QKV: given, or fast's, or why fast could not."""
    parts = []
    for name, label, fast, why_not in _DEVICE_INDEPENDENT:
        value = getattr(spec, name)
        shown = value if isinstance(value, str) else _on(value)
        why = " (given)" if name in given else "" if value == fast else f" ({why_not.format(engine=spec.engine)})"
        parts.append(f"{label} {shown}{why}")
    return parts


# (option, its name in words, fast's value, why fast could not give it)
_DEVICE_INDEPENDENT = (
    ("compile", "torch.compile", True, "--engine {engine} does not compile"),
    ("cross_entropy", "cross-entropy", "chunked", "chunked runs on the native engine with --tp 1, and not with --fsdp "
                                                  "beside --pp"),
    ("fused_qkv", "fused QKV", True, "DeepSpeed's pipeline engine has separate projections"),
)


def _on(value: bool) -> str:
    return "on" if value else "off"
