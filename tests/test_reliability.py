"""The holes a reliability attack found, each held shut: nothing written
outside --out, no measurement lost to a failed write, bad input refused in one line,
and damaged files named rather than hidden. Process faults are in test_faults.py."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hwbench.cli import main
from hwbench.suites.executor import lock_path

REPO = Path(__file__).resolve().parent.parent
FAST = {"model": "tiny", "data": "synthetic", "seq-length": 32, "steps": 1, "warmup": 0, "eval-iters": 0,
        "telemetry": False, "timeout": 120}
RESULT = REPO / "tests" / "data" / "compare" / "tiny-cpu.json"


def _one_line_exit_2(capsys, argv, *fragments) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in captured.err
    return lines[0]


def _files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")} if folder.exists() else set()


# --- 1. writes escape --out --------------------------------------------------------


@pytest.mark.parametrize("suite_name,point_name", [
    ("../../escape", "p"), ("ok", "../../../pt"), ("ok", "a/b"), ("..", "p"), ("ok", "nul\x00name"),
    ("ok", "back\\slash"),
])
def test_names_that_would_leave_out_are_refused_at_load(tmp_path, capsys, suite_name, point_name):
    work = tmp_path / "work"
    out = work / "deep" / "out"
    out.mkdir(parents=True)
    suite = work / "suite.yaml"
    suite.write_text(json.dumps({"name": suite_name, "defaults": FAST, "points": [{"name": point_name}]}))
    before = _files_under(tmp_path)
    _one_line_exit_2(capsys, ["sweep", str(suite), "--out", str(out)], "is not accepted", "folder under --out")
    assert _files_under(tmp_path) == before  # nothing written anywhere


def test_a_suite_built_in_code_cannot_leave_out_either(tmp_path):
    from hwbench.errors import UsageError
    from hwbench.suites.executor import SweepOptions
    from hwbench.suites.suite import Point, Suite
    from hwbench.suites.sweep import run_sweep

    suite = Suite("s", "", "code", (Point("../../x", (("model", "tiny"),)),))
    with pytest.raises(UsageError, match="outside --out"):
        run_sweep(suite, SweepOptions(out_dir=tmp_path / "out"))
    assert not (tmp_path / "x").exists() and not (tmp_path / "out").exists()


# --- 3. an unwritable or full --out -------------------------------------------------


@contextlib.contextmanager
def _tmpfs(folder: Path, size: str):
    """A small tmpfs at ``folder`` (root can mount one); skips when this machine cannot."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to test a full or read-only disk: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _fill(folder: Path) -> None:
    """Write until the file system is full."""
    handle = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(handle, b"\0" * 4096)
    finally:
        os.close(handle)


def test_a_read_only_out_is_refused_before_anything_runs(tmp_path, capsys):
    with _tmpfs(tmp_path / "ro", "1m") as disk:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        _one_line_exit_2(capsys, ["run", "--quiet", "--model", "tiny", "--out", str(disk / "runs")],
                         "--out", "cannot be written", "Read-only file system")
        _one_line_exit_2(capsys, ["sweep", "smoke", "--quiet", "--out", str(disk / "sweeps")],
                         "--out", "cannot be written")


def test_a_regular_file_as_sweep_out_is_one_line(tmp_path, capsys):
    target = tmp_path / "a-regular-file"
    target.write_text("keep me")
    _one_line_exit_2(capsys, ["sweep", "smoke", "--out", str(target)], "--out", "is a file")
    assert target.read_text() == "keep me"


def _run_into(out: Path, temp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hwbench", "run", "--quiet", "--model", "tiny", "--data", "synthetic",
                           "--seq-length", "32", "--steps", "1", "--warmup", "0", "--eval-iters", "0",
                           "--no-telemetry", "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(temp)})


def test_a_disk_that_fills_during_the_run_keeps_the_result_elsewhere(tmp_path):
    """--out passes the check (an empty probe file fits) but the result does not: it is
    kept in the system temp folder, named on stderr in one line, exit 1."""
    spare = tmp_path / "spare"
    spare.mkdir()
    with _tmpfs(tmp_path / "full", "256k") as disk:
        _fill(disk)
        done = _run_into(disk, spare)
    assert done.returncode == 1, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    kept = list(spare.glob("*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["status"] == "ok"
    assert "could not be written to" in line and "No space left on device" in line
    assert f"it was kept as {kept[0]}" in line  # the file, not only the folder it is in
    assert str(kept[0]) in done.stdout  # the summary table names where it is


def test_when_no_folder_takes_the_result_its_json_is_returned_for_stdout(tmp_path, monkeypatch, capsys):
    """--out and the temp folder both full: the JSON is printed (hwbench.cli prints
    StoredResult.text), and the line on stderr says so."""
    import tempfile

    from hwbench.result.model import RunResult
    from hwbench.result.store import store_result

    result = RunResult.from_dict(json.loads(RESULT.read_text()))
    with _tmpfs(tmp_path / "full", "256k") as disk:
        _fill(disk)
        monkeypatch.setattr(tempfile, "tempdir", str(disk))  # the temp folder is that full disk too
        stored = store_result(result, disk / "runs")
    assert stored.path is None and "the result follows on stdout" in stored.problem
    assert "No space left on device" in stored.problem
    assert json.loads(stored.text) == result.to_dict()  # the whole result (at schema 2: tests/test_result_upgrade.py)


# --- 4. non-UTF-8 YAML ------------------------------------------------------------------


def test_a_non_utf8_suite_names_the_file_and_byte(tmp_path, capsys):
    suite = tmp_path / "latin1.yaml"
    suite.write_bytes("name: caf\u00e9\npoints: [{}]\n".encode("latin-1"))
    _one_line_exit_2(capsys, ["sweep", str(suite), "--out", str(tmp_path / "out")], str(suite),
                     "not UTF-8 text at byte 9")


def test_a_non_utf8_catalog_entry_names_the_file_and_byte(tmp_path, capsys, monkeypatch):
    entry = tmp_path / "catalog" / "devices" / "weird.yaml"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"name: weird\ntitle: \xff\xfe\n")
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path / "catalog"))
    _one_line_exit_2(capsys, ["models"], str(entry), "not UTF-8 text at byte 19")


