"""Faults to real process trees: a signal to the launcher (`hwbench run`), torchrun's
agent, a rank, or the sweep. Each case asserts what docs/reliability.md promises: a
result or a recorded status, the documented exit status, finished results intact, and
no process of the tree left behind.

"No process left" is checked by a tag, not by names or parentage: every process of a
case inherits HWBENCH_TEST_TAG=<unique> in its environment, so /proc finds each one
wherever it was re-parented.

The default run covers the cases the reliability attack found orphaning processes
(SIGKILL of the launcher and of the sweep) and SIGTERM of the launcher (a rank's SIGKILL is
also in tests/test_sweep.py); the other 13 cases of the matrix run with
`python -m pytest -m faults tests/test_faults.py` (about 2 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import kill_tree, sigint_as_usual, without_preflight

from hwbench.result.store import load_results

RUN = [sys.executable, "-m", "hwbench", "run", "--quiet", "--model", "tiny", "--data", "synthetic", "--seq-length",
       "32", "--warmup", "1", "--eval-iters", "0", "--no-telemetry", "--nproc-per-node", "2", "--timeout", "300"]
FAST = {"model": "tiny", "data": "synthetic", "seq-length": 32, "steps": 2, "warmup": 1, "eval-iters": 0,
        "telemetry": False, "timeout": 300}
GONE_WITHIN_S = 30.0


def tagged(tag: str) -> list[int]:
    """Every live process whose environment holds the tag."""
    found = []
    marker = f"HWBENCH_TEST_TAG={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry))
        except OSError:
            continue
    return found


def wait_until_gone(tag: str) -> list[int]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline:
        left = tagged(tag)
        if not left:
            return []
        time.sleep(0.2)
    return tagged(tag)


class Case:
    """One process tree under test, with its own tag and temp folder."""

    def __init__(self, tmp_path: Path) -> None:
        self.tag = uuid.uuid4().hex
        self.temp = tmp_path / "tmp"
        self.temp.mkdir()
        self.env = {**os.environ, "HWBENCH_TEST_TAG": self.tag, "TMPDIR": str(self.temp)}
        self.process: subprocess.Popen | None = None

    def start(self, command: list[str]) -> subprocess.Popen:
        self.process = subprocess.Popen(command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, preexec_fn=sigint_as_usual)
        return self.process

    def run_folders(self) -> list[Path]:
        return sorted(self.temp.glob("hwbench-run-*"))

    def wait_for_training(self, timeout_s: float = 180.0) -> dict[int, dict]:
        """Both ranks past their first step; returns their heartbeats."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.communicate()
            beats = {}
            for folder in self.run_folders():
                for path in folder.glob("rank*.json"):
                    try:
                        beat = json.loads(path.read_text())
                    except (OSError, ValueError):
                        continue
                    beats[beat["rank"]] = beat
            if len(beats) == 2 and all(b["step"] >= 1 for b in beats.values()):
                return beats
            time.sleep(0.3)
        raise AssertionError("the ranks did not start training in time")

    def agent_pid(self) -> int:
        for pid in tagged(self.tag):
            try:
                if b"hwbench.harness.agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        raise AssertionError("no torchrun agent found")

    def finish(self, timeout_s: float = 120.0) -> tuple[int, str, str]:
        try:
            stdout, stderr = self.process.communicate(timeout=timeout_s)
        finally:
            kill_tree(self.process.pid)
        return self.process.returncode, stdout, stderr

    def cleanup(self) -> None:
        for pid in tagged(self.tag):  # a failing case must not leave its tree to the next
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def case(tmp_path):
    made = Case(tmp_path)
    yield made
    made.cleanup()


def _default(*values):
    return pytest.param(*values)


def _matrix_only(*values):
    return pytest.param(*values, marks=pytest.mark.faults)


# --- a signal to `hwbench run` (the launcher) ---------------------------------------


@pytest.mark.parametrize("sig", [_default(signal.SIGKILL), _default(signal.SIGTERM), _matrix_only(signal.SIGINT),
                                 _matrix_only(signal.SIGHUP)])
