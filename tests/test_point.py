"""Point identity (hwbench.point): results whose specs differ in any key field are never merged
into one figure (compare, history, report), the label says what sets points apart, and a
history database written before the key grew keeps working. No training: modified copies of
a real result (tests/data/compare/tiny-cpu.json)."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path

import pytest

from hwbench.cli import run_command
from hwbench.history import store
from hwbench.metrics import METRICS
from hwbench.point import PointKey
from hwbench.report import plots
from hwbench.result.model import RunResult
from hwbench.result.store import load_result, write_result

TEMPLATE = json.loads((Path(__file__).parent / "data" / "compare" / "tiny-cpu.json").read_text())


def result(run_id: str, tokens_per_s: float, started_at: str = "2026-10-01T02:00:00+00:00", **spec) -> dict:
    data = copy.deepcopy(TEMPLATE)
    data["run_id"], data["started_at"] = run_id, started_at
    data["spec"].update(spec)
    data["metrics"]["tokens_per_s"] = tokens_per_s
    return data


def write(folder: Path, *results: dict) -> Path:
    for data in results:
        write_result(RunResult.from_dict(data), folder)
    return folder


@pytest.mark.parametrize("field, value, shown", [
    ("seq_length", 64, "seq 64"), ("max_positions", 256, "256 positions"), ("data", "synthetic", "data synthetic"),
    ("micro_batch_size", 2, "micro batch 2"), ("steps", 5, "5 steps"), ("fused_qkv", True, "fused qkv"),
    ("cross_entropy", "fused", "fused cross entropy"),
])
def test_runs_that_differ_in_a_key_field_are_two_points_everywhere(tmp_path, capsys, field, value, shown):
    base = write(tmp_path / "base", result("a", 1000.0), result("b", 500.0, **{field: value}))
    keys = [load_result(path).point_key for path in sorted(base.glob("*.json"))]
    assert keys[0] != keys[1]
    assert keys[1].label(keys).endswith(f", {shown}") and not keys[0].label(keys).endswith(f", {shown}")
    # compare: two points, each matched with itself (a merge would read a 50% fall)
    code = run_command("compare", [str(base), str(base)])
    out = capsys.readouterr().out
    assert code == 0 and "2 points compared: 0 regression(s)" in out and shown in out
    # history: two series
    db = tmp_path / "history.sqlite"
    assert run_command("history", ["add", str(base), "--db", str(db)]) == 0
    capsys.readouterr()
    connection = store.open_history(db)
    try:
        runs = store.runs_with_metric(connection, "tokens_per_s")
    finally:
        connection.close()
    assert len({run.point for run in runs}) == 2
    # the report: two points in its runs table, and two bars on its throughput chart
    report = json.loads(_report(capsys, base))
    assert len({row["point"] for row in report["runs"]}) == 2
    variants = sorted(row["point_variant"] for row in report["runs"])
    assert shown in variants and len(set(variants)) == 2
    chart = plots.throughput("tiny", report["runs"])
    assert all(variant in chart for variant in variants) and "median 500.0 " in chart and "median 1,000.0 " in chart


def test_a_simulated_run_and_the_devices_own_are_two_points_everywhere(tmp_path, capsys):
    """The same settings run through a stand-in (its figures this host's) and on the device: two
    points in compare, the history and the report, the stand-in's labelled [simulated]."""
    stand_in = result("b", 10.0)
    stand_in["device"]["simulated"] = stand_in["environment"]["simulated"] = True
    both = write(tmp_path / "both", result("a", 1000.0), stand_in)
    keys = [load_result(path).point_key for path in sorted(both.glob("*.json"))]
    assert keys[0] != keys[1] and (keys[0].stand_in, keys[1].stand_in) == (None, "simulated")
    assert keys[1].label() == "tiny on Intel(R) Xeon(R) Processor [simulated] fp32"
    code = run_command("compare", [str(both), str(both)])
    assert code == 0 and "2 points compared: 0 regression(s)" in capsys.readouterr().out
    db = tmp_path / "history.sqlite"
    assert run_command("history", ["add", str(both), "--db", str(db)]) == 0
    capsys.readouterr()
    connection = store.open_history(db)
    try:
        assert len({run.point for run in store.runs_with_metric(connection, "tokens_per_s")}) == 2
    finally:
        connection.close()
    assert len({row["point"] for row in json.loads(_report(capsys, both))["runs"]}) == 2


def _report(capsys, folder: Path) -> str:
    assert run_command("report", [str(folder), "--format", "json"]) == 0
    return capsys.readouterr().out


def test_a_label_alone_names_no_detail_and_a_set_names_only_what_differs():
    key = RunResult.from_dict(result("a", 1.0)).point_key
    assert key.label() == "tiny on Intel(R) Xeon(R) Processor fp32"
    other = RunResult.from_dict(result("b", 1.0, seq_length=64, micro_batch_size=2)).point_key
    assert other.label([key, other]) == "tiny on Intel(R) Xeon(R) Processor fp32, micro batch 2, seq 64"
    assert key.label([key, other]) == "tiny on Intel(R) Xeon(R) Processor fp32, micro batch 4, seq 128"
    assert PointKey(*key.values()) == key and len(key.values()) == len(PointKey.fields()) == 25


def test_the_dataset_is_named_not_where_it_is_kept():
    here = RunResult.from_dict(result("a", 1.0, data="/data/one/corpus_text_document")).point_key
    there = RunResult.from_dict(result("b", 1.0, data="/mnt/two/corpus_text_document")).point_key
    assert here == there and here.data == "megatron:corpus_text_document"
    assert PointKey(*here.values()) == here  # read back from a database, not prefixed again


def test_metrics_read_the_figure_or_none():
    data = result("a", 1234.5)
    read = RunResult.from_dict(data)
    assert METRICS["tokens_per_s"].read(read) == 1234.5
    assert METRICS["step_time_median"].read(read) == data["metrics"]["step_time_s"]["median"]
    assert METRICS["step_time_median"].stored_name == "step_time_s.median"
    assert METRICS["mfu"].read(read) is None  # not measured
    failed = RunResult.from_dict({**data, "status": "failed", "metrics": {}})
    assert all(metric.read(failed) is None for metric in METRICS.values())


def test_a_version_1_history_database_keeps_its_series(tmp_path, capsys):
    """A database made before the key had max_positions, fused_qkv, cross_entropy, ep and stand_in:
    opened, its keys are migrated, and tonight's run of the same point joins the old nights' series."""
    db = tmp_path / "history.sqlite"
    connection = sqlite3.connect(db)
    for statement in store.MIGRATIONS[1]:
        connection.execute(statement)
    old_key = ["tiny", "cpu", "Intel(R) Xeon(R) Processor", "fp32", 4, 8, 128, False, False, 1, 1, 1, 1, "native", 0,
               False, None, "builtin", 2]
    assert len(old_key) == len(store.V1_POINT_FIELDS)
    for night in range(3):
        run_id = f"old{night}"
        connection.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (run_id, f"2026-10-0{night + 1}T02:00:00+00:00", f"2026-10-0{night + 1}", "c" * 40, 0,
                            "ok", json.dumps(old_key), "{}", "{}", "old.json", "2026-10-05T00:00:00+00:00"))
        connection.execute("INSERT INTO metrics VALUES (?, ?, ?)", (run_id, "tokens_per_s", 1000.0 + night))
    connection.execute("PRAGMA user_version = 1")
    connection.commit()
    connection.close()
    tonight = write(tmp_path / "tonight", result("new", 1001.0, started_at="2026-10-04T02:00:00+00:00"))
    assert run_command("history", ["add", str(tonight), "--db", str(db)]) == 0
    capsys.readouterr()
    connection = store.open_history(db)
    try:
        runs = store.runs_with_metric(connection, "tokens_per_s")
        version = connection.execute("PRAGMA user_version").fetchone()[0]
    finally:
        connection.close()
    assert version == store.SCHEMA_VERSION == 6
    assert len(runs) == 4 and len({run.point for run in runs}) == 1  # one series: old nights and tonight
    assert runs[0].point.max_positions == 128 and runs[0].point.cross_entropy == "standard"
    assert runs[0].point.stand_in is None and runs[0].point.fp8_recipe is None  # versions 3 and 4: not FP8
    assert runs[0].point.ep == 1  # version 5: no expert parallelism
    code, out, _ = (run_command("history", ["show", "--db", str(db)]), *capsys.readouterr())
    assert code == 0 and "tokens/s of tiny on Intel(R) Xeon(R) Processor fp32" in out


def test_a_point_without_pipelining_reads_no_pipeline_schedule_not_none(tmp_path, capsys):
    """A PP2 point beside a PP1 one: the PP1 label names no schedule (its layout has no PP), in the
    labels and in `baseline save`'s output (it read 'schedule None')."""
    flat = result("flat", 1000.0)
    piped = result("piped", 900.0, parallel={**TEMPLATE["spec"]["parallel"], "pp": 2})
    keys = [RunResult.from_dict(data).point_key for data in (flat, piped)]
    assert keys[0].pp_schedule is None and keys[1].pp_schedule == "1f1b"
    assert keys[0].label(keys) == keys[0].label() and keys[1].label(keys).endswith(" PP2 fp32, schedule 1f1b")
    assert run_command("baseline", ["save", str(write(tmp_path / "runs", flat, piped)), "--out",
                                    str(tmp_path / "baseline.json")]) == 0
    said = capsys.readouterr().out
    assert "schedule 1f1b" in said and "None" not in said
    unset = PointKey(*[None if name == "steps" else value for name, value in zip(PointKey.fields(), keys[0].values())])
    assert ", steps not set" in unset.label(keys) and "None" not in unset.label(keys)
