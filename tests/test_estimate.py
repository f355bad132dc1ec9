"""What is said before a long command starts (hwbench/harness/estimate.py): a precision the device
emulates, with those it runs at speed (Backend.slow_precision), and the estimated duration from the
model FLOPs and the GEMM rate `hwbench calibrate` stored, or why it is unknown. No training here."""

from __future__ import annotations

import json

import pytest

from hwbench.catalog import load_catalog
from hwbench.cli import run_command
from hwbench.device import cpu, select_backend
from hwbench.harness.estimate import before_run, duration_text, estimate_text, run_work
from hwbench.options import RunOptions
from hwbench.spec import build_run_spec
from hwbench.workload.flops import model_flops_per_iteration


@pytest.fixture
def avx2_only(monkeypatch):
    """A CPU with neither bf16 nor fp16 units, as this project's AMD EPYC."""
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"fpu", "avx", "avx2", "fma", "f16c"})


def test_a_cpu_without_fp16_units_says_fp16_is_slow_and_what_runs_at_speed(avx2_only, monkeypatch):
    backend = select_backend("cpu")
    assert backend.slow_precision("fp32") is None
    assert "has no fp16 matrix units (avx512_fp16, amx_fp16, asimdhp)" in backend.slow_precision("fp16")
    assert "has no bf16 matrix units" in backend.slow_precision("bf16")
    assert backend.fast_precisions() == ["fp32"]
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    assert backend.slow_precision("bf16") is None and backend.fast_precisions() == ["fp32", "bf16"]


@pytest.mark.parametrize("capability, slow", [((8, 0), False), ((7, 0), False), ((6, 0), False), ((6, 1), True),
                                              ((5, 2), True)])
def test_a_gpu_before_tensor_cores_runs_fp16_slowly(monkeypatch, capability, slow):
    import torch

    from hwbench.device.cuda import CudaBackend

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    gpu = CudaBackend.__new__(CudaBackend)  # no GPU here: only the capability is asked
    gpu.local_index = 0
    assert (gpu.slow_precision("fp16") is not None) is slow
    assert gpu.slow_precision("fp32") is None


def _store(tmp_path, monkeypatch, rates: dict[str, float]):
    backend = select_backend("cpu")
    driver, _ = backend.driver()
    store = tmp_path / "calibration.json"
    store.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "entries": [
                    {
                        "device_kind": "cpu",
                        "device_model": backend.device_names()[0],
                        "driver": driver,
                        "gemm": {
                            p: {"ceiling_flops": rate, "measured_at": "2026-11-25T06:34:31+00:00"}
                            for p, rate in rates.items()
                        },
                    }
                ],
            }
        )
    )
    monkeypatch.setenv("HWBENCH_CALIBRATION", str(store))
    return backend


def test_the_estimate_is_the_model_flops_over_the_measured_rate(tmp_path, monkeypatch):
    backend = _store(tmp_path, monkeypatch, {"fp32": 2e9})
    catalog = load_catalog()
    spec = build_run_spec(RunOptions(model="tiny", steps=20, warmup=4), catalog)
    config = spec.model_config(catalog.workloads["tiny"].model)
    flops = model_flops_per_iteration(config, spec.global_batch_size, spec.seq_length) * 24
    work = run_work(spec, catalog, backend)
    assert work.flops == pytest.approx(flops) and work.devices == 1
    text = estimate_text(backend, [work], "this run")
    assert text.startswith(
        f"this run: at least {duration_text(flops / 2e9)}: {flops / 1e12:,.4g} TFLOP of training "
        "steps (warm-up and any recompute included) at the GEMM rate measured on "
    )
    assert text.endswith("; start-up, validation and a step's other work make it longer")
    assert "fp32 2.0 GFLOP/s per device (hwbench calibrate, 2026-11-25)" in text
    # two ranks on one CPU share its rate: the same work takes as long; on GPUs, each rank has its own
    two = build_run_spec(RunOptions(model="tiny", steps=20, warmup=4, nproc_per_node=2), catalog)
    assert run_work(two, catalog, backend).devices == 1


def test_without_a_measured_rate_the_duration_is_unknown_and_says_how_to_know(tmp_path, monkeypatch):
    backend = _store(tmp_path, monkeypatch, {"fp32": 2e9})
    spec = build_run_spec(RunOptions(model="tiny", precision="bf16"), load_catalog())
    text = estimate_text(backend, [run_work(spec, load_catalog(), backend)], "this run")
    assert text == "this run: duration unknown: no usable bf16 GEMM ceiling (hwbench calibrate --help)"