def test_a_signal_to_the_launcher_ends_the_whole_tree(case, tmp_path, sig):
    out = tmp_path / "out"
    case.start(RUN + ["--steps", "100000", "--out", str(out)])
    case.wait_for_training()
    case.process.send_signal(sig)
    code, _, stderr = case.finish()
    assert wait_until_gone(case.tag) == [], "processes of the run outlived the launcher"
    assert not out.exists() or not list(out.iterdir())  # an unfinished run writes nothing
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        stranded = case.run_folders()
        assert len(stranded) == 1  # the launcher could not clean up: the next run does (any run: one process
        # is enough, every `hwbench run` looks for stranded run folders before it starts its point)
        one_process = RUN[:RUN.index("--nproc-per-node")] + RUN[RUN.index("--nproc-per-node") + 2:]
        again = subprocess.run(one_process + ["--steps", "1", "--out", str(out)], env=case.env, capture_output=True,
                               text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-2000:]
        assert f"removed the run folder {stranded[0]} of a launcher that was killed" in again.stderr
        assert "it held no finished result" in again.stderr
        assert case.run_folders() == []
    else:
        how = "" if sig == signal.SIGINT else f" by {sig.name}"
        said = without_preflight(stderr)
        assert code == 130 and said == f"hwbench: interrupted{how}; nothing unfinished was written\n", stderr[-2000:]
        assert case.run_folders() == []


# --- a signal to torchrun's agent ------------------------------------------------------


@pytest.mark.parametrize(
    "sig",
    [
        _matrix_only(signal.SIGKILL),
        _matrix_only(signal.SIGTERM),
        _matrix_only(signal.SIGINT),
        _matrix_only(signal.SIGHUP),
    ],
)
def test_a_signal_to_the_agent_is_a_failed_result_and_no_orphan(case, tmp_path, sig):
    out = tmp_path / "out"
    case.start(RUN + ["--steps", "100000", "--out", str(out)])
    case.wait_for_training()
    os.kill(case.agent_pid(), sig)
    code, stdout, stderr = case.finish()
    assert wait_until_gone(case.tag) == []
    assert code == 1, stderr[-2000:]
    results, unreadable = load_results([out])
    assert unreadable == [] and len(results) == 1
    assert results[0].status == "failed" and results[0].error.message
    if sig != signal.SIGKILL:  # torchrun's own handler stopped the ranks: named, without torch's traceback
        assert results[0].error.type == "AgentStopped" and results[0].error.signal == sig.name
        assert "Traceback" not in stderr, stderr[-2000:]
    assert case.run_folders() == []


# --- a signal to a rank -------------------------------------------------------------------


@pytest.mark.parametrize(
    "sig",
    [
        _matrix_only(signal.SIGKILL),
        _matrix_only(signal.SIGTERM),
        _matrix_only(signal.SIGINT),
        _matrix_only(signal.SIGHUP),
    ],
)
def test_a_signal_to_a_rank_is_a_failed_result_naming_it(case, tmp_path, sig):
    out = tmp_path / "out"
    case.start(RUN + ["--steps", "100000", "--out", str(out)])
    beats = case.wait_for_training()
    os.kill(beats[1]["pid"], sig)
    code, _, stderr = case.finish()
    assert wait_until_gone(case.tag) == []
    assert code == 1, stderr[-2000:]
    (result,), _ = load_results([out])
    assert result.status == "failed"
    if sig == signal.SIGKILL:
        assert result.error.rank == 1 and result.error.signal == "SIGKILL"
    assert {r.rank for r in result.ranks} == {0, 1}  # every rank's last step is kept


# --- a signal to the sweep ---------------------------------------------------------------


def _sweep(case: Case, tmp_path: Path) -> tuple[list[str], Path]:
    suite = tmp_path / "s.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "defaults": FAST,
                "points": [
                    {"name": "first"},
                    {"name": "second", "nproc-per-node": 2, "steps": 100000},
                    {"name": "third"},
                ],
            }
        )
    )
    out = tmp_path / "out"
    return [sys.executable, "-m", "hwbench", "sweep", str(suite), "--out", str(out)], out


@pytest.mark.parametrize(
    "sig",
    [_default(signal.SIGKILL), _matrix_only(signal.SIGTERM), _matrix_only(signal.SIGINT), _matrix_only(signal.SIGHUP)],
)
def test_a_signal_to_the_sweep_keeps_finished_points_and_leaves_nothing(case, tmp_path, sig):
    command, out = _sweep(case, tmp_path)
    case.start(command)
    case.wait_for_training(timeout_s=300)  # the first point is done; the second is training
    first = load_results([out / "s" / "first"])[0]
    assert [r.status for r in first] == ["ok"]
    case.process.send_signal(sig)
    code, _, stderr = case.finish()
    assert wait_until_gone(case.tag) == [], "processes of the sweep outlived it"
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 128 + sig and "the same command resumes" in stderr, stderr[-2000:]
    assert [r.run_id for r in load_results([out / "s" / "first"])[0]] == [first[0].run_id]  # intact
    assert load_results([out / "s" / "second"])[0] == []  # nothing half-written for the stopped point
