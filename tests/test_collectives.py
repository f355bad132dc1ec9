"""`hwbench collectives`: the collectives measured by real torchrun ranks over gloo, reported as
nccl-tests reports them (busbw factors, the check), bad input refused in one line, a hung rank
named, and every slow link of a ring found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwbench.cli import main
from hwbench.fabric.collectives import COLLECTIVES, CollectiveSettings, message_elements
from hwbench.fabric.launch import laggard, timeout_message
from hwbench.result.collectives import CollectivesFormatError, judge_pairs, load_collectives

REPO_ROOT = Path(__file__).resolve().parent.parent


def collectives(out: Path, *options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hwbench", "collectives", "--device", "cpu", "--out", str(out),
                           *options], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})})


def test_each_collective_s_factor_text_is_its_factor():
    """The table's and the docs' text of a factor ('2(n-1)/n') evaluates to the factor it names, for any n,
    and docs/collectives.md's table writes that text."""
    import re

    doc = (REPO_ROOT / "docs" / "collectives.md").read_text()
    for name, collective in COLLECTIVES.items():
        expression = re.sub(r"(\d)\(", r"\1*(", collective.bus_factor_text)  # 2(n-1)/n: 2 times (n-1), over n
        for n in range(2, 10):
            assert eval(expression, {"n": n}) == pytest.approx(collective.bus_factor(n)), (name, n)
        assert re.search(rf"^\| `{name}` \|.*\| {re.escape(collective.bus_factor_text)} \|$", doc, re.M), name


def test_bus_factors_are_nccl_tests():
    """doc/PERFORMANCE.md of nccl-tests: all-reduce 2(n-1)/n; all-gather, reduce-scatter and
    all-to-all (n-1)/n; broadcast and send/recv 1."""
    for n in (2, 4, 8):
        assert COLLECTIVES["all_reduce"].bus_factor(n) == pytest.approx(2 * (n - 1) / n)
        for name in ("all_gather", "reduce_scatter", "all_to_all"):
            assert COLLECTIVES[name].bus_factor(n) == pytest.approx((n - 1) / n)
        assert COLLECTIVES["broadcast"].bus_factor(n) == COLLECTIVES["send_recv"].bus_factor(n) == 1


def test_sizes_double_and_shares_are_whole():
    settings = CollectiveSettings(("all_gather",), 8, 64 * 2 ** 20, 1, 1, True, 60)
    sizes = settings.sizes()
    assert sizes[0] == 8 and sizes[-1] == 64 * 2 ** 20 and len(sizes) == 24
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    # 8 bytes are 2 float32: no whole share for 4 ranks, kept whole for all-reduce
    assert message_elements(COLLECTIVES["all_gather"], 8, 4) == 0
    assert message_elements(COLLECTIVES["all_reduce"], 8, 4) == 2
    assert message_elements(COLLECTIVES["reduce_scatter"], 40, 4) == 8


NOT_A_SIZE = "is not a size; accepted: whole bytes of at least 4 B, e.g. 4096"
NO_ELEMENT = "holds no float32 element; accepted: a size of at least 4 B, e.g. 4KiB"


@pytest.mark.parametrize(("size", "says"), [
    (2, f"2 B {NO_ELEMENT}"),  # whole bytes, too few for one element
    ("4KiB", f"'4KiB' {NOT_A_SIZE}"),  # the Python API's values that are not whole bytes at all
    (True, f"True {NOT_A_SIZE}"),
    (3.5, f"3.5 {NOT_A_SIZE}"),
])
def test_a_message_size_is_refused_in_one_line_naming_option_value_and_what_is_accepted(size, says):
    """The one check of a message size, for argv (parsed to bytes) and the Python API's values alike."""
    from hwbench.errors import UsageError
    from hwbench.fabric.collectives import check_message_bytes

    with pytest.raises(UsageError) as refused:
        check_message_bytes(size, "--ring-bytes")
    assert str(refused.value) == f"--ring-bytes {says}"
    check_message_bytes(4, "--ring-bytes")


