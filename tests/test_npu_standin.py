"""The Ascend NPU path, exercised through the stand-in torch_npu and npu-smi in
tests/fakes: the npu-smi parser on recorded outputs, and `hwbench` run as a
real subprocess with and without the stand-in (and without the CANN runtime)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import stand_in_gave

from hwbench.device.npu import NpuBackend
from hwbench.device.npu_smi import NpuSmiSampler, parse_npu_smi_info

FAKES = Path(__file__).resolve().parent / "fakes"
RECORDINGS = FAKES / "npu-smi"

# Seconds a subprocess may take. Start-up (torch import) is ~2 s; the tiny run trains
# in ~10 s on 2 cores. The budgets leave room for a loaded CI machine, not more.
QUICK_S = 45
TRAIN_S = 120


@pytest.fixture(scope="module")
def standin():
    """The stand-in module's constants, loaded under a private name; the torch.npu
    it attaches is taken off again so this test process still has no NPU."""
    had_npu = hasattr(torch, "npu")
    spec = importlib.util.spec_from_file_location("_hwbench_standin_torch_npu", FAKES / "torch_npu" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    previous = os.environ.pop("HWBENCH_STANDIN_NO_CANN", None)
    try:
        spec.loader.exec_module(module)
    finally:
        if previous is not None:
            os.environ["HWBENCH_STANDIN_NO_CANN"] = previous
        if not had_npu:
            if hasattr(torch, "npu"):
                delattr(torch, "npu")
            sys.modules.pop("torch.npu", None)
    return module


def plain_env() -> dict[str, str]:
    """os.environ without the stand-ins: tests/fakes off PYTHONPATH and PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWBENCH_STANDIN_")}
    for key in ("PYTHONPATH", "PATH"):
        parts = [p for p in env.get(key, "").split(os.pathsep) if p and not Path(p).resolve().is_relative_to(FAKES)]
        env[key] = os.pathsep.join(parts)
    if not env["PYTHONPATH"]:
        del env["PYTHONPATH"]
    return env


