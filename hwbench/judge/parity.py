"""Convergence parity: do two runs train to the same loss, step by step?

``hwbench parity RUN_A RUN_B`` compares the training-loss curves of two result
files (GPU vs NPU, native vs DeepSpeed, before vs after a change) at every
step both recorded, and their validation losses at common steps. The relative
difference |a - b| / max(|a|, |b|) must stay within the tolerance at every
step and at the end. docs/parity.md says how the default tolerance was chosen.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tabulate import tabulate

from hwbench.errors import UsageError
from hwbench.point import PointKey
from hwbench.precision import FP8, FP8_HIGH_PRECISION
from hwbench.result.model import RunResult

DEFAULT_TOLERANCE = 0.02  # docs/parity.md
# Two layouts of one run (TP, PP, DP, FSDP, ZeRO) on the same device and precision
# differ only in reduction order and the tensor-parallel vocabulary padding:
# docs/parity.md shows 0.03% at most on `tiny`; a real layout bug is far larger.
LAYOUT_TOLERANCE = 1e-3
FINAL_WINDOW = 5  # steps averaged for the final comparison
# Spec fields that must match for loss curves to be comparable at all.
MUST_MATCH = ("model", "seed", "data", "split", "global_batch_size", "seq_length")


# The convergence check of a run against a reference curve (docs/parity.md, "Convergence check"):
# per-step tolerances in tiers over the fraction of the steps compared (tight early, where the
# curves of one recipe start together, looser later, where noise accumulates), the Pearson
# correlation of the two curves, and the final validation perplexity within a margin. The same
# three kinds of check as Megatron-Bridge's golden-value tests; the figures are hwbench's, chosen
# from docs/parity.md's measurements (a precision change stays far inside, a 1.5x learning rate
# does not).
TIERS = ((0.25, 0.005), (0.5, 0.01), (1.0, DEFAULT_TOLERANCE))  # (up to this fraction of the steps, tolerance)
MIN_CORRELATION = 0.95
FINAL_PPL_MARGIN = 0.05  # the final validation perplexity within 5% of the reference's


@dataclasses.dataclass
class ConvergenceCheck:
    """A run against a reference run of the same workload, precision and seed."""

    tiers: list[dict[str, Any]]  # first_step, last_step, tolerance, worst, worst_step, passed
    correlation: float | None
    final_ppl: float | None
    reference_ppl: float | None
    failures: list[str]  # why it is numerically different, one line each

    @property
    def passed(self) -> bool:
        return not self.failures


def convergence_check(run: RunResult, reference: RunResult) -> ConvergenceCheck:
    """The tiered per-step check, the correlation and the final validation PPL of ``run``
    against ``reference`` (UsageError when they share no step with a finite loss)."""
    from scipy import stats

    losses, ref, common = _common_losses(run, reference)
    failures, tiers, start = [], [], 0
    for fraction, tolerance in TIERS:
        end = max(start, round(fraction * len(common)))
        steps = common[start:end]
        start = end
        if not steps:
            continue
        diffs = [(relative_difference(losses[s], ref[s]), s) for s in steps]
        worst, worst_step = max(diffs)
        tiers.append({"first_step": steps[0], "last_step": steps[-1], "tolerance": tolerance, "worst": worst,
                      "worst_step": worst_step, "passed": worst <= tolerance})
        if worst > tolerance:
            failures.append(f"loss {worst:.2%} off the reference at step {worst_step} (steps {steps[0]}-{steps[-1]} "
                            f"allow {tolerance:.1%})")
    correlation = None
    a, b = [losses[s] for s in common], [ref[s] for s in common]
    if len(common) >= 3 and len(set(a)) > 1 and len(set(b)) > 1:
        correlation = float(stats.pearsonr(a, b).statistic)
        if correlation < MIN_CORRELATION:
            failures.append(f"loss curves correlate at r = {correlation:.3f}, below {MIN_CORRELATION}")
    final_ppl, reference_ppl = run.metrics.valid_ppl, reference.metrics.valid_ppl
    if final_ppl is not None and reference_ppl:
        off = abs(final_ppl / reference_ppl - 1)
        if off > FINAL_PPL_MARGIN:
            failures.append(f"final validation PPL {final_ppl:,.2f} is {off:.1%} off the reference's "
                            f"{reference_ppl:,.2f} (margin {FINAL_PPL_MARGIN:.0%})")
    return ConvergenceCheck(tiers, correlation, final_ppl, reference_ppl, failures)


REFERENCE_MATCH = ("model", "seed", "global_batch_size", "seq_length", "data")  # a reference's identity, with precision
DIFFERENT = "numerically different"  # the report's status of a run that fails its reference's check


def reference_precisions(precision: str | None) -> tuple[str | None, ...]:
    """The precisions a run's reference may have, first the one it is held to: its own, and for an
    FP8 run the BF16 run it stands in for first (a speed-up bought with a worse loss must show)."""
    return (FP8_HIGH_PRECISION, FP8) if precision == FP8 else (precision,)


def reference_of(result: RunResult, references: list[RunResult]) -> RunResult | None:
    """The first reference of ``result``'s workload, seed, global batch, sequence length and data in
    the first precision of reference_precisions that one has; None when there is none."""
    same = [ref for ref in references if ref.run_id != result.run_id and all(
        getattr(ref.spec, key) == getattr(result.spec, key) for key in REFERENCE_MATCH)]
    for precision in reference_precisions(result.spec.precision):
        found = next((ref for ref in same if ref.spec.precision == precision), None)
        if found is not None:
            return found
    return None


def check_against_references(results: list[RunResult], references: list[RunResult]) -> dict[str, str]:
    """run_id -> why, for each ok result that fails the convergence check against its reference
    (reference_of: its workload, precision, seed, global batch, sequence length and data; an FP8
    run's the BF16 run's; the report's --reference); a result without a reference, or the reference
    itself, is not checked."""
    different: dict[str, str] = {}
    for result in results:
        if result.status != "ok":
            continue
        reference = reference_of(result, references)
        if reference is None:
            continue
        try:
            check = convergence_check(result, reference)
        except UsageError as error:
            different[result.run_id] = f"{DIFFERENT} from the reference {reference.run_id}: {error}"
            continue
        if not check.passed:
            different[result.run_id] = f"{DIFFERENT} from the reference {reference.run_id}: " + "; ".join(
                check.failures)
    return different


def format_convergence_check(check: ConvergenceCheck) -> str:
    lines = ["convergence check of A against B as the reference:"]
    lines += [f"  steps {t['first_step']}-{t['last_step']}: largest difference {t['worst']:.3%} at step "
              f"{t['worst_step']}, allowed {t['tolerance']:.1%}" + ("" if t["passed"] else "  OVER")
              for t in check.tiers]
    lines.append("  correlation of the loss curves: " + (f"r = {check.correlation:.4f} (at least {MIN_CORRELATION})"
                                                       if check.correlation is not None
                                                       else "not computed (fewer than 3 steps, or a flat curve)"))
    lines.append("  final validation PPL: " + (f"{check.final_ppl:,.2f} vs {check.reference_ppl:,.2f} (within "
                                               f"{FINAL_PPL_MARGIN:.0%})" if check.final_ppl is not None
                                               and check.reference_ppl else "not compared (a run has no "
                                                                                        "validation)"))
    if check.passed:
        lines.append("CONVERGENCE: A converges as the reference does")
    else:
        lines.append("NUMERICALLY DIFFERENT from the reference: " + "; ".join(check.failures))
    return "\n".join(lines)


@dataclasses.dataclass
class ParityReport:
    rows: list[dict[str, Any]]  # step, loss_a, loss_b, rel_diff, over
    validation_rows: list[dict[str, Any]]
    max_rel_diff: float
    max_rel_diff_step: int
    first_divergent_step: int | None
    final_rel_diff: float
    tolerance: float
    warnings: list[str]

    @property
    def within_tolerance(self) -> bool:
        return self.first_divergent_step is None and self.final_rel_diff <= self.tolerance


def relative_difference(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def _common_losses(a: RunResult, b: RunResult) -> tuple[dict[int, float], dict[int, float], list[int]]:
    """Each run's training loss by step, and the steps both have (UsageError when none)."""
    losses_a, losses_b = ({step.step: step.loss for step in run.steps if step.loss is not None} for run in (a, b))
    common = sorted(set(losses_a) & set(losses_b))
    if not common:
        raise UsageError(f"runs {a.run_id} and {b.run_id} share no step with a finite loss; nothing to compare")
    return losses_a, losses_b, common


def _validation_losses(result: RunResult) -> dict[int, float]:
    return {point.step: point.loss for point in result.metrics.validation or [] if point.loss is not None}


def compare_runs(a: RunResult, b: RunResult, tolerance: float = DEFAULT_TOLERANCE) -> ParityReport:
    if not 0 < tolerance < 1:
        raise UsageError(f"--tolerance {tolerance!r} is not accepted; give a fraction between 0 and 1, e.g. 0.02")
    losses_a, losses_b, common = _common_losses(a, b)
    warnings = [f"spec.{key} differs: {getattr(a.spec, key)!r} vs {getattr(b.spec, key)!r}; the curves need not agree"
                for key in MUST_MATCH if getattr(a.spec, key) != getattr(b.spec, key)]
    rows: list[dict[str, Any]] = []
    for step in common:
        diff = relative_difference(losses_a[step], losses_b[step])
        rows.append({"step": step, "loss_a": losses_a[step], "loss_b": losses_b[step], "rel_diff": diff,
                     "over": diff > tolerance})
    worst = max(rows, key=lambda r: r["rel_diff"])
    first_over = next((r["step"] for r in rows if r["over"]), None)
    window = common[-FINAL_WINDOW:]
    final_a = sum(losses_a[s] for s in window) / len(window)
    final_b = sum(losses_b[s] for s in window) / len(window)
    valid_a, valid_b = _validation_losses(a), _validation_losses(b)
    validation_rows = [{"step": s, "loss_a": valid_a[s], "loss_b": valid_b[s],
                        "rel_diff": relative_difference(valid_a[s], valid_b[s])}
                       for s in sorted(set(valid_a) & set(valid_b))]
    if len(common) < max(len(losses_a), len(losses_b)):
        warnings.append(f"compared {len(common)} common steps of {len(losses_a)} and {len(losses_b)}")
    return ParityReport(rows, validation_rows, worst["rel_diff"], worst["step"], first_over,
                        relative_difference(final_a, final_b), tolerance, warnings)


def _point_text(key: PointKey | None, keys: list[PointKey | None], run: RunResult) -> str:
    """The run's point, with whatever sets it apart from the other's (its label among both)."""
    if key is None:
        return f"{run.device.device_model or '?'}, {run.spec.precision}"
    return key.label([k for k in keys if k is not None])


def format_report(report: ParityReport, a: RunResult, b: RunResult) -> str:
    keys = [run.point_key for run in (a, b)]
    lines = [f"{name}: {run.run_id} ({_point_text(key, keys, run)})" for name, run, key in zip("AB", (a, b), keys)]
    lines.append("")
    shown = report.rows if len(report.rows) <= 40 else (
        report.rows[:10] + [r for r in report.rows[10:-10] if r["over"]][:10] + report.rows[-10:])
    over = any(r["over"] for r in shown)  # the column only where a step is over: never an empty one
    lines.append(tabulate([[r["step"], f"{r['loss_a']:.5f}", f"{r['loss_b']:.5f}", f"{r['rel_diff']:.3%}"]
                           + (["OVER" if r["over"] else ""] if over else []) for r in shown],
                          headers=["step", "loss A", "loss B", "rel diff"] + (["over tolerance"] if over else []),
                          disable_numparse=True))
    if report.validation_rows:
        lines += ["", tabulate([[v["step"], f"{v['loss_a']:.5f}", f"{v['loss_b']:.5f}", f"{v['rel_diff']:.3%}"]
                                for v in report.validation_rows],
                               headers=["valid step", "loss A", "loss B", "rel diff"], disable_numparse=True)]
    lines.append("")
    lines += [f"warning: {w}" for w in report.warnings]
    lines.append(f"largest step difference {report.max_rel_diff:.3%} at step {report.max_rel_diff_step}; "
                 f"final ({FINAL_WINDOW}-step mean) difference {report.final_rel_diff:.3%}; "
                 f"tolerance {report.tolerance:.2%}")
    if report.within_tolerance:
        lines.append("PARITY: the curves agree within tolerance")
    else:
        where = (f"first diverge at step {report.first_divergent_step}" if report.first_divergent_step
                 else "end apart")
        lines.append(f"NO PARITY: the curves {where}")
    return "\n".join(lines)
