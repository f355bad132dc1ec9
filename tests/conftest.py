"""Shared pytest fixtures for hwbench's tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FAKES = REPO_ROOT / "tests" / "fakes"


# --- Stand-in Ascend NPU (tests/fakes: torch_npu module and npu-smi) ---------


@pytest.fixture
def repo_root() -> Path:
    """The hwbench checkout (the folder holding pyproject.toml)."""
    return REPO_ROOT


@pytest.fixture
def standin_npu_env() -> dict[str, str]:
    """Environment for a subprocess that should see the stand-in NPU: a copy of
    os.environ with tests/fakes first on PYTHONPATH (``import torch_npu`` finds
    the stand-in) and tests/fakes/bin first on PATH (the stand-in ``npu-smi``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKES), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join(filter(None, [str(FAKES / "bin"), env.get("PATH")]))
    return env


def sigint_as_usual() -> None:
    """preexec_fn for a child that a test interrupts with SIGINT: a test run
    started in the background (CI wrappers, `cmd &`) ignores SIGINT, and a child
    inherits that; Python then never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_tree(pid: int) -> None:
    """End a child a failed test left running, with every process under it."""
    from hwbench.harness.launcher import kill_tree as kill

    kill([pid])