def hwbench(args: list[str], env: dict[str, str], cwd: Path, timeout: float = QUICK_S):
    return subprocess.run([sys.executable, "-m", "hwbench", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def recording(name: str) -> str:
    return (RECORDINGS / name).read_text()


# --- npu-smi info parsing ----------------------------------------------------


def test_parse_910b3_idle_recording():
    table = parse_npu_smi_info(recording("info-910b3.txt"))
    assert list(table) == [0]  # the process table adds no device
    npu = table[0]
    assert npu["name"] == "910B3"
    assert npu["health"] == "OK"
    assert npu["bus_id"] == "0000:C1:00.0"
    assert npu["power_w"] == 101.8
    assert npu["temperature_c"] == 43.0
    assert npu["utilization_percent"] == 0.0
    assert (npu["memory_used_mb"], npu["memory_total_mb"]) == (0.0, 0.0)
    assert (npu["hbm_used_mb"], npu["hbm_total_mb"]) == (3318.0, 65536.0)


def test_parse_two_loaded_910b3_whose_hbm_field_lost_its_space():
    text = recording("info-910b3-loaded.txt")
    assert "59356/ 65536" in text  # the recording really has the squeezed field
    table = parse_npu_smi_info(text)
    assert sorted(table) == [0, 1]  # process rows ("| 0       0  | 124528 | python3 ...") are not devices
    first, second = table[0], table[1]
    assert (first["power_w"], first["temperature_c"], first["utilization_percent"]) == (310.5, 58.0, 87.0)
    assert (first["hbm_used_mb"], first["hbm_total_mb"]) == (59356.0, 65536.0)
    assert (first["memory_used_mb"], first["memory_total_mb"]) == (0.0, 0.0)
    assert first["bus_id"] == "0000:C1:00.0"
    assert (second["power_w"], second["temperature_c"], second["utilization_percent"]) == (296.2, 55.0, 84.0)
    assert (second["hbm_used_mb"], second["hbm_total_mb"]) == (58890.0, 65536.0)
    assert second["bus_id"] == "0000:C2:00.0"


def test_parse_310p_recording_without_hbm_column():
    table = parse_npu_smi_info(recording("info-310p.txt"))
    assert list(table) == [0]
    npu = table[0]
    assert npu["name"] == "310P3"
    assert npu["health"] == "OK"
    assert npu["power_w"] == 15.8
    assert npu["temperature_c"] == 42.0
    assert npu["bus_id"] == "0000:82:00.0"
    assert npu["utilization_percent"] == 0.0
    assert (npu["memory_used_mb"], npu["memory_total_mb"]) == (1074.0, 21534.0)
    assert "hbm_used_mb" not in npu and "hbm_total_mb" not in npu


def test_parse_310p_first_row_alone():
    """The first row of a 310P card alone: no HBM fields."""
    first_row = [line for line in recording("info-310p.txt").splitlines() if "310P3" in line]
    npu = parse_npu_smi_info("\n".join(first_row))[0]
    assert (npu["name"], npu["power_w"], npu["temperature_c"]) == ("310P3", 15.8, 42.0)
    assert "hbm_used_mb" not in npu and "utilization_percent" not in npu


def test_parse_power_not_available():
    text = recording("info-910b3.txt").replace("| 101.8       43 ", "| NA          43 ")
    npu = parse_npu_smi_info(text)[0]
    assert npu["power_w"] is None
    assert npu["temperature_c"] == 43.0


# --- the npu-smi sampler over the stand-in npu-smi ---------------------------


def test_npu_smi_sampler_reads_the_physical_npus(monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKES / "bin"), os.environ.get("PATH", "")]))
    monkeypatch.setenv("HWBENCH_STANDIN_NPU_SMI", "info-910b3-loaded.txt")
    sampler = NpuSmiSampler([1, 0], interval_s=0.1)
    assert sampler.interval_s == 1.0  # npu-smi is slow: intervals under a second are raised
    assert sampler.unavailable_reason() is None
    first, second = sampler.read()
    assert (first["power_w"], first["utilization_percent"]) == (296.2, 84.0)
    assert first["memory_used_mib"] == 58890.0  # on HBM cards, memory is the HBM figure
    assert (second["power_w"], second["memory_used_mib"]) == (310.5, 59356.0)


def test_npu_smi_sampler_without_npu_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    sampler = NpuSmiSampler([0])
    assert "npu-smi is not on PATH" in sampler.unavailable_reason()
    summary = sampler.stop()
    assert summary["available"] is False and summary["source"] == "npu-smi"


def test_smi_device_id_follows_ascend_rt_visible_devices(monkeypatch):
    backend = NpuBackend.__new__(NpuBackend)  # no torch_npu needed for the mapping
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "6,3")
    backend.local_index = 1
    assert backend.smi_device_id() == 3
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES")
    assert backend.smi_device_id() == 1


# --- the stand-in torch_npu itself (in a subprocess: it patches torch) --------


