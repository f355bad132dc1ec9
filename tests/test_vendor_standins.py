"""NVIDIA (CUDA), AMD Instinct (ROCm) and Intel Gaudi (HPU) paths through the stand-ins in
tests/fakes/cuda, tests/fakes/rocm and tests/fakes/gaudi: complete, simulated results with
telemetry, the one-line errors on a machine without the vendor software, and the resources
`hwbench k8s`/`hwbench slurm` request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import STANDIN_RUN, stand_in_gave, standin_path

from hwbench.cli import main

FAKES = Path(__file__).resolve().parent / "fakes"
RUN = STANDIN_RUN


def hwbench(args, cwd, **env):
    environment = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "hwbench", *args], env=environment, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def only_result(out: Path) -> dict:
    files = list(out.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def test_a_rocm_run_through_the_stand_in_is_complete_and_simulated(tmp_path):
    done = hwbench([*RUN, "--device", "rocm", "--out", str(tmp_path / "out")], tmp_path,
                   PYTHONPATH=standin_path("rocm"), HWBENCH_STANDIN_ROCM="1")
    assert done.returncode == 0, done.stderr[-3000:]
    result = only_result(tmp_path / "out")
    device, env = result["device"], result["environment"]
    assert (device["backend"], device["device_model"], device["catalog_entry"]) == ("rocm", "AMD Instinct MI300X",
                                                                                    "mi300x")
    assert device["simulated"] is True and device["gfx_arch"] == "gfx942" and device["dist_backend"] == "gloo"
    assert result["metrics"]["mfu"] is None and "simulated" in result["metrics"]["unmeasured"]["mfu"]
    assert result["warnings"][0].startswith("device simulated: a stand-in ran the rocm code path")
    assert (env["hip_version"], env["rccl_version"], env["gfx_arch"]) == ("6.4.43482-0f2d60242", "2.22.3", ["gfx942"])
    # the stand-in's sensors were read through AMD SMI, and are recorded as none: each null, its value in the reason
    telemetry = result["metrics"]["telemetry"]
    assert telemetry["source"] == "amdsmi" and telemetry["available"] is False and "simulated" in telemetry["reason"]
    gpu = telemetry["devices"][0]
    assert stand_in_gave(gpu, "power_w_mean") == 717 and stand_in_gave(gpu, "temperature_c_max") == 52
    assert gpu["pci_bus_id"] == "0000:0c:00.0" and stand_in_gave(gpu, "throttle_reasons") == ["package_power"]
    assert stand_in_gave(gpu, "energy_resolution_uj") == pytest.approx(15.259)
    assert stand_in_gave(gpu, "energy_j") / telemetry["window_s"] == pytest.approx(717, rel=0.05)  # the counter, J


def test_a_cuda_run_through_the_stand_in_is_complete_and_simulated(cuda_standin_result):
    """conftest's cuda_standin_result: RUN through tests/fakes/cuda."""
    result = only_result(cuda_standin_result.parent)
    device, env = result["device"], result["environment"]
    assert (device["backend"], device["device_model"], device["catalog_entry"]) == ("cuda", "NVIDIA H100 80GB HBM3",
                                                                                    "h100-sxm")
    assert device["simulated"] is True and device["torch_device"] == "cpu" and device["dist_backend"] == "gloo"
    assert result["metrics"]["mfu"] is None and "simulated" in result["metrics"]["unmeasured"]["mfu"]
    assert result["warnings"][0].startswith("device simulated: a stand-in ran the cuda code path")
    assert result["metrics"]["host_syncs"] is None  # not "the cuda backend cannot count": on a GPU it does
    assert result["metrics"]["unmeasured"]["host_syncs"].startswith("the device is simulated: torch's sync debug")
    assert (env["cuda_version"], env["driver_version"], env["compute_capability"]) == ("12.4", "550.54.15", ["9.0"])
    memory = result["metrics"]["memory"]
    assert stand_in_gave(memory, "capacity_bytes") == device["memory_capacity_bytes"] == 81559 * 2**20
    assert stand_in_gave(memory, "peak_reserved_bytes") > 0  # the stand-in's memory_stats(), not this host's
    telemetry = result["metrics"]["telemetry"]
    assert telemetry["source"] == "nvml" and telemetry["available"] is False and "simulated" in telemetry["reason"]
    gpu = telemetry["devices"][0]
    assert (stand_in_gave(gpu, "power_w_mean"), stand_in_gave(gpu, "temperature_c_max")) == (88, 28)
    assert gpu["identified_by"] == "uuid" and gpu["pci_bus_id"] == "0000:18:00.0"
    assert stand_in_gave(gpu, "energy_j") / telemetry["window_s"] == pytest.approx(88, rel=0.05)  # the counter, J