# --- 6. two sweeps into one folder ------------------------------------------------


def test_a_second_sweep_on_a_locked_folder_is_refused_naming_the_holder(tmp_path, capsys):
    suite = tmp_path / "t.yaml"
    suite.write_text(yaml.safe_dump({"name": "t", "defaults": FAST, "points": [{"name": "p"}]}))
    out = tmp_path / "out"
    (out / "t").mkdir(parents=True)
    with open(lock_path(out, "t"), "a+") as holder:  # as a running sweep holds it
        fcntl.flock(holder, fcntl.LOCK_EX)
        holder.write("424242\n")
        holder.flush()
        _one_line_exit_2(capsys, ["sweep", str(suite), "--out", str(out)], "another sweep (pid 424242)", "--wait")
    assert not (out / "t" / "p").exists()  # nothing ran


@pytest.mark.slow
def test_a_stale_lock_from_a_dead_sweep_never_blocks(tmp_path):
    suite = tmp_path / "t.yaml"
    suite.write_text(yaml.safe_dump({"name": "t", "defaults": FAST, "points": [{"name": "p"}]}))
    out = tmp_path / "out"
    (out / "t").mkdir(parents=True)
    (lock_path(out, "t")).write_text("1\n")  # a lock file whose holder is gone: no flock on it
    assert main(["sweep", str(suite), "--out", str(out), "--quiet"]) == 0
    assert len(list((out / "t" / "p").glob("*.json"))) == 1
    assert (lock_path(out, "t")).read_text().strip() == str(os.getpid())


# --- 7, 2. damaged result files -------------------------------------------------------


