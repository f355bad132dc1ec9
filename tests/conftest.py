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