def test_standin_torch_npu_api(standin_npu_env, tmp_path, standin):
    script = textwrap.dedent("""
        import json, os, sys, time, torch
        import torch_npu
        import torch.npu as npu_module
        out = {"version": torch_npu.__version__, "stand_in": torch_npu.__hwbench_stand_in__,
               "same_module": npu_module is torch.npu, "count": torch.npu.device_count(),
               "name": torch.npu.get_device_name(0), "total": torch.npu.get_device_properties(0).total_memory,
               "bf16": torch.npu.is_bf16_supported(), "available": torch.npu.is_available(),
               "stats": torch.npu.memory_stats(), "mem_get_info": list(torch.npu.mem_get_info()),
               "max_allocated": torch.npu.max_memory_allocated(), "max_reserved": torch.npu.max_memory_reserved()}
        torch.npu.set_device(1)
        out["current"] = torch.npu.current_device()
        try:
            torch.npu.set_device(2)
            out["bad_ordinal"] = "accepted"
        except RuntimeError as error:
            out["bad_ordinal"] = str(error)
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record(); time.sleep(0.05); end.record(); torch.npu.synchronize()
        out["elapsed_ms"] = start.elapsed_time(end)
        torch.npu.reset_peak_memory_stats()
        out["stats_after_reset"] = torch.npu.memory_stats()
        print(json.dumps(out))
    """)
    env = {**standin_npu_env, "ASCEND_RT_VISIBLE_DEVICES": "4,5"}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=QUICK_S)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["version"] == "2.13.0+standin" and out["stand_in"] is True and out["same_module"] is True
    assert out["count"] == 2 and out["current"] == 1
    assert "invalid device ordinal 2" in out["bad_ordinal"]
    assert out["name"] == "Ascend910B3" and out["total"] == 65536 * 2**20
    assert out["bf16"] is True and out["available"] is True
    assert out["stats"]["allocated_bytes.all.peak"] == standin.PEAK_ALLOCATED_BYTES
    assert out["stats"]["reserved_bytes.all.peak"] == standin.PEAK_RESERVED_BYTES
    assert out["stats"]["num_alloc_retries"] == standin.RETRIES_BEFORE_RESET  # counted since the process started
    assert out["stats"]["num_ooms"] == standin.NUM_OOMS
    # recorded values, not measurements; the retry counter goes on counting after a peak reset
    assert out["stats_after_reset"] == {**out["stats"], "num_alloc_retries": standin.RETRIES_BEFORE_RESET
                                        + standin.NUM_ALLOC_RETRIES}
    assert out["max_allocated"] == standin.PEAK_ALLOCATED_BYTES
    assert out["max_reserved"] == standin.PEAK_RESERVED_BYTES
    assert out["mem_get_info"] == [65536 * 2**20 - standin.CURRENT_RESERVED_BYTES, 65536 * 2**20]
    assert 45 <= out["elapsed_ms"] < 1000  # milliseconds, from perf_counter


def test_standin_counts_one_device_by_default_and_none_when_hidden(standin_npu_env, tmp_path):
    script = "import torch, torch_npu; print(torch.npu.device_count())"
    env = {k: v for k, v in standin_npu_env.items() if k != "ASCEND_RT_VISIBLE_DEVICES"}
    default = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=QUICK_S)
    assert default.returncode == 0, default.stderr
    assert default.stdout.strip() == "1"
    # No visible NPU: hwbench refuses --device npu with one line and exit 2.
    hidden = hwbench(["run", "--device", "npu", "--model", "tiny", "--out", str(tmp_path / "out")],
                     {**env, "ASCEND_RT_VISIBLE_DEVICES": ""}, tmp_path)
    assert hidden.returncode == 2, hidden.stderr
    assert hidden.stderr.strip() == ("hwbench: error: --device npu: torch_npu sees no NPU; "
                                     "check npu-smi info and ASCEND_RT_VISIBLE_DEVICES")
    assert not (tmp_path / "out").exists()


# --- hwbench end to end through the stand-in ----------------------------------