def test_the_check_counts_wrong_values():
    """A call that did nothing leaves each rank's own pattern where the sum of both must be."""
    import torch

    from hwbench.device import select_backend
    from hwbench.fabric.measure import check_call, pattern, prepare_call

    call = prepare_call(COLLECTIVES["all_reduce"], True, 1000, 0, 2, torch.device("cpu"))
    call.run = lambda: None
    assert check_call(call, select_backend("cpu")) == int((pattern(1, 1000) != 0).sum()) > 900


@pytest.mark.parametrize(("options", "words"), [
    (["--min-bytes", "lots"], ["--min-bytes", "'lots'", "not a size"]),
    (["--min-bytes", "4.5"], ["--min-bytes", "'4.5'", "not a size", "whole bytes"]),  # not read as 4
    (["--max-bytes", "8", "--min-bytes", "1KiB"], ["--max-bytes", "below --min-bytes"]),
    (["--collectives", "all_reduce,allgather"], ["--collectives", "'allgather'", "all_gather"]),
    (["--nproc-per-node", "1"], ["--nproc-per-node 1", "at least 2 ranks"]),
    (["--slow-link", "--slow-threshold", "half"], ["--slow-threshold", "'half'"]),
    (["--slow-link", "--slow-threshold", "1500%"], ["--slow-threshold", "'1500%'", "below 1000%"]),
    (["--slow-threshold", "abc"], ["--slow-threshold", "'abc'"]),  # refused without --slow-link too
    (["--ring-bytes", "xyz"], ["--ring-bytes", "'xyz'", "not a size"]),
    (["--max-bytes", "2", "--min-bytes", "1"], ["--max-bytes 2 B", "no float32 element"]),
    (["--slow-link", "--ring-bytes", "3"], ["--ring-bytes 3 B", "no float32 element"]),
    (["--warmup", "-1"], ["--warmup -1", "from 0 to 100000"]),
])
def test_bad_input_is_one_line_and_nothing_written(tmp_path, capsys, options, words):
    out = tmp_path / "out"
    assert main(["collectives", "--device", "cpu", "--out", str(out), *options]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and all(word in error for word in words), error
    assert not out.exists()


def test_two_ranks_measure_every_collective(tmp_path):
    """Real torchrun ranks over gloo: every collective at every size, busbw from algbw by
    nccl-tests' factor, every value checked, the file read back; the ring of the slow-link check
    measured (its verdict on two ranks of a shared CPU is noise: the four-rank test judges it)."""
    run = collectives(tmp_path, "--nproc-per-node", "2", "--min-bytes", "256KiB", "--max-bytes", "1MiB",
                      "--warmup", "1", "--iters", "2", "--slow-link", "--ring-bytes", "4KiB")
    assert run.returncode == 0, run.stderr
    [path] = tmp_path.glob("*.json")
    result = load_collectives(path)
    assert (result.status, result.world_size, result.dist_backend, result.check_passed) == ("ok", 2, "gloo", True)
    assert [r.rank for r in result.ranks] == [0, 1]
    sizes = [2 ** k for k in range(18, 21)]
    for name, collective in COLLECTIVES.items():
        rows = [row for row in result.rows if row.collective == name]
        forms = collective.in_place + collective.out_of_place
        assert sorted({row.size_bytes for row in rows}) == sizes and len(rows) == forms * len(sizes), name
        for row in rows:
            assert row.wrong == 0 and row.time_us_min <= row.time_us <= row.time_us_max
            assert row.algbw_gbs == pytest.approx(row.size_bytes / row.time_us / 1e3)
            assert row.busbw_gbs == pytest.approx(row.algbw_gbs * collective.bus_factor(2))
    assert "## all_reduce (busbw = algbw x 2(n-1)/n)" in run.stdout
    assert "check: every value as expected" in run.stdout
    assert result.slow_link is not None and [(link.sender, link.receiver) for link in result.slow_link.links] == [
        (0, 1), (1, 0)]
    assert all(link.time_us > 0 and link.busbw_gbs == pytest.approx(4096 / link.time_us / 1e3)
               for link in result.slow_link.links)


def test_a_result_of_another_kind_is_refused(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"run_id": "x", "status": "ok", "spec": {}}))
    with pytest.raises(CollectivesFormatError, match="not a collectives result"):
        load_collectives(path)
    path.write_text(json.dumps({"kind": "collectives", "schema_version": 99}))
    with pytest.raises(CollectivesFormatError, match="schema_version 99"):
        load_collectives(path)