def _damaged_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(RESULT, folder / "good.json")
    data = json.loads(RESULT.read_text())
    (folder / "null-spec.json").write_text(json.dumps({**data, "run_id": "x", "spec": None}))
    (folder / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (folder / "digits.json").write_text('{"schema_version": 1, "run_id": "d", "status": "ok", "spec": {}, '
                                        '"metrics": {"samples_per_s": ' + "9" * 5000 + "}}")
    return folder


def test_report_skips_a_null_spec_and_deep_nesting_with_the_reason(tmp_path, capsys):
    folder = _damaged_folder(tmp_path)
    assert main(["report", str(folder), "--out", str(tmp_path / "report.md")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for name, reason in (("null-spec.json", "spec: must be a mapping"), ("deep.json", "nested too deeply"),
                         ("digits.json", "not a result")):
        assert any(name in line and reason in line for line in err.splitlines()), err
    assert "null-spec.json" in (tmp_path / "report.md").read_text()  # and in the report itself


def test_compare_skips_them_too(tmp_path, capsys):
    folder = _damaged_folder(tmp_path)
    assert main(["compare", str(folder), str(folder)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("file left out") == 6  # three each side


# --- 8. tune checks its paths first ------------------------------------------------------


def test_tune_refuses_a_missing_dataset_before_the_first_trial(tmp_path, capsys):
    out = tmp_path / "tune"
    _one_line_exit_2(capsys, ["tune", "--model", "tiny", "--devices", "2", "--data", "/nonexistent",
                              "--out", str(out)], "--data '/nonexistent'")
    assert not out.exists()


# --- 10. smaller ones -------------------------------------------------------------------


def test_an_unknown_option_in_suite_defaults_refuses_the_suite(tmp_path, capsys):
    suite = tmp_path / "t.yaml"
    suite.write_text(yaml.safe_dump({"name": "t", "defaults": {**FAST, "tpp": 2}, "points": [{"name": "p"}]}))
    _one_line_exit_2(capsys, ["sweep", str(suite), "--out", str(tmp_path / "out")], "`tpp` is not a `hwbench run` "
                     "option", "accepted:", "tp")
    assert not (tmp_path / "out").exists()


def test_a_missing_catalog_path_folder_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path / "no-such-catalog"))
    _one_line_exit_2(capsys, ["models"], "HWBENCH_CATALOG_PATH", "no-such-catalog", "not a folder")


def test_a_fault_for_a_rank_or_step_the_run_does_not_have_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HWBENCH_FAULT", "5:1:raise")
    _one_line_exit_2(capsys, ["run", "--quiet", "--model", "tiny", "--nproc-per-node", "2", "--out",
                              str(tmp_path / "out")], "RANK 5", "0 to 1")
    monkeypatch.setenv("HWBENCH_FAULT", "0:99:raise")
    _one_line_exit_2(capsys, ["run", "--quiet", "--model", "tiny", "--steps", "2", "--warmup", "1", "--out",
                              str(tmp_path / "out")], "STEP 99", "1 to 3")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,fragment", [(["--out", ""], "--out ''"), (["--timeout", "inf"], "--timeout inf")])
def test_empty_out_and_infinite_timeout_are_refused(tmp_path, capsys, args, fragment):
    _one_line_exit_2(capsys, ["run", "--quiet", "--model", "tiny", *args], fragment)


def test_a_negative_pointer_is_named_as_such(tmp_path):
    import numpy as np

    from hwbench.errors import UsageError
    from hwbench.workload.indexed import IndexedDataset, IndexedDatasetWriter

    prefix = str(tmp_path / "d")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document(np.arange(4, dtype=np.uint16))
        writer.add_document(np.arange(3, dtype=np.uint16))
    raw = bytearray(Path(prefix + ".idx").read_bytes())
    header = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, sequence count, document count
    pointers_at = header + 4 * 2  # after two int32 lengths
    raw[pointers_at + 8:pointers_at + 16] = (-2).to_bytes(8, "little", signed=True)
    Path(prefix + ".idx").write_bytes(bytes(raw))
    with pytest.raises(UsageError) as error:
        IndexedDataset(prefix)
    assert "sequence_pointers[1]" in str(error.value) and "is -2" in str(error.value)
    assert "ends at byte -2" not in str(error.value)


# --- found by the second attack ------------------------------------------------------------


@pytest.mark.parametrize("command", ["report", "system"])
def test_an_output_that_is_an_input_or_not_a_regular_file_is_refused(tmp_path, capsys, command):
    result = tmp_path / "r.json"
    shutil.copy(RESULT, result)
    before = result.read_bytes()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # stands for /dev/full: a rename would have replaced the device with a file
    for out, fragment in ((result, "is one of the input files"), (fifo, "is not a regular file")):
        argv = [command, str(result), "--out", str(out)] if command == "system" else [command, str(result), "--out",
                                                                                     str(out)]
        _one_line_exit_2(capsys, argv, "--out", fragment)
    assert result.read_bytes() == before and fifo.is_fifo()


@pytest.mark.parametrize("point,fragment", [
    ({"name": "a", "env": {"A=B": "x"}}, "env 'A=B'"),
    ({"name": "a", "env": {"A": "x\x00y"}}, "env 'A'"),
    ({"name": ["a", "b"]}, "must be one name"),
])
def test_a_bad_point_env_or_name_refuses_the_suite(tmp_path, capsys, point, fragment):
    suite = tmp_path / "t.yaml"
    suite.write_text(json.dumps({"name": "t", "defaults": FAST, "points": [point]}))
    _one_line_exit_2(capsys, ["sweep", str(suite), "--out", str(tmp_path / "out")], fragment)
    assert not (tmp_path / "out").exists()


def test_a_list_as_suite_name_is_refused(tmp_path, capsys):
    suite = tmp_path / "t.yaml"
    suite.write_text(json.dumps({"name": ["a", "b"], "defaults": FAST, "points": [{"name": "p"}]}))
    _one_line_exit_2(capsys, ["sweep", str(suite), "--out", str(tmp_path / "out")], "must be one name")


@pytest.mark.parametrize("args,fragment", [
    (["--nproc-per-node", "100000"], "--nproc-per-node 100000"),
    (["--micro-batch-size", "99999999999999999999"], "--micro-batch-size 99999999999999999999"),
    (["--eval-iters", "99999999999999"], "--eval-iters 99999999999999"),
    (["--fsdp"], "--fsdp shards over the data-parallel ranks"),
])
def test_unbounded_values_and_fsdp_alone_are_refused(tmp_path, capsys, args, fragment):
    _one_line_exit_2(capsys, ["run", "--quiet", "--model", "tiny", *args, "--out", str(tmp_path / "o")], fragment)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_sweep_into_a_full_disk_ends_in_one_line(tmp_path):
    suite = tmp_path / "t.yaml"
    suite.write_text(json.dumps({"name": "t", "defaults": FAST, "points": [{"name": "p"}]}))
    spare = tmp_path / "spare"
    spare.mkdir()
    with _tmpfs(tmp_path / "full", "256k") as disk:
        _fill(disk)
        done = subprocess.run([sys.executable, "-m", "hwbench", "sweep", str(suite), "--out", str(disk / "s")],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(spare)})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "the sweep could not write to" in done.stderr.strip().splitlines()[-1]
    assert len(list(spare.glob("*.json"))) == 1  # the point's own result, kept by `hwbench run`
