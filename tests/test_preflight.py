"""`hwbench preflight` and the check at the start of every run: on this machine for real; the
host checks against kernel file trees of the test's own; the GPU through a fake pynvml (the calls
of NVIDIA's NVML API reference), the NPU through the npu-smi stand-in and its recorded outputs;
the readings in a result, and compare and the report naming a difference in them."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest

from hwbench.cli import main
from hwbench.harness.preflight import Host, cpu_quota, preflight
from hwbench.result.model import Preflight

FAKES = Path(__file__).resolve().parent / "fakes"
# every check, in the order docs/preflight.md's table lists them: the table and the result keep it
CHECKS = tuple(re.findall(r"^\| `(\w+)` \|", (FAKES.parents[1] / "docs" / "preflight.md").read_text(), re.M))


def test_preflight_on_this_machine_prints_every_check(tmp_path, capsys):
    code = main(["preflight", "--out", str(tmp_path / "results")])
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()  # a wrapped cell's next line starts with spaces
             if line[:1].strip() and line.split()[0] in CHECKS}
    assert list(lines) == list(CHECKS)
    assert all(line.split()[1] in ("ok", "warning", "failure", "n/a") for line in lines.values())
    assert "checked in" in out and code == (1 if " failure " in out.replace("failure(s)", "") else 0)


def test_preflight_json_is_the_results_section(tmp_path, capsys):
    main(["preflight", "--json", "--out", str(tmp_path)])
    report = json.loads(capsys.readouterr().out)
    section = Preflight.model_validate(report)
    assert [check.name for check in section.checks] == list(CHECKS)
    assert section.device == "cpu" and section.worst in ("ok", "warning", "failure")
    disk = next(check for check in section.checks if check.name == "disk_space")
    assert disk.reading.endswith(f"free in {tmp_path}")  # --out, or the nearest folder of it that exists
    unread = [check for check in section.checks if check.status is None]
    assert all(check.reason for check in unread)  # null with the reason


@pytest.mark.parametrize("argv, message", [(["--nproc-per-node", "0"], "--nproc-per-node 0 is not accepted"),
                                           (["--device", "tpu"], "invalid choice: 'tpu'")])
def test_preflight_bad_input(capsys, argv, message):
    assert main(["preflight", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_out_that_is_a_file_fails_the_disk_check(tmp_path):
    from hwbench.harness.preflight import disk_space

    (tmp_path / "a-file").write_text("x")  # it read "ok: 39 GiB free in a-file"; a run refuses such --out
    for out in (tmp_path / "a-file", tmp_path / "a-file" / "runs"):
        check = disk_space(out)
        assert check.status == "failure" and "is a file" in check.reason


@pytest.mark.parametrize("kwargs, message", [({"device": "tpu"}, "--device 'tpu' is not known"),
                                             ({"nproc_per_node": 0}, "--nproc-per-node 0 is not accepted"),
                                             ({"threads_per_rank": -2}, "--threads-per-rank -2 is not accepted")])
def test_the_python_api_refuses_what_the_command_refuses(kwargs, message):
    import hwbench  # it returned a report of a device kind that does not exist, or of 0 ranks
    from hwbench.errors import UsageError

    with pytest.raises(UsageError, match=message):
        hwbench.preflight(**kwargs)


# --- the host, on kernel file trees of the test's own -----------------------------------------------


def kernel_tree(root: Path, *, governor="performance", numa="0", nodes=1, thp="always [madvise] never",
                defrag="always defer [madvise] never", swap=(0, 0), cpu_max="max 100000") -> Host:
    proc, sys_ = root / "proc", root / "sys"
    for cpu in range(2):
        folder = sys_ / f"devices/system/cpu/cpu{cpu}/cpufreq"
        folder.mkdir(parents=True)
        (folder / "scaling_governor").write_text(governor + "\n")
    for node in range(nodes):
        (sys_ / f"devices/system/node/node{node}").mkdir(parents=True)
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/numa_balancing").write_text(numa + "\n")
    (sys_ / "kernel/mm/transparent_hugepage").mkdir(parents=True)
    (sys_ / "kernel/mm/transparent_hugepage/enabled").write_text(thp + "\n")
    (sys_ / "kernel/mm/transparent_hugepage/defrag").write_text(defrag + "\n")
    total, free = swap
    (proc / "meminfo").write_text(f"MemTotal: 1000 kB\nMemAvailable: 900 kB\nSwapTotal: {total} kB\n"
                                  f"SwapFree: {free} kB\n")
    (proc / "self").mkdir()
    (proc / "self/cgroup").write_text("0::/hwbench.slice\n")
    (sys_ / "fs/cgroup/hwbench.slice").mkdir(parents=True)
    (sys_ / "fs/cgroup/hwbench.slice/cpu.max").write_text(cpu_max + "\n")
    return Host(proc=proc, sys=sys_)


def checks_of(host: Host, environ=None, ranks=1, threads=1, monkeypatch=None) -> dict:
    import hwbench.harness.preflight as module

    monkeypatch.setattr(module, "allowed_cpus", lambda: [0, 1])
    report = preflight("cpu", ".", ranks, threads, environ or {}, host)
    return {check.name: check for check in report.checks}


def test_a_well_set_host_is_ok(tmp_path, monkeypatch):
    checks = checks_of(kernel_tree(tmp_path), monkeypatch=monkeypatch)
    for name in ("cpu_governor", "numa_balancing", "transparent_hugepages", "swap", "cpu_quota",
                 "collective_settings"):
        assert checks[name].status == "ok", checks[name]
    assert checks["cpu_governor"].value == "performance" and checks["swap"].reading == "no swap"
    assert checks["collective_settings"].value == "none set"


def test_each_host_setting_that_moves_figures_is_a_warning_with_its_reading(tmp_path, monkeypatch):
    host = kernel_tree(tmp_path, governor="powersave", numa="1", nodes=2, defrag="[always] defer madvise never",
                       swap=(2048, 1024), cpu_max="100000 100000")
    checks = checks_of(host, {"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring", "PATH": "/bin"}, ranks=2, threads=2,
                       monkeypatch=monkeypatch)
    governor = checks["cpu_governor"]
    assert (governor.status, governor.reading, governor.value) == ("warning", "powersave on 2 CPUs", "powersave")
    assert "cpupower frequency-set -g performance" in governor.reason
    assert (checks["numa_balancing"].status, checks["numa_balancing"].reading) == ("warning", "on (2 NUMA nodes)")
    assert (
        checks["transparent_hugepages"].status == "warning" and "defrag always" in checks["transparent_hugepages"].value
    )
    assert (checks["swap"].status, checks["swap"].reading) == ("warning", "1.0 MiB used of 2.0 MiB")
    quota = checks["cpu_quota"]
    assert quota.status == "warning" and quota.value == "1 CPUs" and "2 ranks x 2 threads = 4" in quota.reading
    collective = checks["collective_settings"]
    assert collective.status == "warning" and collective.value == "NCCL_ALGO=Ring, NCCL_P2P_DISABLE=1"
    assert "NCCL_P2P_DISABLE=1" in collective.reason


def test_a_virtual_machine_without_cpufreq_is_not_read_with_the_reason(tmp_path, monkeypatch):
    host = kernel_tree(tmp_path)
    for governor in (host.sys / "devices/system/cpu").rglob("scaling_governor"):
        governor.unlink()
    check = checks_of(host, monkeypatch=monkeypatch)["cpu_governor"]
    assert check.status is None and check.reading is None and "no cpufreq" in check.reason


def test_threads_within_the_quota_are_ok(tmp_path, monkeypatch):
    import hwbench.harness.preflight as module

    monkeypatch.setattr(module, "allowed_cpus", lambda: list(range(8)))
    check = cpu_quota(2, 2, kernel_tree(tmp_path, cpu_max="400000 100000"))
    assert (check.status, check.value) == ("ok", "4 CPUs")



def test_the_cores_a_run_sizes_its_threads_by_are_capped_by_the_quota_preflight_reads(tmp_path, monkeypatch):
    """One reading of the cgroup quota: the process's own cgroup v2 slice (a container's), which the
    CPU backend's thread count (usable_cores) and preflight's check both take; cgroup v1's CFS quota too."""
    import hwbench.device.host as host

    monkeypatch.setattr(host, "allowed_cpus", lambda: list(range(8)))
    tree = kernel_tree(tmp_path / "v2", cpu_max="300000 100000")  # 3 CPUs in hwbench.slice, none at the root
    monkeypatch.setattr(host, "PROC", tree.proc)
    monkeypatch.setattr(host, "SYS", tree.sys)
    assert host.usable_cores() == 3
    v1 = tmp_path / "v1" / "sys/fs/cgroup/cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    monkeypatch.setattr(host, "PROC", tmp_path / "v1/proc")
    monkeypatch.setattr(host, "SYS", tmp_path / "v1/sys")
    assert host.cgroup_cpu_quota(host.PROC, host.SYS) == (2.5, "cgroup v1 cpu.cfs_quota_us")
    assert host.usable_cores() == 2