def test_a_timeout_names_the_rank_behind():
    beats = {0: {"step": 3, "phase": "all_gather in place, 256 elements", "host": "a"},
             1: {"step": 2, "phase": "all_gather out of place, 256 elements", "host": "b"},
             2: {"step": 3, "phase": "all_gather in place, 256 elements", "host": "a"}}
    assert laggard(beats) == 1
    message = timeout_message(beats, 30)
    assert "rank 1 (host b) stopped before all_gather in place" in message
    assert laggard({0: {"step": 3}, 1: {"step": 3}}) is None


def test_every_pair_past_the_threshold_is_named():
    one = judge_pairs([1.0, 1.1, 1.6, 0.9], 0.25)
    assert one.slow == [2] and one.slowdowns[2] == pytest.approx(1.6 / 1.0 - 1)
    none = judge_pairs([1.0, 1.1, 1.2, 0.9], 0.25)
    assert none.slow == [] and none.slowdowns[2] == pytest.approx(1.2 / 1.0 - 1)
    assert none.median_s == pytest.approx(1.05)
    # a slow rank 2 of four is on pairs 1 -> 2 and 2 -> 3: each held against the others' median (1.0), not
    # against all four's (2.5, which two slow pairs lift), so both are named
    two = judge_pairs([1.0, 4.0, 4.0, 1.0], 0.25)
    assert two.slow == [1, 2] and two.slowdowns == pytest.approx([-0.75, 3.0, 3.0, -0.75])
    # two ranks: both pairs are between the same two ranks, a slow one slows both alike
    assert judge_pairs([4.0, 4.1], 0.25).slow == []
    assert judge_pairs([4.0], 0.25).slowdowns == [None]


@pytest.mark.parametrize(("hosts", "intra", "inter", "why"), [
    (["a", "a"], None, None, None),  # one host: no scopes, every figure is intra-node
    (["a", "a", "b", "b"], [[0, 1], [2, 3]], [[0, 2]], None),
    (["a", "b", "a", "b"], [[0, 2], [1, 3]], [[0, 1]], None),  # ranks interleaved over hosts by the scheduler
    (["a", "b"], [], [[0, 1]], "each node has one rank: no two ranks share a node"),
    (["a", "a", "b"], [], [[0, 2]], "the nodes hold different numbers of ranks (1, 2)")])
def test_a_multi_node_run_is_measured_within_and_between_nodes(hosts, intra, inter, why):
    from hwbench.fabric.collectives import scopes

    found = scopes(hosts)
    if intra is None:
        assert found == []
        return
    assert [(scope.name, scope.groups, scope.unmeasured) for scope in found] == [
        ("intra_node", intra, why), ("inter_node", inter, None)]


def test_the_scopes_are_merged_over_their_member_ranks():
    """Each scope's table from its members' rows only (the busbw factor of its group's size); a scope
    not measured carries its reason and no rows."""
    from hwbench.fabric.launch import merge_scopes

    def rows(seconds: float) -> list[dict]:
        return [{"collective": "all_reduce", "in_place": True, "size_bytes": 4096, "elements": 1024,
                 "time_s": seconds, "wrong": 0}]

    ranks = [{"rank": r, "host": "ab"[r // 2], "scopes": {"intra_node": rows(1e-3 * (r + 1)),
                                                          "inter_node": rows(5e-3) if r % 2 == 0 else None}}
             for r in range(4)]
    intra, inter = merge_scopes(ranks)
    assert intra.groups == [[0, 1], [2, 3]] and inter.groups == [[0, 2]]
    [row] = intra.rows
    assert row.time_us == pytest.approx(2500) and (row.time_us_min, row.time_us_max) == pytest.approx((1000, 4000))
    assert row.bus_factor == 1.0 and inter.rows[0].time_us == pytest.approx(5000)
    single = merge_scopes([{"rank": r, "host": "ab"[r], "scopes": {"inter_node": rows(1e-3)}} for r in range(2)])
    assert single[0].rows == [] and single[0].unmeasured == "each node has one rank: no two ranks share a node"


