"""Rank 0's view of a run: every rank's figures merged into one RunResult.

Global figures use the slowest rank, as the run itself does: step t of the
run takes as long as its slowest rank took for step t. The loss curve comes
from a rank of the last pipeline stage (its losses were already averaged over
the data-parallel ranks). Memory is the peak over ranks; every rank's own
figures stay in ``ranks``; the slowest rank is named as the straggler.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from typing import Any

from hwbench.catalog import Workload
from hwbench.device.base import HostSyncCount, MemoryStats, Placement
from hwbench.files import finite
from hwbench.harness.checkpointing import RankCheckpoints, merge_checkpoints
from hwbench.harness.goodput import goodput_figures, restart_time_before
from hwbench.harness.placement import cpu_list_text, host_placements, run_placement
from hwbench.harness.profile import PROFILER_WARMUP_STEPS
from hwbench.harness.routing import expert_parallel_figures, routing_summary, step_all_to_all_s, step_routing
from hwbench.harness.stand_in import STAND_IN_PRICE
from hwbench.plausibility import implausible_throughput
from hwbench.precision import FP8
from hwbench.result.breakdown import STRAGGLER_WAIT_SHARE, SUM_TOLERANCE, waiting_straggler
from hwbench.result.model import (
    Environment,
    FormulaFigures,
    Goodput,
    HostSyncs,
    Memory,
    Metrics,
    NodeSummary,
    Profile,
    RankPlacement,
    RankSummary,
    RunError,
    RunResult,
    SteadyState,
    Step,
    StepTime,
    Straggler,
    Telemetry,
    TelemetryDevice,
    TimeBreakdown,
    TimeToTarget,
    ValidationPoint,
    sum_known,
)
from hwbench.spec import RunSpec
from hwbench.stats import finite_or_none, steady_state, summarize
from hwbench.target import INIT_BOUND_S
from hwbench.workload.flops import (
    FLOPS_FORMULAS,
    flops_by_formula,
    flops_counts,
    shape_caveat,
    uncounted,
    work_formula,
)

NOISY_CV = 0.10  # step-time CV above which a result carries a warning
FEW_TIMED_STEPS = 10
STRAGGLER_RATIO = 1.05  # a rank this much slower than the median rank is named in the warnings


@dataclasses.dataclass
class RankReport:
    """One rank's figures, sent to rank 0 (torch.distributed.gather_object pickles it).
    Per-step lists are aligned: entry i is step i (warm-up included)."""

    rank: int
    step_times_s: list[float]  # timed steps only
    memory: MemoryStats
    local_rank: int = 0
    node_rank: int = 0
    host: str = ""
    pid: int = 0
    coordinates: dict[str, int] = dataclasses.field(default_factory=lambda: {"pp": 0, "dp": 0, "tp": 0})
    losses: list[float] = dataclasses.field(default_factory=list)  # averaged over the data-parallel ranks
    grad_norms: list[float] = dataclasses.field(default_factory=list)
    lrs: list[float] = dataclasses.field(default_factory=list)
    loss_scales: list[float | None] = dataclasses.field(default_factory=list)
    skipped: list[bool] = dataclasses.field(default_factory=list)
    wall_time_s: float = 0.0
    telemetry: Telemetry | None = None
    host_syncs: HostSyncCount | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    validation: list[ValidationPoint] = dataclasses.field(default_factory=list)
    environment: Environment = dataclasses.field(default_factory=Environment)
    placement: Placement | None = None
    init_s: float | None = None  # from run_point's start to the first training step
    phases_s: dict[str, float] | None = None  # PhaseClock.stop(): this rank's wall time per phase
    checkpoints: RankCheckpoints | None = None  # Checkpointer.describe(): saves, loads, restarts
    first_iteration: int = 0  # steps of the training before this run's first (a resumed run)
    # an MoE model's routing per step (warm-up included), MoE layer and expert, over the data-parallel
    # ranks: [assignments per expert..., dropped, mean load-balancing loss]; None for a dense model
    routing: list[list[list[float]]] | None = None
    # expert parallelism: this rank's seconds in the all-to-alls per step (warm-up included); None without
    all_to_all_s: list[float] | None = None
    profile: TimeBreakdown | None = None  # --profile: this rank's profiled steps (hwbench.harness.profile)


def _loss_rank(reports: list[RankReport], spec: RunSpec) -> RankReport:
    last_stage = spec.parallel.pp - 1
    return next(r for r in reports if r.coordinates["pp"] == last_stage)


def _peak(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def merge_memory(reports: list[RankReport]) -> Memory:
    """Peak over ranks of every byte count, the sum of every other count (allocator retries,
    OOMs); the rank that had the peak."""
    merged = dataclasses.asdict(reports[0].memory)
    for key, value in merged.items():
        values = [getattr(r.memory, key) for r in reports]
        if key.endswith("_bytes"):
            merged[key] = _peak(values)
        elif isinstance(value, int):
            merged[key] = sum(v or 0 for v in values)
    peak = merged["peak_allocated_bytes"]
    if peak is not None and len(reports) > 1:
        merged["peak_allocated_rank"] = next(r.rank for r in reports if r.memory.peak_allocated_bytes == peak)
    return Memory.model_validate(merged)


def device_key(host: str, device: TelemetryDevice) -> tuple:
    """What makes a sampled device the same one on every rank that samples it: its
    UUID (unique everywhere), else its PCI bus id and chip on its host (two chips of
    one card can share a bus id), else its name on its host (a CPU package, a chip
    without a bus id). The index is no identity: every accelerator rank samples its
    own device at index 0."""
    if device.uuid:
        return ("uuid", device.uuid)
    if device.pci_bus_id:
        return ("pci", host, device.pci_bus_id, device.chip)
    return ("name", host, device.name if device.name is not None else device.index)


def merge_telemetry(reports: list[RankReport]) -> Telemetry | None:
    """One rank's telemetry as is; with several, every device once (device_key) and
    the sum of their energy and mean power, beside every rank's own."""
    readings = [r.telemetry for r in reports]
    if len(readings) == 1 or readings[0] is None:
        return readings[0]
    available = [t for t in readings if t and t.available]
    if not available:
        return readings[0].model_copy(update={"ranks": len(readings)})
    devices, seen = [], set()
    for report, reading in zip(reports, readings):
        for device in (reading.devices or []) if reading and reading.available else []:
            # ranks of one node may sample the same device: the CPU's packages, or one
            # accelerator shared by several ranks (or by slices of it, each a rank)
            key = device_key(report.host, device)
            if key not in seen:
                seen.add(key)
                devices.append(device.model_copy(update={"host": report.host}))
    return Telemetry(source=available[0].source, available=True, ranks=len(readings),
                     ranks_available=len(available), energy_j=sum_known(d.energy_j for d in devices),
                     power_w_mean_total=sum_known(d.power_w_mean for d in devices), devices=devices)


