"""FP8 training (--precision fp8, hwbench/engine/float8.py): refused where it cannot run, the
transformer blocks' layers converted and the rest left with why, the CPU's emulated run marked
and kept apart (no MFU, no price, its own point), MFU against the BF16 peak with the FP8 peak
beside it, and an FP8 loss curve held to its BF16 reference."""

from __future__ import annotations

import copy
import json
import types
from pathlib import Path

import pytest
import torch

from hwbench.catalog import load_catalog
from hwbench.cli import main
from hwbench.device.cpu import CpuBackend
from hwbench.device.cuda import CudaBackend
from hwbench.device_check import fp8_problem
from hwbench.engine.float8 import OUTPUT_WHY, convert, plan_layers
from hwbench.harness.merge import _fp8_utilisation
from hwbench.judge.parity import check_against_references, reference_of
from hwbench.plausibility import implausible_throughput
from hwbench.point import EMULATED
from hwbench.result.model import Device, RunResult
from hwbench.result.store import write_result
from hwbench.spec import build_run_spec
from hwbench.workload.config import GPTConfig
from hwbench.workload.model import GPT

TEMPLATE = json.loads((Path(__file__).parent / "data" / "compare" / "tiny-cpu.json").read_text())
RUN = ["run", "--quiet", "--no-preflight", "--no-telemetry", "--model", "llama-tiny", "--seq-length", "32"]
LLAMA_TINY_LAYERS = 14  # q, k, v, out, gate, up and down projections of 2 blocks


