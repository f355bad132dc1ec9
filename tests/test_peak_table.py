"""The peak table people can trust: catalog entries without a source or with a sparse figure
given as dense are refused, a device's peak follows from its entry (scaled to the compute units
it reports), and a throughput the device cannot reach marks the run invalid instead of giving
an MFU (hwbench/plausibility.py)."""

from __future__ import annotations

import json
import types

import pytest

from hwbench.catalog import load_catalog
from hwbench.cli import main
from hwbench.device_check import device_peak
from hwbench.plausibility import implausible_throughput
from hwbench.result.model import Device

NULLS = "  fp16: {dense: null, unavailable: not in the test}\n  fp32: {dense: null, unavailable: not in the test}\n"


def _user_catalog(tmp_path, monkeypatch, bf16: str, backend: str = "cuda", match: str = "Mine") -> None:
    devices = tmp_path / "catalog" / "devices"
    devices.mkdir(parents=True)
    (devices / "mychip.yaml").write_text(f"name: mychip\nvendor: me\nbackend: {backend}\ntitle: Mine\n"
                                         f"match: ['{match}']\npeak_flops:\n  bf16: {bf16}\n" + NULLS)
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path / "catalog"))


@pytest.mark.parametrize("bf16, expected", [
    ("{dense: 1.0e15, listed: 1.0e15, sparsity: false, read: 2026-11-25}", "field peak_flops.bf16.source: is missing"),
    ("{dense: 1.0e15, listed: 1.0e15, sparsity: false, source: a data sheet}",
     "field peak_flops.bf16.read: is missing"),
    ("{dense: 1.0e15, source: a data sheet, read: 2026-11-25}", "field peak_flops.bf16.listed: is missing"),
    ("{dense: 1.979e15, listed: 1.979e15, sparsity: true, source: a data sheet, read: 2026-11-25}",
     "is the figure the source lists with sparsity (1.979e+15): the dense peak is half of it, 9.895e+14"),
    ("{dense: 1.0e15, listed: 1.0e15, source: a data sheet, read: 2026-11-25}", "field peak_flops.bf16.sparsity"),
    ("{dense: null}", "field peak_flops.bf16.unavailable: is missing"),
    ("1.0e15", "field peak_flops.bf16: must be a mapping with dense, listed, sparsity, source and read"),
])
def test_a_peak_without_its_provenance_or_given_sparse_as_dense_is_one_line_and_exit_2(
        tmp_path, monkeypatch, capsys, bf16, expected):
    _user_catalog(tmp_path, monkeypatch, bf16)
    out = tmp_path / "out"
    assert main(["run", "--model", "tiny", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "mychip.yaml" in lines[0] and expected in lines[0], lines
    assert captured.out == "" and not out.exists()


def _backend(compute_units, simulated=False):
    return types.SimpleNamespace(simulated=simulated, compute_units=lambda: compute_units)


def test_one_die_of_a_two_die_module_gets_its_share_of_the_module_peak():
    mi250x = load_catalog().devices["mi250x"]  # 383 TFLOP/s bf16 for the module's 220 CUs
    peak, reason, basis = device_peak(_backend(110), mi250x, "bf16", "")
    assert peak == pytest.approx(191.5e12) and reason is None
    assert "110 of 220 compute units" in basis and "read 2026-11-25" in basis
    peak, reason, _ = device_peak(_backend(304), mi250x, "bf16", "")
    assert peak is None and "more than the 220" in reason
    peak, reason, _ = device_peak(_backend(110, simulated=True), mi250x, "bf16", "")
    assert peak is None and "simulated" in reason


def test_no_entry_and_no_figure_give_no_peak_with_the_reason():
    catalog = load_catalog()
    assert device_peak(_backend(None), None, "bf16", "no catalog entry matches") == (None, "no catalog entry matches",
                                                                                      None)
    peak, reason, _ = device_peak(_backend(304), catalog.devices["mi300x"], "bf16", "")
    assert peak is None and "AMD's own data sheet" in reason


DEVICE = Device.model_validate({"peak_flops": 989.5e12, "peak_flops_precision": "bf16", "catalog_entry": "h200",
                                "measured_ceiling": {"flops": 700e12, "cv": 0.05,
                                                     "measured_at": "2026-11-25T00:00:00+00:00"}})


@pytest.mark.parametrize("achieved, expected", [
    (600e12, None),
    (730e12, None),  # above the ceiling, within its 5% spread
    (740e12, "above the measured GEMM ceiling (700 TFLOP/s"),
    (1500e12, "152% of the data sheet's dense bf16 peak (989.5 TFLOP/s, h200)"),
])
def test_a_throughput_the_device_cannot_reach_is_named(achieved, expected):
    reason = implausible_throughput(achieved, DEVICE)
    assert reason is None if expected is None else expected in reason


def test_a_run_above_its_data_sheet_peak_is_invalid_and_gives_no_mfu(tmp_path, monkeypatch, capsys):
    from hwbench.device.cpu import _cpu_model

    pattern = _cpu_model().replace("(", ".").replace(")", ".")
    devices = tmp_path / "catalog" / "devices"
    devices.mkdir(parents=True)
    (devices / "slow-cpu.yaml").write_text(  # a made-up peak far below what the CPU does
        f"name: slow-cpu\nvendor: test\nbackend: cpu\ntitle: this machine\nmatch: ['^{pattern}$']\npeak_flops:\n"
        "  fp32: {dense: 1.0e6, listed: 1.0e6, sparsity: false, source: a deliberately wrong test figure, "
        "read: 2026-11-25}\n  bf16: {dense: null, unavailable: x}\n  fp16: {dense: null, unavailable: x}\n")
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path / "catalog"))
    out = tmp_path / "out"
    # in this process (a process of its own started torch again, most of this test's time): the catalog is
    # read per HWBENCH_CATALOG_PATH; one sample a step, any throughput is far above the made-up peak
    code = main(["run", "--model", "tiny", "--seq-length", "32", "--steps", "2", "--warmup", "1", "--eval-iters", "0",
                 "--micro-batch-size", "1", "--global-batch-size", "1", "--no-telemetry", "--out", str(out)])
    done = capsys.readouterr()
    assert code == 1, done.err[-2000:]
    result = json.loads(next(out.glob("*.json")).read_text())
    assert result["status"] == "invalid" and result["error"]["type"] == "ImplausibleThroughput"
    assert (
        result["metrics"]["mfu"] is None
        and "of the data sheet's dense fp32 peak" in result["metrics"]["unmeasured"]["mfu"]
    )
    assert result["device"]["catalog_entry"] == "slow-cpu" and "slow-cpu's pattern" in result["device"]["catalog_match"]
    assert "MFU" in done.out and "of the data sheet's dense fp32 peak" in done.out