def merge_host_syncs(reports: list[RankReport]) -> HostSyncs | None:
    """The rank whose host waited for its device most often in the timed window (each such
    wait leaves the device idle): its count and call sites; None when no rank could count."""
    counted = [(r.rank, r.host_syncs) for r in reports if r.host_syncs and r.host_syncs.count is not None]
    if not counted:
        return None
    rank, most = max(counted, key=lambda counts: counts[1].count or 0)
    return HostSyncs(count=most.count, where=most.where, rank=rank, ranks_counted=len(counted))


def straggler(reports: list[RankReport]) -> Straggler | None:
    """The rank with the slowest median step, and how much slower than the median rank."""
    if len(reports) < 2:
        return None
    medians = {r.rank: statistics.median(r.step_times_s) for r in reports}
    slowest = max(medians, key=medians.__getitem__)
    typical = statistics.median(medians.values())
    return Straggler(rank=slowest, median_step_time_s=medians[slowest], median_of_ranks_s=typical,
                     ratio=medians[slowest] / typical if typical > 0 else None)


def merge_nodes(reports: list[RankReport]) -> list[NodeSummary]:
    """The environment of every node (one entry per node rank), with its ranks and
    where they ran (threads, usable cores, devices, oversubscription)."""
    nodes: dict[int, NodeSummary] = {}
    for r in reports:
        node = nodes.setdefault(r.node_rank, NodeSummary(node_rank=r.node_rank, host=r.host, ranks=[],
                                                         environment=r.environment.model_copy()))
        node.ranks.append(r.rank)
    for placement in host_placements(reports) or []:
        for node_rank in placement.node_ranks:  # nodes on one host share its cores: judged together
            nodes[node_rank].placement = placement.describe()
    return [nodes[k] for k in sorted(nodes)]