def test_run_on_the_standin_npu_end_to_end(standin_npu_env, tmp_path, standin):
    out = tmp_path / "results"
    # one sample a step: what is checked is the NPU path and what the stand-in reports, not the throughput
    done = hwbench(["run", "--device", "npu", "--model", "tiny", "--seq-length", "32", "--steps", "3", "--warmup", "1",
                    "--micro-batch-size", "1", "--global-batch-size", "1", "--quiet", "--out", str(out)],
                   standin_npu_env, tmp_path, timeout=TRAIN_S)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 1 and files[0].endswith(".json"), files
    result = json.loads((out / files[0]).read_text())
    assert result["status"] == "ok"

    device, environment, metrics = result["device"], result["environment"], result["metrics"]
    assert device["backend"] == "npu"
    assert device["dist_backend"] == "gloo"  # the stand-in computes on the host; a real NPU uses hccl
    assert NpuBackend.dist_backend == "hccl"
    assert device["simulated"] is True
    assert device["device_model"] == "Ascend910B3"
    assert device["torch_device"] == "cpu"  # the stand-in computes on the host
    assert device["peak_flops"] is None
    assert environment["simulated"] is True
    assert environment["backend"] == "npu"
    assert environment["torch_npu_version"] == standin.__version__ == "2.13.0+standin"
    assert "simulated" in result["warnings"][0]

    # the stand-in's fixed memory statistics, read as on a real NPU and recorded as none (null, the value in the reason)
    memory = metrics["memory"]
    assert stand_in_gave(memory, "peak_allocated_bytes") == standin.PEAK_ALLOCATED_BYTES
    assert stand_in_gave(memory, "peak_reserved_bytes") == standin.PEAK_RESERVED_BYTES
    assert stand_in_gave(memory, "alloc_retries") == standin.NUM_ALLOC_RETRIES  # the timed window's, not the process's
    assert stand_in_gave(memory, "ooms") == standin.NUM_OOMS
    assert stand_in_gave(memory, "capacity_bytes") == standin.TOTAL_MEMORY_BYTES

    assert metrics["mfu"] is None
    assert "simulated" in metrics["unmeasured"]["mfu"]
    assert metrics["mfu_measured_ceiling"] is None and device["measured_ceiling"] is None
    assert "simulated" in metrics["unmeasured"]["mfu_measured_ceiling"]
    assert metrics["timed_steps"] == 3
    assert metrics["tokens_per_s"] > 0

    telemetry = metrics["telemetry"]
    assert telemetry["source"] == "npu-smi"
    assert telemetry["available"] is False and "simulated" in telemetry["reason"]
    assert telemetry["errors"] == []
    assert telemetry["samples"] >= 2  # one at the start, one at the end of the window
    npu0 = telemetry["devices"][0]
    assert stand_in_gave(npu0, "power_w_mean") == pytest.approx(101.8)
    assert stand_in_gave(npu0, "power_w_max") == pytest.approx(101.8)
    assert stand_in_gave(npu0, "temperature_c_mean") == pytest.approx(43.0)
    assert stand_in_gave(npu0, "utilization_percent_mean") == pytest.approx(0.0)
    assert stand_in_gave(npu0, "memory_used_mib_mean") == pytest.approx(3318.0)
    assert npu0["energy_method"] == "integrated power samples"

    assert "SIMULATED" in done.stdout