def test_run_says_it_before_it_starts(tmp_path, monkeypatch, capsys, avx2_only):
    """`hwbench run --precision fp16` on such a CPU: the warning and the estimate are on stderr
    before the run is started (the run itself is replaced: no training here)."""
    import hwbench.harness.run

    _store(tmp_path, monkeypatch, {"fp16": 3.4e8})
    said_before: list[str] = []

    def no_run(options, show_progress=True, on_preflight=None):
        said_before.append(capsys.readouterr().err)
        raise SystemExit(0)

    monkeypatch.setattr(hwbench.harness.run, "run_and_store", no_run)
    with pytest.raises(SystemExit):
        run_command("run", ["--model", "tiny", "--precision", "fp16", "--out", str(tmp_path)])
    [err] = said_before
    lines = err.splitlines()
    assert lines[0].startswith("hwbench: warning: --precision fp16: this CPU (") and lines[0].endswith(
        "; --precision fp32 runs at speed here"
    )
    assert lines[1].startswith("hwbench: note: this run: at least ") and "fp16 340.00 MFLOP/s per device" in lines[1]
    # the estimate is a floor: the run says its measured length later (a sweep's quiet runs do not)
    assert lines[1].endswith("; a run of 5 min or more says its measured length after its first micro-batch")


@pytest.mark.parametrize(
    "seconds, text", [(0.2, "1 s"), (45, "45 s"), (600, "10 min"), (5400, "1.5 h"), (86400 * 3, "3.0 days")]
)
def test_durations_read_as_people_write_them(seconds, text):
    assert duration_text(seconds) == text


