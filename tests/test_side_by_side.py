"""An NVIDIA H100, an AMD MI300X, an Intel Gaudi 3 and an Ascend 910B side by side: one real
`hwbench run` through each vendor's stand-in (tests/fakes), then `hwbench report` over the four
results. The report names each device with its catalog entry and that entry's peak with its
source (or why there is none), marks each simulated and claims no MFU for any of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import stand_in_gave

from hwbench.catalog import load_catalog

# four training runs, about a minute on 2 cores; each stand-in run alone is in the default run
# (tests/test_vendor_standins.py, tests/test_npu_standin.py) and so is the peaks table (tests/test_decision.py)
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

FAKES = Path(__file__).resolve().parent / "fakes"
RUN = ["run", "--model", "tiny", "--seq-length", "32", "--steps", "2", "--warmup", "1", "--eval-iters", "0",
       "--precision", "bf16", "--no-telemetry", "--quiet"]


def on_path(*folders: Path, key: str = "PYTHONPATH") -> str:
    return os.pathsep.join([*map(str, folders), *filter(None, [os.environ.get(key)])])


# --device, the stand-in's environment, the device model it reports, its catalog entry
DEVICES = {
    "cuda": ({"PYTHONPATH": on_path(FAKES / "cuda", FAKES / "common"), "HWBENCH_STANDIN_CUDA": "1"},
             "NVIDIA H100 80GB HBM3", "h100-sxm"),
    "rocm": ({"PYTHONPATH": on_path(FAKES / "rocm", FAKES / "common"), "HWBENCH_STANDIN_ROCM": "1"},
             "AMD Instinct MI300X", "mi300x"),
    "hpu": ({"PYTHONPATH": on_path(FAKES / "gaudi", FAKES / "common"), "HWBENCH_STANDIN_GAUDI": "gaudi3"},
            "GAUDI3", "gaudi3"),
    "npu": ({"PYTHONPATH": on_path(FAKES, FAKES / "common"), "PATH": on_path(FAKES / "bin", key="PATH")},
            "Ascend910B3", "ascend-910b"),
}


def hwbench(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hwbench", *args], env={**os.environ, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """The four stand-in runs' result files, in one folder."""
    folder = tmp_path_factory.mktemp("side-by-side")
    for device, (env, _, _) in DEVICES.items():
        done = hwbench([*RUN, "--device", device, "--out", str(folder / "runs")], folder, **env)
        assert done.returncode == 0, f"--device {device}:\n{done.stderr[-3000:]}"
    return folder / "runs"


def test_each_stand_in_run_is_its_device_simulated_without_mfu(results):
    found = {}
    for file in results.glob("*.json"):
        result = json.loads(file.read_text())
        found[result["device"]["backend"]] = result
    assert sorted(found) == sorted(DEVICES)
    for backend, (_, model, entry) in DEVICES.items():
        device, metrics = found[backend]["device"], found[backend]["metrics"]
        assert (device["device_model"], device["catalog_entry"]) == (model, entry)
        assert device["simulated"] is True and device["torch_device"] == "cpu" and device["dist_backend"] == "gloo"
        assert device["peak_flops"] is None and metrics["mfu"] is None
        assert "simulated" in metrics["unmeasured"]["mfu"]
        assert found[backend]["warnings"][0].startswith(f"device simulated: a stand-in ran the {backend} code path")
    # the Gaudi 3's, not the Gaudi 2's: the stand-in's, recorded as none
    assert stand_in_gave(found["hpu"]["metrics"]["memory"], "capacity_bytes") == 131072 * 2**20


def catalog_peak(entry: str) -> str:
    """The bf16 peak of a catalog entry as the report must quote it: the figure with its source,
    or null with the reason."""
    return f"{entry} bf16: {load_catalog().devices[entry].peak_flops['bf16'].describe()}"


def test_the_json_report_puts_the_four_side_by_side_with_their_peaks_sources(results, tmp_path):
    done = hwbench(["report", str(results), "--format", "json"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    decision = json.loads(done.stdout)["decision"]
    assert {"heading": "tiny, bf16"} in decision
    peaks = next(block["table"] for block in decision if "catalog entry" in (block.get("table") or [{}])[0])
    rows = {row["device"]: row for row in peaks}
    assert sorted(rows) == sorted(f"{model} [simulated]" for _, model, _ in DEVICES.values())
    catalog = load_catalog().devices
    for _, model, entry in DEVICES.values():
        row = rows[f"{model} [simulated]"]
        assert row["catalog entry"] == f"{entry} ({catalog[entry].title})"
        assert row["peak per device (bf16) and its source"] == catalog_peak(entry)
        assert row["MFU"].startswith("no MFU: the device is simulated")
    # the catalog's sources, as the report quotes them: NVIDIA's and Intel's figures, and why AMD's
    # and Huawei's are null
    assert "NVIDIA H100 Tensor Core GPU datasheet" in catalog_peak("h100-sxm")
    assert "Hot Chips 2024" in catalog_peak("gaudi3")
    assert "null: AMD's own data sheet could not be read" in catalog_peak("mi300x")
    assert "null: Huawei publishes no per-chip figure" in catalog_peak("ascend-910b")


def test_the_markdown_report_names_each_device_its_entry_and_its_peaks_source(results, tmp_path):
    done = hwbench(["report", str(results)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    decision = done.stdout.split("\n## ")[1]  # the first section
    assert decision.startswith("Decision")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in decision.splitlines()
            if line.startswith("|")]
    catalog = load_catalog().devices
    for _, model, entry in DEVICES.values():
        row = next(row for row in rows if row[:2] == [f"{model} [simulated]", f"{entry} ({catalog[entry].title})"])
        assert row[2] == catalog_peak(entry) and row[3].startswith("no MFU: the device is simulated")
    assert "MFU measured against this peak" not in done.stdout
