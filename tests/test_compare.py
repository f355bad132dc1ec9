"""`hwbench compare` and `hwbench system`: fast, no training.

tests/data/compare/tiny-cpu.json is one real result (`hwbench run --quiet --model tiny
--steps 2 --warmup 1 --eval-iters 0`); the tests write modified copies of it (other
throughput, seed, status, environment) into tmp_path.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from hwbench.cli import main as cli_main
from hwbench.cli import run_command
from hwbench.errors import UsageError
from hwbench.judge import compare
from hwbench.metrics import METRICS
from hwbench.report import system
from hwbench.result.model import RunResult
from hwbench.result.store import load_result, write_result

TEMPLATE = Path(__file__).parent / "data" / "compare" / "tiny-cpu.json"


def template() -> dict:
    return json.loads(TEMPLATE.read_text())


def write(folder: Path, tokens: list[float], *, start_seed: int = 1234, status: str = "ok", env: dict | None = None,
          spec: dict | None = None, point: str | None = "one-rank", repeats: int | None = None) -> Path:
    """One result per value in ``tokens`` (repeats with seeds start_seed, +1, ...); ``repeats``: what
    the sweep asked for (default: as many as ``tokens``)."""
    for repeat, value in enumerate(tokens):
        data = template()
        data["run_id"] = f"{folder.name}-{data['spec']['model']}-{repeat}-{value}-{status}".replace(".", "_")
        data["spec"]["seed"] = start_seed + repeat
        data["spec"].update(spec or {})
        data["environment"].update(env or {})
        data["status"] = status
        if status == "ok":
            seq = data["spec"]["seq_length"]
            data["metrics"]["tokens_per_s"] = value
            data["metrics"]["samples_per_s"] = value / seq
            data["metrics"]["step_time_s"]["median"] = data["spec"]["global_batch_size"] * seq / value
        else:
            data["metrics"], data["steps"] = {}, []
            data["error"] = {"type": "RuntimeError", "message": "boom", "traceback": None, "rank": 0}
        if point:
            data["sweep"] = {"suite": "nightly", "suite_path": "x", "point": point, "repeat": repeat,
                             "repeats": repeats or len(tokens), "key": f"k{repeat}"}
        write_result(RunResult.from_dict(data), folder)
    return folder


def run(capsys, *argv) -> tuple[int, str, str]:
    code = run_command("compare", [str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def verdicts(out: str) -> str:
    return out.split("\n\n")[1]  # the table


def test_template_is_a_real_result():
    result = load_result(TEMPLATE)
    assert result.status == "ok" and result.metrics.tokens_per_s > 0 and result.environment.torch_version


# --- Mann-Whitney U against hand-computed values ------------------------------


def test_mann_whitney_exact_separated_3v3():
    # U = 0; the exact null distribution of U for 3 vs 3 has 20 equally likely
    # assignments, one with U = 0 and one with U = 9: p = 2/20.
    u, p, method = compare.mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert (u, method) == (0, "exact") and p == pytest.approx(0.1)
    u, p, _ = compare.mann_whitney_u([4, 5, 6], [1, 2, 3])
    assert u == 9 and p == pytest.approx(0.1)


def test_mann_whitney_exact_interleaved():
    # x ranks 1, 3, 5: R = 9, U = 9 - 6 = 3, mean 4.5. Counts of U = 0..9 for 3 vs 3 are
    # 1 1 2 3 3 3 3 2 1 1; |U - 4.5| >= 1.5 covers U <= 3 and U >= 6: 14/20.
    u, p, _ = compare.mann_whitney_u([1, 3, 5], [2, 4, 6])
    assert u == 3 and p == pytest.approx(0.7)


def test_mann_whitney_exact_with_ties():
    # pooled 1 2 2 3 -> midranks 1, 2.5, 2.5, 4; x = [1, 2]: R = 3.5, U = 3.5 - 3 = 0.5,
    # mean 2. The 6 assignments of 2 ranks to x have rank sums 3.5, 3.5, 5, 5, 6.5, 6.5,
    # so U = 0.5, 0.5, 2, 2, 3.5, 3.5; |U - 2| >= 1.5 for 4 of them: p = 4/6.
    u, p, _ = compare.mann_whitney_u([1, 2], [2, 3])
    assert u == 0.5 and p == pytest.approx(4 / 6)


def test_mann_whitney_ties_with_a_lopsided_distribution():
    # pooled 1 1 1 1 2 -> midranks 2.5 x4, 5; x = [1, 1, 1]: R = 7.5, U = 7.5 - 6 = 1.5, mean 3. Of the
    # 10 assignments of 3 ranks to x, 4 give U = 1.5 and 6 give U = 4 (2.5 + 2.5 + 5 - 6): only the
    # 4 are as far from the mean, p = 4/10. Doubling the smaller tail, as a two-sided test of a
    # symmetric distribution may, would say 2 x 4/10 = 0.8.
    u, p, method = compare.mann_whitney_u([1, 1, 1], [1, 2])
    assert (u, method) == (1.5, "exact") and p == pytest.approx(0.4)


def test_mann_whitney_needs_two_values_a_side():
    with pytest.raises(ValueError, match="at least two values"):
        compare.mann_whitney_u([1], [2, 3, 4])


def test_mann_whitney_normal_approximation():
    # 10 vs 10 completely separated: U = 0, mean 50, variance 10*10*21/12 = 175,
    # z = (50 - 0.5) / sqrt(175), p = erfc(z / sqrt 2).
    u, p, method = compare.mann_whitney_u(list(range(1, 11)), list(range(11, 21)))
    assert (u, method) == (0, "normal")
    assert p == pytest.approx(math.erfc(49.5 / math.sqrt(175) / math.sqrt(2)))
    assert p == pytest.approx(1.83e-4, rel=0.01)


def test_mann_whitney_all_tied():
    assert compare.mann_whitney_u([5, 5, 5], [5, 5, 5])[1] == 1.0


# --- thresholds ----------------------------------------------------------------


@pytest.mark.parametrize("text,value", [("5%", 0.05), ("0.05", 0.05), ("2.5%", 0.025), ("0", 0.0)])
def test_threshold_forms(text, value):
    assert compare.parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "-5%", "-0.1", "5", "150%", "nan"])
def test_bad_threshold_is_a_usage_error(tmp_path, text):
    base = write(tmp_path / "base", [100.0])
    with pytest.raises(UsageError, match="--threshold"):
        run_command("compare", [str(base), str(base), "--threshold", text])


# --- verdicts ------------------------------------------------------------------


def test_planted_10_percent_regression_with_3_repeats(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [900.0, 905.0, 898.0], start_seed=2000)
    code, out, _ = run(capsys, base, cur, "--threshold", "5%")
    assert code == 3
    table = verdicts(out)
    assert "regression" in table and "separated" in table and "-10." in table
    assert "nightly/one-rank" in table and "(n=3)" in table


@pytest.mark.parametrize("base_values, cur_values, extra", [
    ([1000.0, 1030.0, 980.0], [990.0, 1000.0, 970.0], ()),
    ([1000.0, 1001.0, 1002.0], [980.0, 981.0, 982.0], ("--threshold", "0.05")),
], ids=["two-percent-change", "separated-but-below-threshold"])
def test_change_is_within_noise(tmp_path, capsys, base_values, cur_values, extra):
    base = write(tmp_path / "base", base_values)
    cur = write(tmp_path / "cur", cur_values)
    code, out, _ = run(capsys, base, cur, *extra)
    assert code == 0 and "within noise" in verdicts(out)


def test_a_large_change_the_repeats_cannot_judge_is_inconclusive_not_within_noise(tmp_path, capsys):
    """Median 1000 -> 700 tokens/s (-30%) with 3 noisy runs a side: the test cannot show it, which
    is not the same as no change; exit 0, and it is said."""
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [700.0, 1300.0, 650.0])
    code, out, _ = run(capsys, base, cur)
    assert code == 0
    table = verdicts(out)
    assert "inconclusive: not significant with 3 and 3 runs" in table and "within noise" not in table
    assert "-30.00%" in table and "0 regression(s), 0 improvement(s), 1 inconclusive" in out


def test_every_figure_printed_carries_its_unit(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [900.0, 905.0, 898.0])
    _, out, _ = run(capsys, base, cur)
    assert "1,000 tokens/s (n=3)" in verdicts(out) and "900 tokens/s (n=3)" in verdicts(out)
    _, out, _ = run(capsys, base, cur, "--metric", "step_time_median")
    seconds = template()["spec"]["global_batch_size"] * template()["spec"]["seq_length"] / 1000.0
    assert f"{seconds:.4g} s (n=3)" in verdicts(out)


def test_json_output_for_ci(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [900.0, 905.0, 898.0])
    code, out, _ = run(capsys, base, cur, "--format", "json")
    data = json.loads(out)
    assert code == data["exit_status"] == 3
    assert (data["metric"], data["unit"], data["threshold"]) == ("tokens_per_s", "tokens/s", 0.05)
    [point] = data["points"]
    assert point["outcome"] == "regression" and point["verdict"] == "regression"
    assert point["baseline"]["median"] == 1000.0 and point["current"]["values"] == [900.0, 905.0, 898.0]
    assert point["change"] == pytest.approx(-0.1) and point["p"] == pytest.approx(0.1)
    assert point["key"]["model"] == "tiny" and point["key"]["seq_length"] == 128
    assert data["counts"] == {"regression": 1, "improvement": 0, "inconclusive": 0, "repeats failed": 0}


def test_junit_output_is_read_by_a_junit_consumer(tmp_path, capsys):
    """A regression, an inconclusive change, a pass and a missing point, read back with junitparser
    (the parser pytest-based CI tools use): failed, skipped, passed, failed (skipped when allowed)."""
    junitparser = pytest.importorskip("junitparser")
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0], point="regressed")
    write(base, [500.0, 505.0, 495.0], spec={"seq_length": 64}, point="noisy")
    write(base, [300.0, 301.0, 302.0], spec={"seq_length": 32}, point="same")
    write(base, [200.0], spec={"precision": "bf16"}, point="gone")
    cur = write(tmp_path / "cur", [900.0, 905.0, 898.0], point="regressed")
    write(cur, [350.0, 650.0, 330.0], spec={"seq_length": 64}, point="noisy")
    write(cur, [301.0, 300.0, 303.0], spec={"seq_length": 32}, point="same")
    junit = tmp_path / "out" / "compare.xml"
    junit.parent.mkdir()
    code, _, _ = run(capsys, base, cur, "--junit", junit)
    assert code == 3
    suites = junitparser.JUnitXml.fromfile(str(junit))
    [suite] = list(suites)
    assert (suite.name, suite.tests, suite.failures, suite.skipped, suite.errors) == ("hwbench compare", 4, 2, 1, 0)
    outcome = {}
    for case in suite:
        [result] = case.result or [None]
        outcome[case.name.split(" ")[0]] = (type(result).__name__ if result else "passed",
                                            result.message if result else "")
        assert case.classname == "tokens_per_s"
    assert outcome["nightly/regressed"][0] == "Failure" and "change -10.00%" in outcome["nightly/regressed"][1]
    assert outcome["nightly/noisy"] == ("Skipped", outcome["nightly/noisy"][1])
    assert outcome["nightly/noisy"][1].startswith("inconclusive: not significant with 3 and 3 runs")
    assert outcome["nightly/same"] == ("passed", "")
    assert outcome["nightly/gone"][0] == "Failure" and "missing from CURRENT" in outcome["nightly/gone"][1]
    code, _, _ = run(capsys, base, cur, "--junit", junit, "--allow-missing")
    suite = list(junitparser.JUnitXml.fromfile(str(junit)))[0]
    assert code == 3 and (suite.failures, suite.skipped) == (1, 2)


def test_junit_path_that_would_destroy_an_input_is_refused(tmp_path):
    base = write(tmp_path / "base", [1000.0])
    cur = write(tmp_path / "cur", [1000.0])
    victim = next(base.glob("*.json"))
    before = victim.read_bytes()
    with pytest.raises(UsageError, match="--junit .* is one of the input files"):
        run_command("compare", [str(base), str(cur), "--junit", str(victim)])
    assert victim.read_bytes() == before
    with pytest.raises(UsageError, match="--junit '' is not accepted"):  # it was taken as no --junit
        run_command("compare", [str(base), str(cur), "--junit", ""])


def test_improvement(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [1100.0, 1120.0, 1105.0])
    code, out, _ = run(capsys, base, cur)
    assert code == 0 and "improvement" in verdicts(out) and "1 improvement(s)" in out


def test_lower_is_better_metric(tmp_path, capsys):
    # tokens/s down 10% -> step time up 11%: a regression in step_time_median too
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [900.0, 905.0, 898.0])
    code, out, _ = run(capsys, base, cur, "--metric", "step_time_median")
    assert code == 3 and "lower is better" in out and "+11." in verdicts(out)


def _with_moe_figures(folder: Path, imbalances: list[float], shares: list[float]) -> Path:
    """``folder``'s results (one per repeat, in order) given an MoE run's imbalance and an
    expert-parallel run's all-to-all share, as `hwbench run --ep 2` records them."""
    for file, imbalance, share in zip(sorted(folder.glob("*.json")), imbalances, shares, strict=True):
        data = json.loads(file.read_text())
        data["spec"]["parallel"]["ep"] = 2
        data["metrics"]["routing"] = {"imbalance_median": imbalance, "imbalance_max": imbalance + 0.1}
        data["metrics"]["expert_parallel"] = {"ep": 2, "all_to_all_share": share}
        file.write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("metric, base, cur, change", [
    ("moe_imbalance", ([1.10, 1.11, 1.09], [0.2] * 3), ([1.32, 1.31, 1.33], [0.2] * 3), "+20."),
    ("all_to_all_share", ([1.1] * 3, [0.20, 0.21, 0.20]), ([1.1] * 3, [0.26, 0.25, 0.26]), "+30."),
], ids=["imbalance", "all-to-all-share"])
def test_more_expert_imbalance_or_all_to_all_time_is_a_regression(tmp_path, capsys, metric, base, cur, change):
    """Tokens piled on fewer experts, or more of the step in the all-to-alls, at the same throughput:
    the regression compare names (lower is better), exit 3; the same figures are no regression."""
    baseline = _with_moe_figures(write(tmp_path / "base", [1000.0, 1010.0, 995.0]), *base)
    current = _with_moe_figures(write(tmp_path / "cur", [1000.0, 1010.0, 995.0]), *cur)
    code, out, _ = run(capsys, baseline, current, "--metric", metric)
    assert code == 3 and "lower is better" in out and "regression" in verdicts(out) and change in verdicts(out)
    assert run(capsys, baseline, baseline, "--metric", metric)[0] == 0
    assert "EP2" in verdicts(out)  # the point's layout names its expert parallelism


