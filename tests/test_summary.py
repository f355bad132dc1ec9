"""The table `hwbench run` prints after a run (hwbench/report/summary.py), from a real result
(tests/data/compare/tiny-cpu.json) with the validations set."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hwbench.report.summary import run_summary_rows
from hwbench.result.model import RunResult

TEMPLATE = Path(__file__).parent / "data" / "compare" / "tiny-cpu.json"


def with_validations(steps: list[int]) -> RunResult:
    data = json.loads(TEMPLATE.read_text())
    losses = [10.5 - 0.1 * i for i in range(len(steps))]
    data["metrics"]["validation"] = [{"step": s, "loss": loss, "ppl": math.exp(loss)} for s, loss in zip(steps, losses)]
    data["metrics"].update(valid_ppl=math.exp(losses[-1]), valid_loss=losses[-1], valid_ppl_step=steps[-1])
    return RunResult.from_dict(data)


def test_every_validation_is_shown_not_only_the_last():
    rows = dict(run_summary_rows(with_validations([2, 4, 6])))
    assert rows["validation"].startswith(f"PPL {math.exp(10.3):,.3f} (loss 10.3000) after 6 steps")
    assert rows["validation curve"] == (f"PPL after step 2: {math.exp(10.5):,.1f}, 4: {math.exp(10.4):,.1f}, "
                                        f"6: {math.exp(10.3):,.1f}")


def test_a_long_curve_is_shown_briefly():
    steps = list(range(100, 2100, 100))  # 20 validations
    curve = dict(run_summary_rows(with_validations(steps)))["validation curve"]
    shown = [int(part.split(":")[0]) for part in curve.removeprefix("PPL after step ").split(" (")[0].split(", ")]
    assert shown[0] == 100 and shown[-1] == 2000 and len(shown) == 6
    assert curve.endswith("(14 more in the result's metrics.validation)")


def test_one_validation_has_no_curve():
    assert "validation curve" not in dict(run_summary_rows(with_validations([4])))


def _with(recompute: bool, formula: str, mfu: float = 0.4) -> RunResult:
    data = json.loads(TEMPLATE.read_text())
    data["spec"].update(recompute=recompute, flops_formula=formula)
    data["metrics"].update(flops_formula=formula, mfu=mfu)
    return RunResult.from_dict(data)


def test_a_formula_that_counts_recompute_is_hfu_for_a_run_that_recomputes():
    """megatron-deepspeed adds the recompute's forward: its figure of a recompute run is HFU, said why."""
    rows = dict(run_summary_rows(_with(True, "megatron-deepspeed")))
    assert rows["HFU"] == "40.0%" and "MFU" not in rows and "HFU, measured ceiling" in rows
    assert rows[""].startswith("HFU, not MFU: the megatron-deepspeed formula counts activation recomputation")
    for recompute, formula in ((False, "megatron-deepspeed"), (True, "megatron-core-v0.12"), (True, "palm")):
        rows = dict(run_summary_rows(_with(recompute, formula)))
        assert rows["MFU"] == "40.0%" and "HFU" not in rows and "" not in rows


def test_the_sweep_table_marks_an_hfu_figure_and_says_why():
    from types import SimpleNamespace

    from hwbench.report.summary import sweep_summary_table
    from hwbench.suites.executor import PointRecord
    from hwbench.suites.suite import Point

    def record(name, result):
        return PointRecord(Point(name, ()), [result])

    text = sweep_summary_table(SimpleNamespace(name="s"), [record("a", _with(True, "megatron-deepspeed")),
                                                           record("b", _with(False, "megatron-deepspeed", 0.3))])
    line_a = next(line for line in text.splitlines() if line.startswith("a "))
    line_b = next(line for line in text.splitlines() if line.startswith("b "))
    assert "40.0% HFU" in line_a and "30.0%" in line_b and "HFU" not in line_b
    assert text.splitlines()[-1].startswith("HFU, not MFU: the megatron-deepspeed formula")
    plain = sweep_summary_table(SimpleNamespace(name="s"), [record("b", _with(False, "megatron-deepspeed", 0.3))])
    assert "HFU" not in plain


def test_a_long_reason_is_wrapped_not_a_separator_line_of_its_length():
    """A stored rate that is no ceiling gave a 300-character reason, and the table a separator line
    of 399 characters: every line is now within the width, and the reason is all there."""
    from hwbench.report.summary import run_summary_table
    from hwbench.report.terminal import WIDEST

    data = json.loads(TEMPLATE.read_text())
    reason = ("the fp32 rate of AMD EPYC driver torch 2.13.0+cpu, 2 threads in /root/.cache/hwbench/calibration.json "
              "is no ceiling (its repetitions spread by CV 11.0% (more than 10%): the device did "
              "not run at one rate; other work took 39% of the time of the CPUs it ran on): run hwbench calibrate "
              "--device cpu --precisions fp32 when the machine is quiet")
    data["metrics"]["unmeasured"]["mfu_measured_ceiling"] = reason
    table = run_summary_table(RunResult.from_dict(data))
    lines = table.splitlines()
    assert max(map(len, lines)) <= WIDEST, table
    assert not any(reason in line for line in lines)  # wrapped...
    assert " ".join(reason.split()) in " ".join(table.split())  # ...and all of it there, in order


def test_a_table_fits_the_width_without_cutting_figures_or_names():
    from hwbench.report.terminal import text_table

    # "1,024" in a wrapped column: tabulate's own wrapping read it as an int and raised ValueError
    rows = [["one", "fp16+recompute", "12,345.6", "x " * 150], ["two", "deepspeed zero3", "7.0", "1,024"]]
    table = text_table(rows, headers=["point", "variant", "tokens/s", "note"], width=100, disable_numparse=True)
    assert max(map(len, table.splitlines())) <= 100
    assert "fp16+recompute" in table and "12,345.6" in table  # a word stays whole
    assert text_table(rows[1:], headers=["point", "variant", "tokens/s", "note"], width=100).count("\n") == 2
