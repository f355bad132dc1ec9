"""`hwbench tune`: the fastest layout of a model on N devices that fits.

Candidates are the layouts `hwbench plan` enumerates (hwbench.layouts) with every micro
batch that divides the per-rank batch, recompute off and on; those `hwbench run` refuses
or the planner predicts will not fit are pruned without running. The rest are points of
the point loop (hwbench.suites.executor), measured in an order that tries the usually
fast first, kept when an earlier tune measured them, until --max-trials or --patience
trials in a row without a 2% gain. The result is a ranking of what was measured.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from hwbench.files import write_json_atomic
from hwbench.harness.estimate import estimate_text, run_work, slow_precision_warning
from hwbench.layouts import PlannedLayout
from hwbench.options import RunOptions
from hwbench.paths import RANKING_FILE
from hwbench.planner import Variant
from hwbench.suites.executor import PointRecord, Say, SweepOptions, progress_lines, run_points
from hwbench.suites.suite import Point, Suite
from hwbench.suites.sweep import LocalExecutor
from hwbench.units import decimal_size_note, gib, parse_size

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

    def prior(self) -> tuple:
        """Usually fastest first, and every layout early: no recompute; the
        largest micro batches (as a share of the rank's batch) of every plain
        layout before sharded variants and smaller micro batches; then least
        model parallelism."""
        return (self.recompute, -self.micro_batch / self.per_rank_batch, self.variant != "plain",
                self.tp * self.pp, self.pp)


@dataclasses.dataclass
class Trial:
    candidate: Candidate
    status: str  # ok, oom, failed, timeout, ... (measured) or invalid / does-not-fit (pruned)
    samples: list[float] = dataclasses.field(default_factory=list)  # samples/s of each ok repeat
    predicted_peak_bytes: int | None = None
    note: str = ""
    run_ids: list[str] = dataclasses.field(default_factory=list)

    @property
    def samples_per_s(self) -> float | None:
        """The median of the repeats; None when none was measured."""
        return statistics.median(self.samples) if self.samples else None


@dataclasses.dataclass(frozen=True)
class Ranked:
    """A measured trial's place: trials the repeats cannot tell apart share a rank, and say why."""

    rank: int
    trial: Trial
    of_best: float  # its median / the best median
    confidence: str  # how it was told from the trial ranked above it, or why it shares that one's rank
    shares_with: str | None = None  # the first trial of its rank, when it is not that one


def candidates(base: RunOptions, devices: int, capacity_bytes: int | None,
               engines: list[str]) -> tuple[list[tuple[Candidate, PlannedLayout]], list[Trial]]:
    """The candidates that may run, in prior order, and the pruned ones as trials
    (`invalid`: `hwbench run` refuses them; `does-not-fit`: the planner's prediction)."""
    from hwbench.catalog import load_catalog
    from hwbench.device import detect_device
    from hwbench.layouts import each_layout
    from hwbench.planner import DEFAULT_HEADROOM
    from hwbench.spec import build_run_spec

    catalog = load_catalog()
    base = base.merged(nproc_per_node=devices)
    global_batch = build_run_spec(base, catalog, check_paths=False).global_batch_size

    def settings(tp: int, pp: int, dp: int, variant: Variant) -> list[dict]:
        if global_batch % dp or (variant.engine == "deepspeed" and dp > 1 and variant.zero == 0):
            return []  # ZeRO 0 with data parallelism is plain data parallelism on DeepSpeed
        per_rank = global_batch // dp
        return [{"micro_batch_size": micro, "recompute": recompute}
                for micro in range(1, per_rank + 1) if per_rank % micro == 0 for recompute in (False, True)]

    kind = detect_device() if base.device in (None, "auto") else base.device
    runnable, pruned = [], []
    for layout in each_layout(base, devices, kind, capacity_bytes, DEFAULT_HEADROOM, engines, catalog,
                              settings=settings):
        options = layout.options
        micro = options.micro_batch_size
        assert micro is not None, "each_layout gives every layout its micro batch"
        candidate = Candidate(layout.tp, layout.pp, layout.dp, Variant(options.engine or "native",
                              bool(options.fsdp), options.zero or 0).short, micro,
                              bool(options.recompute), global_batch // layout.dp)
        if layout.refused:
            pruned.append(Trial(candidate, "invalid", note=layout.refused))
        elif layout.fits is False:
            pruned.append(Trial(candidate, "does-not-fit", predicted_peak_bytes=layout.peak_bytes,
                                note=f"predicted {gib(layout.peak_bytes)} GiB per rank"))
        else:
            runnable.append((candidate, layout))
    return sorted(runnable, key=lambda found: found[0].prior()), pruned


def tune(base: RunOptions, devices: int, out: str, device_memory: str | None, engines: list[str], max_trials: int,
         patience: int, progress: bool = True, repeats: int = 1) -> tuple[list[Trial], Path]:
    """Prune, then measure in prior order until the stopping rule, keeping the trials an
    earlier tune measured in OUT/<model>-<N>/; every candidate as a trial, and that folder
    (with ranking.json). ``device_memory``: the planner's capacity (else the device's);
    ``repeats``: runs of each trial (its median ranks it, its spread says which ranks are shared)."""
    from hwbench.catalog import load_catalog
    from hwbench.device import select_backend
    from hwbench.device_check import device_capacity_bytes
    from hwbench.spec import build_run_spec, check_data

    catalog = load_catalog()
    fixed = build_run_spec(base, catalog, check_paths=False)  # the fixed options must be valid on their own
    model, say = fixed.model, progress_lines(progress)
    check_data(base.data or "builtin")  # before the first trial, not once per trial
    backend = select_backend(base.device or "auto")
    warning = slow_precision_warning(backend, fixed.precision)
    if warning:  # said even when --quiet: it is a warning, not progress
        progress_lines(True)(f"hwbench: warning: {warning}")
    reading = decimal_size_note(device_memory, "--device-memory")
    if reading:  # said even when --quiet: the capacity the trials are chosen for
        progress_lines(True)(f"hwbench: note: {reading}")
    capacity = (parse_size(device_memory, "--device-memory") if device_memory
                else device_capacity_bytes(backend, catalog))
    runnable, trials = candidates(base, devices, capacity, engines)
    chosen, folder = runnable[:max_trials], Path(out) / f"{model}-{devices}"
    say(f"tune on {devices} devices: {len(runnable)} candidates fit, {len(trials)} pruned; measuring at most "
        f"{max_trials}")
    work = [run_work(build_run_spec(layout.options, catalog, check_paths=False), catalog, backend)
            for _, layout in chosen] * repeats
    say(estimate_text(backend, work, f"{len(chosen)} trial(s) x {repeats} repeat(s)"))
    points = tuple(Point(candidate.name, tuple(layout.options.given().items())) for candidate, layout in chosen)
    # the trials are a suite's points: OUT/<model>-<N>/<candidate>/, resumed as a sweep resumes
    records = run_points(Suite(folder.name, "hwbench tune", None, points), SweepOptions(Path(out), repeats=repeats),
                         LocalExecutor(plan=False, say=say), say, lambda done: _keep_going(done, patience, say))
    for (candidate, layout), record in zip(chosen, records):
        results = [r for r in record.results if r is not None]
        measured = [figure for r in results if r.status == "ok" and (figure := r.metrics.samples_per_s)]
        statuses: list[str] = sorted({r.status for r in results}) or ["not-measured"]
        status = "ok" if measured and len(measured) == len(results) else "/".join(statuses)
        trials.append(Trial(candidate, status, measured, layout.peak_bytes,
                            next((r.error.message or "" for r in results if r.error), ""),
                            [r.run_id for r in results]))
    trials += [Trial(candidate, "not-measured", predicted_peak_bytes=layout.peak_bytes,
                     note="the search stopped first") for candidate, layout in runnable[len(records):]]
    write_ranking(trials, folder / RANKING_FILE)
    return trials, folder


def _keep_going(records: list[PointRecord], patience: int, say: Say) -> bool:
    """False once ``patience`` trials in a row did not beat the best by IMPROVEMENT."""
    best, since_best = 0.0, 0
    for record in records:
        figures = [r.metrics.samples_per_s for r in record.results if r and r.status == "ok"]
        samples = statistics.median([f for f in figures if f]) if any(figures) else None
        if samples and samples > best * (1 + IMPROVEMENT):
            best, since_best = samples, 0
        else:
            since_best += 1
    if since_best >= patience:
        say(f"stopping: {patience} trials in a row without a {IMPROVEMENT:.0%} gain")
        return False
    return True


def ranking(trials: list[Trial]) -> list[Ranked]:
    """The measured trials, fastest median first. A trial shares the rank of the first trial of
    the rank above unless that one is faster by `hwbench compare`'s rule (the change of the median
    past DEFAULT_THRESHOLD and significant; with one run a side, the threshold alone, and it says so)."""
    from hwbench.judge.compare import DEFAULT_THRESHOLD, PointComparison, compare_point

    measured = sorted((t for t in trials if t.samples), key=lambda t: -statistics.median(t.samples))
    if not measured:
        return []
    leader, best = measured[0], statistics.median(measured[0].samples)
    ranked = [Ranked(1, leader, 1.0, "fastest median" + _runs(leader))]
    for position, trial in enumerate(measured[1:], start=2):
        judged = compare_point(PointComparison(None, "", trial.samples, leader.samples, ["ok"] * len(trial.samples),
                                               ["ok"] * len(leader.samples)), DEFAULT_THRESHOLD, True)
        if judged.verdict == "improvement":  # the leader of the rank above is faster, and the repeats show it
            how = "threshold only: one run on a side" if judged.rule.startswith("no repeats") else judged.rule
            ranked.append(Ranked(position, trial, statistics.median(trial.samples) / best,
                                 f"{leader.candidate.name} is {judged.change:.1%} faster ({how})"))
            leader = trial
            continue
        name = leader.candidate.name
        if judged.verdict == "no repeats":
            why = (f"within {DEFAULT_THRESHOLD:.0%} of {name} with one run a side: not distinguishable "
                   "(--repeats 3 measures the spread)")
        elif judged.verdict == "within noise":
            why = f"within {DEFAULT_THRESHOLD:.0%} of {name} ({judged.rule}): not distinguishable"
        else:
            why = f"not distinguishable from {name}: {judged.verdict} ({judged.rule})"
        rank = next(r.rank for r in ranked if r.trial is leader)
        ranked.append(Ranked(rank, trial, statistics.median(trial.samples) / best, why, leader.candidate.name))
    return ranked


def _runs(trial: Trial) -> str:
    return f" ({len(trial.samples)} run{'s' if len(trial.samples) != 1 else ''})"


def trial_figures(trial: Trial) -> dict:
    """A trial's samples/s as ranking.json holds them: median, range and runs."""
    return {"samples_per_s": trial.samples_per_s, "samples_per_s_min": min(trial.samples, default=None),
            "samples_per_s_max": max(trial.samples, default=None), "runs": len(trial.samples),
            "samples_per_s_each": trial.samples}


def write_ranking(trials: list[Trial], path: Path) -> None:
    rows = [{**dataclasses.asdict(t.candidate), "name": t.candidate.name, "status": t.status, **trial_figures(t),
             "predicted_peak_bytes": t.predicted_peak_bytes, "note": t.note, "run_ids": t.run_ids} for t in trials]
    ranked = [{"rank": r.rank, "name": r.trial.candidate.name, **trial_figures(r.trial), "of_best": r.of_best,
               "shares_rank_with": r.shares_with, "confidence": r.confidence} for r in ranking(trials)]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"ranking": ranked, "trials": rows})