def test_single_values_use_the_threshold_only(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0])
    same = write(tmp_path / "same", [980.0])
    code, out, _ = run(capsys, base, same)
    assert code == 0 and "no repeats: threshold only" in out and "no repeats" in verdicts(out).splitlines()[-1]
    slow = write(tmp_path / "slow", [900.0, 905.0, 898.0])  # 3 values here, 1 there: still threshold only
    code, out, _ = run(capsys, base, slow)
    assert code == 3 and "no repeats: threshold only" in out and "regression" in verdicts(out)
    assert ("1 point(s) have a single run on a side: with one run per side significance cannot be judged, so the "
            "5% threshold alone decided them (1 regression(s), 0 improvement(s), 0 within it)") in out


def test_repeats_on_both_sides_need_no_threshold_only_note(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [900.0, 905.0, 898.0])
    code, out, _ = run(capsys, base, cur)
    assert code == 3 and "significance cannot be judged" not in out


def test_failed_in_current_is_a_regression(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [0.0, 0.0], status="failed")
    code, out, _ = run(capsys, base, cur)
    assert code == 3 and "regression: failed in current" in verdicts(out)


def test_failed_repeats_fail_the_gate_with_their_own_verdict_and_status(tmp_path, capsys):
    """Three ok runs in the baseline, one ok and two failed tonight: the one ok figure is within the
    threshold, but the gate cannot vouch for a point whose repeats failed (it read "no repeats", exit 0)."""
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [1002.0], repeats=3)
    write(cur, [0.0, 0.0], status="failed", repeats=3, start_seed=1235)
    code, out, err = run(capsys, base, cur)
    assert code == compare.REPEATS_EXIT == 5
    assert "repeats failed: 1 of 3 repeats ok; baseline had 3" in verdicts(out)
    assert "1 with failed repeats" in out
    assert "1 point(s) have fewer ok repeats" in err
    data = json.loads(run(capsys, base, cur, "--format", "json")[1])
    assert data["exit_status"] == 5 and data["counts"]["repeats failed"] == 1
    assert data["points"][0]["outcome"] == "repeats failed"
    junit = tmp_path / "compare.xml"
    assert run(capsys, base, cur, "--junit", junit)[0] == 5
    assert '<failure message="repeats failed: 1 of 3 repeats ok; baseline had 3' in junit.read_text()
    assert 'type="repeats failed"' in junit.read_text()


