"""How torch_npu's import fails on a real host, and what
hwbench says then. The stand-in (tests/fakes) now loads the way the torch-npu
2.13.0 wheel does, through a torch backend entry point at ``import torch``; its
failures are the wheel's: without CANN an ImportError that torch turns into
"Failed to load the backend extension: torch_npu", and under a torch built for
another accelerator the wheel's _check_device_conflict RuntimeError.

The same checks against the real wheel are in tests/test_npu_wheel.py (opt-in)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hwbench.device import npu as npu_module
from hwbench.errors import SetupError

FAKES = Path(__file__).resolve().parent / "fakes"
QUICK_S = 45
TRAIN_S = 120

SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
NO_CANN_LINE = f"hwbench: error: --device npu: CANN runtime not found: libhccl.so (source {SET_ENV})"
TORCH_VERSION = torch.__version__.split("+")[0]


def hwbench(args: list[str], env: dict[str, str], cwd: Path, timeout: float = QUICK_S):
    return subprocess.run([sys.executable, "-m", "hwbench", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def no_cann_env(standin_npu_env):
    """A host with torch_npu installed and CANN not sourced (nor the switch set)."""
    env = {k: v for k, v in standin_npu_env.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    return {**env, "HWBENCH_STANDIN_NO_CANN": "1"}


@pytest.fixture
def cuda_torch_env(standin_npu_env):
    """A host whose torch is a CUDA build, with torch_npu installed beside it."""
    env = {k: v for k, v in standin_npu_env.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    return {**env, "HWBENCH_STANDIN_TORCH_ACCELERATOR": "cuda"}


# --- the stand-in fails where and how the wheel does --------------------------


def test_standin_without_cann_breaks_plain_import_torch_like_the_wheel(no_cann_env, tmp_path):
    script = ("import torch\n")
    done = subprocess.run([sys.executable, "-c", script], env=no_cann_env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=QUICK_S)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "RuntimeError: Failed to load the backend extension: torch_npu. "
        "You can disable extension auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.")
    assert "ImportError: libhccl.so: cannot open shared object file" in done.stderr  # the cause, chained


def test_standin_is_loaded_by_import_torch_and_not_with_autoload_off(standin_npu_env, tmp_path):
    script = "import os, torch; print(hasattr(torch, 'npu'), os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD'))"
    env = {k: v for k, v in standin_npu_env.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    loaded = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=QUICK_S)
    assert loaded.stdout.split() == ["True", "1"], loaded.stderr  # autoloaded; the switch restored
    off = subprocess.run([sys.executable, "-c", script], env={**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
                         cwd=tmp_path, capture_output=True, text=True, timeout=QUICK_S)
    assert off.stdout.split() == ["False", "0"], off.stderr


# --- case 1: a host with torch_npu and no CANN ---------------------------------


def test_help_works_without_cann(no_cann_env, tmp_path):
    done = hwbench(["--help"], no_cann_env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage: hwbench" in done.stdout
    assert done.stderr == ""


# heavy (python -m pytest -m heavy): the default run trains on the CPU in the same environment (the stand-in
# torch_npu without CANN, loaded by `import torch`) in test_auto_run_without_cann_records_and_prints_the_npu_
# it_passed_over below, where auto has passed over the NPU to the CPU backend --device cpu names directly
@pytest.mark.heavy
def test_cpu_run_works_without_cann(no_cann_env, tmp_path):
    out = tmp_path / "out"
    done = hwbench(["run", "--device", "cpu", "--model", "tiny", "--seq-length", "32", "--steps", "2", "--warmup", "1",
                    "--eval-iters", "0", "--quiet", "--out", str(out)], no_cann_env, tmp_path, timeout=TRAIN_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(out.glob("*.json"))) == 1


def test_npu_run_without_cann_is_one_line_naming_set_env(no_cann_env, tmp_path):
    out = tmp_path / "out"
    done = hwbench(["run", "--device", "npu", "--model", "tiny", "--out", str(out)], no_cann_env, tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [NO_CANN_LINE]
    assert done.stdout == ""
    assert not out.exists()


def test_auto_without_cann_falls_back_to_cpu_and_says_why(no_cann_env, tmp_path):
    done = hwbench(["devices"], no_cann_env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--device auto uses cpu" in done.stdout
    assert f"passed over npu: CANN runtime not found: libhccl.so (source {SET_ENV})" in done.stdout


def test_auto_run_without_cann_records_and_prints_the_npu_it_passed_over(no_cann_env, tmp_path):
    """A CPU figure must not pass for the NPU's: the run says, and its result records, why auto chose the CPU."""
    out = tmp_path / "out"
    done = hwbench(["run", "--device", "auto", "--model", "tiny", "--seq-length", "32", "--steps", "2", "--warmup", "1",
                    "--eval-iters", "0", "--micro-batch-size", "1", "--global-batch-size", "1",  # the choice, not speed
                    "--quiet", "--out", str(out)], no_cann_env, tmp_path, timeout=TRAIN_S)
    assert done.returncode == 0, done.stderr[-3000:]
    reason = f"npu: CANN runtime not found: libhccl.so (source {SET_ENV})"
    assert f"hwbench: note: --device auto passed over {reason}; this run used the cpu" in done.stderr
    (result_file,) = out.glob("*.json")
    device = json.loads(result_file.read_text())["device"]
    assert device["backend"] == "cpu" and device["auto_passed_over"] == [reason]