def test_a_schema_1_file_loads_with_every_slow_link_judged_again(tmp_path):
    """Version 1 named the slowest pair only; read now, each link has its slowdown and every slow one is named."""
    data = json.loads(_result_file(tmp_path, "old", 10.0).read_text())
    links = [{"sender": i, "receiver": (i + 1) % 4, "sender_host": "a" if i < 2 else "b",
              "receiver_host": "a" if (i + 1) % 4 < 2 else "b", "time_us": t, "busbw_gbs": 4096 / t / 1e3}
             for i, t in enumerate([10.0, 40.0, 40.0, 10.0])]
    data.update(schema_version=1, slow_link={"size_bytes": 4096, "threshold": 0.25, "links": links,
                                             "median_time_us": 25.0, "slowest": links[1], "slowdown": 3.0})
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    ring = load_collectives(path).slow_link
    assert ring is not None and [(link.sender, link.receiver) for link in ring.slow] == [(1, 2), (2, 3)]
    assert [link.slowdown for link in ring.links] == pytest.approx([-0.75, 3.0, 3.0, -0.75])
    assert [link.inter_node for link in ring.links] == [False, True, False, True]
    assert "slowest" not in ring.model_dump() and "slowdown" not in ring.model_dump()
    data["slow_link"]["links"][0].pop("time_us")
    path.write_text(json.dumps(data))
    with pytest.raises(CollectivesFormatError, match="old.json: its schema_version 1 ring cannot be read"):
        load_collectives(path)


@pytest.mark.heavy
def test_a_hung_rank_is_a_timeout_naming_it(tmp_path):
    run = collectives(tmp_path, "--nproc-per-node", "2", "--collectives", "all_reduce", "--max-bytes", "64",
                      "--iters", "2", "--timeout", "20", env={"HWBENCH_FAULT": "1:2:hang"})
    assert run.returncode == 1
    [path] = tmp_path.glob("*.json")
    result = load_collectives(path)
    assert result.status == "timeout" and result.error is not None and result.error.rank == 1
    assert "rank 1" in result.error.message and "rank 1" in run.stderr
    assert [rank.rank for rank in result.ranks] == [0, 1]
    alive = [rank.pid for rank in result.ranks if rank.pid and _running(rank.pid)]
    assert not alive, f"ranks left behind: {alive}"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.heavy
def test_a_rank_that_raises_is_a_failed_result_naming_it(tmp_path):
    run = collectives(tmp_path, "--nproc-per-node", "2", "--collectives", "broadcast", "--max-bytes", "64",
                      "--iters", "2", env={"HWBENCH_FAULT": "1:1:raise"})
    assert run.returncode == 1
    [path] = tmp_path.glob("*.json")
    result = load_collectives(path)
    assert result.status == "failed" and result.error is not None and result.error.rank == 1
    assert "injected fault: rank 1 raised at step 1" in result.error.message and not result.rows


@pytest.mark.heavy
def test_four_ranks_name_both_links_of_the_slowed_rank(tmp_path):
    """HWBENCH_FAULT's slow rank sleeps inside the timed window of both its pairs, as it sends and as
    it answers: the ring sees its two links slow (1 -> 2 and 2 -> 3) and names both, the others not.
    (HWBENCH_FAULT names one rank; two slowed ranks would be four such links, or three side by side.)"""
    run = collectives(tmp_path, "--nproc-per-node", "4", "--collectives", "send_recv", "--min-bytes", "4KiB",
                      "--max-bytes", "4KiB", "--warmup", "1", "--iters", "4", "--slow-link", "--ring-bytes", "4KiB",
                      env={"HWBENCH_FAULT": "2:2:slow"})
    assert run.returncode == 0, run.stderr
    [path] = tmp_path.glob("*.json")
    ring = load_collectives(path).slow_link
    assert ring is not None and [(link.sender, link.receiver) for link in ring.links] == [(0, 1), (1, 2), (2, 3),
                                                                                          (3, 0)]
    assert [(link.sender, link.receiver) for link in ring.slow] == [(1, 2), (2, 3)]
    assert all(link.slowdown is not None and link.slowdown > ring.threshold for link in ring.slow)
    assert "slow link: rank 1 (" in run.stdout and "slow link: rank 2 (" in run.stdout
    assert "2 of 4 pairs slower than the median of the others by more than 25%" in run.stdout