def test_a_bare_container_fails_no_check_and_an_unforeseen_error_is_a_warning(tmp_path, monkeypatch):
    """A CI container: no accelerator, no cpufreq, no NUMA, no THP, a cgroup quota file in a form
    not foreseen, and a device tool that raises. Every check is read or says why; none fails."""
    import hwbench.device.preflight as devices
    import hwbench.harness.preflight as module

    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/ci\n")
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 900 kB\n")
    (tmp_path / "sys/fs/cgroup/ci").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/ci/cpu.max").write_text("150000 one-hundred-thousand\n")
    monkeypatch.setattr(module, "allowed_cpus", lambda: [0, 1])
    host = Host(proc=tmp_path / "proc", sys=tmp_path / "sys")
    checks = {check.name: check for check in preflight("cpu", tmp_path, 2, 1, {}, host).checks}
    assert list(checks) == list(CHECKS) and not [check for check in checks.values() if check.status == "failure"]
    for name in ("cpu_governor", "numa_balancing", "transparent_hugepages", "swap", "cpu_quota"):
        assert checks[name].status is None and checks[name].reason, checks[name]
    assert "unreadable" in checks["cpu_quota"].reason

    def broken_tool(environ):
        raise RuntimeError("driver/library version mismatch")

    monkeypatch.setitem(devices.READERS, "cuda", ("nvml", broken_tool))
    report = preflight("cuda", tmp_path, environ={}, host=host)
    device_part = [check for check in report.checks if check.name in CHECKS[:5]]
    assert [check.status for check in device_part] == ["warning"] * 5
    assert all("RuntimeError: driver/library version mismatch" in check.reason for check in device_part)
    assert report.worst == "warning"


