"""Every layout of N devices, resolved and planned: the one enumeration of `hwbench plan`,
hwbench.plan and `hwbench tune` (docs/planner.md). A layout is a tensor x pipeline x data
split (planner.layouts) run by a variant (planner.variants), resolved by build_run_spec as
`hwbench run` would (a refusal kept with its reason) and planned stage by stage. No torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from hwbench.arguments import Option
from hwbench.catalog import Catalog
from hwbench.device.kinds import DEVICE_KINDS
from hwbench.errors import UsageError
from hwbench.options import ENGINES, RUN_OPTIONS, RunOptions
from hwbench.planner import (
    DEFAULT_HEADROOM,
    OVERHEAD_BYTES,
    MemoryPlan,
    Variant,
    layouts,
    plan_for_all_stages,
    variants,
)
from hwbench.spec import RunSpec, build_run_spec, find_workload
from hwbench.units import parse_size

# A layout's ranks are one launch's (each_layout gives them as --nproc-per-node): more would be
# refused layout by layout, after enumerating the splits of a number that large for a minute.
MAX_DEVICES: int = RUN_OPTIONS["nproc_per_node"].maximum  # type: ignore[assignment]

# Options for one layout and variant: each mapping one candidate (tune's micro batches, recompute)
Settings = Callable[[int, int, int, Variant], Iterable[dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class PlannedLayout:
    """One layout and variant: its predicted memory for every pipeline stage, or why
    `hwbench run` would refuse it."""

    tp: int
    pp: int
    dp: int
    variant: str  # native, native fsdp, deepspeed zero0-3; native [fsdp] epN with expert parallelism
    stages: list[MemoryPlan]  # none when refused
    fits: bool | None  # every stage fits the device at the headroom; None: no capacity known, or refused
    spec: RunSpec | None = dataclasses.field(repr=False, compare=False)
    options: RunOptions = dataclasses.field(repr=False, compare=False)  # what resolved to ``spec``
    refused: str | None = None  # `hwbench run`'s one-line reason

    @property
    def name(self) -> str:
        return f"{self.tp}x{self.pp}x{self.dp}"

    @property
    def peak(self) -> MemoryPlan:
        """The stage with the largest prediction (the first on a tie), as planner.plan_memory."""
        return max(self.stages, key=lambda plan: (plan.total_bytes, -plan.stage))

    @property
    def peak_bytes(self) -> int:
        return self.peak.total_bytes


@dataclasses.dataclass(frozen=True)
class LayoutPlan:  # what `hwbench plan` shows: the device it planned for and every layout
    capacity_bytes: int
    device_kind: str
    headroom: float
    layouts: list[PlannedLayout]  # smallest peak first
    refused: list[PlannedLayout]


def plan_layouts(base: RunOptions, devices: Any, *, device_memory: Any = None, device_model: str | None = None,
                 device: str | None = None, headroom: Any = None, engines: Iterable[str] = ENGINES,
                 layout: tuple[int, int, int] | None = None) -> LayoutPlan:
    """`hwbench plan` and hwbench.plan, input checked as the command checks it: every layout
    of ``devices`` (or ``layout``, with the variant ``base`` names). One device's memory:
    ``device_memory`` (bytes, or "32GiB") or the catalog's ``device_model``; ``device``: the
    kind whose framework overhead is added (default: the device model's, else cuda)."""
    from hwbench.catalog import load_catalog

    catalog = load_catalog()
    find_workload(catalog, base.value("model"))  # every layout would be refused for it: said once
    capacity, kind = _device(device_memory, device_model, device, catalog)
    headroom = DEFAULT_HEADROOM if headroom is None else _HEADROOM.check(headroom)
    if layout:
        devices = layout[0] * layout[1] * layout[2]
        if devices > MAX_DEVICES:
            raise UsageError(f"--layout {'x'.join(map(str, layout))} has {devices} ranks; give at most {MAX_DEVICES}, "
                             "the ranks of one launch (--nproc-per-node)")
    else:
        devices = check_count("--devices", devices, maximum=MAX_DEVICES)
    # recompute given: as given; else each layout both without and with it (--layout: the workload's)
    both = None if layout or base.recompute is not None else _without_and_with_recompute
    found = each_layout(base, devices, kind, capacity, headroom, engines, catalog, only=layout, settings=both,
                        expert_parallel=True)
    return LayoutPlan(capacity, kind, headroom, sorted((f for f in found if not f.refused), key=lambda f: f.peak_bytes),
                      [f for f in found if f.refused])


def each_layout(base: RunOptions, devices: int, kind: str, capacity: int | None, headroom: float,
                engines: Iterable[str], catalog: Catalog, *, only: tuple[int, int, int] | None = None,
                settings: Settings | None = None, expert_parallel: bool = False) -> list[PlannedLayout]:
    """Every layout of ``devices`` with every variant of ``engines`` (or only the layout
    ``only``, with the variant of ``base``), each with every mapping ``settings`` gives,
    resolved and planned (or refused), in enumeration order. ``expert_parallel``: a mixture
    of experts' layouts with expert parallelism too (`hwbench plan`'s; `hwbench tune` does
    not try them yet)."""
    found: list[PlannedLayout] = []
    experts = find_workload(catalog, base.value("model")).model.num_experts if expert_parallel else None
    for tp, pp, dp in [only] if only else layouts(devices):
        for variant in [None] if only else variants(tp, pp, dp, tuple(engines), experts):
            for extra in settings(tp, pp, dp, variant) if settings and variant else [{}]:
                options = base.merged(**(variant.options() if variant else {}), **extra, nproc_per_node=devices,
                                      tp=tp, pp=pp, dp=dp)
                try:
                    spec = build_run_spec(options, catalog, check_paths=False)
                except UsageError as error:
                    found.append(PlannedLayout(tp, pp, dp, variant.name if variant else "", [], None, None, options,
                                               str(error)))
                    continue
                stages = plan_for_all_stages(spec, catalog.workloads[spec.model].model, kind)
                fit = None if capacity is None else all(stage.fits(capacity, headroom) for stage in stages)
                found.append(PlannedLayout(tp, pp, dp, Variant(spec.engine, spec.fsdp, spec.zero_stage,
                                                                   spec.parallel.ep).name,
                                           stages, fit, spec, options))
    return found


def _without_and_with_recompute(tp: int, pp: int, dp: int, variant: Variant) -> list[dict[str, Any]]:
    return [{"recompute": False}, {"recompute": True}]


def check_count(option: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    return Option(help="", name=option[2:].replace("-", "_"), type=int, minimum=minimum, maximum=maximum).check(value)


_BYTES = Option(help="", name="device_memory", type=int, minimum=1, accepts="a size such as 32GiB or a number of bytes")
_HEADROOM = Option(help="", name="headroom", type=float, valid=lambda value: 0 < value <= 1,
                   accepts="a fraction in (0, 1]")


def _device(memory: Any, model: str | None, kind: str | None, catalog: Catalog) -> tuple[int, str]:
    """(bytes of one device, the device kind for the framework overhead)."""
    if kind is not None and kind not in DEVICE_KINDS:
        raise UsageError(f"--device {kind!r} is not known; accepted: {', '.join(DEVICE_KINDS)}")
    if memory is not None:
        if isinstance(memory, str):
            return parse_size(memory, "--device-memory"), kind or "cuda"
        return _BYTES.check(memory), kind or "cuda"
    if model is None:
        raise UsageError("hwbench plan needs --device-memory SIZE (e.g. 32GiB) or --device-model NAME "
                         f"(accepted: {', '.join(sorted(catalog.devices))})")
    entry = catalog.devices.get(model)
    if entry is None:
        raise UsageError(f"--device-model {model!r} is not in the catalog; accepted: "
                         f"{', '.join(sorted(catalog.devices))}")
    if entry.memory_bytes is None:
        raise UsageError(f"--device-model {model} has no fixed memory in the catalog; give --device-memory SIZE")
    return entry.memory_bytes, kind or (entry.backend if entry.backend in OVERHEAD_BYTES else "cuda")