# --- report and compare -------------------------------------------------------


def _result_file(folder: Path, run_id: str, busbw: float, wrong: int = 0) -> Path:
    """A collectives result of two ranks with one all-reduce row of the given busbw (algbw and time
    follow from it, as the launcher computes them)."""
    from hwbench.result.collectives import CollectivesResult, Row, Settings, write_collectives

    size, factor = 2 ** 20, COLLECTIVES["all_reduce"].bus_factor(2)
    algbw = busbw / factor
    time_us = size / algbw / 1e3
    row = Row(collective="all_reduce", in_place=True, size_bytes=size, elements=size // 4, time_us=time_us,
              time_us_min=time_us, time_us_max=time_us, algbw_gbs=algbw, busbw_gbs=busbw, bus_factor=factor,
              wrong=wrong)
    settings = Settings(collectives=["all_reduce"], min_bytes=size, max_bytes=size, warmup=1, iterations=2,
                        check=True, timeout_s=60)
    result = CollectivesResult(run_id=run_id, status="ok", device="cpu", device_model="test cpu", dist_backend="gloo",
                               world_size=2, settings=settings, rows=[row], check_passed=wrong == 0)
    return write_collectives(result, folder)


def test_one_key_names_a_row_alike_in_compare_baselines_and_exports(tmp_path):
    """Compare, the baseline file and the exports key and label a row by CollectiveKey, its size in
    bytes as the nccl-tests table prints it; a baseline entry (its JSON shape as written) reads into
    the same key; two sizes one decimal of KiB spells alike (2000 B, 2048 B) keep two labels."""
    import dataclasses

    from hwbench.exports.figures import collective_figures
    from hwbench.fabric.table import collectives_table
    from hwbench.judge.collectives import compare_collectives
    from hwbench.judge.collectives_baseline import CollectivesBaselinePoint, build_points

    result = load_collectives(_result_file(tmp_path, "c1", 10.0))
    [figure] = collective_figures([result])
    [entry] = build_points([result])
    [point] = compare_collectives([result], [result], 0.05)["points"]
    label = "all_reduce in place 1048576 B, 2 ranks on 1 host (cpu test cpu, gloo, float32)"
    assert figure.key.label() == entry["label"] == point.label == label
    assert CollectivesBaselinePoint.model_validate(json.loads(json.dumps(entry))).collective_key == figure.key
    assert f"{2 ** 20:>12} " in collectives_table(result)
    labels = {dataclasses.replace(figure.key, size_bytes=size).label() for size in (2000, 2048)}
    assert labels == {label.replace("1048576 B", "2000 B"), label.replace("1048576 B", "2048 B")}


def test_run_readers_pass_over_collectives_files(tmp_path):
    from hwbench.result.store import OtherKindOfResult, load_result, read_results

    path = _result_file(tmp_path, "c1", 10.0)
    assert read_results(tmp_path) == ([], [])  # not a damaged run
    with pytest.raises(OtherKindOfResult, match="a collectives result, not a run's"):
        load_result(path)


@pytest.mark.parametrize(("current", "wrong", "status", "verdict"), [
    (10.2, 0, 0, "within threshold"), (5.0, 0, 3, "regression"), (20.0, 0, 0, "improvement"),
    (10.0, 3, 3, "regression: wrong values in current")])
def test_compare_judges_busbw_a_fall_is_a_regression(tmp_path, capsys, current, wrong, status, verdict):
    _result_file(tmp_path / "base", "b1", 10.0)
    _result_file(tmp_path / "cur", "c1", current, wrong)
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "cur")]) == status
    out = capsys.readouterr().out
    assert "collectives: busbw (higher is better), threshold 5%" in out and "all_reduce in place 1048576 B" in out
    if verdict != "within threshold":
        assert verdict in out
    assert ("1 regression(s)" in out) == (status == 3)


def test_report_shows_collectives(tmp_path, capsys):
    path = _result_file(tmp_path, "c1", 10.0)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "## Collectives" in out and f"c1: test cpu, gloo, 2 ranks ({path})" in out
    assert "| all_reduce   | in place | 1048576" in out


