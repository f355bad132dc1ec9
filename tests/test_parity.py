"""`hwbench parity`: identical seeded runs agree; a perturbed one does not."""

import json
import math
from pathlib import Path

import pytest
from conftest import SEEDED_TINY_RUN

from hwbench.cli import main


@pytest.fixture
def two_runs(seeded_tiny_runs):
    """conftest's two identical seeded runs (SEEDED_TINY_RUN): read them, copy them to change them."""
    return seeded_tiny_runs


def test_identical_seeded_runs_have_parity(two_runs, capsys):
    assert main(["parity", str(two_runs[0]), str(two_runs[1])]) == 0
    out = capsys.readouterr().out
    assert "PARITY: the curves agree" in out and "largest step difference 0.000%" in out
    header, rule = out.splitlines()[3:5]  # the step table: no empty column when no step is over
    assert header.split() == ["step", "loss", "A", "loss", "B", "rel", "diff"] and len(rule.split()) == 4


def _perturbed_copy(path, tmp_path, from_step, factor):
    data = json.loads(path.read_text())
    for step in data["steps"]:
        if step["step"] >= from_step:
            step["loss"] *= factor
    target = tmp_path / "perturbed.json"
    target.write_text(json.dumps(data))
    return target


def test_a_perturbed_run_fails_where_it_diverges(two_runs, tmp_path, capsys):
    perturbed = _perturbed_copy(two_runs[1], tmp_path, from_step=4, factor=1.05)
    assert main(["parity", str(two_runs[0]), str(perturbed)]) == 1
    out = capsys.readouterr().out
    assert "NO PARITY: the curves first diverge at step 4" in out
    assert "over tolerance" in out.splitlines()[3] and "OVER" in out


def test_tolerance_option_decides(two_runs, tmp_path):
    # from step 3 of 7: past the convergence check's first tier (0.5%), inside its second (1%)
    perturbed = _perturbed_copy(two_runs[1], tmp_path, from_step=3, factor=1.01)
    assert main(["parity", str(two_runs[0]), str(perturbed)]) == 0  # 1% < default 2%
    assert main(["parity", "--tolerance", "0.005", str(two_runs[0]), str(perturbed)]) == 1


def test_unusable_input_exits_2(two_runs, tmp_path, capsys):
    data = json.loads(two_runs[1].read_text())
    for step in data["steps"]:
        step["step"] += 100
    shifted = tmp_path / "shifted.json"
    shifted.write_text(json.dumps(data))
    assert main(["parity", str(two_runs[0]), str(shifted)]) == 2
    assert "share no step" in capsys.readouterr().err
    assert main(["parity", "--tolerance", "5", str(two_runs[0]), str(two_runs[1])]) == 2
    truncated = tmp_path / "cut.json"
    truncated.write_text(two_runs[0].read_text()[:100])
    assert main(["parity", str(two_runs[0]), str(truncated)]) == 2


def test_validation_points_and_ppl(two_runs):
    result = json.loads(two_runs[0].read_text())
    metrics = result["metrics"]
    assert [v["step"] for v in metrics["validation"]] == [7]  # only after the last step by default
    point = metrics["validation"][-1]
    assert point["ppl"] == pytest.approx(math.exp(min(20.0, point["loss"])))
    assert metrics["valid_ppl"] == point["ppl"] and metrics["valid_ppl_step"] == 7
    assert point["tokens"] == 1 * 8 * 32  # eval_iters x global batch x seq
    assert metrics["ppl_floor"] == pytest.approx(math.exp(metrics["loss_floor"]))
    assert metrics["ppl_floor"] < metrics["valid_ppl"]


def test_eval_interval_is_kept_out_of_step_times(tmp_path):
    assert main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--steps", "4", "--warmup", "1",
                 "--eval-interval", "2",
                 "--eval-iters", "2", "--out", str(tmp_path)]) == 0
    result = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [v["step"] for v in result["metrics"]["validation"]] == [2, 4, 5]
    assert result["metrics"]["step_time_s"]["n"] == 4
    assert all(s["time_s"] is not None for s in result["steps"] if s["phase"] == "timed")
    losses = [v["loss"] for v in result["metrics"]["validation"]]
    assert losses[-1] < losses[0]  # validation loss falls as it trains


