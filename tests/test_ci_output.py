"""`hwbench history changes --format json` and `--junit FILE`: the verdicts of the change-point
search as data for CI (hwbench/judge/ci_output.py). The nights are those of tests/test_history.py:
modified copies of a real result, 3 repeats a night around a level."""

from __future__ import annotations

import json

import pytest
from test_history import night_date, write_nights

from hwbench.cli import run_command
from hwbench.errors import UsageError
from hwbench.judge.compare import REGRESSION_EXIT


def history(capsys, *argv) -> tuple[int, str]:
    code = run_command("history", [str(a) for a in argv])
    return code, capsys.readouterr().out


@pytest.fixture
def db(tmp_path, capsys):
    """25 nights at 1000 tokens/s, then 6 at 930: an open 7% regression from night 25."""
    path = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 25 + [930.0] * 6), "--db", path)
    return path


def test_changes_as_json(db, capsys):
    code, out = history(capsys, "changes", "--db", db, "--metric", "tokens_per_s", "--format", "json")
    data = json.loads(out)
    assert code == data["exit_status"] == REGRESSION_EXIT
    [series] = data["series"]
    assert series["label"] == "tokens/s of tiny on Intel(R) Xeon(R) Processor fp32" and series["nights"] == 31
    [change] = series["changes"]
    assert change["night"] == night_date(25) and change["kind"] == "regression"
    assert -0.08 <= change["change"] <= -0.06 and change["ci95_low"] < change["change"] < change["ci95_high"]
    assert change["commit"].startswith("c025") and change["previous_commit"].startswith("c024")
    assert series["open_regression"]["night"] == night_date(25) and data["open_regressions"] == 1
    # accepted from a later date on: no open regression, exit 0
    code, out = history(capsys, "changes", "--db", db, "--metric", "tokens_per_s", "--format", "json",
                        "--since", night_date(26))
    assert code == 0 and json.loads(out)["series"][0]["open_regression"] is None


def test_changes_as_junit_read_by_a_junit_consumer(db, capsys, tmp_path):
    junitparser = pytest.importorskip("junitparser")
    junit = tmp_path / "changes.xml"
    code, out = history(capsys, "changes", "--db", db, "--junit", junit)
    assert code == REGRESSION_EXIT and "OPEN REGRESSION" in out  # the text output is unchanged
    [suite] = list(junitparser.JUnitXml.fromfile(str(junit)))
    assert (suite.name, suite.tests, suite.failures) == ("hwbench history changes", 3, 2)  # tokens/s, step time
    cases = {case.name: case for case in suite}
    [failure] = cases["tokens/s of tiny on Intel(R) Xeon(R) Processor fp32"].result
    assert type(failure).__name__ == "Failure" and failure.message.startswith("open regression: ")
    assert f"worse than before {night_date(25)}" in failure.message
    assert cases["peak memory of tiny on Intel(R) Xeon(R) Processor fp32"].is_passed


def test_an_unwritable_junit_file_is_one_line(db, tmp_path):
    with pytest.raises(UsageError, match="--junit .*cannot be written"):
        run_command("history", ["changes", "--db", str(db), "--junit", str(tmp_path / "no" / "such" / "x.xml")])


def test_a_junit_file_naming_the_database_or_empty_is_refused(db):
    before = db.read_bytes()
    with pytest.raises(UsageError, match="--junit .* is one of the input files"):  # it replaced the database
        run_command("history", ["changes", "--db", str(db), "--junit", str(db)])
    assert db.read_bytes() == before
    with pytest.raises(UsageError, match="--junit '' is not accepted"):  # it was taken as no --junit
        run_command("history", ["changes", "--db", str(db), "--junit", ""])
