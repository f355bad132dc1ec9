"""`hwbench tune`: the fastest layout of a model on N devices that fits.

Candidates are every tensor x pipeline x data split of N devices, with plain
data parallelism or FSDP (native engine) or ZeRO 1-3 (DeepSpeed), every micro
batch that divides the per-rank batch, recompute off and on. Layouts
`hwbench run` refuses and those the memory planner predicts will not fit are
pruned without running. The rest are measured one by one, each a short
`hwbench run` in its own process tree (hwbench.harness.sweep.run_one), in an
order that tries the usually-fast ones first (no recompute, little model
parallelism, large micro batches). The search stops after --max-trials
measurements, or after --patience measurements in a row that did not beat the
best by more than 2%. The result is a ranking of what was measured.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hwbench.errors import UsageError
from hwbench.options import RunOptions
from hwbench.result.model import RunResult
from hwbench.result.store import write_json_atomic
from hwbench.units import gib

IMPROVEMENT = 0.02  # a trial must beat the best by this much to reset the patience count


@dataclasses.dataclass(frozen=True)
class Candidate:
    tp: int
    pp: int
    dp: int
    variant: str  # plain, fsdp, zero1, zero2, zero3
    micro_batch: int
    recompute: bool
    per_rank_batch: int  # global batch / dp: the micro batch divides it

    @property
    def name(self) -> str:
        return (f"tp{self.tp}-pp{self.pp}-dp{self.dp}-{self.variant}-mb{self.micro_batch}"
                + ("-recompute" if self.recompute else ""))

    def options(self) -> dict:
        """The run options that make this candidate."""
        if self.variant == "plain":
            variant = {}
        elif self.variant == "fsdp":
            variant = {"fsdp": True}
        else:  # zeroN
            variant = {"engine": "deepspeed", "zero": int(self.variant[4:])}
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "micro_batch_size": self.micro_batch,
                "recompute": self.recompute, **variant}

    def prior(self) -> tuple:
        """Usually fastest first, and every layout early: no recompute; the
        largest micro batches (as a share of the rank's batch) of every plain
        layout before sharded variants and smaller micro batches; then least
        model parallelism."""
        return (self.recompute, -self.micro_batch / self.per_rank_batch, self.variant != "plain",
                self.tp * self.pp, self.pp)


def candidates(devices: int, global_batch: int, engines: list[str]) -> list[Candidate]:
    """Every layout of ``devices`` (hwbench.planner.layouts) with each variant that can
    run it (hwbench.planner.variants, but ZeRO 0 only without data parallelism: with
    it, it is plain data parallelism on DeepSpeed), micro batch and recompute setting."""
    from hwbench.planner import layouts, variants

    found = []
    for tp, pp, dp in layouts(devices):
        if global_batch % dp:
            continue
        names = [v.short for v in variants(tp, pp, dp, engines) if not (v.engine == "deepspeed" and dp > 1
                                                                        and v.zero == 0)]
        per_rank = global_batch // dp
        micros = [m for m in range(1, per_rank + 1) if per_rank % m == 0]
        for variant in names:
            for micro in micros:
                for recompute in (False, True):
                    found.append(Candidate(tp, pp, dp, variant, micro, recompute, per_rank))
    return sorted(found, key=Candidate.prior)


@dataclasses.dataclass
class Trial:
    candidate: Candidate
    status: str  # ok, oom, failed, timeout, ... (measured) or invalid / does-not-fit (pruned)
    samples_per_s: float | None = None
    predicted_peak_bytes: int | None = None
    note: str = ""
    run_id: str | None = None


def tune(base: RunOptions, devices: int, out_dir: Path, capacity_bytes: int | None, engines: list[str],
         max_trials: int, patience: int, show_progress: bool = True) -> list[Trial]:
    """Prune, then measure in prior order until the stopping rule; every trial returned."""
    from hwbench.catalog import load_catalog
    from hwbench.harness.sweep import TIMEOUT_MARGIN_S, _say, run_one
    from hwbench.point import resume_key as result_key
    from hwbench.planner import fits, plan_memory
    from hwbench.spec import build_run_spec

    catalog = load_catalog()
    base = base.merged(nproc_per_node=devices)
    base_spec = build_run_spec(base, catalog, check_paths=False)
    config = catalog.workloads[base_spec.model].model
    trials: list[Trial] = []
    runnable: list[tuple[Candidate, list[str], Any, Any]] = []
    for candidate in candidates(devices, base_spec.global_batch_size, engines):
        options = base.merged(**candidate.options())
        try:
            spec = build_run_spec(options, catalog, check_paths=False)
        except UsageError as error:
            trials.append(Trial(candidate, "invalid", note=str(error)))
            continue
        plan = plan_memory(spec, config, _backend_name(spec.device))
        if capacity_bytes and not fits(plan, capacity_bytes):
            trials.append(Trial(candidate, "does-not-fit", predicted_peak_bytes=plan.total_bytes,
                                note=f"predicted {gib(plan.total_bytes)} GiB per rank"))
            continue
        runnable.append((candidate, options.to_argv(), spec, plan))
    _say(show_progress, f"tune {base_spec.model} on {devices} devices: {len(runnable)} candidates fit, "
                        f"{len(trials)} pruned; measuring at most {max_trials}")
    best, since_best, measured = 0.0, 0, 0
    for index, (candidate, args, spec, plan) in enumerate(runnable[:max_trials], start=1):
        measured = index
        sweep = {"suite": f"tune-{base_spec.model}-{devices}", "suite_path": None, "point": candidate.name,
                 "repeat": 0, "repeats": 1, "key": result_key(args, 0)}
        _say(show_progress, f"[{index}/{min(max_trials, len(runnable))}] {candidate.name}")
        result: RunResult = run_one(args, out_dir / candidate.name, sweep, spec.launch.timeout_s + TIMEOUT_MARGIN_S)
        samples = result.metrics.get("samples_per_s") if result.status == "ok" else None
        trials.append(Trial(candidate, result.status, samples, plan.total_bytes,
                            (result.error or {}).get("message", ""), result.run_id))
        _say(show_progress, f"    {result.status}" + (f", {samples:,.2f} samples/s" if samples else ""))
        if samples and samples > best * (1 + IMPROVEMENT):
            best, since_best = samples, 0
        else:
            since_best += 1
        if since_best >= patience:
            _say(show_progress, f"stopping: {patience} trials in a row without a {IMPROVEMENT:.0%} gain")
            break
    for candidate, _, _, plan in runnable[measured:]:
        trials.append(Trial(candidate, "not-measured", predicted_peak_bytes=plan.total_bytes,
                            note="the search stopped first"))
    return trials


def _backend_name(device: str) -> str:
    from hwbench.device import detect_device

    return detect_device() if device == "auto" else device


def ranking(trials: list[Trial]) -> list[Trial]:
    measured = [t for t in trials if t.samples_per_s]
    return sorted(measured, key=lambda t: -t.samples_per_s)


def write_ranking(trials: list[Trial], path: Path) -> None:
    rows = [{**dataclasses.asdict(t.candidate), "name": t.candidate.name, "status": t.status,
             "samples_per_s": t.samples_per_s, "predicted_peak_bytes": t.predicted_peak_bytes, "note": t.note,
             "run_id": t.run_id} for t in trials]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"ranking": [t.candidate.name for t in ranking(trials)], "trials": rows})