def test_a_device_this_machine_cannot_use_is_refused_by_the_run_alone(tmp_path):
    """The run's own one-line error, with no preflight table of a machine it will not measure."""
    from hwbench.device import unavailable_reason
    from hwbench.harness.run import machine_checked

    for kind in ("cuda", "rocm", "npu"):
        if unavailable_reason(kind) is not None:
            assert machine_checked(kind, tmp_path, 1) is None
    assert machine_checked("cpu", tmp_path, 1).device == "cpu"


# --- the devices, through their tools' stand-ins ----------------------------------------------------


class NVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict]) -> types.ModuleType:
    """A pynvml whose GPUs answer what each dict gives (processes, free memory, ECC, clocks,
    clock event mask, persistence); a missing key raises NVMLError (not supported)."""
    nv = types.ModuleType("pynvml")
    nv.NVML_CLOCK_SM, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED = 1, 1, 0
    nv.NVML_VOLATILE_ECC = 0

    def answer(key):
        def call(handle, *args):
            if key not in gpus[handle]:
                raise NVMLError("Not Supported")
            value = gpus[handle][key]
            return value(*args) if callable(value) else value

        return call

    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetCount = lambda: len(gpus)
    nv.nvmlDeviceGetHandleByIndex = lambda index: index
    nv.nvmlDeviceGetUUID = answer("uuid")
    nv.nvmlDeviceGetComputeRunningProcesses = answer("processes")
    nv.nvmlDeviceGetGraphicsRunningProcesses = lambda handle: []
    nv.nvmlSystemGetProcessName = lambda pid: {4242: b"/usr/bin/python3"}.get(pid, b"other")
    nv.nvmlDeviceGetMemoryInfo = answer("memory")
    nv.nvmlDeviceGetTotalEccErrors = answer("ecc")
    nv.nvmlDeviceGetClockInfo = answer("clock")
    nv.nvmlDeviceGetMaxClockInfo = answer("max_clock")
    nv.nvmlDeviceGetApplicationsClock = answer("app_clock")
    nv.nvmlDeviceGetDefaultApplicationsClock = answer("default_app_clock")
    nv.nvmlDeviceGetCurrentClocksEventReasons = answer("events")
    nv.nvmlDeviceGetPersistenceMode = answer("persistence")
    return nv


