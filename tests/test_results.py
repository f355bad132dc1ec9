"""Result files: atomic writes, round trips and refusing what cannot be read."""

import json
import math
import warnings

import pytest
from pydantic import ValidationError

from hwbench import RESULT_SCHEMA_VERSION
from hwbench.files import finite
from hwbench.result.model import Metrics, RunResult
from hwbench.result.store import ResultFormatError, load_result, load_results, write_result


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
    """JSON has no NaN: a figure that is not a number was not measured. The figures a run
    assembles pass through finite() (hwbench.harness.merge), so it is null and the rest of the
    measurement is kept; set directly, the model refuses it at once, naming the field."""
    figures = finite({"tokens_per_s": math.nan, "mfu": math.inf, "samples_per_s": 2.5})
    path = write_result(_result(**figures), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["r1.json"]  # no temporary left
    loaded = load_result(path)
    assert loaded.metrics.tokens_per_s is None and loaded.metrics.mfu is None and loaded.metrics.samples_per_s == 2.5
    assert [(step.step, step.loss) for step in loaded.steps] == [(1, 10.8)]
    with pytest.raises(ValidationError, match="mfu"):
        loaded.metrics.mfu = math.nan


def test_unknown_status_is_refused(tmp_path):
    bad = _result()
    with pytest.raises(ValidationError, match="status"):
        bad.status = "great"
    with pytest.raises(ValidationError, match="status"):
        RunResult(run_id="r1", status="great", spec={})


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


def test_an_integer_of_400_digits_where_a_float_belongs_is_named_and_skipped(tmp_path, capsys):
    """It used to pass the loader and end `hwbench report`, `compare` and `history add` in an
    OverflowError (a float cannot hold it): now each names the file and leaves it out."""
    from pathlib import Path

    from hwbench.cli import main

    template = Path(__file__).parent / "data" / "compare" / "tiny-cpu.json"
    good, mixed = tmp_path / "good", tmp_path / "mixed"
    for folder in (good, mixed):
        folder.mkdir()
        (folder / "good.json").write_text(template.read_text())
    path = mixed / "digits.json"
    big = json.loads(template.read_text())["metrics"]["samples_per_s"]
    path.write_text(template.read_text().replace(f'"samples_per_s": {big}', '"samples_per_s": 1' + "0" * 400))
    reason = f"{path}: field metrics.samples_per_s: must be a number a float holds, not an integer of 401 digits"
    with pytest.raises(ResultFormatError) as error:
        load_result(path)
    assert str(error.value) == reason
    for argv in (["report", str(mixed)], ["compare", str(good), str(mixed)],
                 ["history", "add", str(mixed), "--db", str(tmp_path / "h.sqlite")]):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 0 and "Traceback" not in err and reason in err, argv


def test_the_umask_is_read_without_leaving_its_file_open(monkeypatch):
    import builtins

    from hwbench import files

    opened = []
    real_open = builtins.open

    def recording(*args, **kwargs):
        opened.append(real_open(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(builtins, "open", recording)
    assert 0 <= files.umask() <= 0o777
    assert opened and all(stream.closed for stream in opened)  # it used to wait for the garbage collector


def test_a_result_out_could_not_take_is_named_by_its_file_where_it_was_kept(tmp_path, monkeypatch):
    """The line used to name only the temp folder, where other results lie too."""
    import tempfile

    from hwbench.result.store import store_result

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    stored = store_result(_result(), blocker / "runs")  # --out under a file: it cannot be made
    assert stored.path == tmp_path / "temp" / "r1.json" and load_result(stored.path) == _result()
    assert stored.problem.endswith(f"it was kept as {stored.path}")


def test_a_section_refuses_membership_tests():
    """`"x" in section` would be quietly False (pydantic iterates pairs): refused, so no assertion
    written that way can pass without looking."""
    section = Metrics(tokens_per_s=1.0)
    with pytest.raises(TypeError, match="read by attribute"):
        _ = "tokens_per_s" in section