def test_fewer_ok_repeats_than_the_baseline_had_fail_the_gate(tmp_path, capsys):
    """Tonight's sweep asked for 1 repeat, the baseline had 3: the figure is the threshold's alone."""
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [1002.0])
    code, out, _ = run(capsys, base, cur)
    assert code == compare.REPEATS_EXIT and "repeats failed: 1 of 1 repeats ok; baseline had 3" in verdicts(out)


def test_a_regression_with_failed_repeats_stays_a_regression(tmp_path, capsys):
    """The stronger verdict wins: a point 30% down whose other repeats failed is a regression (exit 3)."""
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [700.0], repeats=3)
    write(cur, [0.0, 0.0], status="oom", repeats=3, start_seed=1235)
    code, out, _ = run(capsys, base, cur)
    assert code == compare.REGRESSION_EXIT
    assert verdicts(out).splitlines()[-1].rstrip().endswith("regression") and "repeats failed" not in out


def test_a_baseline_point_that_failed_on_both_sides_does_not_pass(tmp_path, capsys):
    """No ok run in the baseline nor tonight: "no figure on either side" passed with exit 0."""
    base = write(tmp_path / "base", [0.0, 0.0, 0.0], status="failed")
    cur = write(tmp_path / "cur", [0.0, 0.0, 0.0], status="timeout")
    code, out, _ = run(capsys, base, cur)
    assert code == compare.REPEATS_EXIT and "repeats failed: 0 of 3 repeats ok; baseline had 0" in verdicts(out)