def healthy_gpu(uuid: str) -> dict:
    return {
        "uuid": uuid,
        "processes": [],
        "memory": types.SimpleNamespace(free=79 * 2**30, total=80 * 2**30),
        "ecc": lambda kind, counter: 0,
        "clock": lambda kind: 1980,
        "max_clock": lambda kind: 1980,
        "app_clock": lambda kind: 1980,
        "default_app_clock": lambda kind: 1980,
        "events": 0x1,
        "persistence": 1,
    }


def test_a_healthy_gpu_is_ok(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([healthy_gpu("GPU-aaaa")]))
    checks = {check.name: check for check in preflight("cuda", ".", environ={}).checks}
    for name in ("other_processes", "device_memory", "ecc_errors", "clocks", "persistence_mode"):
        assert checks[name].status == "ok", checks[name]
    assert (
        checks["clocks"].value == "not locked" and "no throttle reason" in checks["clocks"].reading
    )  # idle bit left out
    assert checks["other_processes"].value == "none" and checks["persistence_mode"].value == "on"


def test_this_process_on_the_gpu_is_not_another_process(monkeypatch):
    """hwbench.run twice in one Python session: the first run's context is this process's own."""
    import os

    mine = {**healthy_gpu("GPU-aaaa"), "processes": [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=2**30)]}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([mine]))
    other = {check.name: check for check in preflight("cuda", ".", environ={}).checks}["other_processes"]
    assert (other.status, other.reading) == ("ok", "none")


def test_what_makes_a_gpu_figure_wrong_is_a_failure_naming_it(monkeypatch):
    busy = {
        **healthy_gpu("GPU-bbbb"),
        "processes": [types.SimpleNamespace(pid=4242, usedGpuMemory=3 * 2**30)],
        "memory": types.SimpleNamespace(free=40 * 2**30, total=80 * 2**30),
        "ecc": lambda kind, counter: 2 if kind == 1 else 7,
        "events": 0x8 | 0x4,
        "app_clock": lambda kind: 1410,
        "persistence": 0,
    }
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([healthy_gpu("GPU-aaaa"), busy]))
    report = preflight("cuda", ".", environ={})
    checks = {check.name: check for check in report.checks}
    other = checks["other_processes"]
    assert other.status == "failure" and "gpu 1 (GPU-bbbb): pid 4242 python3, 3.0 GiB" in other.reading
    assert other.value == "none; present"
    assert (
        checks["device_memory"].status == "warning" and "40.0 GiB free of 80.0 GiB" in checks["device_memory"].reading
    )
    assert checks["ecc_errors"].status == "failure" and "2 uncorrected, 7 corrected" in checks["ecc_errors"].reading
    clocks = checks["clocks"]
    assert clocks.status == "failure" and "hw_slowdown" in clocks.reason and "sw_power_cap" in clocks.reading
    assert "locked: application clocks 1410 MHz (default 1980" in clocks.reading
    assert checks["persistence_mode"].status == "warning"
    assert report.worst == "failure"


