"""`hwbench parity`: identical seeded runs agree; a perturbed one does not."""

import json
import math

import pytest

from hwbench.cli import main


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    paths = []
    for name in ("a", "b"):
        out = tmp_path_factory.mktemp(name)
        assert main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--steps", "6", "--warmup", "1",
                     "--eval-iters", "1",
                     "--out", str(out)]) == 0
        paths.append(next(out.glob("*.json")))
    return paths


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
    perturbed = _perturbed_copy(two_runs[1], tmp_path, from_step=2, factor=1.01)
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