def test_a_stand_in_runs_time_to_target_has_no_cost_and_no_energy(tmp_path):
    """Its device-hours are this host's and its energy counter the stand-in's: the catalog's H100
    price and the counter's joules were recorded as the run's cost and energy to the target."""
    options = ["--steps", "2", "--warmup", "0", "--eval-iters", "1", "--eval-interval", "1", "--target-loss", "20"]
    done = hwbench(["run", "--model", "tiny", "--seq-length", "32", *options, "--telemetry-interval", "0.1",
                    "--device", "cuda", "--out", str(tmp_path / "out")], tmp_path, PYTHONPATH=standin_path("cuda"),
                   HWBENCH_STANDIN_CUDA="1")
    assert done.returncode == 0, done.stderr[-3000:]
    result = only_result(tmp_path / "out")
    target = result["metrics"]["time_to_target"]
    assert target["reached"] is True and target["device_hours"] > 0 and result["device"]["price_usd_per_hour"] > 0
    assert target["cost_usd"] is None and target["unmeasured"]["cost_usd"].startswith("not priced: a simulated device")
    assert target.get("energy_j") is None and target["unmeasured"]["energy_j"].startswith("the device is simulated")


def test_a_gaudi_run_through_the_stand_in_names_its_mode_and_marks_each_lazy_step(tmp_path):
    marks = tmp_path / "marks"
    done = hwbench([*RUN, "--device", "hpu", "--out", str(tmp_path / "out")], tmp_path,
                   PYTHONPATH=standin_path("gaudi"), HWBENCH_STANDIN_MARK_STEP_LOG=str(marks))
    assert done.returncode == 0, done.stderr[-3000:]
    result = only_result(tmp_path / "out")
    device = result["device"]
    assert (device["backend"], device["device_model"], device["catalog_entry"]) == ("hpu", "GAUDI2", "gaudi2")
    assert device["simulated"] is True and device["hpu_mode"] == "lazy" and result["metrics"]["mfu"] is None
    assert len(marks.read_text().splitlines()) == len(result["steps"])  # one mark_step per training step
    gpu = result["metrics"]["telemetry"]["devices"][0]
    assert [stand_in_gave(gpu, figure) for figure in ("power_w_mean", "temperature_c_max", "memory_used_mib_max")] \
        == [75, 27, 768]
    assert gpu["name"] == "hpu:0" and gpu["pci_bus_id"] == "0000:33:00.0"
    assert stand_in_gave(result["metrics"]["memory"], "capacity_bytes") == 98304 * 2**20


def test_eager_mode_is_named_and_marks_no_steps(tmp_path):
    marks = tmp_path / "marks"
    done = hwbench([*RUN, "--device", "hpu", "--no-telemetry", "--out", str(tmp_path / "out")], tmp_path,
                   PYTHONPATH=standin_path("gaudi"), HWBENCH_STANDIN_MARK_STEP_LOG=str(marks), PT_HPU_LAZY_MODE="0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert only_result(tmp_path / "out")["device"]["hpu_mode"] == "eager" and not marks.exists()


@pytest.mark.parametrize("device, expected", [
    ("rocm", "hwbench: error: --device rocm: this torch build"),
    ("hpu", "hwbench: error: --device hpu: habana_frameworks is not installed"),
])
def test_a_missing_vendor_stack_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, device, expected):
    """This process has the CPU torch and no vendor stack: hwbench's main(), as `hwbench run` calls it."""
    out = tmp_path / "out"
    assert main(["run", "--device", device, "--model", "tiny", "--out", str(out)]) == 2
    said = capsys.readouterr()
    lines = said.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert said.out == "" and not out.exists()


@pytest.mark.parametrize("device, resource", [("rocm", "amd.com/gpu"), ("hpu", "habana.ai/gaudi")])
def test_k8s_requests_the_vendors_device_resource(capsys, device, resource):
    assert (
        main(
            [
                "k8s",
                "--image",
                "registry.example.com/hwbench:0.1",
                "--device",
                device,
                "--nnodes",
                "1",
                "--nproc-per-node",
                "2",
                "--model",
                "tiny",
                "--micro-batch-size",
                "1",
                "--global-batch-size",
                "2",
            ]
        )
        == 0
    )
    assert f'{resource}: "2"' in capsys.readouterr().out


def test_slurm_binds_amd_gpus_with_gres(capsys):
    assert main(["slurm", "--model", "tiny", "--device", "rocm", "--nnodes", "1", "--nproc-per-node", "8"]) == 0
    assert "#SBATCH --gres=gpu:8\n" in capsys.readouterr().out