def test_every_field_of_the_file_is_documented():
    from hwbench.result import collectives as model

    doc = (REPO_ROOT / "docs" / "collectives.md").read_text()
    sections = (model.CollectivesResult, model.Settings, model.Row, model.RankHost, model.SlowLink, model.Link,
                model.CollectivesError)
    missing = [f"{section.__name__}.{name}" for section in sections for name in section.model_fields
               if f"`{name}`" not in doc]
    assert not missing, f"docs/collectives.md does not describe: {missing}"


def test_runs_on_one_side_only_are_refused_as_without_collectives(tmp_path, capsys):
    import shutil

    _result_file(tmp_path / "base", "b1", 10.0)
    _result_file(tmp_path / "cur", "c1", 10.0)
    run = REPO_ROOT / "tests" / "data" / "compare" / "tiny-cpu.json"
    shutil.copy(run, tmp_path / "base" / run.name)
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "cur")]) == 2
    assert "CURRENT" in capsys.readouterr().err


def test_runs_and_collectives_together_the_worse_exit_wins(tmp_path, capsys):
    import shutil

    run = REPO_ROOT / "tests" / "data" / "compare" / "tiny-cpu.json"
    for side, busbw in (("base", 10.0), ("cur", 5.0)):
        _result_file(tmp_path / side, f"{side}1", busbw)
        shutil.copy(run, tmp_path / side / run.name)
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "cur")]) == 3
    out = capsys.readouterr().out
    assert "1 collective points compared: 1 regression(s)" in out and "1 points compared: 0 regression(s)" in out


def test_compare_and_report_read_each_file_once_runs_and_collectives_alike(tmp_path, monkeypatch, capsys):
    """One reader (hwbench.result.store.read_files) sorts each file by its kind: compare and report open
    every input file once, whether it holds a run or a collectives result."""
    import collections
    import shutil

    run = REPO_ROOT / "tests" / "data" / "compare" / "tiny-cpu.json"
    files = {"base": _result_file(tmp_path / "base", "b1", 10.0), "cur": _result_file(tmp_path / "cur", "c1", 10.0)}
    for side in files:
        shutil.copy(run, tmp_path / side / run.name)
    texts = {files["base"].read_text(): "b1", files["cur"].read_text(): "c1", run.read_text(): "run"}
    parsed: collections.Counter = collections.Counter()
    loads = json.loads

    def counting(text, *args, **kwargs):
        parsed.update([texts.get(text.decode() if isinstance(text, bytes) else text)])
        return loads(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "cur")]) == 0
    assert (parsed["b1"], parsed["c1"], parsed["run"]) == (1, 1, 2)  # the run: one file on each side
    parsed.clear()
    assert main(["report", str(tmp_path / "base")]) == 0
    assert "## Collectives" in capsys.readouterr().out
    assert (parsed["b1"], parsed["run"]) == (1, 1)


# --- baselines and acceptance ------------------------------------------------


