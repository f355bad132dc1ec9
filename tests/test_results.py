"""Result files: atomic writes, round trips and refusing what cannot be read."""

import json
import math
import warnings

import pytest

from hwbench import RESULT_SCHEMA_VERSION
from hwbench.results import ResultFormatError, RunResult, load_result, load_results, write_result


def _result(run_id="r1", **metrics):
    return RunResult(run_id=run_id, status="ok", spec={"model": "tiny"},
                     metrics={"tokens_per_s": 123.5, **metrics}, steps=[{"step": 1, "loss": 10.8}])


def test_write_then_load_round_trip(tmp_path):
    original = _result(mfu=None, unmeasured={"mfu": "no peak"})
    path = write_result(original, tmp_path / "runs")
    assert path.name == "r1.json"
    loaded = load_result(path)
    assert loaded == original
    data = json.loads(path.read_text())
    assert list(data)[0] == "schema_version" and data["schema_version"] == RESULT_SCHEMA_VERSION
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["r1.json"]  # no temporary left


def test_a_non_finite_figure_is_written_as_null_not_lost(tmp_path):
    """JSON has no NaN: a figure that is not a number was not measured, so it is written
    as null and the rest of the measurement is kept (it used to raise and lose it all)."""
    path = write_result(_result(tokens_per_s=math.nan, mfu=math.inf), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["r1.json"]  # no temporary left
    loaded = load_result(path)
    assert loaded.metrics["tokens_per_s"] is None and loaded.metrics["mfu"] is None
    assert loaded.steps == [{"step": 1, "loss": 10.8}]


def test_unknown_status_is_refused(tmp_path):
    bad = _result()
    bad.status = "great"
    with pytest.raises(ValueError, match="unknown status"):
        write_result(bad, tmp_path)


def test_truncated_file_is_refused_and_skipped_with_a_warning(tmp_path):
    good = write_result(_result("good"), tmp_path)
    broken = write_result(_result("broken"), tmp_path)
    broken.write_text(broken.read_text()[:40])
    with pytest.raises(ResultFormatError, match="broken.json.*truncated"):
        load_result(broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results, skipped = load_results([tmp_path])
    assert [r.run_id for r in results] == ["good"]
    assert [p.name for p, _ in skipped] == ["broken.json"]
    assert any("broken.json" in str(w.message) for w in caught)
    assert good.exists()


def test_a_run_read_twice_counts_once(tmp_path):
    """The same folder given twice, or a result copied beside its original, is one run:
    counted twice it would pass for a repeat in a comparison or a report's statistics."""
    original = write_result(_result("r1"), tmp_path / "a")
    (tmp_path / "b").mkdir()
    copy = tmp_path / "b" / original.name
    copy.write_text(original.read_text())
    write_result(_result("r2"), tmp_path / "b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results, skipped = load_results([tmp_path, tmp_path / "a"])
    assert sorted(r.run_id for r in results) == ["r1", "r2"]
    assert skipped == [(copy, f"{copy}: run r1 was already read from {original}")]  # the file named twice: once
    assert len(caught) == 1


def test_unknown_schema_version_is_refused(tmp_path):
    path = write_result(_result(), tmp_path)
    data = json.loads(path.read_text())
    data["schema_version"] = RESULT_SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(ResultFormatError, match=f"schema_version {RESULT_SCHEMA_VERSION + 1}"):
        load_result(path)


def test_file_without_schema_version_is_not_a_result(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(ResultFormatError, match="not an hwbench result"):
        load_result(path)


def test_sweep_and_tune_summaries_beside_results_are_not_read_as_results(tmp_path):
    """A sweep point keeps aggregate.json beside its repeats, tune its ranking.json: a
    folder search reads the results only, with no 'not an hwbench result' warning."""
    write_result(_result("r1"), tmp_path / "point")
    (tmp_path / "point" / "aggregate.json").write_text(json.dumps({"ok": 1}))
    (tmp_path / "ranking.json").write_text(json.dumps([]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results, skipped = load_results([tmp_path])
    assert [r.run_id for r in results] == ["r1"] and skipped == []