def test_cuda_visible_devices_by_uuid_checks_only_those_gpus(monkeypatch):
    busy = {**healthy_gpu("GPU-bbbb"), "processes": [types.SimpleNamespace(pid=1, usedGpuMemory=None)]}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([healthy_gpu("GPU-aaaa"), busy]))
    checks = {
        check.name: check for check in preflight("cuda", ".", environ={"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}).checks
    }
    assert checks["other_processes"].status == "ok"


def test_without_nvml_the_gpu_checks_are_not_read_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    checks = {check.name: check for check in preflight("cuda", ".", environ={}).checks}
    assert checks["clocks"].status is None and "nvidia-ml-py" in checks["clocks"].reason
    assert checks["cpu_quota"].status is not None  # the host's checks still run


def test_npu_processes_and_health_from_npu_smi(monkeypatch):
    import os

    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HWBENCH_STANDIN_NPU_SMI", "info-910b3-loaded.txt")
    report = preflight("auto", ".", environ=os.environ)
    checks = {check.name: check for check in report.checks}
    assert (report.device, report.source) == ("npu", "npu-smi")
    assert (
        checks["other_processes"].status == "failure"
        and "npu 0: pid 124528 python3" in checks["other_processes"].reading
    )
    assert checks["ecc_errors"].status == "ok" and "health OK" in checks["ecc_errors"].reading
    assert (
        checks["persistence_mode"].status is None
        and "npu-smi info does not show it" in checks["persistence_mode"].reason
    )
    only = preflight("npu", ".", environ={**os.environ, "ASCEND_RT_VISIBLE_DEVICES": "1"})
    assert only.checks[0].reading == "pid 124529 python3, 54.3 GiB"  # npu 1 alone: npu 0's process is not its


# --- the readings in results, compared ---------------------------------------------------------------


def test_a_run_stores_its_check_and_no_preflight_leaves_it_out(single_process_run, tmp_path):
    preflight_section = single_process_run["environment"]["preflight"]
    assert [check["name"] for check in preflight_section["checks"]] == list(CHECKS)
    assert preflight_section["device"] == "cpu"
    from conftest import parity_run

    code, result = parity_run(tmp_path / "off", "--no-preflight")
    assert code == 0 and "preflight" not in result["environment"]


def with_governor(result: dict, governor: str, run_id: str) -> dict:
    data = json.loads(json.dumps(result))
    data["run_id"] = run_id
    for check in data["environment"]["preflight"]["checks"]:
        if check["name"] == "cpu_governor":
            check.update(
                status="ok" if governor == "performance" else "warning", reading=f"{governor} on 2 CPUs", value=governor
            )
    return data


def test_compare_and_the_report_name_a_preflight_difference(single_process_run, tmp_path, capsys):
    base, current = tmp_path / "base", tmp_path / "current"
    for folder, governor in ((base, "performance"), (current, "powersave")):
        folder.mkdir()
        for repeat in range(2):
            data = with_governor(single_process_run, governor, f"{folder.name}-{repeat}")
            data["spec"]["seed"] = 1234 + repeat
            (folder / f"{data['run_id']}.json").write_text(json.dumps(data))
    main(["compare", str(base), str(current)])
    out, err = capsys.readouterr()
    assert "preflight.cpu_governor performance (baseline) vs powersave (current)" in out + err
    assert main(["report", str(base), str(current)]) == 0
    report = capsys.readouterr().out
    assert "runs differ in preflight.cpu_governor" in report
    # a run without the check (an older hwbench, --no-preflight) is not taken for a different machine
    old = json.loads(json.dumps(single_process_run))
    del old["environment"]["preflight"]
    (current / "old.json").write_text(json.dumps({**old, "run_id": "old"}))
    (base / "old.json").unlink(missing_ok=True)
    for path in current.glob("current-*.json"):
        path.unlink()
    main(["compare", str(base), str(current)])
    assert "preflight." not in "".join(capsys.readouterr())


def fake_amdsmi(processes: list, uncorrectable: int, perf_level: str, violations: dict) -> types.ModuleType:
    """An amdsmi with one MI300X answering the calls AMD SMI's Python reference documents
    (amdsmi_get_processor_handles, _gpu_process_list, _gpu_total_ecc_count, _gpu_perf_level, ...)."""
    smi = types.ModuleType("amdsmi")
    smi.AmdSmiClkType = types.SimpleNamespace(GFX=0)
    smi.amdsmi_init = lambda *flags: None
    smi.amdsmi_get_processor_handles = lambda: ["h0"]
    smi.amdsmi_get_gpu_device_bdf = lambda handle: "0000:0c:00.0"
    smi.amdsmi_get_gpu_process_list = lambda handle: processes
    smi.amdsmi_get_gpu_vram_usage = lambda handle: {"vram_total": 196592, "vram_used": 283}
    smi.amdsmi_get_gpu_total_ecc_count = lambda handle: {"correctable_count": 0, "uncorrectable_count": uncorrectable}
    smi.amdsmi_get_clock_info = lambda handle, kind: {"clk": 132, "max_clk": 2100}
    smi.amdsmi_get_gpu_perf_level = lambda handle: perf_level
    smi.amdsmi_get_violation_status = lambda handle: violations
    return smi


def test_an_amd_gpu_through_amd_smi(monkeypatch):
    monkeypatch.setitem(
        sys.modules,
        "amdsmi",
        fake_amdsmi([], 0, "AMDSMI_DEV_PERF_LEVEL_AUTO", {"active_ppt_pwr": False, "active_hbm_thrm": False}),
    )
    checks = {check.name: check for check in preflight("rocm", ".", environ={}).checks}
    for name in ("other_processes", "device_memory", "ecc_errors", "clocks"):
        assert checks[name].status == "ok", checks[name]
    assert checks["clocks"].value == "not locked" and "performance level AUTO" in checks["clocks"].reading
    assert checks["persistence_mode"].status is None and "no persistence mode" in checks["persistence_mode"].reason

    monkeypatch.setitem(
        sys.modules,
        "amdsmi",
        fake_amdsmi(
            [{"pid": 77, "name": "python"}],
            1,
            "AMDSMI_DEV_PERF_LEVEL_STABLE_PEAK",
            {"active_ppt_pwr": True, "active_hbm_thrm": True},
        ),
    )
    checks = {check.name: check for check in preflight("rocm", ".", environ={}).checks}
    assert checks["other_processes"].status == "failure" and "pid 77 python" in checks["other_processes"].reading
    assert checks["ecc_errors"].status == "failure"
    assert checks["clocks"].status == "failure" and "hbm_thermal" in checks["clocks"].reason
    assert checks["clocks"].value == "locked"


def standin_pyhlml() -> types.ModuleType:
    """The pyhlml stand-in of tests/fakes/gaudi (two Gaudi 2 cards), loaded as a module of its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pyhlml", FAKES / "gaudi" / "pyhlml" / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_gaudi_through_hlml(monkeypatch):
    """preflight on hpu read nothing ("hwbench reads no preflight figures from the hpu tools yet"):
    its kind had no reader in preflight's own table, which the other kinds' had."""
    from hwbench.units import human_bytes

    hlml = standin_pyhlml()
    monkeypatch.setitem(sys.modules, "pyhlml", hlml)
    report = preflight("hpu", ".", environ={})
    checks = {check.name: check for check in report.checks}
    assert (report.device, report.source) == ("hpu", "hlml")
    assert checks["device_memory"].status == "ok" and checks["device_memory"].reading.startswith("hpu 0 (0000:33:00.0)")
    clock = hlml.hlmlDeviceGetClockInfo(None)
    assert checks["clocks"].status == "ok" and f"{clock:g} MHz; no throttle reason" in checks["clocks"].reading
    assert checks["other_processes"].status is None and "HLML" in checks["other_processes"].reason

    monkeypatch.setattr(hlml, "hlmlDeviceGetCurrentClocksThrottleReasons", lambda handle: 2)  # thermal
    checks = {check.name: check for check in preflight("hpu", ".", environ={"HABANA_VISIBLE_MODULES": "1"}).checks}
    memory = hlml.hlmlDeviceGetMemoryInfo(None)
    assert checks["device_memory"].reading == f"{human_bytes(memory.free)} free of {human_bytes(memory.total)}"
    assert checks["clocks"].status == "warning" and "throttled: thermal" in checks["clocks"].reading

    monkeypatch.setitem(sys.modules, "pyhlml", None)  # `import pyhlml` raises ImportError
    checks = {check.name: check for check in preflight("hpu", ".", environ={}).checks}
    assert checks["device_memory"].status is None and "habana-pyhlml" in checks["device_memory"].reason


def test_the_history_starts_a_new_segment_where_a_preflight_reading_changes(single_process_run):
    from hwbench.history.series import Night, segments_of
    from hwbench.result.environment import performance_fingerprint
    from hwbench.result.model import RunResult

    nights = [
        Night(
            f"2026-11-0{day}",
            "abc",
            f"2026-11-0{day}T01:00:00+00:00",
            [100.0],
            [f"run-{day}"],
            performance_fingerprint(RunResult.from_dict(with_governor(single_process_run, governor, f"r{day}"))),
        )
        for day, governor in ((1, "performance"), (2, "performance"), (3, "powersave"))
    ]
    first, second = segments_of(nights)
    assert len(first.nights) == 2 and second.environment_change == [
        ("preflight.cpu_governor", ["performance"], ["powersave"])
    ]


def test_sweep_no_preflight_reaches_every_point_and_keeps_the_resume_key(tmp_path):
    """Each point's run gets --no-preflight; the key a sweep resumes by is the same either way, so
    a sweep resumed with or without the check keeps the results it has."""
    import yaml

    from hwbench.suites.executor import Executor, SweepOptions, run_points
    from hwbench.suites.suite import load_suite

    class Recording(Executor):  # submits nothing: records what each point's run would be
        def __init__(self):
            self.submitted = []

        def machine(self):
            return {"host": "node"}

        def submit(self, run, kept):
            self.submitted.append((run.argv, run.sweep["key"]))

    path = tmp_path / "pair.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "pair",
                "defaults": {"model": "tiny", "steps": 2},
                "points": [{"name": "a"}, {"name": "b", "seq-length": 32}],
            }
        )
    )
    suite, submitted = load_suite(path), {}
    for checked in (True, False):
        executor = Recording()
        run_points(suite, SweepOptions(out_dir=tmp_path / "out", preflight=checked), executor, say=lambda line: None)
        submitted[checked] = executor.submitted
    assert all("--no-preflight" not in argv for argv, _key in submitted[True])
    assert all("--no-preflight" in argv for argv, _key in submitted[False])
    keys = [[key for _argv, key in submitted[checked]] for checked in (True, False)]
    assert keys[0] == keys[1] and len(set(keys[0])) == 2


def test_the_processes_that_started_a_run_are_not_other_processes_on_its_device(tmp_path):
    """A sweep (or launcher) that asked the device's name and memory may hold a context on it;
    the point it starts must not count it as another process computing there. Real processes:
    this test's process starts a child, which starts the checking grandchild; a sibling is other."""
    import os
    import subprocess

    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        check = ("import os, sys; from hwbench.device.health import not_this_process, own_process_tree; "
                 "print(sorted(own_process_tree())); "
                 "print([not_this_process(int(p)) for p in sys.argv[1:]])")
        middle = ("import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', sys.argv[1], *sys.argv[2:]])"
                  ".returncode)")
        done = subprocess.run([sys.executable, "-c", middle, check, str(os.getpid()), str(sibling.pid), "1234567"],
                              capture_output=True, text=True, timeout=60)
    finally:
        sibling.kill()
        sibling.wait()
    assert done.returncode == 0, done.stderr
    tree, verdicts = done.stdout.splitlines()
    assert str(os.getpid()) in tree  # the grandparent: this test's own process
    assert verdicts == "[False, True, True]"  # an ancestor is not other; a sibling and an unknown pid are