def test_skipped_repeats_and_a_multi_night_baseline_are_no_shortfall(tmp_path, capsys):
    """A repeat the planner skipped (it will not fit) was not asked to run; a baseline folder of two
    nights of 3 repeats had 3 a night, not 6."""
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    write(base, [1001.0, 1003.0, 998.0], start_seed=1300)
    cur = write(tmp_path / "cur", [1002.0, 1000.0, 1005.0])
    code, out, _ = run(capsys, base, cur)
    assert code == 0 and "within noise" in verdicts(out)
    both = write(tmp_path / "both-skipped", [0.0], status="skipped", repeats=1)
    code, out, _ = run(capsys, both, write(tmp_path / "skipped", [0.0], status="skipped", repeats=1))
    assert code == 0 and "no figure on either side" in verdicts(out)


def test_sweep_record_without_spec_joins_its_point(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = tmp_path / "cur"
    data = template()
    record = {"run_id": "x-one-rank-sweep-abc", "status": "timeout", "spec": {"run_args": ["--model", "tiny"]},
              "sweep": {"suite": "nightly", "point": "one-rank", "repeat": 0, "repeats": 1, "key": "k"},
              "environment": {}, "hwbench_version": data["hwbench_version"]}
    write_result(RunResult.from_dict(record), cur)
    code, out, _ = run(capsys, base, cur)
    assert code == 3 and "regression: timeout in current" in verdicts(out)


def test_environment_difference_is_warned(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [1001.0, 1009.0, 996.0], env={"torch_version": "2.14.0+cpu"})
    code, _, err = run(capsys, base, cur)
    assert code == 0
    assert "warning: environments differ: torch_version 2.13.0+cpu (baseline) vs 2.14.0+cpu (current)" in err


def test_a_different_backend_tuning_is_warned(tmp_path, capsys):
    """HWBENCH_CPU_ALLOCATOR_TUNING=0 on one side: slower by itself (found by running the
    nightly workflow's steps on the CPU), so the comparison says so."""
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    tuning = {**template()["environment"]["tuning"], "allocator": "unchanged (HWBENCH_CPU_ALLOCATOR_TUNING=0)"}
    cur = write(tmp_path / "cur", [1001.0, 1009.0, 996.0], env={"tuning": tuning})
    code, _, err = run(capsys, base, cur)
    assert code == 0
    line = next(line for line in err.splitlines() if "environments differ: tuning" in line)
    assert "allocator=glibc: mmap off" in line and "allocator=unchanged (HWBENCH_CPU_ALLOCATOR_TUNING=0)" in line


def test_points_only_on_one_side_are_listed(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0])
    write(tmp_path / "base", [500.0], spec={"precision": "bf16"}, point="bf16")
    cur = write(tmp_path / "cur", [1000.0])
    write(tmp_path / "cur", [400.0], spec={"seq_length": 64}, point="short")
    code, out, err = run(capsys, base, cur)
    assert code == compare.MISSING_EXIT == 4  # the gate cannot vouch for a point it did not see
    assert "only in baseline (missing from current):\n  nightly/bf16" in out
    assert "only in current:\n  nightly/short" in out
    assert "1 baseline point(s) have no result in CURRENT" in err and "--allow-missing" in err
    code, _, _ = run(capsys, base, cur, "--allow-missing")
    assert code == 0