@pytest.mark.parametrize("argv, expected", [
    (["--precision", "fp8", "--engine", "deepspeed"], "--precision fp8 runs on the native engine"),
    (["--model", "tiny", "--precision", "fp8", "--nproc-per-node", "2", "--tp", "2"], "--precision fp8 with --tp 2"),
    (["--precision", "bf16", "--fp8-recipe", "rowwise"], "--fp8-recipe rowwise is the recipe of --precision fp8"),
    (["--precision", "fp8", "--fp8-recipe", "mxfp8", "--nproc-per-node", "2"], "--fp8-recipe mxfp8 with 2 processes"),
    (["--precision", "fp8", "--fp8-recipe", "fp4"], "--fp8-recipe"),
])
def test_fp8_where_it_cannot_run_is_one_line_and_exit_2(tmp_path, capsys, argv, expected):
    out = tmp_path / "out"
    assert main([*RUN, "--out", str(out), *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert not out.exists()


def test_fp8_without_torchao_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "torchao" else
                        find_spec(name, *rest))
    out = tmp_path / "out"
    assert main([*RUN, "--precision", "fp8", "--out", str(out)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("hwbench: warning")]
    assert len(errors) == 1 and "torchao, which is not installed: pip install 'hwbench[fp8]'" in errors[0], errors
    assert not out.exists()


def test_the_recipe_is_resolved_for_fp8_only():
    catalog = load_catalog()
    assert build_run_spec({"model": "llama-tiny", "precision": "fp8"}, catalog,
                          check_paths=False).fp8_recipe == "tensorwise"
    assert build_run_spec({"model": "tiny", "precision": "fp8", "fp8_recipe": "rowwise"}, catalog,
                          check_paths=False).fp8_recipe == "rowwise"
    assert build_run_spec({"model": "tiny", "precision": "bf16"}, catalog, check_paths=False).fp8_recipe is None


def _meta_gpt(hidden: int, heads: int = 4) -> GPT:
    config = GPTConfig(num_layers=2, hidden_size=hidden, num_attention_heads=heads, max_position_embeddings=32,
                       vocab_size=1000)
    with torch.device("meta"):
        return GPT(config)


def test_the_blocks_linear_layers_convert_and_the_output_layer_stays():
    layers = plan_layers(_meta_gpt(128), "tensorwise")
    assert len(layers.converted) == 12 and all(name.startswith("blocks.") for name in layers.converted)
    assert layers.kept == {"output": OUTPUT_WHY}
    described = layers.describe(None)
    assert described["converted_layers"] == 12 and {"layers": "blocks.*.mlp.fc1", "count": 2} in described["converted"]
    assert described["high_precision"] == [{"layers": "output", "count": 1, "why": OUTPUT_WHY}]


def test_a_layer_whose_dimensions_are_no_multiple_of_16_stays_in_high_precision():
    layers = plan_layers(_meta_gpt(72, heads=3), "tensorwise")  # hidden 72: 72 % 16 = 8
    assert layers.converted == ()
    assert len(layers.kept) == 13 and "no multiple of 16" in layers.kept["blocks.0.mlp.fc1"]


def test_converted_layers_compute_through_scaled_fp8_gemms_on_the_cpu(monkeypatch):
    """The emulated path is torchao's own to torch._scaled_mm (the CPU's kernel), not a dequantised GEMM."""
    root = torch.nn.ModuleDict({"blocks": torch.nn.ModuleDict({"0": torch.nn.Sequential(
        torch.nn.LayerNorm(32), torch.nn.Linear(32, 32))})})
    layers = plan_layers(root, "tensorwise")
    assert layers.converted == ("blocks.0.1",)
    convert(root, layers, emulated=True)
    model = root["blocks"]["0"]
    seen = []
    scaled_mm = torch._scaled_mm

    def spy(a, b, *args, **kwargs):
        seen.append((a.dtype, b.dtype, kwargs.get("out_dtype")))
        return scaled_mm(a, b, *args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(16, 32)).float().sum().backward()
    assert type(model[1]).__name__ == "Float8Linear"
    assert seen[0] == (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16)  # forward
    assert len(seen) == 3 and torch.float8_e5m2 in seen[1]  # input and weight gradients: e5m2 gradients


def _backend(name: str, model: str, units: tuple[bool | None, str], emulation: str | None = None):
    return types.SimpleNamespace(name=name, device_names=lambda: [model], power_limit_watts=lambda: (None, "none"),
                                 fp8_units=lambda block_scaled: units, fp8_emulation=lambda: emulation)


def test_where_fp8_may_run():
    catalog = load_catalog()
    assert fp8_problem(CpuBackend(), "tensorwise", catalog) is None  # emulated
    assert "no FP8 tensor cores" in fp8_problem(_backend("cuda", "x", (False, "no FP8 tensor cores")), "tensorwise",
                                                catalog)
    cannot_tell = (None, "the npu backend does not read FP8 support from the device")
    refused = fp8_problem(_backend("npu", "Ascend910B3", cannot_tell), "tensorwise", catalog)
    assert "ascend-910b" in refused and "no fp8 peak" in refused and "no FP8 matrix units" in refused
    assert "nothing says" in fp8_problem(_backend("npu", "Unknown NPU", cannot_tell), "tensorwise", catalog)


@pytest.mark.parametrize("capability, block_scaled, has", [
    ((8, 0), False, False), ((8, 9), False, True), ((9, 0), False, True), ((9, 0), True, False), ((10, 0), True, True),
])
def test_cuda_fp8_units_follow_the_compute_capability(monkeypatch, capability, block_scaled, has):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    found, why = CudaBackend.fp8_units(types.SimpleNamespace(local_index=0), block_scaled)
    assert found is has and f"compute capability {capability[0]}.{capability[1]}" in why


def _fp8_result(**device) -> RunResult:
    data = copy.deepcopy(TEMPLATE)
    data["spec"].update(precision="fp8", fp8_recipe="tensorwise")
    data["device"].update(device)
    return RunResult.from_dict(data)


def test_mfu_is_against_the_bf16_peak_and_the_fp8_peak_beside_it():
    result = _fp8_result(peak_flops=989.5e12, peak_flops_precision="bf16", fp8_peak_flops=1979e12)
    unmeasured: dict[str, str] = {}
    assert _fp8_utilisation(result, result.spec.run_spec(), 500e12, None, unmeasured) == {
        "mfu_fp8_peak": pytest.approx(500 / 1979)}
    without = _fp8_result(fp8_peak_flops_unmeasured="the catalog entry 'h200' has no fp8 peak: not found")
    assert _fp8_utilisation(without, without.spec.run_spec(), 500e12, None, unmeasured) == {"mfu_fp8_peak": None}
    assert "not found" in unmeasured["mfu_fp8_peak"]


def test_an_fp8_run_is_held_to_its_fp8_peak_not_the_bf16_one():
    device = Device(peak_flops=989.5e12, peak_flops_precision="bf16", fp8_peak_flops=1979e12, catalog_entry="h100-sxm")
    assert implausible_throughput(1200e12, device) is None  # above BF16's peak, below FP8's
    assert "dense fp8 peak" in implausible_throughput(2000e12, device)


def test_an_emulated_run_is_a_stand_in_kept_apart(tmp_path, capsys, fp8_tiny_run):
    """A real CPU run (conftest's FP8_TINY_RUN): marked emulated in the device, the key and the warnings, no
    MFU, no price; then compare never matches it with the device's own FP8 point."""
    out = fp8_tiny_run.parent
    result = RunResult.from_dict(json.loads(fp8_tiny_run.read_text()))
    assert result.status == "ok" and result.stand_in == EMULATED and result.point_key.stand_in == EMULATED
    assert result.device.fp8_emulated.startswith("FP8 emulated on the CPU")
    assert result.engine.fp8.recipe == "tensorwise" and result.engine.fp8.converted_layers == 12
    assert result.engine.fp8.emulated == result.device.fp8_emulated
    assert result.metrics.mfu is None and result.metrics.why("mfu") == result.device.fp8_emulated
    assert result.metrics.mfu_fp8_peak is None and result.metrics.why("mfu_fp8_peak") == result.device.fp8_emulated
    assert result.device.peak_flops_precision == "bf16" and result.warnings[0].startswith("FP8 emulated")
    assert "[emulated]" in result.point_key.label() and "fp8 tensorwise" in result.point_key.label()
    real = copy.deepcopy(result.to_dict())
    real["run_id"] += "-real"
    real["device"]["fp8_emulated"] = None  # the same point measured on FP8 units
    base = tmp_path / "base"
    write_result(RunResult.from_dict(real), base)
    capsys.readouterr()
    assert main(["compare", str(base), str(out)]) == 2  # no point in common: the two are never one figure
    assert "measured on the device in baseline, emulated in current" in capsys.readouterr().err


def _curve(run_id: str, precision: str, losses: list[float], recipe: str | None = None) -> RunResult:
    data = copy.deepcopy(TEMPLATE)
    data["run_id"] = run_id
    data["spec"].update(precision=precision, fp8_recipe=recipe)
    data["steps"] = [{"step": i + 1, "phase": "timed", "time_s": 1.0, "loss": loss, "grad_norm": 1.0, "lr": 1e-3,
                      "loss_scale": None, "skipped": False} for i, loss in enumerate(losses)]
    data["metrics"]["valid_ppl"] = None
    return RunResult.from_dict(data)


def test_an_fp8_curve_is_held_to_its_bf16_reference():
    bf16 = _curve("bf16", "bf16", [10.0, 9.5, 9.0, 8.6, 8.2, 7.9, 7.6, 7.4])
    fp8_ref = _curve("fp8-ref", "fp8", [10.0, 9.5, 9.0, 8.6, 8.2, 7.9, 7.6, 7.4], "tensorwise")
    close = _curve("close", "fp8", [10.001, 9.502, 9.004, 8.61, 8.21, 7.92, 7.63, 7.41], "tensorwise")
    worse = _curve("worse", "fp8", [10.0, 9.6, 9.2, 8.9, 8.6, 8.4, 8.2, 8.1], "tensorwise")
    assert reference_of(close, [fp8_ref, bf16]).run_id == "bf16"  # the BF16 run first, whatever the order
    assert reference_of(bf16, [fp8_ref]) is None  # a BF16 run is never held to an FP8 one
    different = check_against_references([close, worse], [bf16])
    assert "close" not in different and "numerically different from the reference bf16" in different["worse"]


@pytest.mark.heavy
def test_an_emulated_fp8_run_converges_as_its_bf16_reference(tmp_path, capsys):
    """Real runs of llama-tiny of the same seed: FP8 (emulated on the CPU, its 14 block layers in FP8)
    passes `hwbench parity` against BF16 (docs/parity.md has the figures: 0.04 % at most)."""
    runs = {}
    for precision in ("bf16", "fp8"):
        out = tmp_path / precision
        assert main([*RUN, "--steps", "8", "--warmup", "0", "--eval-iters", "1", "--precision", precision,
                     "--out", str(out)]) == 0
        runs[precision] = next(out.glob("*.json"))
    capsys.readouterr()
    assert main(["parity", str(runs["fp8"]), str(runs["bf16"])]) == 0
    said = capsys.readouterr().out
    assert "CONVERGENCE: A converges as the reference does" in said and "[emulated]" in said


@pytest.mark.heavy
@pytest.mark.parametrize("layout", [["--fsdp"], ["--pp", "2"], []])
def test_fp8_trains_under_fsdp2_pipelining_and_ddp_as_on_one_process(tmp_path, layout):
    """Two ranks: the converted model under FSDP2, two pipeline stages and DDP follows the loss curve
    of one process (the layers are chosen on the whole model and converted before any wrapping)."""
    losses = {}
    for name, extra in (("one", []), ("two", ["--nproc-per-node", "2", *layout])):
        out = tmp_path / name  # GPT's tiny: the Llama layers do not pipeline yet
        assert main([*RUN, "--model", "tiny", "--steps", "2", "--warmup", "1", "--eval-iters", "0", "--precision",
                     "fp8", "--out", str(out), *extra]) == 0
        result = RunResult.from_dict(json.loads(next(out.glob("*.json")).read_text()))
        assert result.engine.fp8.converted_layers == 12
        losses[name] = [step.loss for step in result.steps]
    assert losses["two"] == pytest.approx(losses["one"], rel=2e-3)
