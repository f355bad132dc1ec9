"""The NPU checks (docs/npu.md) against the real torch-npu 2.13.0 wheel, on this machine (no CANN).

Opt-in: it builds a virtual environment with torch 2.13.0 and torch-npu 2.13.0
from the package index (about 1 GB of downloads the first time), so it runs only
with HWBENCH_TEST_NPU_WHEEL=1:

    HWBENCH_TEST_NPU_WHEEL=1 python -m pytest tests/test_npu_wheel.py -m npu_wheel -v

The environment is built once under HWBENCH_NPU_WHEEL_VENV (default: a folder
in the system temp directory, outside the repository) and reused; hwbench runs
from this checkout through PYTHONPATH. The test skips, saying why, when pip
cannot get the wheels."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.npu_wheel,
    pytest.mark.skipif(os.environ.get("HWBENCH_TEST_NPU_WHEEL") != "1",
                       reason="builds a venv with the real torch-npu wheel: set HWBENCH_TEST_NPU_WHEEL=1"),
]

REPO = Path(__file__).resolve().parent.parent
TORCH_PIN = "2.13.0"
# hwbench's own dependencies (pyproject.toml), installed beside the pinned torch.
HWBENCH_DEPENDENCIES = ["numpy", "PyYAML", "tabulate", "nvidia-ml-py", "tokenizers", "pandas", "scipy", "Jinja2"]
SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
INSTALL_S = 1800
RUN_S = 180


@pytest.fixture(scope="module")
def wheel_venv() -> Path:
    venv = Path(os.environ.get("HWBENCH_NPU_WHEEL_VENV", Path(tempfile.gettempdir()) / "hwbench-npu-wheel-venv"))
    python = venv / "bin" / "python"
    ready = venv / ".hwbench-ready"
    if not ready.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        install = subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={TORCH_PIN}",
                                  f"torch-npu=={TORCH_PIN}", *HWBENCH_DEPENDENCIES],
                                 capture_output=True, text=True, timeout=INSTALL_S)
        if install.returncode != 0:
            pytest.skip(f"pip could not install torch=={TORCH_PIN} torch-npu=={TORCH_PIN}: "
                        f"{(install.stderr.strip().splitlines() or ['no output'])[-1]}")
        ready.write_text("torch and torch-npu installed\n")
    return python


def in_venv(python: Path, args: list[str], cwd: Path, hwbench_path: bool = True):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD") and not k.startswith("HWBENCH_STANDIN_")}
    if hwbench_path:
        env["PYTHONPATH"] = str(REPO)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "tests/fakes" not in p)
    return subprocess.run([str(python), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=RUN_S)


def test_the_venv_reproduces_a_host_without_cann(wheel_venv, tmp_path):
    """Plain `import torch` fails there, as on a host without CANN (so the checks below mean something)."""
    done = in_venv(wheel_venv, ["-c", "import torch"], tmp_path, hwbench_path=False)
    assert done.returncode == 1
    assert "RuntimeError: Failed to load the backend extension: torch_npu" in done.stderr


def test_help_works(wheel_venv, tmp_path):
    done = in_venv(wheel_venv, ["-m", "hwbench", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage: hwbench" in done.stdout


def test_cpu_run_works(wheel_venv, tmp_path):
    out = tmp_path / "out"
    done = in_venv(wheel_venv, ["-m", "hwbench", "run", "--device", "cpu", "--model", "tiny", "--steps", "2",
                                "--warmup", "1", "--eval-iters", "0", "--quiet", "--out", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(out.glob("*.json"))) == 1


def test_npu_run_is_one_line_naming_set_env(wheel_venv, tmp_path):
    out = tmp_path / "out"
    done = in_venv(wheel_venv, ["-m", "hwbench", "run", "--device", "npu", "--model", "1.3b", "--out", str(out)],
                   tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"hwbench: error: --device npu: CANN runtime not found: libhccl.so (source {SET_ENV})"]
    assert done.stdout == ""
    assert not out.exists()


def test_auto_falls_back_to_cpu(wheel_venv, tmp_path):
    done = in_venv(wheel_venv, ["-m", "hwbench", "devices"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--device auto uses cpu" in done.stdout


def test_stand_in_fidelity_check_passes_against_the_installed_wheel(wheel_venv, tmp_path):
    site = next((wheel_venv.parent.parent / "lib").glob("python3*/site-packages"))
    done = subprocess.run([sys.executable, str(REPO / "tests" / "fakes" / "check_wheel_fidelity.py"), str(site)],
                          capture_output=True, text=True, timeout=RUN_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 not" in done.stdout