def _unreadable_variants():
    nested = "[" * 100_000 + "]" * 100_000
    data = template()
    negative = copy.deepcopy(data)
    negative["metrics"]["tokens_per_s"] = -5.0
    infinite = json.dumps(data).replace(
        '"tokens_per_s": ' + json.dumps(data["metrics"]["tokens_per_s"]), '"tokens_per_s": Infinity', 1
    )
    return {
        "truncated": (json.dumps(data)[:700], "not a complete JSON document"),
        "empty": ("", "not a complete JSON document"),
        "binary": (b"\x89PNG\r\n\x1a\n\xff\xfe", "not UTF-8"),
        "a list": ("[1, 2, 3]", "not an hwbench result"),
        "unknown schema": (
            json.dumps({**data, "schema_version": 99}),
            "schema_version 99 is newer than this hwbench reads (4); upgrade hwbench",
        ),
        "null spec": (json.dumps({**data, "spec": None}), "field spec: must be a mapping, not null"),
        "deep nesting": (nested, "nested too deeply"),
        "negative throughput": (json.dumps(negative), "metrics.tokens_per_s: must be >= 0"),
        "infinite throughput": (infinite, "metrics.tokens_per_s: must be a finite number"),
    }


@pytest.mark.parametrize("variant", list(_unreadable_variants()))
def test_an_unreadable_current_file_is_named_and_fails_the_gate(tmp_path, capsys, variant):
    """A regressed point whose current file is damaged must not pass as 'only in baseline'
    with exit 0: the file is named with its reason, and the gate fails."""
    base = write(tmp_path / "base", [1000.0])
    write(tmp_path / "base", [500.0], spec={"precision": "bf16"}, point="bf16")
    cur = write(tmp_path / "cur", [1000.0])
    write(cur, [400.0], spec={"precision": "bf16"}, point="bf16")
    assert run(capsys, base, cur)[0] == compare.REGRESSION_EXIT  # intact: -20%, a regression
    target = next(p for p in cur.glob("*.json") if "400" in p.name)
    content, reason = _unreadable_variants()[variant]
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, out, err = run(capsys, base, cur)
    assert code == compare.MISSING_EXIT
    assert f"CURRENT file left out: {target}: " in err and reason in err
    assert "unreadable files (left out):" in out and reason in out
    assert "only in baseline (missing from current):\n  nightly/bf16" in out


def simulated(folder: Path) -> Path:
    """The results in ``folder`` as a stand-in writes them: the device and the environment marked simulated."""
    for path in folder.glob("*.json"):
        data = json.loads(path.read_text())
        data["device"]["simulated"] = data["environment"]["simulated"] = True
        path.write_text(json.dumps(data))
    return folder


def test_a_stand_in_result_is_never_compared_with_the_devices_own(tmp_path):
    """A real baseline against the same point run through a stand-in (this host's figures, 100x
    slower) was a -99% regression; it is no point in common, and the line says which side was simulated."""
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = simulated(write(tmp_path / "cur", [10.0, 11.0, 9.0]))
    with pytest.raises(UsageError, match=r"no point in common.*the closest pair differs in measured on the device "
                                         r"in baseline, simulated in current \(a stand-in's figures are never "
                                         r"compared with the device's\);"):
        run_command("compare", [str(base), str(cur)])