def test_auto_picks_the_standin_npu(standin_npu_env, tmp_path):
    done = hwbench(["devices"], standin_npu_env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--device auto uses npu (1 x Ascend910B3)" in done.stdout


def test_calibrate_refuses_the_simulated_npu_and_writes_nothing(standin_npu_env, tmp_path):
    store = tmp_path / "calibration.json"
    done = hwbench(["calibrate", "--device", "npu", "--sizes", "32", "--store", str(store)], standin_npu_env, tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "--device npu: the device is simulated" in lines[0], done.stderr
    assert not store.exists()


def test_npu_without_cann_runtime_is_one_line_and_writes_nothing(standin_npu_env, tmp_path):
    out = tmp_path / "results"
    done = hwbench(["run", "--device", "npu", "--model", "tiny", "--steps", "3", "--warmup", "1", "--quiet",
                    "--out", str(out)], {**standin_npu_env, "HWBENCH_STANDIN_NO_CANN": "1"}, tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "libhccl.so" in lines[0] and "set_env.sh" in lines[0]
    assert lines[0].startswith("hwbench: error: --device npu:")
    assert done.stdout == ""
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="a real torch_npu is installed here")
def test_npu_without_torch_npu_says_how_to_install_it(tmp_path, capsys):
    """This process has no torch_npu (the stand-in is only ever on a child's path): hwbench's main()."""
    from hwbench.cli import main

    out = tmp_path / "results"
    code = main(["run", "--device", "npu", "--model", "tiny", "--out", str(out)])
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    torch_version = torch.__version__.split("+")[0]
    assert "torch_npu is not installed" in lines[0]
    assert f"pip install torch-npu=={torch_version}" in lines[0]
    assert not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="a real torch_npu is installed here")
def test_auto_falls_back_to_cpu_without_torch_npu(capsys):
    from hwbench.cli import main

    code = main(["devices"])  # this process has no torch_npu, as above
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "--device auto uses cpu" in said.out


@pytest.mark.slow
def test_two_simulated_npu_ranks_train_over_gloo_and_say_so(standin_npu_env, tmp_path):
    """The stand-in computes on the host, so its ranks join over gloo (no HCCL);
    the merged result still says the device was simulated."""
    env = {**standin_npu_env, "ASCEND_RT_VISIBLE_DEVICES": "0,1"}
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, "-m", "hwbench", "run", "--quiet", "--device", "npu", "--model", "tiny", "--data",
         "synthetic", "--seq-length", "32", "--steps", "2", "--warmup", "1", "--eval-iters", "0",
         "--micro-batch-size", "1", "--global-batch-size", "2",  # one sample a rank and step
         "--nproc-per-node", "2", "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(next(out.glob("*.json")).read_text())
    assert result["device"]["simulated"] is True and result["device"]["dist_backend"] == "gloo"
    assert result["metrics"]["world_size"] == 2 and result["metrics"]["mfu"] is None
    assert result["warnings"][0].startswith("device simulated")


def test_cann_driver_and_hccl_versions_are_read_from_their_files(tmp_path):
    """The formats CANN writes: version.cfg with one [package:CANN] bracket per installed
    release, ascend_toolkit_install.info and the driver's version.info with key=value lines
    where other keys end in 'version' too."""
    from hwbench.device.npu import _cann_version, _read_version

    (tmp_path / "version.cfg").write_text(
        "# version cfg\nruntime_running_version=[7.3.0.1.231:8.0.RC2]\n"
        "toolkit_upgrade_version=[7.3.0.1.231:8.0.RC2]\n"
        "toolkit_installed_version=[7.0.0.5.242:7.0.RC1][7.1.0.3.220:7.0.0][7.3.0.1.231:8.0.RC2]\n")
    assert _cann_version(str(tmp_path)) == "8.0.RC2"  # the newest installed, not 7.0.RC1
    (tmp_path / "version.cfg").write_text("toolkit_installed_version=[7.3.0.1.231:8.0.RC2]\n"
                                          "toolkit_running_version=[7.1.0.3.220:7.0.0]\n")
    assert _cann_version(str(tmp_path)) == "7.0.0"  # the running one, when it is named
    (tmp_path / "version.cfg").unlink()
    (tmp_path / "aarch64-linux").mkdir()
    (tmp_path / "aarch64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\ninnerversion=V100R001C19SPC001B227\nversion=8.0.RC3\narch=aarch64\n")
    assert _cann_version(str(tmp_path)) == "8.0.RC3"
    driver = tmp_path / "version.info"
    driver.write_text("ascendhal_version=7.35.19\nVersion=24.1.rc2\nInnerversion=V100R001C19SPC002B109\n")
    assert _read_version([str(driver)], "version") == "24.1.rc2"
    assert _read_version([str(tmp_path / "nothing.info")], "version") is None
    driver.write_text("Version=\ninnerversion=V100R001\nversion: 25.0.rc1\n")  # an empty value is skipped
    assert _read_version([str(driver)], "version") == "25.0.rc1"
    (tmp_path / "version.cfg").write_text("toolkit_installed_version=[8.0.RC2]\n")  # no package part
    assert _cann_version(str(tmp_path)) == "8.0.RC2"