def _rank_placement(placement: Placement | None) -> RankPlacement | None:
    if placement is None:
        return None
    return RankPlacement(threads=placement.threads, usable_cores=placement.usable_cores,
                         cpus=cpu_list_text(placement.cpus), devices=placement.devices)


def merge_ranks(result: RunResult, spec: RunSpec, workload: Workload, reports: list[RankReport]) -> None:
    """Fill the result's metrics, steps, ranks and nodes from every rank's report."""
    source = _loss_rank(reports, spec)
    # expert parallelism's all-to-all seconds per step (warm-up included), the mean over ranks
    all_to_all = (step_all_to_all_s([r.all_to_all_s for r in reports if r.all_to_all_s is not None])
                  if source.all_to_all_s is not None else None)
    # Step t takes as long as its slowest rank.
    times = [max(r.step_times_s[i] for r in reports) for i in range(len(source.step_times_s))]
    result.steps = [_step(source, index, spec.warmup, times, all_to_all) for index in range(len(source.losses))]
    implausible, result.metrics = _metrics(result, spec, workload, reports, source, times)
    if source.routing is not None:
        result.metrics.routing = routing_summary(source.routing, spec.warmup, spec.model_config(workload.model))
    if all_to_all:
        in_order = sorted(reports, key=lambda r: r.rank)
        result.metrics.expert_parallel = expert_parallel_figures(
            spec.parallel.ep, [r.all_to_all_s or [] for r in in_order], [r.step_times_s for r in in_order],
            spec.warmup)
    config = spec.model_config(workload.model)
    caveat = shape_caveat(spec.flops_formula, config)  # e.g. megatron-deepspeed on Llama
    if caveat and not uncounted(spec.flops_formula, config):  # an uncounted model's figures are null, said there
        result.warnings.append(caveat)
    result.ranks = [RankSummary(
        rank=r.rank, node_rank=r.node_rank, local_rank=r.local_rank, host=r.host, coordinates=r.coordinates,
        step_time_s=StepTime.model_validate(finite(summarize(r.step_times_s))),
        memory=Memory.model_validate(r.memory, from_attributes=True),
        telemetry=r.telemetry if len(reports) > 1 else None, placement=_rank_placement(r.placement),
    ) for r in reports]
    result.nodes = merge_nodes(reports)
    result.checkpoint = merge_checkpoints(spec, [r.checkpoints for r in sorted(reports, key=lambda r: r.rank)],
                                          result.metrics.step_time_s.median if result.metrics.step_time_s else None)
    result.warnings += reports[0].checkpoints.warnings if reports[0].checkpoints else []
    # the nodes' entries keep each node's own environment as it was reported
    result.environment = Environment.model_validate(
        {**result.environment.dump(), **dataclasses.asdict(run_placement(host_placements(reports)))})
    result.metrics.time_to_target = time_to_target(result, spec, reports)
    result.metrics.goodput = merged_goodput(reports)
    result.profile = merged_profile(spec, reports)
    result.metrics.steady_state = measured_steady_state(times, result.metrics.telemetry)
    _judge(result, spec, times, implausible)


def _step(source: RankReport, index: int, warmup: int, times: list[float], all_to_all: list[float] | None) -> Step:
    """Step ``index`` of ``source``'s (warm-up first), its time the slowest rank's (``times``); an MoE
    model's routing and expert parallelism's all-to-all seconds where the run has them (else unset)."""
    timed = index >= warmup
    step = Step(step=source.first_iteration + index + 1, phase="timed" if timed else "warmup",
                time_s=times[index - warmup] if timed else None, loss=finite_or_none(source.losses[index]),
                grad_norm=finite_or_none(source.grad_norms[index]), lr=source.lrs[index],
                loss_scale=source.loss_scales[index], skipped=source.skipped[index])
    if source.routing is not None:
        routing = step_routing(source.routing[index])
        step.moe_aux_loss, step.moe_imbalance = routing.aux_loss, routing.imbalance
        step.moe_dropped_tokens = routing.dropped_tokens
    if all_to_all:
        step.all_to_all_s = all_to_all[index]
    return step