def test_baseline_save_keeps_busbw_of_ok_collectives_only(tmp_path, capsys):
    _result_file(tmp_path / "ref", "r1", 10.0)
    _result_file(tmp_path / "ref", "r2", 12.0)
    _result_file(tmp_path / "ref", "r3", 50.0, wrong=2)  # its check failed: no baseline figure
    out = tmp_path / "baseline.json"
    assert main(["baseline", "save", str(tmp_path / "ref"), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "collectives result r3" in captured.err and "wrong values" in captured.err
    assert "0 point(s) from 0 result(s), 1 collective(s) from 3 collectives result(s)" in captured.out
    [entry] = json.loads(out.read_text())["collectives"]
    assert entry["key"] == {"device": "cpu", "device_model": "test cpu", "dist_backend": "gloo", "world_size": 2,
                            "hosts": 1, "dtype": "float32"}
    assert (entry["collective"], entry["in_place"], entry["size_bytes"]) == ("all_reduce", True, 2 ** 20)
    assert entry["busbw_gbs"] == {"median": 11.0, "min": 10.0, "max": 12.0, "n": 2}
    assert entry["run_ids"] == ["r1", "r2"]


@pytest.mark.parametrize(("busbw", "wrong", "failed"), [(9.6, 0, None), (9.4, 0, "94.0% of its baseline 10.000"),
                                                        (20.0, 3, "wrong values")])
def test_a_busbw_below_min_ratio_of_the_baseline_fails_naming_it(tmp_path, busbw, wrong, failed):
    from hwbench.judge.baseline import load_baseline
    from hwbench.judge.collectives_baseline import judge_collectives

    _result_file(tmp_path / "ref", "r1", 10.0)
    out = tmp_path / "baseline.json"
    assert main(["baseline", "save", str(tmp_path / "ref"), "--out", str(out)]) == 0
    baseline = load_baseline(str(out))
    current = load_collectives(_result_file(tmp_path / "cur", "c1", busbw, wrong))
    outcome = judge_collectives([current], baseline.collectives, 0.95)
    assert outcome.missing == []
    if failed is None:
        assert outcome.failures == [] and outcome.compared[0][3] == pytest.approx(0.96)
    else:
        [line] = outcome.failures
        assert failed in line and "all_reduce in place 1048576 B, 2 ranks on 1 host" in line


def test_a_collective_the_baseline_lacks_is_missing(tmp_path):
    from hwbench.judge.baseline import load_baseline
    from hwbench.judge.collectives_baseline import judge_collectives

    _result_file(tmp_path / "ref", "r1", 10.0)
    baseline = load_baseline(str(tmp_path / "ref"))  # a folder: made into a baseline on the fly
    current = load_collectives(_result_file(tmp_path / "cur", "c1", 10.0)).model_copy(update={"world_size": 4})
    outcome = judge_collectives([current], baseline.collectives, 0.95)
    assert outcome.failures == [] and outcome.missing == [
        "all_reduce in place 1048576 B, 4 ranks on 1 host (cpu test cpu, gloo, float32)"]


def _with_ring(path: Path, slow: bool) -> Path:
    """The result at ``path`` given a ring of four ranks, its link 2 -> 3 named slow when ``slow``."""
    from hwbench.result.collectives import Link, SlowLink, write_collectives

    result = load_collectives(path)
    times = [10.0, 10.0, 40.0 if slow else 10.5, 10.0]
    slowdowns = [0.0, 0.0, 3.0 if slow else 0.05, 0.0]
    links = [Link(sender=i, receiver=(i + 1) % 4, sender_host="h", receiver_host="h", time_us=t,
                  busbw_gbs=4096 / t / 1e3, slowdown=d) for i, (t, d) in enumerate(zip(times, slowdowns, strict=True))]
    ring = SlowLink(size_bytes=4096, threshold=0.25, links=links, median_time_us=10.0,
                    slow=[links[2]] if slow else [])
    return write_collectives(result.model_copy(update={"slow_link": ring}), path.parent)


@pytest.mark.parametrize(("busbw", "slow", "passed"), [(10.0, False, True), (10.0, True, False), (5.0, False, False)])
def test_accept_judges_the_fabric_against_the_baseline_and_names_a_slow_link(tmp_path, busbw, slow, passed):
    """The judgement and page of `hwbench accept` with a fabric baseline, on stored result files
    (the heavy test in test_accept.py measures them with real gloo ranks)."""
    from hwbench.judge.accept import judge
    from hwbench.judge.baseline import load_baseline
    from hwbench.report.accept import render

    _result_file(tmp_path / "ref", "r1", 10.0)
    current = load_collectives(_with_ring(_result_file(tmp_path / "cur", "c1", busbw), slow))
    acceptance = judge([], [], load_baseline(str(tmp_path / "ref")), 0.95, 0.05, None, [current])
    assert (acceptance.passed, acceptance.exit_status) == (passed, 0 if passed else 3)
    page = render(acceptance, "md")
    assert "Fabric against the baseline" in page and "rank 2 (h) -> rank 3 (h)" in page
    named = [line for line in acceptance.failures
             if line.startswith("slow link: rank 2 (h) -> rank 3 (h), intra-node: 40.0 us one way")]
    assert len(named) == slow and all("300% slower" in line for line in named)
    below = [line for line in acceptance.failures if line.startswith("collective all_reduce in place 1048576 B")]
    assert len(below) == (busbw < 9.5)
    if passed:
        assert "every collective too, and no slow link" in page


def test_the_table_shows_busbw_as_a_fraction_of_the_catalog_s_link():
    """H100 SXM's NVLink 4, 900 GB/s both ways: a busbw of 225 GB/s is 50% of the 450 each way; a device
    the catalog has no link figure for says why and shows '-'."""
    from hwbench.fabric.table import collectives_table

    with_link = _result_file_data("NVIDIA H100 80GB HBM3", "cuda", 225.0)
    table = collectives_table(with_link)
    assert "# link: h100-sxm NVLink 4 (18 links), 450 GB/s each way (half of 900 GB/s both ways;" in table
    assert " 225.000  50.0% " in table
    table = collectives_table(_result_file_data("AMD Instinct MI300X", "rocm", 224.0))  # 7 links, 896 GB/s
    assert "# link: mi300x AMD Infinity Fabric (7 links to the other GPUs of the platform), 448 GB/s each way" in table
    assert " 224.000  50.0% " in table
    table = collectives_table(_result_file_data("NVIDIA H100 PCIe", "cuda", 225.0))
    assert "# no link figure for h100-pcie: not read from a data sheet" in table and "50.0%" not in table


def _result_file_data(device_model: str, device: str, busbw: float):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        result = load_collectives(_result_file(Path(folder), "x", busbw))
    return result.model_copy(update={"device": device, "device_model": device_model})


def test_a_link_figure_without_its_source_is_refused_and_the_old_text_still_loads():
    from pydantic import ValidationError

    from hwbench.catalog import LinkBandwidth, load_catalog

    with pytest.raises(ValidationError, match="must be given with link, source and read"):
        LinkBandwidth(bidirectional_bytes_per_s=900e9)
    with pytest.raises(ValidationError, match="give unavailable"):
        LinkBandwidth()
    for entry in load_catalog().devices.values():  # each shipped entry: its text and a figure or the reason
        assert entry.interconnect and entry.link_bandwidth is not None, entry.name
        link = entry.link_bandwidth
        assert (link.bidirectional_bytes_per_s is None) == bool(link.unavailable), entry.name


def test_the_python_api_saves_the_collectives_in_the_baseline_too(tmp_path):
    from hwbench import api

    _result_file(tmp_path / "ref", "r1", 10.0)
    content = api.baseline_save(tmp_path / "ref", out=tmp_path / "b.json")
    assert [entry["busbw_gbs"]["median"] for entry in content["collectives"]] == [10.0]


SLURM_STEP = {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "hwb-node[1-2]",
              "SLURM_NNODES": "2", "SLURM_NODEID": "1"}


def test_srun_one_task_per_node_places_this_node_and_more_tasks_are_refused(monkeypatch, tmp_path, capsys):
    """Under srun with one task per node, this node's rank among the nodes and the rendezvous on the job's
    first host (the port from the job id, as `hwbench run` derives it); more tasks on a node are refused
    in one line, exit 2, before anything starts or is written."""
    from hwbench.fabric.launch import NodePlace, nodes_from_slurm
    from hwbench.harness.slurm_env import rendezvous_port

    for name in ("MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    assert nodes_from_slurm() is None  # outside Slurm: this node alone
    for name, value in {**SLURM_STEP, "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)"}.items():
        monkeypatch.setenv(name, value)
    assert nodes_from_slurm() == NodePlace(2, 1, "hwb-node1", rendezvous_port("4711"))
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2)")
    assert main(["collectives", "--device", "cpu", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2 tasks on this node; accepted: one task per node" in err
    assert not (tmp_path / "out").exists()


def test_a_copied_collectives_file_is_read_once_and_named(tmp_path):
    """A result copied beside its original would count twice in a baseline's n and an export's median,
    as a copied run would pass for a repeat: the second file is left out, naming the first."""
    import shutil

    from hwbench.result.store import read_files

    original = _result_file(tmp_path / "a", "c1", 10.0)
    shutil.copy(original, tmp_path / "copy.json")
    files = read_files([tmp_path])
    found, skipped = files.collectives, files.skipped_collectives
    assert len(found) == 1
    [(path, reason)] = skipped
    assert "run " in reason and "was already read from" in reason and str(found[0][1]) in reason