def test_a_rank_started_by_torchrun_says_nothing(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert before_run(RunOptions(model="tiny")) == []


def test_a_sweep_estimates_every_point_and_repeat(tmp_path, monkeypatch):
    from hwbench.suites.executor import SweepOptions, point_runs
    from hwbench.suites.suite import find_suite, load_suite
    from hwbench.suites.sweep import before_sweep

    backend = _store(tmp_path, monkeypatch, {"fp32": 2e9})
    suite = load_suite(find_suite("smoke"))
    options = SweepOptions(tmp_path / "out", device="cpu", repeats=3)
    catalog = load_catalog()
    specs = [build_run_spec(run.options, catalog, check_paths=False) for run in point_runs(suite, options, {})]
    seconds = sum(run_work(spec, catalog, backend).flops for spec in specs) / 2e9
    [line] = before_sweep(suite, options)
    assert line.startswith(f"note: {len(specs)} run(s) of suite smoke: at least {duration_text(seconds)}: ")


def test_quiet_keeps_the_warning_and_drops_the_estimate(tmp_path, monkeypatch, capsys, avx2_only):
    """--quiet silences progress, not warnings: a slow precision is still said, the estimate is not."""
    import hwbench.harness.run

    _store(tmp_path, monkeypatch, {"fp16": 3.4e8})
    said_before: list[str] = []

    def no_run(options, show_progress=True, on_preflight=None):
        said_before.append(capsys.readouterr().err)
        raise SystemExit(0)

    monkeypatch.setattr(hwbench.harness.run, "run_and_store", no_run)
    with pytest.raises(SystemExit):
        run_command("run", ["--model", "tiny", "--precision", "fp16", "--quiet", "--out", str(tmp_path)])
    [err] = said_before
    [line] = err.splitlines()
    assert line.startswith("hwbench: warning: --precision fp16: this CPU (")


def test_an_unknown_duration_names_calibrate_only_when_calibrate_can_help(tmp_path, monkeypatch):
    backend = _store(tmp_path, monkeypatch, {"fp32": 2e9})
    spec = build_run_spec(RunOptions(model="tiny", precision="bf16"), load_catalog())
    work = [run_work(spec, load_catalog(), backend)]
    assert estimate_text(backend, work, "this run").endswith("(hwbench calibrate --help)")
    monkeypatch.setattr(backend, "simulated", True)  # a stand-in: calibrating it would not help
    text = estimate_text(backend, work, "this run")
    assert text == (
        "this run: duration unknown: the device is simulated: there is no ceiling to compare host-CPU work with"
    )


def test_a_quiet_sweep_keeps_its_warnings_and_drops_its_estimate(tmp_path, monkeypatch, avx2_only):
    import dataclasses

    from hwbench.suites.executor import SweepOptions
    from hwbench.suites.suite import find_suite, load_suite
    from hwbench.suites.sweep import before_sweep

    _store(tmp_path, monkeypatch, {"fp32": 2e9})
    smoke = load_suite(find_suite("smoke"))
    fp16 = dataclasses.replace(
        smoke,
        points=tuple(  # every point at a precision this CPU emulates
            dataclasses.replace(
                p, options=tuple((k, v) for k, v in p.options if k != "precision") + (("precision", "fp16"),)
            )
            for p in smoke.points
        ),
    )
    options = SweepOptions(tmp_path / "out", device="cpu")
    loud, quiet = before_sweep(fp16, options), before_sweep(fp16, options, estimate=False)
    assert quiet and all(line.startswith("warning: --precision fp16: ") for line in quiet)
    assert loud[:-1] == quiet and loud[-1].startswith("note: ")


def test_a_calibration_that_gives_no_ceiling_is_said_once_in_one_short_line(tmp_path, monkeypatch):
    """A rate stored marked unreliable (calibrate refused it; --force kept it) gave a 455-character
    note before every run: now one line under 100 characters, the first time for that cause, and
    again only once the store gives another cause."""
    _store(tmp_path, monkeypatch, {"fp32": 2e9})
    store = json.loads((tmp_path / "calibration.json").read_text())
    gemm = store["entries"][0]["gemm"]["fp32"]
    gemm["unreliable"] = ("its repetitions spread by CV 11.0% (more than 10%): the device did not run at one rate; "
                          "other work took 39% of the time of the CPUs it ran on (more than 10%)")
    (tmp_path / "calibration.json").write_text(json.dumps(store))
    options = RunOptions(model="tiny", device="cpu")
    [first] = before_run(options)
    assert first.startswith("note: this run: duration unknown") and len(f"hwbench: {first}") < 100
    assert before_run(options) == [] and before_run(options) == []  # not on every run
    assert before_run(options, estimate=False) == []
    gemm["unreliable"] = "other work took 60% of the time of the CPUs it ran on (more than 10%)"  # calibrated again
    (tmp_path / "calibration.json").write_text(json.dumps(store))
    assert before_run(options) == [first]
    assert (tmp_path / ".calibration.json.said").is_file()  # beside the store, hwbench's own


@pytest.mark.parametrize("memory, said", [("80GB", "74.5 GiB"), ("1.5TB", "1.4 TiB"), ("512MB", "488.3 MiB"),
                                          ("80GiB", None), ("80G", None), ("85899345920", None)])
def test_a_size_in_a_decimal_unit_is_said_as_it_was_read(memory, said):
    """`hwbench run --settings fast --device-memory 80GB` plans for 74.5 GiB: said before it starts, with
    the binary spelling; GiB, G and bytes are read as written and need no word."""
    lines = before_run(RunOptions(model="tiny", settings="fast", device_memory=memory), estimate=False)
    notes = [line for line in lines if "is read as" in line]
    if said is None:
        assert notes == []
    else:
        number, unit = memory[:-2], memory[-2:]
        power = {"GB": (9, 30), "TB": (12, 40), "MB": (6, 20)}[unit]
        assert notes == [f"note: --device-memory {memory} is read as {number} x 10^{power[0]} bytes = {said} "
                         f"({unit} is a power of 10, as disks count); for {number} x 2^{power[1]} bytes give "
                         f"{number}{unit[0]}iB"]


def test_the_floor_counts_the_recomputed_forward_the_device_computes():
    """--recompute (345m's published setting) runs each block's forward twice: a floor of the time
    counts it (forward 1 + backward 2 + recompute 1 = 4/3 of the model FLOPs), once only where the
    formula counts it itself (megatron-deepspeed's hardware FLOPs)."""
    backend, catalog = select_backend("cpu"), load_catalog()
    config = catalog.workloads["tiny"].model
    for formula, factor in (("megatron-core-v0.12", 4 / 3), ("megatron-deepspeed", 1.0)):
        plain, recomputed = (build_run_spec(RunOptions(model="tiny", steps=3, warmup=1, recompute=recompute,
                                                       flops_formula=formula), catalog) for recompute in (False, True))
        model_flops = 4 * model_flops_per_iteration(config, recomputed.global_batch_size, recomputed.seq_length,
                                                    recompute=True, formula=formula)
        assert run_work(recomputed, catalog, backend).flops == pytest.approx(model_flops * factor)
        assert run_work(plain, catalog, backend).flops < run_work(recomputed, catalog, backend).flops
