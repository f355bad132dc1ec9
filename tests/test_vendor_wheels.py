"""The real AMD SMI (amdsmi 7.0.2) and HLML (habana-pyhlml) wheels installed on a machine
without ROCm or the Gaudi driver. Opt-in (it installs them from the package index into a folder
of their own, put on PYTHONPATH beside this checkout for hwbench run by this interpreter):

    HWBENCH_TEST_VENDOR_WHEELS=1 python -m pytest -m vendor_wheels tests/test_vendor_wheels.py"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.vendor_wheels,
    pytest.mark.skipif(
        os.environ.get("HWBENCH_TEST_VENDOR_WHEELS") != "1",
        reason="installs the real amdsmi and habana-pyhlml wheels: set HWBENCH_TEST_VENDOR_WHEELS=1",
    ),
]

REPO = Path(__file__).resolve().parent.parent
WHEELS = ["amdsmi==7.0.2", "habana-pyhlml"]


@pytest.fixture(scope="module")
def python() -> Path:
    target = Path(tempfile.gettempdir()) / "hwbench-vendor-wheels"
    if not (target / ".ready").exists():
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *WHEELS],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            pytest.skip(f"pip could not install {WHEELS}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        (target / ".ready").write_text("ok\n")
    return target


def run(wheels: Path, *args: str, cwd: Path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(wheels)])
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_wheels_fail_as_on_a_host_without_the_drivers(python, tmp_path):
    amd = run(python, "-c", "import amdsmi", cwd=tmp_path)
    assert amd.returncode == 1 and "KeyError: 'libamd_smi.so'" in amd.stderr  # not an ImportError
    hl = run(
        python,
        "-c",
        "import pyhlml\ntry:\n    pyhlml.hlmlInit()\nexcept Exception as e:\n    print(type(e).__name__)",
        cwd=tmp_path,
    )
    assert hl.returncode == 0 and hl.stdout.splitlines()[-1] == "HLMLError_Uninitialized"


def test_help_cpu_run_and_auto_still_work(python, tmp_path):
    assert run(python, "-m", "hwbench", "--help", cwd=tmp_path).returncode == 0
    devices = run(python, "-m", "hwbench", "devices", cwd=tmp_path)
    assert devices.returncode == 0 and "--device auto uses cpu" in devices.stdout
    assert "libamd_smi" not in devices.stdout and "Failed to load libhlml" not in devices.stdout
    out = tmp_path / "out"
    done = run(
        python,
        "-m",
        "hwbench",
        "run",
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--seq-length",
        "32",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--eval-iters",
        "0",
        "--quiet",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_samplers_say_what_is_missing(python, tmp_path):
    script = (
        "from hwbench.device.amd_smi import AmdSmiSampler\nfrom hwbench.device.hlml import HlmlSampler\n"
        "print(AmdSmiSampler(['0000:0c:00.0']).unavailable_reason())\nprint(HlmlSampler([0]).unavailable_reason())"
    )
    done = run(python, "-c", script, cwd=tmp_path)
    amd, hl = done.stdout.strip().splitlines()[-2:]
    assert "amdsmi cannot load libamd_smi.so (KeyError" in amd
    assert "HLML unavailable: HLMLError_Uninitialized" in hl


@pytest.mark.parametrize(
    "device, line",
    [
        ("rocm", "hwbench: error: --device rocm: this torch build"),
        ("hpu", "hwbench: error: --device hpu: habana_frameworks is not installed"),
    ],
)
def test_rocm_and_hpu_name_what_is_missing(python, tmp_path, device, line):
    done = run(
        python,
        "-m",
        "hwbench",
        "run",
        "--device",
        device,
        "--model",
        "tiny",
        "--out",
        str(tmp_path / "o"),
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines()[0].startswith(line)
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