def _metrics(result: RunResult, spec: RunSpec, workload: Workload, reports: list[RankReport], source: RankReport,
             times: list[float]) -> tuple[str | None, Metrics]:
    """(why the throughput is impossible for the device, or None; the metrics)."""
    world = spec.parallel.world_size
    total_time = sum(times)
    samples_per_s = spec.global_batch_size * len(times) / total_time
    peak = result.device.peak_flops
    config = spec.model_config(workload.model)
    formulas = flops_by_formula(config, spec.global_batch_size, spec.seq_length, tensor_parallel=spec.parallel.tp,
                                recompute=spec.recompute)
    steps_per_s_per_device = len(times) / total_time / world
    by_formula = {name: _formula_figures(formula_flops, steps_per_s_per_device, peak, uncounted(name, config))
                  for name, formula_flops in formulas.items()}
    flops = formulas[spec.flops_formula]  # None: the formula cannot count this model (an MoE switch)
    achieved = flops * steps_per_s_per_device if flops is not None else None
    counting, not_counted = work_formula(spec.flops_formula, config)
    judged = formulas[counting]
    assert judged is not None, f"{counting} counts this model"
    implausible = implausible_throughput(judged * steps_per_s_per_device, result.device)
    ceiling = result.device.measured_ceiling.flops if result.device.measured_ceiling else None
    unmeasured: dict[str, str] = {}
    if implausible:  # a figure the device cannot reach: no MFU against anything (the status says why)
        peak = ceiling = None
        unmeasured.update(mfu=implausible, mfu_measured_ceiling=implausible)
        for figures in by_formula.values():
            figures.mfu = None
    elif not_counted:  # no FLOPs, so no rate and no utilisation: each null with the formula's reason
        peak = ceiling = None
        unmeasured.update(tflops_per_device=not_counted, mfu=not_counted, mfu_measured_ceiling=not_counted)
    emulated = result.device.fp8_emulated
    if emulated and not implausible and not not_counted:  # FP8 computed without FP8 units: no peak to use
        peak = ceiling = None
        unmeasured.update(mfu=emulated, mfu_measured_ceiling=emulated)
        for figures in by_formula.values():
            figures.mfu = None
    explained = implausible or not_counted or emulated
    if peak is None and not explained:
        unmeasured["mfu"] = result.device.peak_flops_unmeasured or "no peak FLOP/s"
    if not ceiling and not explained:
        unmeasured["mfu_measured_ceiling"] = (result.device.measured_ceiling_unmeasured
                                              or "no measured ceiling: run hwbench calibrate")
    fp8 = _fp8_utilisation(result, spec, achieved, implausible, unmeasured)
    validation = reports[0].validation
    telemetry = merge_telemetry(reports)
    host_syncs = merge_host_syncs(reports)
    if not validation:
        unmeasured["valid_ppl"] = ("no validation (--eval-iters 0)" if spec.eval_iters == 0
                                   else f"--split {spec.split} leaves no validation documents")
    if telemetry is None:
        unmeasured["telemetry"] = "turned off with --no-telemetry"
    elif not telemetry.available:
        unmeasured["telemetry"] = telemetry.reason or "unavailable"
    if world == 1:
        unmeasured["straggler"] = "one rank"
    if host_syncs is None:
        unmeasured["host_syncs"] = next((r.host_syncs.reason for r in reports if r.host_syncs), None) or "not counted"
    last = validation[-1] if validation else None
    return implausible, Metrics.model_validate(finite({
        "samples_per_s": samples_per_s, "tokens_per_s": samples_per_s * spec.seq_length,
        "tokens_per_s_per_device": samples_per_s * spec.seq_length / world,
        "tflops_per_device": achieved / 1e12 if achieved is not None else None,
        # against the data sheet (the catalog's peak)
        "mfu": achieved / peak if peak and achieved is not None else None,
        # against hwbench calibrate's GEMM rate
        "mfu_measured_ceiling": achieved / ceiling if ceiling and achieved is not None else None,
        "flops_per_iteration": flops, "flops_formula": spec.flops_formula,
        "flops_formula_expression": FLOPS_FORMULAS[spec.flops_formula].expression,
        "flops_counts": flops_counts(spec.flops_formula, config),  # an MoE model: its active parameters, named
        "by_formula": by_formula,  # every known formula's figures, for comparing with other tools' logs
        "world_size": world, "timed_steps": len(times), "step_time_s": summarize(times),
        "timed_wall_time_s": max(r.wall_time_s for r in reports), "memory": merge_memory(reports),
        "loss_start": finite_or_none(source.losses[0]), "loss_end": finite_or_none(source.losses[-1]),
        "loss_floor": source.data.get("entropy_nats"), "validation": validation,
        "valid_loss": last.loss if last else None, "valid_ppl": last.ppl if last else None,
        "valid_ppl_step": last.step if last else None, "ppl_floor": source.data.get("perplexity_floor"),
        "skipped_steps": sum(source.skipped), "straggler": straggler(reports), "host_syncs": host_syncs,
        "telemetry": telemetry, "data": source.data, **fp8, "unmeasured": unmeasured}))


