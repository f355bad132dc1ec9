"""Each device's health before it is measured (hwbench/device/health.py's judgement): read through
the vendor libraries' stand-ins in tests/fakes (NVML, AMD SMI, HLML, npu-smi) and the kernel's EDAC
counts, and judged as `hwbench preflight` shows it and `hwbench accept` fails on it."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

from hwbench.device.health import (
    FAIL,
    INFO,
    WARNING,
    DeviceHealth,
    LinkHealth,
    NodeHealth,
    cpu_health,
    judge_health,
    readings_from_dict,
    readings_to_dict,
)
from hwbench.device.preflight import read_devices
from hwbench.harness.preflight import preflight

FAKES = Path(__file__).resolve().parent / "fakes"


def standin(module: str, path: Path, monkeypatch) -> types.ModuleType:
    """A stand-in of tests/fakes loaded as ``module`` of its own, in sys.modules for the test."""
    monkeypatch.syspath_prepend(str(FAKES / "common"))  # the NVML stand-in imports standin_device
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    monkeypatch.setitem(sys.modules, module, loaded)
    return loaded


@pytest.fixture
def nvml(monkeypatch):
    return standin("pynvml", FAKES / "cuda" / "pynvml" / "__init__.py", monkeypatch)


def checks_of(kind: str) -> dict:
    return {check.name: check for check in preflight(kind, ".", environ={}).checks}


def failures(kind: str) -> list[str]:
    (device,) = read_devices(kind, {}).devices[:1]
    return [finding.text() for finding in judge_health(device) if finding.severity == FAIL]


# --- NVIDIA, through the NVML stand-in ----------------------------------------------------------------


def test_a_healthy_h100_has_no_finding_and_preflight_shows_its_links(nvml):
    (gpu,) = read_devices("cuda", {}).devices
    assert (gpu.ecc_uncorrected, gpu.ecc_uncorrected_aggregate, gpu.remapped_rows_uncorrected) == (0, 0, 0)
    assert gpu.retirement_pending is False and gpu.remap_failed is False
    assert "remap rows instead" in gpu.unread["retired_pages_double_bit"]  # not offered from Ampere on
    assert len(gpu.links or []) == nvml.H100_NVLINKS and all(link.up for link in gpu.links or [])
    assert (gpu.pcie_width, gpu.pcie_max_width, gpu.pcie_generation, gpu.pcie_max_generation) == (16, 16, 5, 5)
    assert judge_health(gpu) == []
    checks = checks_of("cuda")
    assert checks["ecc_errors"].status == "ok" and "rows remapped 0 uncorrectable" in checks["ecc_errors"].reading
    links = checks["device_links"]
    assert links.status == "ok" and links.reading == "NVLink 18 of 18 up; PCIe gen5 x16 of x16 (gen5 at most)"


@pytest.mark.parametrize("fault, named", [
    ("ecc_uncorrected=2", "gpu 0 (GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9): 2 uncorrected ECC errors"),
    ("remap_pending", "page retirement or row remap pending"),
    ("remap_failure", "row remap failure"),
    ("pcie_width=8", "PCIe x8 of x16"),
    ("nvlink_down=3", "NVLink 3 down (17 of 18 up)"),
])
def test_each_fault_of_a_gpu_fails_naming_the_device_and_its_reading(nvml, monkeypatch, fault, named):
    monkeypatch.setenv(nvml.HEALTH_ENV, fault)
    found = failures("cuda")
    assert len(found) == 1 and named in found[0] and found[0].startswith("gpu 0")
    checks = checks_of("cuda")
    failed = [check for check in checks.values() if check.status == "failure"]
    assert [check.name for check in failed] == ["device_links" if "PCIe" in named or "NVLink" in named
                                                else "ecc_errors"]
    assert named.split(": ")[-1] in failed[0].reason


def test_an_idle_gpu_at_a_lower_pcie_generation_and_a_replayed_link_do_not_fail(nvml, monkeypatch):
    """A GPU at idle trains down its PCIe generation to save power: shown, not judged. Link replays
    are errors the link recovered from: a warning."""
    monkeypatch.setenv(nvml.HEALTH_ENV, "pcie_generation=1,nvlink_replay=5")
    (gpu,) = read_devices("cuda", {}).devices
    severities = {finding.reading: finding.severity for finding in judge_health(gpu)}
    assert severities == {"PCIe gen1 of gen5": INFO, "NVLink 0 replay 5": WARNING}
    links = checks_of("cuda")["device_links"]
    assert links.status == "warning" and "PCIe gen1 x16 of x16" in links.reading and "replay" in links.reason


# --- AMD, Gaudi, Ascend and the CPU through theirs ------------------------------------------------------


def test_an_mi300x_through_amd_smi(monkeypatch):
    smi = standin("amdsmi", FAKES / "rocm" / "amdsmi" / "__init__.py", monkeypatch)
    (gpu,) = read_devices("rocm", {}).devices
    assert [link.up for link in gpu.links or []] == [True] * smi.XGMI_LINKS and gpu.link_errors is None
    assert (gpu.pcie_width, gpu.pcie_max_width, gpu.pcie_generation) == (16, 16, 5)
    assert gpu.retired_pages_double_bit == 0 and judge_health(gpu) == []
    assert checks_of("rocm")["device_links"].reading == "xGMI 7 of 7 up; PCIe gen5 x16 of x16"
    monkeypatch.setenv(smi.HEALTH_ENV, "xgmi_down=2,bad_page_pending,pcie_width=8")
    assert [text.split(": ", 1)[1].split(" (")[0] for text in failures("rocm")] == [
        "page retirement or row remap pending", "xGMI 2 down", "PCIe x8 of x16"]


def test_a_gaudi_through_hlml(monkeypatch):
    hlml = standin("pyhlml", FAKES / "gaudi" / "pyhlml" / "__init__.py", monkeypatch)
    first, second = read_devices("hpu", {}).devices
    assert len(first.links or []) == hlml.NIC_PORTS and first.link_kind == "NIC port"
    assert (first.pcie_width, first.pcie_max_width) == (16, None) and "not judged" in first.unread["pcie_max_width"]
    assert judge_health(first) == judge_health(second) == []
    monkeypatch.setenv(hlml.HEALTH_ENV, "ecc_uncorrected=1,nic_down=5,rows_pending")
    found = failures("hpu")
    assert found[0].startswith("hpu 0 (0000:33:00.0): 1 uncorrected ECC errors")
    assert any("NIC port 5 down (23 of 24 up)" in text for text in found)
    assert any("row remap pending" in text for text in found)


def test_an_npu_gives_its_health_verdict_and_says_what_npu_smi_info_does_not_show(monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HWBENCH_STANDIN_NPU_SMI", "info-910b3.txt")
    devices = read_devices("npu", os.environ).devices
    assert devices and all(judge_health(device) == [] for device in devices)
    assert "npu-smi info shows no" in devices[0].unread["links"]
    links = checks_of_environ("npu", os.environ)["device_links"]
    assert links.status is None and "npu-smi info shows no" in links.reason
    broken = DeviceHealth("npu 0", health="Alarm")
    assert [f.severity for f in judge_health(broken)] == [FAIL]


def checks_of_environ(kind: str, environ) -> dict:
    return {check.name: check for check in preflight(kind, ".", environ=environ).checks}


def test_the_cpu_s_edac_counts_as_today(tmp_path):
    edac = tmp_path / "edac"
    for controller, (ue, ce) in {"mc0": (0, 3), "mc1": (1, 0)}.items():
        (edac / controller).mkdir(parents=True)
        (edac / controller / "ue_count").write_text(f"{ue}\n")
        (edac / controller / "ce_count").write_text(f"{ce}\n")
    cpu = cpu_health(edac=edac)
    assert [(f.severity, f.reading) for f in judge_health(cpu)] == [
        (FAIL, "1 uncorrected ECC errors"), (INFO, "3 corrected ECC errors, 0 rows remapped (correctable)")]
    assert judge_health(cpu_health(edac=tmp_path / "none")) == []


# --- the rules, directly ------------------------------------------------------------------------------


def test_wear_and_history_are_warnings_and_no_link_in_use_is_no_link_down():
    worn = DeviceHealth("gpu 3", ecc_uncorrected=0, ecc_uncorrected_aggregate=4, retired_pages_double_bit=2,
                        retired_pages_single_bit=0, retirement_pending=False,
                        links=[LinkHealth(0, False), LinkHealth(1, False)], link_kind="NVLink")
    assert [(f.severity, f.reading) for f in judge_health(worn)] == [
        (WARNING, "4 uncorrected ECC errors over its life"), (WARNING, "2 pages retired (double-bit)"),
        (WARNING, "no NVLink up (of 2)")]
    unread = DeviceHealth("gpu 4")  # nothing read: nothing judged
    assert judge_health(unread) == []


def test_a_node_s_read_survives_json_and_names_its_node(nvml, monkeypatch):
    import json

    monkeypatch.setenv(nvml.HEALTH_ENV, "nvlink_down=0")
    readings = read_devices("cuda", {})
    again = readings_from_dict(json.loads(json.dumps(readings_to_dict(readings))))
    assert again == readings
    node = NodeHealth("node7", again)
    assert node.failed and node.lines()[0].startswith("fail: gpu 0 (GPU-") and " of node7: NVLink 0 down" in \
        node.lines()[0]
    with pytest.raises(ValueError, match="not a device health read"):
        readings_from_dict({"kind": "cuda"})
