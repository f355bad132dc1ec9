"""Sweeps: every point recorded whatever happens, resumable, with repeats."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import kill_tree, process_gone

from hwbench.cli import main
from hwbench.errors import UsageError
from hwbench.result.store import load_results
from hwbench.stats import throughput_statistics
from hwbench.suites.suite import load_suite

REPO = Path(__file__).resolve().parent.parent
# two samples a step (one a rank on two): the sweeps here check what is recorded of each point, not its speed
FAST = {"model": "tiny", "data": "synthetic", "seq-length": 32, "steps": 2, "warmup": 1, "eval-iters": 0,
        "micro-batch-size": 1, "global-batch-size": 2, "telemetry": False, "timeout": 120}


def _suite(tmp_path: Path, points: list[dict], name: str = "t", **extra) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "defaults": FAST, "points": points, **extra}, sort_keys=False))
    return path


def _statuses(out: Path, suite: str) -> dict[str, list[str]]:
    found = {}
    for point_dir in sorted((out / suite).iterdir()):
        results, _ = load_results([point_dir])
        found[point_dir.name] = sorted(r.status for r in results)
    return found


# "raises" is one process (a rank of two that raises is tests/test_parallel.py's, through the same
# launcher as "killed" and "good-again" here): the worker's own record of its failure
FAULT_POINTS = [
    {"name": "good"},
    {"name": "raises", "env": {"HWBENCH_FAULT": "0:2:raise"}},
    {"name": "killed", "nproc-per-node": 2, "env": {"HWBENCH_FAULT": "1:2:signal"}},
    {"name": "hangs", "timeout": 4, "env": {"HWBENCH_FAULT": "0:2:hang"}},  # hung by 3 s here
    {"name": "bad-layout", "nproc-per-node": 2, "tp": 3},
    {"name": "too-big", "model": "3.7b", "seq-length": 32, "micro-batch-size": 1, "global-batch-size": 1},
    {"name": "good-again", "nproc-per-node": 2},
]
FAULT_STATUSES = {"good": ["ok"], "raises": ["failed"], "killed": ["failed"], "hangs": ["timeout"],
                  "bad-layout": ["invalid"], "too-big": ["skipped"], "good-again": ["ok"]}


@pytest.mark.slow
@pytest.mark.parametrize("points", [
    # "raises" is heavy too: to the sweep it is a point whose process exits 1 leaving a failed result, as
    # "killed" is; the one process's own record of its failure is tests/test_export.py's failed_result's
    # (the same `hwbench run`, in that test's process)
    pytest.param([point for point in FAULT_POINTS[:-1] if point["name"] != "raises"], id="faults"),
    # heavy (python -m pytest -m heavy): a 2-rank point that ends ok after the faults; the default run's
    # sweeps run points after failed ones (above) and 2-rank points that end ok (tests/test_accept.py's
    # and tests/test_tune.py's)
    pytest.param(FAULT_POINTS, id="and-a-2-rank-point-after", marks=pytest.mark.heavy),
])
def test_a_sweep_records_every_fault_and_keeps_the_good_results(tmp_path, capsys, points):
    suite = _suite(tmp_path, points)
    names = [point["name"] for point in points]
    out = tmp_path / "out"
    assert main(["sweep", str(suite), "--out", str(out)]) == 1  # not every point was ok
    assert _statuses(out, "t") == {name: FAULT_STATUSES[name] for name in names}
    results = {r.sweep.point: r for r in load_results([out])[0]}
    if "raises" in results:
        assert results["raises"].error.rank == 0 and "InjectedFault" in results["raises"].error.traceback
        assert results["raises"].error.message == "injected fault: rank 0 raised at step 2"
    killed = results["killed"]  # the launcher's record of a rank killed by a signal (test_parallel's, heavy)
    assert killed.error.rank == 1 and killed.error.signal == "SIGKILL" and "SIGKILL" in killed.error.message
    assert len(killed.ranks) == 2 and all(process_gone(r.pid) for r in killed.ranks), "a rank outlived the point"
    assert "--tp 3" in results["bad-layout"].error.message
    skipped = results["too-big"].error
    assert skipped.model_extra["predicted_peak_bytes"] > skipped.model_extra["capacity_bytes"]
    assert results["good"].metrics.samples_per_s > 0
    if "good-again" in results:
        assert results["good-again"].metrics.world_size == 2
    from test_docs import undocumented

    for result in results.values():
        assert not undocumented(result.to_dict()), result.sweep.point
    table = capsys.readouterr().out
    for name in names:
        assert name in table


@pytest.mark.slow
@pytest.mark.parametrize("after", [
    pytest.param([], id="stopped-last"),
    # heavy (python -m pytest -m heavy): a point after the stopped one, never started before the resumption;
    # the resumption runs it as it runs the stopped point, neither having a finished result
    pytest.param([{"name": "third"}], id="and-one-after", marks=pytest.mark.heavy),
])
def test_sigterm_stops_the_sweep_and_the_same_command_resumes(tmp_path, capsys, after):
    suite = _suite(tmp_path, [{"name": "first"}, {"name": "second", "env": {"HWBENCH_FAULT": "0:2:hang"}}, *after])
    out = tmp_path / "out"
    command = [sys.executable, "-m", "hwbench", "sweep", str(suite), "--out", str(out)]
    sweep = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list((out / "t" / "second").glob("repeat0.log")):  # the first point is done, the second hangs
            assert time.monotonic() < deadline and sweep.poll() is None
            time.sleep(0.5)
        time.sleep(4)
        sweep.send_signal(signal.SIGTERM)
        _, stderr = sweep.communicate(timeout=90)
    finally:
        kill_tree(sweep.pid)
    assert sweep.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "the same command resumes" in stderr
    assert _statuses(out, "t") == {"first": ["ok"], "second": []}  # nothing half-written for the stopped point
    first = load_results([out / "t" / "first"])[0][0]

    suite.write_text(suite.read_text().replace("0:2:hang", "none:0:raise").replace("HWBENCH_FAULT", "UNUSED"))
    capsys.readouterr()
    again = main(command[3:])  # the same command, in this process (its points are processes as before)
    stderr = capsys.readouterr().err
    assert again == 0, stderr[-2000:]
    assert "first: ok (kept from an earlier sweep" in stderr
    assert _statuses(out, "t") == {"first": ["ok"], "second": ["ok"], **{point["name"]: ["ok"] for point in after}}
    assert load_results([out / "t" / "first"])[0][0].run_id == first.run_id  # not run again


@pytest.mark.slow
def test_repeats_give_distinct_seeds_and_statistics(three_repeats):
    """A point with seed 7 swept with --repeats 3 (conftest's three_repeats)."""
    aggregate = json.loads((three_repeats["point"] / "aggregate.json").read_text())
    assert aggregate["seeds"] == [7, 8, 9] and aggregate["ok"] == 3
    samples = aggregate["samples_per_s"]
    assert samples["n"] == 3 and samples["ci95_low"] <= samples["mean"] <= samples["ci95_high"]
    assert samples["olympic_mean"] == pytest.approx(samples["median"])  # 3 values: the middle one
    assert isinstance(samples["noisy"], bool)


@pytest.mark.slow
def test_the_sweep_sums_its_runs_goodput_and_the_time_outside_their_clocks(three_repeats):
    """The line under the sweep's table: the three runs' phases summed, and the time the sweep spent
    on them outside their own clocks (each `hwbench run` process's start, imports and result writing)."""
    summary = three_repeats["summary"].read_text()
    line = next(line for line in summary.splitlines() if line.startswith("goodput over the sweep's 3 runs: "))
    results = load_results([three_repeats["point"]])[0]
    clocks = [result.metrics.goodput for result in results]
    training = sum(clock.warmup_s + clock.timed_steps_s for clock in clocks)
    in_clocks = sum(clock.total_s for clock in clocks)
    total = float(line.split(" of ", 1)[1].split(" s in training steps", 1)[0])  # shown to 0.1 s
    assert total > in_clocks + 1.0  # three process starts, each with torch's import, are outside the runs' clocks
    goodput = float(line.split(": ", 1)[1].split("%", 1)[0]) / 100
    outside = float(line.split("outside the runs' clocks ", 1)[1].split("%", 1)[0]) / 100
    assert goodput == pytest.approx(training / total, abs=0.003)
    assert outside == pytest.approx((total - in_clocks) / total, abs=0.003)


def test_throughput_statistics_by_hand():
    stats = throughput_statistics([10.0, 12.0, 11.0, 30.0])
    assert stats["median"] == 11.5 and stats["olympic_mean"] == 11.5  # 10 and 30 dropped
    mean, stdev = 15.75, (sum((x - 15.75) ** 2 for x in (10, 12, 11, 30)) / 3) ** 0.5
    assert stats["mean"] == mean and stats["stdev"] == pytest.approx(stdev)
    # t(0.975, df 3) = 3.182446 (tables: 3.182) x s / sqrt(4)
    assert stats["ci95_high"] - mean == pytest.approx(3.182446 * stdev / 2)
    assert stats["noisy"] is True and stats["cv"] == pytest.approx(stdev / mean)


def test_a_grid_expands_to_every_combination(tmp_path):
    path = _suite(tmp_path, [], grid={"tp": [1, 2], "precision": ["fp32", "bf16"]})
    suite = load_suite(path)
    assert [p.name for p in suite.points] == [
        "tiny-tp1-precision-fp32",
        "tiny-tp1-precision-bf16",
        "tiny-tp2-precision-fp32",
        "tiny-tp2-precision-bf16",
    ]
    argv = suite.points[3].run_options().to_argv()
    assert argv[argv.index("--tp") + 1] == "2" and argv[argv.index("--precision") + 1] == "bf16"
    assert "--no-telemetry" in suite.points[0].run_options().to_argv()


@pytest.mark.parametrize(
    "content,fragment",
    [
        ({"name": "x", "points": [{"out": "elsewhere"}]}, "set by `hwbench sweep`"),
        ({"name": "x", "pointz": []}, "unknown key(s) pointz"),
        ({"name": "x"}, "no points"),
        ({"name": "x", "points": [{"name": "a"}, {"name": "a"}]}, "point names repeat: a"),
        ({"name": "x", "grid": {"tp": 2}}, "non-empty lists"),
    ],
)
def test_a_bad_suite_is_one_line_naming_the_file(tmp_path, content, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(UsageError) as error:
        load_suite(path)
    assert fragment in str(error.value) and str(path) in str(error.value) and "\n" not in str(error.value)


def test_shipped_suites_load_and_their_points_validate():
    from hwbench.commands.run import parse_run_spec
    from hwbench.suites.suite import find_suite

    shipped = sorted(p.stem for p in (REPO / "workloads" / "suites").glob("*.yaml"))
    assert {"smoke", "table2", "table3", "nightly", "published-1dev"} <= set(shipped)
    for name in shipped:
        suite = load_suite(find_suite(name))
        for point in suite.points:
            parse_run_spec(point.run_options().to_argv(), check_paths=False)  # raises on a bad point
    table2 = load_suite(find_suite("table2"))
    assert [p.option("model") for p in table2.points] == ["345m", "1.3b", "2.7b", "3.7b"]


def test_a_suite_with_an_impossible_unquoted_date_is_one_line(tmp_path):
    """PyYAML builds an unquoted 2026-13-01 as a date and raises ValueError, not YAMLError."""
    path = tmp_path / "dated.yaml"
    path.write_text("name: x\npoints:\n  - model: tiny\n    note: 2026-13-01\n")
    with pytest.raises(UsageError, match=r"holds a value YAML cannot read \(month must be in 1\.\.12\)") as error:
        load_suite(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)