def _fp8_utilisation(result: RunResult, spec: RunSpec, achieved: float | None, implausible: str | None,
                     unmeasured: dict[str, str]) -> dict[str, float | None]:
    """An FP8 run's model FLOP/s against the FP8 dense peak (``mfu_fp8_peak``; ``mfu`` is against the
    BF16 one), or null with why in ``unmeasured``; nothing for other precisions."""
    if spec.precision != FP8:
        return {}
    device = result.device
    peak = device.fp8_peak_flops if not (implausible or device.fp8_emulated or achieved is None) else None
    if peak is None or achieved is None:
        unmeasured["mfu_fp8_peak"] = (implausible or device.fp8_emulated or device.fp8_peak_flops_unmeasured
                                      or "no FP8 peak FLOP/s")
    return {"mfu_fp8_peak": achieved / peak if peak and achieved is not None else None}


def _formula_figures(flops: float | None, steps_per_s_per_device: float, peak: float | None,
                     not_counted: str | None) -> FormulaFigures:
    """One formula's figures in metrics.by_formula: its FLOPs, TFLOP/s and MFU per device, or each
    null with why the formula cannot count the model."""
    if flops is None:
        return FormulaFigures(flops_per_iteration=None, tflops_per_device=None, mfu=None, unmeasured=dict.fromkeys(
            ("flops_per_iteration", "tflops_per_device", "mfu"), not_counted))
    rate = finite_or_none(flops * steps_per_s_per_device)  # FLOP/s per device
    return FormulaFigures(flops_per_iteration=flops, tflops_per_device=rate / 1e12 if rate is not None else None,
                          mfu=rate / peak if peak and rate is not None else None)


def merged_goodput(reports: list[RankReport]) -> Goodput | None:
    """The run's goodput, on rank 0's clock: the ranks step together (every step ends in a
    collective), so one rank's phases are the job's; None where rank 0 kept no clock (a probe)."""
    first = min(reports, key=lambda r: r.rank)
    if first.phases_s is None:
        return None
    checkpoints = first.checkpoints
    restarts_s = (restart_time_before(checkpoints.restart, checkpoints.restarts, first.init_s or 0.0)
                  if checkpoints else 0.0)
    return goodput_figures(first.phases_s, restarts_s, first.rank)


def merged_profile(spec: RunSpec, reports: list[RankReport]) -> Profile | None:
    """--profile: every rank's breakdown, in rank order, and the rank the others waited for."""
    breakdowns = sorted((r.profile for r in reports if r.profile is not None), key=lambda b: b.rank or 0)
    if not spec.profile or not breakdowns:
        return None
    traces = [b.trace for b in breakdowns if b.trace is not None]
    # numbered as result.steps are (a resumed run's from its checkpoint's iteration), after the timed
    # steps and the profiler's warm-up step
    first = reports[0].first_iteration + spec.warmup + spec.steps + PROFILER_WARMUP_STEPS + 1
    return Profile(steps=list(range(first, first + (spec.profile_steps or 0))),
                   profiler_warmup_steps=PROFILER_WARMUP_STEPS,
                   trace_dir=os.path.dirname(traces[0]) if traces else None, traces=traces,
                   sum_tolerance=SUM_TOLERANCE, ranks=breakdowns, straggler_threshold=STRAGGLER_WAIT_SHARE,
                   straggler=waiting_straggler(breakdowns))


