"""What an attack on the newer commands found outside the history and calibration modules (their
own tests hold the rest): each case a hostile or careless input that used to misbehave, now refused
in one line with nothing written (docs/reliability.md lists them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwbench.cli import main
from hwbench.errors import UsageError

DATA = Path(__file__).parent / "data"


def _one_line_exit_2(capsys, argv, *expected) -> str:
    code = main([str(arg) for arg in argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    return err


@pytest.mark.parametrize("excess", [1, 100_000])
def test_prepare_refuses_more_workers_than_twice_the_cores_before_starting_one(tmp_path, capsys, excess):
    """--workers 100000 used to fork 100,000 tokenizer processes and took down a 24 GiB machine."""
    from hwbench.device.host import usable_cores
    from hwbench.workload.prepare import prepare

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "abc"}) + "\n")
    cores = usable_cores()
    workers = 2 * cores + excess
    _one_line_exit_2(capsys, ["data", "prepare", "--input", source, "--output-prefix", tmp_path / "out",
                              "--tokenizer", "byte", "--workers", workers],
                     f"--workers {workers} is not accepted; give 1 to {2 * cores} (twice the {cores} cores this "
                     "process may use)")
    with pytest.raises(UsageError, match=f"--workers {workers} is not accepted; give 1 to {2 * cores}"):  # the API
        prepare(str(source), str(tmp_path / "out"), tokenizer="byte", workers=workers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_prepare_refuses_an_output_that_is_a_folder_before_tokenizing(tmp_path, capsys):
    """The .bin is renamed over its final name at the end: a folder there was a traceback."""
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "abc"}) + "\n")
    (tmp_path / "out_text_document.bin").mkdir()
    _one_line_exit_2(capsys, ["data", "prepare", "--input", source, "--output-prefix", tmp_path / "out",
                              "--tokenizer", "byte"], "out_text_document.bin exists and is not a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out_text_document.bin"]


def test_load_results_refuses_a_path_that_does_not_exist_as_the_commands_do():
    """A typo used to give an empty DataFrame without a word."""
    import hwbench

    with pytest.raises(UsageError, match="paths 'no_such_folder': no such file or folder"):
        hwbench.load_results("no_such_folder")
    assert len(hwbench.load_results(DATA / "history" / "noise")) == 20


@pytest.mark.parametrize("excess", [1, 1024])
def test_more_cpu_ranks_than_eight_per_core_are_refused_before_any_starts(tmp_path, capsys, excess):
    """--nproc-per-node 1024 on the cpu used to start 1,024 torch processes (220 MiB each)."""
    import hwbench
    from hwbench.device.host import usable_cores

    most = 8 * usable_cores()
    if most >= 1024:
        pytest.skip("--nproc-per-node stops at 1024 on every device: this machine's cpu bound is above it")
    ranks = min(most + excess, 1024)
    expected = f"--nproc-per-node {ranks} is not accepted on the cpu; accepted: 1 to {most}"
    _one_line_exit_2(capsys, ["run", "--device", "cpu", "--model", "tiny", "--quiet", "--nproc-per-node", ranks,
                              "--out", tmp_path / "o"], expected)
    with pytest.raises(UsageError, match=expected):  # the Python API takes the same path
        hwbench.run(device="cpu", model="tiny", nproc_per_node=ranks, out=str(tmp_path / "o"))
    assert list(tmp_path.iterdir()) == []


def test_prepare_refuses_an_output_that_is_its_input(tmp_path, capsys):
    """An input named like the output (PREFIX_text_document.bin) was overwritten by it, exit 0."""
    source = tmp_path / "out_text_document.bin"
    source.write_text(json.dumps({"text": "abc"}) + "\n")
    _one_line_exit_2(capsys, ["data", "prepare", "--input", source, "--input-format", "json",
                              "--output-prefix", tmp_path / "out", "--tokenizer", "byte"],
                     "out_text_document.bin is the --input file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out_text_document.bin"]
    assert json.loads(source.read_text()) == {"text": "abc"}


def test_prepare_names_a_folder_given_as_input_as_such(tmp_path, capsys):
    """A folder used to be called "no such file"."""
    _one_line_exit_2(capsys, ["data", "prepare", "--input", tmp_path, "--output-prefix", tmp_path / "out",
                              "--tokenizer", "byte"], f"--input {tmp_path}: not a regular file")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_with_more_repeats_than_any_spread_needs_is_refused_at_once(tmp_path, capsys):
    """--repeats 10**9 listed every run before the first: hours of CPU and gigabytes of memory."""
    import hwbench

    suite = tmp_path / "t.yaml"
    suite.write_text(json.dumps({"name": "t", "points": [{"name": "p", "model": "tiny"}]}))
    _one_line_exit_2(capsys, ["sweep", suite, "--repeats", "1001", "--out", tmp_path / "o"],
                     "--repeats 1001 is not accepted; give an integer from 1 to 1000")
    with pytest.raises(UsageError, match="--repeats 1000000000 is not accepted"):
        hwbench.sweep(suite, out=tmp_path / "o", repeats=10**9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]


# heavy: the point loop tune runs through stops on SIGTERM and resumes in the default run
# (tests/test_sweep.py, test_sigterm_stops_the_sweep_and_the_same_command_resumes)
@pytest.mark.slow
@pytest.mark.heavy
def test_tune_under_sigterm_ends_in_one_line_and_the_same_command_resumes(tmp_path):
    """A real tune and a real SIGTERM while its first trial runs: one line, exit 128 + 15 as a sweep
    (its trials are a sweep's points), no process left; the same command then finishes, keeping the
    trials measured before."""
    import os
    import signal
    import subprocess
    import sys
    import time

    command = [sys.executable, "-m", "hwbench", "tune", "--model", "tiny", "--devices", "1", "--device", "cpu",
               "--steps", "2", "--warmup", "1", "--seq-length", "32", "--max-trials", "2", "--patience", "2",
               "--quiet", "--out", str(tmp_path)]
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    tune = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)

    def children() -> list[str]:
        return subprocess.run(["pgrep", "-P", str(tune.pid)], capture_output=True, text=True).stdout.split()

    deadline = time.monotonic() + 120
    while not children() and tune.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    tune.send_signal(signal.SIGTERM)
    _out, err = tune.communicate(timeout=120)
    assert tune.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == ("hwbench: tune stopped by SIGTERM; measured trials are kept, the same "
                                            "command resumes")
    assert subprocess.run(["pgrep", "-s", str(tune.pid)], capture_output=True).stdout == b""  # nothing left
    kept = {path.name for path in (tmp_path / "tiny-1").glob("*/*.json")}  # a trial's result, when it finished

    again = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    ranking = json.loads((tmp_path / "tiny-1" / "ranking.json").read_text())
    assert len([trial for trial in ranking["trials"] if trial["samples_per_s"]]) == 2
    results = {path.name for path in (tmp_path / "tiny-1").glob("*/*.json")}
    assert kept <= results and len(results) == 2  # one result per trial: none measured again


def test_a_damaged_earlier_result_is_named_in_one_line_when_a_sweep_resumes(tmp_path, capsys):
    """Python's warning used to show its file:line and a line of hwbench's source per damaged file."""
    suite = tmp_path / "t.yaml"
    suite.write_text(json.dumps({"name": "t", "points": [{"name": "p", "model": "tiny", "nproc_per_node": 1024,
                                                          "device": "cpu"}]}))  # refused at once by its run
    damaged = tmp_path / "o" / "t" / "p" / "earlier.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"schema_version": 2, "run_id": "x", "sta')
    main(["sweep", str(suite), "--out", str(tmp_path / "o"), "--quiet"])
    lines = capsys.readouterr().err.splitlines()
    named = [line for line in lines if str(damaged) in line]
    assert named == [f"hwbench sweep: warning: skipping {damaged}: not a complete JSON document (truncated?): "
                     "Unterminated string starting at: line 1 column 38 (char 37)"], lines
    assert not any("UserWarning" in line or "keyed_results" in line for line in lines), lines


def test_a_cpu_run_predicted_to_need_more_than_the_hosts_memory_is_refused_before_it_starts(tmp_path, capsys):
    """--micro-batch-size 100000 of the tiny model (a 1.8 TiB prediction) was killed by the kernel's
    OOM killer on a 24 GiB machine: no result, no line, and other processes at risk."""
    import hwbench

    argv = ["run", "--device", "cpu", "--model", "tiny", "--quiet", "--micro-batch-size", "100000",
            "--global-batch-size", "100000", "--seq-length", "32", "--out", tmp_path / "o"]
    expected = "--micro-batch-size 100000 and --seq-length 32 is not accepted on this cpu: predicted peak "
    err = _one_line_exit_2(capsys, argv, expected, "more than the host's", "`hwbench plan` shows the prediction")
    assert "x 1 rank(s)" in err
    with pytest.raises(UsageError, match="--micro-batch-size 100000 and --seq-length 32 is not accepted"):
        hwbench.run(device="cpu", model="tiny", micro_batch_size=100000, global_batch_size=100000, seq_length=32,
                    out=str(tmp_path / "o"))
    assert list(tmp_path.iterdir()) == []