def test_the_bare_loop_on_cuda_through_the_stand_in_computes_on_the_host_marked_simulated(tmp_path):
    """benchmarks/side_by_side.py --device cuda starts the bare loop with --device cuda: through the
    stand-in it runs, as hwbench's run does, on the host CPU and says so (it was refused: the stand-in's
    torch.accelerator names no accelerator)."""
    bare = tmp_path / "bare.json"
    done = subprocess.run([sys.executable, str(FAKES.parents[1] / "benchmarks" / "bare_loop.py"), "--device", "cuda",
                           "--model", "tiny", "--seq-length", "32", "--micro-batch-size", "1",
                           "--global-batch-size", "1", "--steps", "2", "--warmup", "1", "--json", str(bare)],
                          env={**os.environ, "PYTHONPATH": standin_path("cuda"), "HWBENCH_STANDIN_CUDA": "1"},
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(bare.read_text())
    assert (figures["device"], figures["simulated"]) == ("cuda", True)
    assert "simulating cuda with a test stand-in" in figures["device_name"]
    assert len(figures["step_time_s"]["all"]) == 2


# heavy: torch.compile of the tiny model on the CPU takes about a minute on 2 cores
@pytest.mark.slow
@pytest.mark.heavy
def test_settings_fast_on_cuda_through_the_stand_in_plans_for_80_gb_and_compiles(tmp_path):
    """What `hwbench sweep fast --device cuda` runs for its fast points, on the tiny model: the planner
    chooses for the stand-in H100's memory, and torch.compile, the chunked cross-entropy and the fused
    QKV projection run. (Compile failed: dynamo saves torch.cuda's generator state wherever
    torch.cuda.is_available(), and the stand-in had no get_rng_state.)"""
    done = hwbench(["run", "--model", "tiny", "--seq-length", "32", "--steps", "2", "--warmup", "1",
                    "--eval-iters", "0", "--precision", "bf16", "--settings", "fast", "--no-telemetry",
                    "--device", "cuda",
                    "--out", str(tmp_path / "out")], tmp_path,
                   PYTHONPATH=standin_path("cuda"), HWBENCH_STANDIN_CUDA="1")
    assert done.returncode == 0, done.stderr[-3000:]
    result = only_result(tmp_path / "out")
    spec = result["spec"]
    assert result["status"] == "ok", result["error"]
    assert (spec["compile"], spec["cross_entropy"], spec["fused_qkv"], spec["recompute"]) == (True, "chunked", True,
                                                                                           False)
    assert spec["micro_batch_size"] == spec["global_batch_size"] == 8  # the whole batch fits 80 GB in one step
    assert spec["device_memory_bytes"] == 81559 * 2**20
    assert spec["settings_choice"].startswith("fast for cuda with 79.6 GiB per device (what the cuda device "
                                              "'NVIDIA H100 80GB HBM3' reports)")


CALIBRATE_SIMULATED = """
import sys
import hwbench.calibration.measure as measure
from hwbench.device import select_backend

def open_backend(device, threads):  # open_backend less its refusal of a simulated device
    backend = select_backend(device)
    backend.prepare_process(threads=threads)
    return backend

measure.open_backend = open_backend
from hwbench.cli import main
sys.exit(main(["calibrate", *sys.argv[1:]]))
"""


# heavy (python -m pytest -m heavy): NVML listing the calibration under its own pid; the default run keeps
# the container's host pid (the same calibration, stand-in and store, plus the pid it must recognise), and
# tests/test_calibrate.py checks both listings against nvml_other_processes in process
@pytest.mark.parametrize("nvml_pid", [pytest.param("", marks=pytest.mark.heavy), "918273"])
def test_calibrate_through_the_cuda_stand_in_reads_the_sm_clock_and_stores_under_its_key(tmp_path, nvml_pid):
    """`hwbench calibrate --device cuda` past its refusal of a simulated device: the device warm-up, NVML's SM
    clock during each GEMM, the store's key and the line naming the store the runs read, and the calibration's
    own context not counted as another process where NVML lists it under a host pid (a container: it was, and
    nothing was stored)."""
    store = tmp_path / "calibration.json"
    # --min-time 0.5: the SM clock is read every 0.1 s, and a window of 0.1 s could hold no sample inside it
    # (seen once in a full default run on a quiet 2-core machine: the figure asserted below was null)
    done = subprocess.run([sys.executable, "-c", CALIBRATE_SIMULATED, "--device", "cuda", "--precisions", "bf16",
                           "--sizes", "128", "--copy-size", "1MiB", "--repeats", "3", "--min-time", "0.5",
                           "--device-warmup", "0.1", "--force", "--store", str(store)],
                          env={**os.environ, "PYTHONPATH": standin_path("cuda"), "HWBENCH_STANDIN_CUDA": "1",
                               "HWBENCH_CALIBRATION": str(store), "HWBENCH_STANDIN_NVML_PID": nvml_pid},
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.rstrip().splitlines()[-1] == (
        f"stored in {store} under cuda / NVIDIA H100 80GB HBM3 / driver 550.54.15: runs on this device and driver "
        "report mfu_measured_ceiling against these ceilings")
    assert "device warm-up: " in done.stdout and "of GEMM bf16 128" in done.stdout
    (entry,) = json.loads(store.read_text())["entries"]
    gemm = entry["gemm"]["bf16"]
    assert (entry["device_kind"], entry["device_model"], entry["driver"]) == ("cuda", "NVIDIA H100 80GB HBM3",
                                                                              "550.54.15")
    assert gemm["sizes"][0]["sm_clock_mhz"]["mean"] == 1980 and gemm["sizes"][0]["sm_clock_unmeasured"] is None
    assert gemm["conditions"]["device_processes"] == []
    assert "other process" not in (gemm["unreliable"] or "")