def time_to_target(result: RunResult, spec: RunSpec, reports: list[RankReport]) -> TimeToTarget | None:
    """Time, steps, samples, device-hours, energy and cost to the run's target, from the first
    validation that reached it; None without a target. The clock starts at the first training
    step (warm-up included: it trains too) and stops when that validation's loss was read;
    initialisation is reported apart and counts only beyond INIT_BOUND_S (MLPerf's rule)."""
    target = spec.target
    if target is None:
        return None
    init = [r.init_s for r in reports if r.init_s is not None]  # the job trains once its last rank is ready
    validation = result.metrics.validation or []
    hit = next((point for point in validation if target.met(getattr(point, target.metric))), None)
    found = TimeToTarget(metric=target.metric, given=target.given, value=target.value,
                         init_s=max(init) if init else None, reached=hit is not None)
    unmeasured: dict[str, str] = {}
    if hit is None:
        last = validation[-1] if validation else None
        figure = getattr(last, target.metric, None) if last else None
        seen = (f"{target.metric} {figure:.4g} at step {last.step}" if last and figure is not None
                else "no finite validation figure")
        why = f"not reached in {spec.warmup + spec.steps} steps ({seen})"
        found.unmeasured = dict.fromkeys(("step", "samples", "tokens", "time_s", "scored_time_s", "device_hours",
                                          "energy_j", "cost_usd"), why)
        return found
    assert hit.elapsed_s is not None  # the worker times every validation
    samples = hit.step * spec.global_batch_size
    scored = hit.elapsed_s + max(0.0, (found.init_s or 0.0) - INIT_BOUND_S)
    device_hours = scored * result.devices_charged / 3600

    price = None if result.stand_in else result.device.price_usd_per_hour  # a stand-in's hours are this host's
    found.step, found.samples, found.tokens, found.time_s = hit.step, samples, samples * spec.seq_length, hit.elapsed_s
    found.scored_time_s, found.device_hours = scored, device_hours
    found.cost_usd = device_hours * price if price is not None else None
    if price is None:
        unmeasured["cost_usd"] = (STAND_IN_PRICE[result.stand_in] if result.stand_in else
                                  "no price per device-hour in the device's catalog entry (the report takes --price)")
    telemetry = result.metrics.telemetry
    energy = telemetry.total_energy_j if telemetry and telemetry.available else None
    if spec.warmup:
        unmeasured["energy_j"] = (f"the telemetry window starts after the {spec.warmup} warm-up steps; --warmup 0 "
                                  "measures the energy to the target")
    elif energy is None:
        unmeasured["energy_j"] = (telemetry.reason if telemetry else None) or result.metrics.why("telemetry") \
            or "no device reported its energy"
    else:
        found.energy_j = energy  # with --warmup 0 the window runs from the first step to the target
    found.unmeasured = unmeasured
    return found


def measured_steady_state(times: list[float], telemetry: Telemetry | None) -> SteadyState:
    """hwbench.stats.steady_state of the merged step times, with the throttle reasons the
    devices reported over the window beside it (the likely cause of a drift)."""
    steady = steady_state(times)
    reported = [device.throttle_reasons for device in (telemetry.devices or [])] if telemetry else []
    known = [reasons for reasons in reported if reasons is not None]
    steady.throttle_reasons = sorted({name for reasons in known for name in reasons}) if known else None
    if not known:
        steady.unmeasured = {**(steady.unmeasured or {}), "throttle_reasons": (
            "telemetry turned off (--no-telemetry)" if telemetry is None
            else telemetry.reason if not telemetry.available and telemetry.reason
            else "no device reported throttle reasons")}
    return steady