def test_auto_on_a_machine_without_accelerator_software_passes_over_nothing(tmp_path):
    from hwbench.device import select_backend

    assert importlib.util.find_spec("torch_npu") is None  # this test's premise: a plain CPU machine
    backend = select_backend("auto")
    assert backend.name == ("cuda" if torch.cuda.is_available() else "cpu")
    assert backend.passed_over == ()


# --- case 2: a CUDA build of torch with torch_npu installed --------------------


def test_npu_run_under_a_cuda_torch_is_one_line(cuda_torch_env, tmp_path):
    out = tmp_path / "out"
    done = hwbench(["run", "--device", "npu", "--model", "tiny", "--out", str(out)], cuda_torch_env, tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"hwbench: error: --device npu: torch_npu refuses this torch {torch.__version__}, a cuda build; "
        f"install the CPU build of torch {TORCH_VERSION} beside torch-npu "
        f"(pip install torch=={TORCH_VERSION} --index-url https://download.pytorch.org/whl/cpu)"]
    assert not out.exists()


def test_help_and_auto_work_under_a_cuda_torch(cuda_torch_env, tmp_path):
    assert hwbench(["--help"], cuda_torch_env, tmp_path).returncode == 0
    done = hwbench(["devices"], cuda_torch_env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--device auto uses cpu" in done.stdout  # this machine has no GPU either


# The wheel's message, as torch-npu 2.13.0's _check_device_conflict formats it.
WHEEL_CONFLICT = ("Two accelerators cannot be used at the same time in PyTorch: npu and cuda. You can install the "
                  "cpu version of PyTorch to use your npu device, or use the cuda device with 'export "
                  "TORCH_DEVICE_BACKEND_AUTOLOAD=0'.\n[ERROR] 2026-11-23-02:00:00 (PID:1, Device:-1, RankID:-1) "
                  "ERR00007 PTA feature not supported")


@pytest.mark.parametrize("error, expected", [
    (RuntimeError(WHEEL_CONFLICT), "torch_npu refuses this torch"),
    (RuntimeError("ACL error 507033\nmore"), "--device npu: torch_npu failed to import: ACL error 507033"),
    (ImportError("libascendcl.so: cannot open shared object file: No such file or directory"),
     f"--device npu: CANN runtime not found: libascendcl.so (source {SET_ENV})"),
])
def test_import_torch_npu_turns_each_failure_into_one_line(monkeypatch, error, expected):
    def failing_import(name):
        if name == "torch_npu":
            raise error
        return importlib.import_module(name)

    monkeypatch.setattr(npu_module.importlib, "import_module", failing_import)
    with pytest.raises(SetupError) as raised:
        npu_module.import_torch_npu()
    message = str(raised.value)
    assert "\n" not in message
    assert expected in message
