"""Commands under SIGTERM, SIGHUP and SIGKILL, as a CI job cancelled, a terminal closed or
the OOM killer would send them: real processes, real signals. SIGTERM and SIGHUP end a
command as Ctrl-C does (exit 130, one line, nothing unfinished left); after SIGKILL, which
no process can handle, nothing hwbench started keeps running, and what it left half-written
is cleaned up by the next run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _session_members(session: int) -> list[int]:
    """Processes of a session (the command was started as its leader)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether the process has installed a handler for ``sig`` (SigCgt in /proc/PID/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _big_input(folder: Path) -> Path:
    source = folder / "in.jsonl"
    line = json.dumps({"text": "lorem ipsum dolor sit amet " * 10}) + "\n"
    source.write_text(line * 150_000)
    return source


def _start_prepare(folder: Path, source: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hwbench", "data", "prepare", "--input", str(source),
                             "--output-prefix", str(folder / "out"), "--tokenizer", "byte", "--workers", "2",
                             "--quiet"], env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob("out_text_document.*.tmp"))


def _writing(folder: Path) -> bool:
    return any(path.name.startswith("out_text_document.bin.") and path.stat().st_size > 0
               for path in _temporaries(folder))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_prepare_under_sigterm_and_sighup_ends_as_ctrl_c(tmp_path, sig):
    prepare = _start_prepare(tmp_path, _big_input(tmp_path))
    try:
        _wait_until(lambda: _writing(tmp_path), 60, "prepare to write")
        os.killpg(prepare.pid, sig)  # a terminal's hang-up goes to the whole group, workers included
        _, err = prepare.communicate(timeout=60)
    finally:
        if prepare.poll() is None:
            os.killpg(prepare.pid, signal.SIGKILL)
    assert prepare.returncode == 130, err
    assert err == f"hwbench: interrupted by {sig.name}; nothing unfinished was written\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    _wait_until(lambda: not _session_members(prepare.pid), 10, "the workers to end")


def test_prepare_killed_outright_leaves_no_worker_and_the_next_run_cleans_up(tmp_path):
    source = _big_input(tmp_path)
    prepare = _start_prepare(tmp_path, source)
    try:
        _wait_until(lambda: _writing(tmp_path), 60, "prepare to write")
        assert len(_session_members(prepare.pid)) >= 3  # the command and its two workers
        prepare.kill()  # SIGKILL to the command alone: its workers must not run on
        prepare.wait(timeout=30)
        _wait_until(lambda: not _session_members(prepare.pid), 10, "the orphaned workers to die")
    finally:
        if _session_members(prepare.pid):
            os.killpg(prepare.pid, signal.SIGKILL)
    assert _temporaries(tmp_path)  # no process could remove them
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"text": "abc"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "hwbench", "data", "prepare", "--input", str(small),
                           "--output-prefix", str(tmp_path / "out"), "--tokenizer", "byte", "--quiet"],
                          env=_environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _temporaries(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out_text_document.bin",
                                                          "out_text_document.idx", "small.jsonl"]


def test_a_one_process_run_under_sigterm_ends_as_ctrl_c(tmp_path):
    sig = signal.SIGTERM  # SIGHUP takes the same handler (the prepare tests send both)
    out = tmp_path / "runs"
    run = subprocess.Popen([sys.executable, "-m", "hwbench", "run", "--model", "tiny", "--device", "cpu",
                            "--seq-length", "32", "--steps", "100000", "--warmup", "0", "--data", "synthetic",
                            "--no-telemetry", "--out", str(out)], env={**_environment(), "CI": "true"},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        said = []  # into the training steps: its progress (stderr) says the first one is done
        for line in run.stderr:
            said.append(line)
            if ": step 1/100000 (timed)" in line:
                break
        assert _catches(run.pid, sig) and run.poll() is None, (said, run.communicate())
        run.send_signal(sig)
        _, rest = run.communicate(timeout=60)
        err = "".join(said) + rest
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, err
    assert err.strip().splitlines()[-1] == f"hwbench: interrupted by {sig.name}; nothing unfinished was written"
    assert "Traceback" not in err
    assert not out.exists() or list(out.iterdir()) == []