def _judge(result: RunResult, spec: RunSpec, times: list[float], implausible: str | None = None) -> None:
    """Status and warnings from the merged figures."""
    metrics, scaled = result.metrics, spec.precision == "fp16"
    bad = [s.step for s in result.steps if s.loss is None or (s.grad_norm is None and not s.skipped)]
    all_skipped = scaled and metrics.skipped_steps == len(result.steps)
    missed = metrics.time_to_target is not None and not metrics.time_to_target.reached
    result.status = "numerics" if bad or all_skipped else "invalid" if implausible else \
        "not_converged" if missed else "ok"
    if result.status == "not_converged":
        assert spec.target is not None and metrics.time_to_target is not None  # only a missed target is
        result.error = RunError(type="TargetNotReached", rank=0, traceback=None,
                                message=f"target {spec.target.text()} {metrics.time_to_target.why('step')}")
    if implausible and result.status == "invalid":
        result.error = RunError(type="ImplausibleThroughput", message=implausible, traceback=None, rank=0)
    if bad:
        result.error = RunError(type="NonFiniteLoss", message=f"loss or gradient not finite at steps {bad[:10]}",
                                traceback=None, rank=0)
    elif all_skipped:
        result.error = RunError(type="LossScaleCollapse", rank=0, traceback=None,
                                message="every fp16 step overflowed and was skipped")
    steady = metrics.steady_state
    if steady and steady.drifting and steady.drift is not None:  # drifting: a drift was measured
        if steady.drift > 0:
            reasons = (f"throttle reasons reported: {', '.join(steady.throttle_reasons)}" if steady.throttle_reasons
                       else f"throttle reasons: {steady.why('throttle_reasons') or 'none reported'}")
            result.warnings.append(f"step time drifted: the last quarter of the timed window {steady.drift:+.1%} "
                                   f"against the first (threshold {steady.drift_threshold:.0%}; {reasons})")
        else:
            result.warnings.append(f"step time drifted: the last quarter of the timed window {steady.drift:+.1%} "
                                   f"against the first (threshold {steady.drift_threshold:.0%}): still settling "
                                   f"after the warm-up; give more --warmup")
    cv = metrics.step_time_s.cv if metrics.step_time_s else None
    if cv is not None and cv > NOISY_CV:
        result.warnings.append(f"step times vary: CV {cv:.1%} over {len(times)} timed steps")
    if len(times) < FEW_TIMED_STEPS:
        result.warnings.append(f"only {len(times)} timed steps: use --steps {FEW_TIMED_STEPS} or more "
                               "for stable figures")
    if metrics.skipped_steps:
        result.warnings.append(f"{metrics.skipped_steps} fp16 steps overflowed and were skipped")
    lagging = metrics.straggler
    if lagging and lagging.ratio and lagging.ratio > STRAGGLER_RATIO:
        result.warnings.append(
            f"straggler: rank {lagging.rank} took {lagging.ratio:.2f}x the median rank's median step time"
        )
    waits = metrics.host_syncs
    if waits and waits.count:
        first = f" (first at {waits.where[0]})" if waits.where else ""
        validating = " (the validations inside it read their losses: --eval-interval)" if spec.eval_interval else ""
        result.warnings.append(
            f"the host waited for the device {waits.count} times in the timed window{first}"
            f"{validating}: the device idles meanwhile, so launch gaps count as step time"
        )
    beyond = metrics.mfu_measured_ceiling
    if beyond is not None and beyond > 1:
        result.warnings.append(
            f"the run reached {beyond:.0%} of the measured GEMM ceiling: that calibration "
            "understates the device (too small --sizes, or a busy machine); calibrate again"
        )
    if result.environment.oversubscribed:
        result.warnings.append(
            f"[oversubscribed] {result.environment.oversubscribed_reason}: the figures include "
            "time spent waiting for a core or a device"
        )
    for restart in (result.checkpoint.restarts or []) if result.checkpoint else []:
        lost = f"{restart.steps_lost} steps" if restart.steps_lost is not None else "steps unknown"
        seconds = f"{restart.time_lost_s:.1f} s" if restart.time_lost_s is not None else "time unknown"
        result.warnings.append(
            f"restart {restart.attempt}: a rank failed; resumed from step "
            f"{restart.resumed_from_iteration}, {lost} and {seconds} lost (left out of the "
            "throughput, which covers the last attempt's timed steps)"
        )
    if spec.parallel.source == "published":
        result.warnings.append(
            f"layout TP{spec.parallel.tp} PP{spec.parallel.pp} DP{spec.parallel.dp} from the "
            "workload's published settings"
        )