def _copy_with(path, tmp_path, name, change):
    data = json.loads(path.read_text())
    change(data)
    target = tmp_path / name
    target.write_text(json.dumps(data))
    return target


def test_the_convergence_check_passes_a_run_that_converges_as_its_reference(two_runs, capsys):
    assert main(["parity", str(two_runs[0]), str(two_runs[1])]) == 0
    out = capsys.readouterr().out
    assert "CONVERGENCE: A converges as the reference does" in out and "r = 1.0000" in out


def test_the_tight_early_tier_catches_a_start_the_plain_tolerance_lets_through(two_runs, tmp_path, capsys):
    def first_step_off(data):  # 0.8% off at step 1: inside the 2% tolerance, outside the first tier's 0.5%
        data["steps"][0]["loss"] *= 1.008
    early = _copy_with(two_runs[1], tmp_path, "early.json", first_step_off)
    assert main(["parity", str(early), str(two_runs[0])]) == 1
    out = capsys.readouterr().out
    assert "PARITY: the curves agree within tolerance" in out
    assert "NUMERICALLY DIFFERENT from the reference: loss 0.79% off the reference at step 1" in out
    assert "allow 0.5%" in out


def test_a_final_perplexity_beyond_the_margin_is_numerically_different(two_runs, tmp_path, capsys):
    def worse_ppl(data):
        data["metrics"]["valid_ppl"] *= 1.10
    worse = _copy_with(two_runs[1], tmp_path, "worse.json", worse_ppl)
    assert main(["parity", str(worse), str(two_runs[0])]) == 1
    out = capsys.readouterr().out
    assert "is 10.0% off the reference's" in out and "(margin 5%)" in out


@pytest.fixture(scope="module")
def changed_recipe(tmp_path_factory):
    """The runs of two_runs with a 5x learning rate: a changed recipe, numerically different."""
    out = tmp_path_factory.mktemp("lr")
    assert main([*SEEDED_TINY_RUN, "--lr", "5e-3", "--out", str(out)]) == 0
    return next(out.glob("*.json"))


def test_a_run_with_a_changed_recipe_fails_the_convergence_check(two_runs, changed_recipe, capsys):
    assert main(["parity", str(changed_recipe), str(two_runs[0])]) == 1
    text = capsys.readouterr().out
    assert "NUMERICALLY DIFFERENT from the reference" in text and "final validation PPL" in text


def test_the_report_marks_a_numerically_different_run_and_leaves_it_out(two_runs, changed_recipe, tmp_path,
                                                                          capsys):
    results = tmp_path / "results"
    results.mkdir()
    for path in (two_runs[1], changed_recipe):
        (results / path.name).write_text(path.read_text())
    page = tmp_path / "report.md"
    assert main(["report", str(results), "--reference", str(two_runs[0]), "--out", str(page)]) == 0
    text = page.read_text()
    assert "2 result(s): 1 ok, 1 numerically different" in text
    assert "numerically different from the reference" in text and "final validation PPL" in text
    assert "left out of the decision and every comparison (--keep-different keeps it)" in text
    assert main(["report", str(results), "--reference", str(two_runs[0]), "--keep-different", "--out",
                 str(page)]) == 0
    kept = page.read_text()
    assert "2 result(s): 2 ok" in kept and "kept in the comparisons (--keep-different)" in kept
    assert main(["report", str(results), "--reference", str(tmp_path / "missing.json")]) == 2
    assert "--reference" in capsys.readouterr().err


def test_an_empty_reference_is_one_line_naming_it(tmp_path, capsys):
    result = Path(__file__).parent / "data" / "compare" / "tiny-cpu.json"
    page = tmp_path / "report.md"  # "" was read as the current folder: "--reference : .: not a regular file"
    assert main(["report", str(result), "--reference", "", "--out", str(page)]) == 2
    err = capsys.readouterr().err
    assert "--reference '' is not accepted; give a result file" in err and len(err.strip().splitlines()) == 1
    assert not page.exists()