def test_a_simulated_point_beside_compared_ones_is_named_not_compared(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    write(base, [400.0, 405.0, 398.0], spec={"seq_length": 64}, point="short")
    cur = simulated(write(tmp_path / "cur", [10.0, 11.0, 9.0]))
    write(cur, [401.0, 404.0, 399.0], spec={"seq_length": 64}, point="short")
    code, out, err = run(capsys, base, cur)
    assert code == compare.MISSING_EXIT  # the device's point has no result in CURRENT: the gate cannot vouch for it
    assert "1 points compared: 0 regression(s)" in out
    label = "tiny on Intel(R) Xeon(R) Processor fp32, seq 128"
    assert (f"warning: not compared: nightly/one-rank ({label}) (baseline) with nightly/one-rank "
            f"(tiny on Intel(R) Xeon(R) Processor [simulated] fp32, seq 128) (current): measured on the device in "
            "baseline, simulated in current; a stand-in's figures are not the device's own (simulated: this host's; "
            "emulated: FP8 computed without FP8 units)") in err
    assert "only in current:\n  nightly/one-rank (tiny on Intel(R) Xeon(R) Processor [simulated] fp32" in out


def test_seed_out_dir_and_port_do_not_split_points(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0], spec={"out_dir": "/a"})
    data = template()
    launch = dict(data["spec"]["launch"], master_port=29500, timeout_s=60.0)
    cur = write(tmp_path / "cur", [1000.0], start_seed=9, spec={"out_dir": "/b", "launch": launch}, point=None)
    code, out, _ = run(capsys, base, cur)
    assert code == 0 and "1 points compared" in out and "only in" not in out


def test_compare_through_the_cli(tmp_path, capsys):
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    cur = write(tmp_path / "cur", [900.0, 905.0, 898.0])
    assert cli_main(["compare", str(base), str(cur)]) == 3
    assert cli_main(["compare", str(base), str(cur), "--threshold", "abc"]) == 2
    assert "--threshold 'abc'" in capsys.readouterr().err


# --- unusable input --------------------------------------------------------------


def test_empty_folder_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    base = write(tmp_path / "base", [1000.0])
    with pytest.raises(UsageError, match="CURRENT .*empty.*no hwbench result files"):
        run_command("compare", [str(base), str(tmp_path / "empty")])
    with pytest.raises(UsageError, match="BASELINE .*missing.*no such file"):
        run_command("compare", [str(tmp_path / "missing"), str(base)])


def test_no_common_point_is_a_usage_error_naming_the_field_that_differs(tmp_path):
    base = write(tmp_path / "base", [1000.0])
    cur = write(tmp_path / "cur", [1000.0], spec={"seq_length": 64})
    with pytest.raises(
        UsageError,
        match="no point in common.*the closest pair differs in seq_length 128 "
        r"\(baseline\) vs 64 \(current\);",
    ):
        run_command("compare", [str(base), str(cur)])


def test_bad_metric_is_a_usage_error(tmp_path):
    base = write(tmp_path / "base", [1000.0])
    with pytest.raises(UsageError, match="--metric"):
        run_command("compare", [str(base), str(base), "--metric", "speed"])


# --- system description ------------------------------------------------------------


def test_system_description_from_a_real_result():
    result = load_result(TEMPLATE)
    described = system.system_description(result)
    env = result.environment
    assert described["number_of_nodes"] == 1
    assert described["accelerator_backend"] == "cpu" and described["accelerators_per_node"] == 0
    assert described["accelerator_model_name"] is None
    assert described["host_processor_model_name"] == result.device.device_model
    assert described["host_processor_core_count"] == env.cpu_cores_usable
    assert described["host_memory_capacity"].endswith("GiB")
    assert described["framework"].startswith(f"PyTorch {env.torch_version}")
    assert described["operating_system"] == env.os
    assert described["hwbench_version"] == env.hwbench_version
    assert described["hwbench_git_commit"] == env.hwbench_git.commit
    assert described["accelerator_interconnect"] is None and described["cuda_version"] is None
    assert described["host_processors_per_node"] is None
    # the same from the dict and from the bare environment (what it lacks is null)
    assert system.system_description(result.to_dict()) == described
    bare = system.system_description(env)
    assert bare["operating_system"] == env.os and bare["number_of_nodes"] is None


def test_system_description_of_a_gpu_result():
    data = copy.deepcopy(template())
    data["device"].update(
        backend="cuda", device_model="NVIDIA H100 80GB HBM3", catalog_entry="h100-sxm", memory_capacity_bytes=85 * 2**30
    )
    data["spec"]["launch"].update(nnodes=2, nproc_per_node=8)
    data["environment"].update(backend="cuda", driver_version="550.54", cuda_version="12.4")
    described = system.system_description(data)
    assert described["system_name"] == "2x8 NVIDIA H100 80GB HBM3"
    assert described["accelerators_per_node"] == 8 and described["number_of_nodes"] == 2
    assert described["accelerator_interconnect"].startswith("NVLink 4")
    assert described["accelerator_memory_capacity"] == "85.0 GiB" and described["host_memory_capacity"] is None
    assert (described["driver_version"], described["cuda_version"]) == ("550.54", "12.4")


def test_system_main_prints_and_writes(tmp_path, capsys):
    out = tmp_path / "sys.json"
    assert run_command("system", [str(TEMPLATE), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text()) and printed["accelerator_backend"] == "cpu"
    with pytest.raises(UsageError, match="RESULT_FILE"):
        run_command("system", [str(tmp_path / "nothing.json")])


def test_report_and_system_out_unwritable_is_one_line_and_leaves_nothing(tmp_path):
    from hwbench.report import build, system  # noqa: F401

    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where a folder is expected
    with pytest.raises(UsageError, match="--out .* lies under the file"):  # said before anything is read
        run_command("system", [str(TEMPLATE), "--out", str(blocked / "system.json")])
    with pytest.raises(UsageError, match="--out .* lies under the file"):
        run_command("report", [str(TEMPLATE), "--out", str(blocked / "report.md")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_tflops_and_mfu_are_compared_under_the_baselines_formula(tmp_path, capsys):
    """A baseline written with the full-score count (megatron-lm, no by_formula) against runs of
    the same speed under the new default: TFLOP/s read from the current runs' by_formula entry of
    the baseline's formula, so the new default is no 6 % regression."""
    base = write(tmp_path / "base", [1000.0, 1010.0, 995.0])
    for path in base.glob("*.json"):
        data = json.loads(path.read_text())
        data["metrics"].update(flops_formula="megatron-lm", tflops_per_device=1.0, mfu=0.5)
        path.write_text(json.dumps(data))
    cur = write(tmp_path / "cur", [1000.0, 1010.0, 995.0], start_seed=2000)
    for path in cur.glob("*.json"):
        data = json.loads(path.read_text())
        data["metrics"].update(
            flops_formula="megatron-core-v0.12",
            tflops_per_device=0.94,
            mfu=0.47,
            by_formula={
                "megatron-core-v0.12": {"flops_per_iteration": 94.0, "tflops_per_device": 0.94, "mfu": 0.47},
                "megatron-core-v0.7": {"flops_per_iteration": 100.0, "tflops_per_device": 1.0, "mfu": 0.5},
            },
        )
        path.write_text(json.dumps(data))
    for metric in ("tflops_per_device", "mfu"):
        code, out, _ = run(capsys, base, cur, "--metric", metric)
        assert code == 0 and "regression" not in verdicts(out), out
    # read under one formula only: a current run without that formula's figures has none
    stripped = load_result(next(cur.glob("*.json")))
    stripped.metrics.by_formula = None
    tflops = METRICS["tflops_per_device"]
    assert tflops.read(stripped, "megatron-core-v0.7") is None
    assert tflops.read(stripped, "megatron-core-v0.12") == 0.94


@pytest.mark.parametrize("recompute", [True, False])
def test_mfu_counted_by_a_formula_that_counts_recompute_is_named_hfu(tmp_path, capsys, recompute):
    """Runs measured with megatron-deepspeed: for a point that recomputes its mfu is HFU (the formula
    adds the recomputed forward), and compare says so, in text and JSON; without recompute, MFU."""
    sides = []
    spec = {"recompute": recompute, "flops_formula": "megatron-deepspeed"}
    for name, seed in (("base", 1234), ("cur", 2000)):
        folder = write(tmp_path / name, [1000.0, 1010.0, 995.0], start_seed=seed, spec=spec)
        for path in folder.glob("*.json"):
            data = json.loads(path.read_text())
            data["metrics"].update(flops_formula="megatron-deepspeed", mfu=0.5)
            path.write_text(json.dumps(data))
        sides.append(folder)
    code, out, _ = run(capsys, *sides, "--metric", "mfu")
    assert code == 0
    assert ("HFU, not MFU: the megatron-deepspeed formula counts" in out) == recompute, out
    code, out, _ = run(capsys, *sides, "--metric", "mfu", "--format", "json")
    hfu = json.loads(out)["hfu_points"]
    assert (list(hfu.values()) == ["megatron-deepspeed"]) if recompute else hfu == {}
    code, out, _ = run(capsys, *sides, "--metric", "tokens_per_s")
    assert "HFU" not in out


# --- baselines from ok runs only (`hwbench baseline save` and `copy`) -------------


def _night_with_failures(folder: Path) -> Path:
    """One point with 2 ok repeats and 1 failed; a second point whose repeats all failed."""
    write(folder, [1000.0, 1010.0], repeats=3)
    write(folder, [0.0], status="failed", repeats=3, start_seed=1236)
    write(folder, [0.0, 0.0], status="oom", spec={"seq_length": 64}, point="short")
    return folder


def test_baseline_save_leaves_out_failed_runs_and_points_saying_which_and_why(tmp_path, capsys):
    night = _night_with_failures(tmp_path / "night")
    out = tmp_path / "baseline.json"
    assert cli_main(["baseline", "save", str(night), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    [point] = json.loads(out.read_text())["points"]
    assert point["tokens_per_s"]["n"] == 2 and point["tokens_per_s"]["median"] == 1005.0
    left = [line for line in captured.err.splitlines() if line.startswith("hwbench baseline: left out ")]
    assert len(left) == 4, captured.err  # 3 runs and 1 point
    assert sum("status failed (boom); not in the baseline" in line for line in left) == 1
    assert sum("status oom (boom); not in the baseline" in line for line in left) == 2
    assert any(line.startswith("hwbench baseline: left out point nightly/short") and
               "no ok run (2 not ok); not a baseline point" in line for line in left)
    assert "1 point(s) from 5 result(s)" in captured.out


def test_baseline_copy_keeps_ok_runs_only_and_compare_judges_against_them(tmp_path, capsys):
    night = _night_with_failures(tmp_path / "night")
    base = tmp_path / "base"
    assert cli_main(["baseline", "copy", str(night), "--out", str(base)]) == 0
    captured = capsys.readouterr()
    copied = sorted(base.rglob("*.json"))
    assert [load_result(p).status for p in copied] == ["ok", "ok"]
    assert {p.read_bytes() for p in copied} == {p.read_bytes() for p in night.glob("*ok*.json")}
    assert captured.err.count("hwbench baseline: left out ") == 4 and "2 ok result file(s) of 5 copied" in captured.out
    # never written over: a folder that holds results is refused, and left as it was
    assert cli_main(["baseline", "copy", str(night), "--out", str(base)]) == 2
    assert "holds result files already" in capsys.readouterr().err and sorted(base.rglob("*.json")) == copied
    assert cli_main(["baseline", "copy", str(night), "--out", ""]) == 2  # was taken for ".", the current folder
    assert "--out '' is not accepted" in capsys.readouterr().err
    # no ok run: refused, nothing made
    failed = write(tmp_path / "failed", [0.0], status="failed")
    assert cli_main(["baseline", "copy", str(failed), "--out", str(tmp_path / "none")]) == 2
    assert "no ok result" in capsys.readouterr().err and not (tmp_path / "none").exists()
    # the point whose repeats all failed is no baseline point: tonight it is only in current
    code, out, _ = run(capsys, base, _night_with_failures(tmp_path / "tonight"))
    assert code == compare.REPEATS_EXIT and "only in current:\n  nightly/short" in out


# --- the drill of docs/compare.md ----------------------------------------------------


def _drill_script() -> str:
    """The bash block under "A drill: make the gate go red on purpose" in docs/compare.md."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "compare.md").read_text()
    section = page.split("### A drill: make the gate go red on purpose", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_the_drill_s_commands_parse_and_its_exits_are_the_gate_s(tmp_path, monkeypatch):
    """The default run's part of the drill (the drill itself, 7 tiny CPU runs, is `-m heavy`): its
    suite loads, each `hwbench` line parses as its command parses it, each HWBENCH_FAULT is one a run
    of that suite accepts, and the exits its comments expect are the ones compare and sweep give."""
    import re
    import shlex

    from hwbench.cli import command_parser
    from hwbench.harness.faults import FAULT_ENV, Fault
    from hwbench.suites.suite import load_suite

    script = _drill_script()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "drill.yaml").write_text(script.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0] + "\n")
    (point,) = load_suite("drill.yaml").points
    total_steps = point.option("warmup") + point.option("steps")
    commands = []
    for line in script.splitlines():
        words = shlex.split(line.split(";", 1)[0], comments=True)
        if "hwbench" not in words:
            continue
        at = words.index("hwbench")
        for assignment in words[:at]:  # the environment the line sets for its command
            name, value = assignment.split("=", 1)
            monkeypatch.setenv(name, value)
            assert name == FAULT_ENV and Fault.from_environ(1, total_steps) is not None, assignment
            monkeypatch.delenv(name)
        module, parser = command_parser(words[at + 1])
        argv = words[at + 2:]
        if hasattr(module, "parse"):
            module.parse(parser, argv)
        else:
            parser.parse_args(argv)
        commands.append((words[at + 1], re.search(r"# exit (\d+)", line).group(1)))
    assert commands == [("sweep", "0"), ("sweep", "0"), ("compare", str(compare.REGRESSION_EXIT)), ("sweep", "1"),
                        ("compare", str(compare.REPEATS_EXIT))]


@pytest.mark.slow
@pytest.mark.heavy  # the default run keeps what it is made of (README, Tests)
def test_the_drill_in_the_docs_makes_the_gate_go_red(tmp_path):
    """The drill's commands as written, with this checkout's `hwbench` on PATH: each prints the exit
    status its comment names (7 tiny CPU runs, 6 of them 2 s a step slower)."""
    import re
    import subprocess
    import sys

    script = _drill_script()
    expected = re.findall(r"# exit (\d+)", script)
    tool_bin = tmp_path / "bin"
    tool_bin.mkdir()
    (tool_bin / "hwbench").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m hwbench "$@"\n')
    (tool_bin / "hwbench").chmod(0o755)
    env = {"PATH": f"{tool_bin}:/usr/bin:/bin", "HOME": str(Path.home()),
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    printed = re.findall(r"^exit (\d+)$", proc.stdout, flags=re.MULTILINE)
    assert printed == expected == ["0", "0", "3", "1", "5"], proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "p=0.1 (exact U=9), separated" in proc.stdout
    assert "repeats failed: 2 of 3 repeats ok; baseline had 3" in proc.stdout
