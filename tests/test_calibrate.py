"""`hwbench calibrate` on the CPU with tiny sizes: the store it writes (keyed by device model
and driver, replaced precision by precision), the run that reads it (mfu_measured_ceiling, or
None with the reason), and bad options (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import math

import pytest

from hwbench.calibration.store import CalibrationStoreError, load_store, lookup_ceiling, merge_entry, record_calibration
from hwbench.cli import main
from tests.test_docs import undocumented

# --force: these tests are about what is stored, on a machine other test runs share; whether a rate is
# a ceiling is judged in the tests of busy machines and implausible rates below
TINY = ["--device", "cpu", "--sizes", "32,64", "--copy-size", "1MiB", "--repeats", "3", "--warmup", "1",
        "--min-time", "0.01", "--device-warmup", "0", "--force"]
# a small run: two timed steps of the tiny model on short sequences
SMALL_RUN = ["run", "--quiet", "--device", "cpu", "--model", "tiny", "--steps", "2", "--warmup", "1",
             "--eval-iters", "0", "--data", "synthetic", "--seq-length", "64", "--micro-batch-size", "1",
             "--global-batch-size", "2"]


def cpu_model() -> str:
    from hwbench.device.cpu import CpuBackend

    return CpuBackend().device_names()[0]


def positive_finite(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_calibrate_on_cpu_stores_positive_rates_keyed_by_model_and_driver(tmp_path, capsys):
    store = tmp_path / "cal" / "calibration.json"
    assert main(["calibrate", *TINY, "--threads", "1", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    entries = json.loads(store.read_text())["entries"]
    assert len(entries) == 1
    entry = entries[0]
    assert (entry["device_kind"], entry["device_model"]) == ("cpu", cpu_model())
    assert entry["driver"].startswith("torch ") and entry["driver"].endswith(", 1 thread")
    assert set(entry["gemm"]) == {"fp32", "bf16"}  # the CPU's default precisions
    for gemm in entry["gemm"].values():
        sizes = {s["size"]: s for s in gemm["sizes"]}
        assert set(sizes) == {32, 64}
        assert all(positive_finite(s["rate"]["median"]) and s["rate"]["n"] == 3 for s in sizes.values())
        assert all(s["input_sets"] >= 2 for s in sizes.values())  # inputs rotate
        # the ceiling is the best median of the sizes
        assert gemm["ceiling_flops"] == max(s["rate"]["median"] for s in sizes.values())
        assert sizes[gemm["best_size"]]["rate"]["median"] == gemm["ceiling_flops"]
    copy = entry["copy"]
    assert positive_finite(copy["bytes_per_s"])
    assert (copy["buffer_bytes"], copy["bytes_per_copy"]) == (2**20, 2**21)
    assert "GEMM fp32" in out and "GEMM bf16" in out and "copy" in out and str(store) in out
    assert not list(store.parent.glob(".*tmp"))  # written atomically: no temporary left


def test_a_second_calibration_replaces_what_it_measured_and_keeps_the_rest(tmp_path, capsys):
    from hwbench.device.host import usable_cores

    if usable_cores() < 2:
        pytest.skip("--threads 2 needs 2 usable cores (more threads than cores are refused)")
    store = tmp_path / "calibration.json"
    assert main(["calibrate", *TINY, "--threads", "1", "--store", str(store)]) == 0
    first = json.loads(store.read_text())["entries"][0]
    assert main(["calibrate", *TINY, "--threads", "1", "--precisions", "bf16", "--sizes", "48",
                 "--store", str(store)]) == 0
    entries = json.loads(store.read_text())["entries"]
    assert len(entries) == 1  # the same key: replaced, not appended
    second = entries[0]
    assert second["gemm"]["fp32"] == first["gemm"]["fp32"]  # not measured again: kept, with its own date
    assert second["gemm"]["bf16"]["best_size"] == 48
    assert second["gemm"]["bf16"]["measured_at"] >= first["gemm"]["bf16"]["measured_at"]
    assert second["copy"]["measured_at"] == second["gemm"]["bf16"]["measured_at"]
    # another driver key (the CPU's threads are part of it): appended beside the first
    assert main(["calibrate", *TINY, "--threads", "2", "--precisions", "fp32", "--store", str(store)]) == 0
    entries = json.loads(store.read_text())["entries"]
    assert [e["driver"].rsplit(", ", 1)[1] for e in entries] == ["1 thread", "2 threads"]
    capsys.readouterr()


def _cpu_key() -> tuple[str, str]:
    """(device model, driver) of this CPU with the threads a run uses (the usable cores)."""
    from hwbench.calibration.measure import device_key, open_backend

    return device_key(open_backend("cpu", None))


def test_a_run_carries_mfu_against_the_measured_ceiling_or_none_with_the_reason(tmp_path, monkeypatch, capsys):
    store = tmp_path / "calibration.json"
    monkeypatch.setenv("HWBENCH_CALIBRATION", str(store))
    assert main([*SMALL_RUN, "--out", str(tmp_path / "before")]) == 0
    before = json.loads(next((tmp_path / "before").glob("*.json")).read_text())
    assert before["metrics"]["mfu_measured_ceiling"] is None
    reason = before["metrics"]["unmeasured"]["mfu_measured_ceiling"]
    assert reason.startswith(f"no calibration for {cpu_model()} driver torch ") and str(store) in reason
    assert reason.endswith("run hwbench calibrate --device cpu")
    assert before["device"]["measured_ceiling"] is None

    # a ceiling of this CPU with the threads the run uses, as calibrate stores it; 1 TFLOP/s is above
    # what this run reaches, so the run stays valid whatever else the machine runs (a measured one
    # on a shared machine need not be: the busy-machine tests below)
    model, driver = _cpu_key()
    record_calibration(store, {"device_kind": "cpu", "device_model": model, "driver": driver, "copy": None,
                               "gemm": {"fp32": {"ceiling_flops": 1e12, "best_size": 2048, "best_cv": 0.02,
                                                 "unreliable": None, "measured_at": "2026-11-23T08:00:00.000+00:00"}}})
    assert main([*SMALL_RUN, "--out", str(tmp_path / "after")]) == 0
    out = capsys.readouterr().out
    after = json.loads(next((tmp_path / "after").glob("*.json")).read_text())
    entry = json.loads(store.read_text())["entries"][0]
    ceiling = after["device"]["measured_ceiling"]
    assert ceiling["flops"] == entry["gemm"]["fp32"]["ceiling_flops"]
    assert (ceiling["precision"], ceiling["driver"], ceiling["store"]) == ("fp32", entry["driver"], str(store))
    assert ceiling["measured_at"] == entry["gemm"]["fp32"]["measured_at"]
    assert after["metrics"]["mfu_measured_ceiling"] == pytest.approx(
        after["metrics"]["tflops_per_device"] * 1e12 / ceiling["flops"])
    assert "mfu_measured_ceiling" not in after["metrics"]["unmeasured"]
    assert after["metrics"]["mfu"] is None  # the data sheet's MFU is still its own figure
    assert "MFU, measured ceiling" in out
    assert not undocumented(after), "docs/results.md does not describe every ceiling field"

    # a bf16 run on the same device: the store has no bf16 rate, and the reason says so
    assert main([*SMALL_RUN, "--precision", "bf16", "--out", str(tmp_path / "bf16")]) == 0
    bf16 = json.loads(next((tmp_path / "bf16").glob("*.json")).read_text())
    assert bf16["metrics"]["mfu_measured_ceiling"] is None
    assert "has no bf16 GEMM rate" in bf16["metrics"]["unmeasured"]["mfu_measured_ceiling"]


@pytest.mark.parametrize("args, named", [
    (["--repeats", "100000000000000000000"], "an integer from 2 to 10000"),  # used to run until killed
    (["--warmup", "10001"], "--warmup 10001 is not accepted; give an integer from 1 to 10000"),
    (["--sizes", "abc"], "--sizes 'abc'"),
    (["--sizes", "64,0"], "--sizes '64,0'"),
    (["--precisions", "fp8"], "--precisions 'fp8'"),
    (["--precisions", "bf16,bf16"], "--precisions 'bf16,bf16'"),
    (["--repeats", "1"], "--repeats 1 is not accepted"),
    (["--warmup", "0"], "--warmup 0 is not accepted"),
    (["--threads", "x"], "--threads 'x'"),
    (["--copy-size", "lots"], "--copy-size 'lots'"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--min-time", "0"], "--min-time 0 is not accepted; give seconds > 0, at most 3600"),
    (["--min-time", "nan"], "--min-time nan is not accepted"),
    (["--device-warmup", "-1"], "--device-warmup -1 is not accepted; give seconds from 0 to 3600"),
    (["--device-warmup", "soon"], "--device-warmup 'soon'"),
])
def test_bad_option_is_one_line_exit_2_and_writes_nothing(args, named, tmp_path, capsys):
    store = tmp_path / "calibration.json"
    assert main(["calibrate", *TINY, *args, "--store", str(store)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "accepted" in lines[0]
    assert not store.exists()


def test_a_store_that_is_not_one_is_refused_before_measuring_and_left_alone(tmp_path, capsys):
    store = tmp_path / "calibration.json"
    store.write_text('{"something": "else"}\n')
    assert main(["calibrate", *TINY, "--store", str(store)]) == 2
    line = capsys.readouterr().err.strip()
    assert "--store" in line and "not a calibration store" in line and "\n" not in line
    assert store.read_text() == '{"something": "else"}\n'
    assert main(["calibrate", *TINY, "--store", str(tmp_path)]) == 2  # a folder
    assert "--store" in capsys.readouterr().err


def test_lookup_names_why_there_is_no_ceiling(tmp_path):
    store = tmp_path / "calibration.json"
    found, reason = lookup_ceiling(store, "cuda", "NVIDIA H100 80GB HBM3", "550.54.15", None, "bf16")
    assert found is None
    assert reason == (f"no calibration for NVIDIA H100 80GB HBM3 driver 550.54.15 in {store}: "
                      "run hwbench calibrate --device cuda")
    record_calibration(store, {"device_kind": "cuda", "device_model": "NVIDIA H100 80GB HBM3", "driver": "550.54.15",
                               "gemm": {"bf16": {"ceiling_flops": 7.0e14, "best_size": 8192,
                                                 "measured_at": "2026-11-23T08:00:00Z"}}, "copy": None})
    found, reason = lookup_ceiling(store, "cuda", "NVIDIA H100 80GB HBM3", "550.54.15", None, "bf16")
    assert reason is None and found["flops"] == 7.0e14 and found["size"] == 8192 and found["copy_bytes_per_s"] is None
    # another driver: no match
    assert lookup_ceiling(store, "cuda", "NVIDIA H100 80GB HBM3", "560.28.03", None, "bf16")[0] is None
    found, reason = lookup_ceiling(store, "cuda", "NVIDIA H100 80GB HBM3", None, "NVML did not answer", "bf16")
    assert found is None and "NVML did not answer" in reason
    store.write_text("{not json")
    found, reason = lookup_ceiling(store, "cuda", "NVIDIA H100 80GB HBM3", "550.54.15", None, "bf16")
    assert found is None and reason.startswith("calibration store unreadable") and "not JSON" in reason
    with pytest.raises(CalibrationStoreError):
        load_store(store)


def test_merge_replaces_each_precision_measured_again():
    store = {"schema_version": 1, "entries": []}
    key = {"device_kind": "cpu", "device_model": "X", "driver": "torch 2, 1 thread"}
    merge_entry(store, {**key, "gemm": {"fp32": {"ceiling_flops": 1.0}, "bf16": {"ceiling_flops": 2.0}},
                        "copy": {"bytes_per_s": 5.0}})
    merge_entry(store, {**key, "gemm": {"bf16": {"ceiling_flops": 3.0}}, "copy": None})
    assert store["entries"] == [{**key, "gemm": {"fp32": {"ceiling_flops": 1.0}, "bf16": {"ceiling_flops": 3.0}},
                                 "copy": {"bytes_per_s": 5.0}}]


def test_a_size_beyond_the_device_memory_is_skipped_with_the_reason_not_tried():
    from hwbench.calibration.measure import CalibrationSettings, measure_copy, measure_gemm
    from hwbench.device.cpu import CpuBackend

    backend = CpuBackend()
    settings = CalibrationSettings(precisions=("fp32",), sizes=(1 << 20,), copy_bytes=1 << 50, repeats=2, warmup=1)
    gemm = measure_gemm(backend, "fp32", 1 << 20, settings)  # 3 x 4 TiB at the least
    assert gemm.rate is None and "do not fit" in gemm.skipped and gemm.input_sets == 2
    copy = measure_copy(backend, 1 << 50, settings)
    assert copy.rate is None and "do not fit" in copy.skipped


# --- corrupted stores, odd options (an attack on `hwbench calibrate` and the run's lookup) ---

H100 = ("cuda", "NVIDIA H100 80GB HBM3", "550.54.15")


def store_text(ceiling_text: str = "7e14", **gemm_fields) -> str:
    """A store of one H100 entry whose bf16 ceiling is the JSON text ``ceiling_text``."""
    extra = "".join(f', "{k}": {json.dumps(v)}' for k, v in gemm_fields.items())
    return ('{"schema_version": 1, "entries": [{"device_kind": "cuda", "device_model": "NVIDIA H100 80GB HBM3", '
            '"driver": "550.54.15", "gemm": {"bf16": {"ceiling_flops": ' + ceiling_text + extra + '}}, '
            '"copy": null}]}')


UNREADABLE_STORES = {
    "an integer of 5000 digits": store_text("1" + "0" * 4999),  # beyond Python's int-string limit
    "nested 200000 deep": "[" * 200000 + "]" * 200000,
}


@pytest.mark.parametrize("name", list(UNREADABLE_STORES))
def test_a_store_json_cannot_hold_is_unreadable_with_the_reason_not_a_traceback(name, tmp_path):
    store = tmp_path / "calibration.json"
    store.write_text(UNREADABLE_STORES[name])
    found, reason = lookup_ceiling(store, *H100, None, "bf16")
    assert found is None and reason.startswith("calibration store unreadable: ") and str(store) in reason
    with pytest.raises(CalibrationStoreError):
        load_store(store)


@pytest.mark.parametrize("ceiling, named", [
    ("1" + "0" * 400, "an integer of 401 digits"),  # an integer, but no float holds it
    ("NaN", "nan"), ("Infinity", "inf"), ("-1.0", "-1.0"), ("0", "0"), ("true", "True"), ('"7e14"', "'7e14'"),
])
def test_a_ceiling_no_float_holds_or_not_positive_is_refused_with_the_reason(ceiling, named, tmp_path):
    store = tmp_path / "calibration.json"
    store.write_text(store_text(ceiling))
    found, reason = lookup_ceiling(store, *H100, None, "bf16")
    assert found is None
    assert "is not usable (gemm.bf16.ceiling_flops: must be a positive finite number" in reason and named in reason


@pytest.mark.parametrize("fields, named", [
    ({"best_size": {"x": [1]}}, "measured_ceiling.size"),
    ({"best_size": -3}, "measured_ceiling.size"),
    ({"best_cv": -0.5}, "measured_ceiling.cv"),
    ({"measured_at": 20261123}, "measured_ceiling.measured_at"),
    ({"torch_version": ["2.13"]}, "measured_ceiling.torch_version"),
    ({"hwbench_version": {"v": 1}}, "measured_ceiling.hwbench_version"),
])
def test_a_stored_field_that_does_not_fit_the_result_shape_gives_no_ceiling(fields, named, tmp_path):
    store = tmp_path / "calibration.json"
    store.write_text(store_text(**fields))
    found, reason = lookup_ceiling(store, *H100, None, "bf16")
    assert found is None and named in reason and "is not usable" in reason


def test_an_implausible_ceiling_is_refused_and_a_plausible_one_kept(tmp_path):
    store = tmp_path / "calibration.json"
    store.write_text(store_text("1e30"))
    found, reason = lookup_ceiling(store, *H100, None, "bf16")
    assert found is None and "not plausible for one device" in reason
    store.write_text(store_text("2e15", best_size=8192, best_cv=0.01))
    found, reason = lookup_ceiling(store, *H100, None, "bf16")
    assert reason is None and found["flops"] == 2e15


def test_a_corrupted_store_never_fails_a_run_and_its_result_stays_readable(tmp_path, monkeypatch, capsys):
    from hwbench.result.store import load_result

    store = tmp_path / "calibration.json"
    monkeypatch.setenv("HWBENCH_CALIBRATION", str(store))
    assert main(["calibrate", *TINY, "--precisions", "fp32", "--sizes", "32"]) == 0
    stored = json.loads(store.read_text())
    stored["entries"][0]["gemm"]["fp32"]["best_size"] = {"x": [1]}
    store.write_text(json.dumps(stored))
    assert main([*SMALL_RUN, "--out", str(tmp_path / "bad-size")]) == 0
    result = load_result(next((tmp_path / "bad-size").glob("*.json")))  # readers accept it
    assert result.status == "ok" and result.device.measured_ceiling is None
    assert "measured_ceiling.size" in result.device.measured_ceiling_unmeasured
    assert "measured_ceiling.size" in result.metrics.unmeasured["mfu_measured_ceiling"]

    store.write_text(UNREADABLE_STORES["nested 200000 deep"])
    assert main([*SMALL_RUN, "--out", str(tmp_path / "deep")]) == 0
    result = load_result(next((tmp_path / "deep").glob("*.json")))
    assert result.status == "ok" and result.device.measured_ceiling is None
    assert result.device.measured_ceiling_unmeasured.startswith("calibration store unreadable: ")
    capsys.readouterr()


@pytest.mark.parametrize("name", list(UNREADABLE_STORES))
def test_calibrate_refuses_a_store_json_cannot_hold_in_one_line_and_leaves_it(name, tmp_path, capsys):
    store = tmp_path / "calibration.json"
    store.write_text(UNREADABLE_STORES[name])
    assert main(["calibrate", *TINY, "--store", str(store)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--store " in lines[0] and "not JSON hwbench can read" in lines[0]
    assert store.read_text() == UNREADABLE_STORES[name]


def test_a_copy_size_below_one_byte_is_refused_not_replaced_by_the_default(tmp_path, capsys):
    store = tmp_path / "calibration.json"
    assert main(["calibrate", *TINY, "--copy-size", "0.5", "--store", str(store)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--copy-size '0.5'" in lines[0] and "at least 1 byte" in lines[0]
    assert not store.exists()


def test_no_gemm_measured_is_exit_1_and_stores_nothing_even_with_the_copy_measured(tmp_path, capsys):
    store = tmp_path / "calibration.json"
    assert main(["calibrate", *TINY, "--sizes", "200000", "--precisions", "fp32", "--store", str(store)]) == 1
    captured = capsys.readouterr()
    assert "no GEMM rate was measured" in captured.err and "nothing stored" in captured.err
    assert "report mfu_measured_ceiling" not in captured.out + captured.err
    assert not store.exists()


def test_a_copy_size_that_is_skipped_is_said_on_stderr(tmp_path, capsys):
    store = tmp_path / "calibration.json"
    assert main(["calibrate", *TINY, "--sizes", "32", "--precisions", "fp32", "--copy-size", "100TiB",
                 "--store", str(store)]) == 0
    err = capsys.readouterr().err
    assert "warning: --copy-size 100TiB: skipped" in err and "no copy bandwidth stored" in err
    entry = json.loads(store.read_text())["entries"][0]
    assert entry["copy"] is None and entry["gemm"]["fp32"]["ceiling_flops"] > 0


def test_a_store_whose_folder_cannot_be_written_is_named_as_given(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    given = str(blocker / "calibration.json")
    assert main(["calibrate", *TINY, "--store", given]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--store {given!r} lies under the file {str(blocker)!r}" in lines[0]
    if __import__("os").path.isdir("/proc"):
        assert main(["calibrate", *TINY, "--store", "/proc/x/y"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "--store '/proc/x/y': its folder" in lines[0]


def test_the_stored_line_says_how_runs_read_a_store_they_would_not(tmp_path, monkeypatch, capsys):
    store = tmp_path / "elsewhere.json"
    monkeypatch.setenv("HWBENCH_CALIBRATION", str(tmp_path / "runs-read-this.json"))
    assert main(["calibrate", *TINY, "--sizes", "32", "--precisions", "fp32", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert f"HWBENCH_CALIBRATION={store}" in out and "runs-read-this.json" in out
    monkeypatch.setenv("HWBENCH_CALIBRATION", str(store))
    assert main(["calibrate", *TINY, "--sizes", "32", "--precisions", "fp32", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "runs on this device and driver report mfu_measured_ceiling" in out and "HWBENCH_CALIBRATION=" not in out


def test_more_threads_than_usable_cores_is_refused_naming_them(tmp_path, capsys):
    from hwbench.device.host import usable_cores

    store = tmp_path / "calibration.json"
    cores = usable_cores()
    assert main(["calibrate", *TINY, "--threads", str(cores + 1), "--store", str(store)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--threads '{cores + 1}'" in lines[0] and f"from 1 to {cores}" in lines[0]
    assert not store.exists()


# --- sustained figures: a device warm-up, each size timed for --min-time, the SM clock during it ---

def test_each_size_is_timed_for_at_least_min_time_after_a_device_warmup(tmp_path, capsys):
    store = tmp_path / "calibration.json"
    assert main(["calibrate", *TINY, "--precisions", "fp32", "--min-time", "0.05", "--device-warmup", "0.05",
                 "--store", str(store)]) == 0
    out = capsys.readouterr().out
    gemm = json.loads(store.read_text())["entries"][0]["gemm"]["fp32"]
    assert gemm["min_time_s"] == 0.05
    for size in gemm["sizes"]:
        assert size["timed_s"] >= 0.05  # the repetitions together, not one burst of 10 ms
        # the CPU reports no SM clock: null, with the reason
        assert size["sm_clock_mhz"] is None and size["sm_clock_unmeasured"]
    warmed = gemm["device_warmup"]
    assert (warmed["precision"], warmed["size"]) == ("fp32", 64) and warmed["seconds"] >= 0.05  # the largest GEMM
    assert "device warm-up: " in out and "at least 0.05 s" in out and "SM clock not read: " in out


class ClockedSampler(__import__("hwbench.device.telemetry", fromlist=["TelemetrySampler"]).TelemetrySampler):
    """A device whose SM clock alternates between two readings."""

    source = "test"
    clocks = (1980.0, 1410.0)

    def __init__(self, interval_s):
        super().__init__(interval_s)
        self.reads = 0

    def read(self):
        self.reads += 1
        return [{"sm_clock_mhz": self.clocks[self.reads % 2], "power_w": 300.0}]


def test_the_sm_clock_during_each_size_comes_from_the_backends_telemetry():
    from hwbench.calibration.measure import CalibrationSettings, measure_gemm
    from hwbench.device.cpu import CpuBackend

    class ClockedBackend(CpuBackend):
        def telemetry_sampler(self, interval_s):
            return ClockedSampler(interval_s)

    settings = CalibrationSettings(precisions=("fp32",), sizes=(32,), copy_bytes=1, repeats=2, warmup=1,
                                   min_time_s=0.5, device_warmup_s=0)
    measured = measure_gemm(ClockedBackend(), "fp32", 32, settings)
    clock = measured.sm_clock_mhz
    assert measured.sm_clock_unmeasured is None and clock["samples"] >= 2  # inside the window
    assert (clock["min"], clock["max"]) == (1410.0, 1980.0) and 1410.0 < clock["mean"] < 1980.0


class IdleAtTheEdgesSampler(ClockedSampler):
    """A GPU whose clock reads idle at the synchronisations around the window (the samples
    start() and stop() take on the caller's thread) and at boost while the GEMMs run."""

    def read(self):
        import threading

        idle = threading.current_thread() is threading.main_thread()
        return [{"sm_clock_mhz": 345.0 if idle else 1980.0, "power_w": 300.0}]


def test_the_sm_clock_leaves_out_the_samples_at_the_windows_edges():
    """The first and last samples are taken where the host synchronises, with the device idle:
    they are no clock of the GEMMs, and would drag min and mean down."""
    from hwbench.calibration.measure import CalibrationSettings, measure_gemm
    from hwbench.device.cpu import CpuBackend

    class EdgeBackend(CpuBackend):
        def telemetry_sampler(self, interval_s):
            return IdleAtTheEdgesSampler(interval_s)

    settings = CalibrationSettings(precisions=("fp32",), sizes=(32,), copy_bytes=1, repeats=2, warmup=1,
                                   min_time_s=0.3, device_warmup_s=0)
    measured = measure_gemm(EdgeBackend(), "fp32", 32, settings)
    clock = measured.sm_clock_mhz
    assert measured.sm_clock_unmeasured is None and clock["samples"] >= 1
    assert clock["min"] == clock["max"] == clock["mean"] == 1980.0


def test_a_relative_store_named_by_the_environment_is_named_in_full(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HWBENCH_CALIBRATION", "cal.json")
    assert main(["calibrate", *TINY, "--sizes", "32", "--precisions", "fp32"]) == 0
    out = capsys.readouterr().out
    assert f"stored in {tmp_path / 'cal.json'} under cpu" in out
    assert "runs on this device and driver report mfu_measured_ceiling" in out and "a relative path" in out


# --- a rate that is no ceiling: implausible for the device kind, spread, or measured beside other work ---

JUDGED = [arg for arg in TINY if arg != "--force"]


def test_a_rate_below_what_any_cpu_reaches_is_not_stored_on_this_cpu(tmp_path, capsys):
    """A 1 x 1 x 1 product is 2 FLOPs behind microseconds of dispatch: a 'ceiling' far below any CPU's."""
    store = tmp_path / "calibration.json"
    assert main(["calibrate", *JUDGED, "--sizes", "1", "--precisions", "fp32", "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert "GEMM fp32: not stored, this is no ceiling: " in err
    assert "not plausible for one cpu device (less than 1e+07" in err
    assert "nothing stored in" in err and not store.exists()


def test_calibrate_beside_other_work_stores_nothing_and_force_stores_it_marked(tmp_path, monkeypatch, capsys):
    """Real busy processes on this process's CPUs: the other work's share of them says the rate is
    the machine's leftovers, not its ceiling. Refused (exit 1, nothing written); --force stores it
    marked, and a run then reports mfu_measured_ceiling null with the reason."""
    import subprocess
    import sys

    from hwbench.device.host import usable_cores

    store = tmp_path / "calibration.json"
    monkeypatch.setenv("HWBENCH_CALIBRATION", str(store))
    # One intra-op thread, in the calibration and in the run that reads it (the thread count is part of
    # the CPU's key): two threads among the busy processes wait for each other at every product while one
    # of them is descheduled, and the --force calibration then took 2 to 5 minutes on a 2-core machine
    # (seconds with one thread). The judgement read is the same: the other work's share of the CPUs.
    judged = [*JUDGED, "--precisions", "fp32", "--sizes", "128", "--min-time", "0.3", "--threads", "1"]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * usable_cores())]
    try:
        assert main(["calibrate", *judged]) == 1
        err = capsys.readouterr().err
        assert "GEMM fp32: not stored, this is no ceiling: " in err and "other work took" in err, err
        assert "nothing stored in" in err and not store.exists()
        assert main(["calibrate", *judged, "--force"]) == 0
    finally:
        for process in busy:
            process.kill()
            process.wait()
    captured = capsys.readouterr()
    assert "warning: GEMM fp32: stored marked unreliable (--force): " in captured.err
    assert "machine while measuring: other work took" in captured.out
    gemm = json.loads(store.read_text())["entries"][0]["gemm"]["fp32"]
    host = gemm["conditions"]["host"]
    assert host["others_cpu_share"] > 0.10 and host["usable_cores"] == usable_cores()
    assert isinstance(host["load_average_1m_end"], float) and "other work took" in gemm["unreliable"]

    assert main([*SMALL_RUN, "--threads-per-rank", "1", "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    result = json.loads(next((tmp_path / "run").glob("*.json")).read_text())
    reason = result["metrics"]["unmeasured"]["mfu_measured_ceiling"]
    assert result["metrics"]["mfu_measured_ceiling"] is None and result["device"]["measured_ceiling"] is None
    assert "the fp32 rate of " in reason and "is no ceiling (" in reason and "other work took" in reason


@pytest.mark.parametrize("ceiling", ["1e-300", "1", "9e9"])
def test_a_ceiling_below_what_the_device_kind_reaches_is_not_usable(ceiling, tmp_path):
    store = tmp_path / "calibration.json"
    store.write_text(store_text(ceiling, best_cv=0.01))
    found, reason = lookup_ceiling(store, *H100, None, "bf16")
    assert (
        found is None and "is not usable" in reason and "not plausible for one cuda device (less than 1e+10" in reason
    )
    store.write_text(store_text("1e10", best_cv=0.01))  # the lowest an accelerator may claim
    assert lookup_ceiling(store, *H100, None, "bf16")[1] is None


def test_a_stored_rate_whose_repetitions_spread_is_no_ceiling(tmp_path):
    """A store written before rates were judged: its spread still says it is no ceiling."""
    store = tmp_path / "calibration.json"
    store.write_text(store_text("7e14", best_cv=0.156))
    found, reason = lookup_ceiling(store, *H100, None, "bf16")
    assert found is None and "is no ceiling (its repetitions spread by CV 15.6% (more than 10%)" in reason
    assert reason.endswith("run hwbench calibrate --device cuda --precisions bf16 when the machine is quiet")


def test_other_processes_on_a_gpu_come_from_nvml_and_make_its_rate_no_ceiling(monkeypatch):
    import os
    import sys
    import types

    from hwbench.calibration.store import not_a_ceiling
    from hwbench.device.nvml import CudaDeviceIds, nvml_other_processes
    from tests.test_telemetry import fake_pynvml

    nv = fake_pynvml()
    nv.nvmlDeviceGetComputeRunningProcesses = lambda handle: [
        types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=1 << 30),  # this calibration itself
        types.SimpleNamespace(pid=4242, usedGpuMemory=None),
    ]  # NVML without the memory figure
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    ids = CudaDeviceIds(cuda_index=0, uuid="0a1b", pci_bus_id="0000:3b:00.0")
    others, reason = nvml_other_processes(ids, os.getpid())
    assert reason is None and others == [{"pid": 4242, "memory_bytes": None}]
    problems = not_a_ceiling("cuda", 7e14, 0.004, {"device_processes": others})
    assert problems == ["1 other process(es) computed on the device (pid 4242)"]
    assert not_a_ceiling("cuda", 7e14, 0.004, {"device_processes": []}) == []
    monkeypatch.setitem(sys.modules, "pynvml", None)
    others, reason = nvml_other_processes(ids, os.getpid())
    assert others is None and "not installed" in reason


def test_in_a_container_nvml_lists_this_process_under_its_host_pid_and_it_is_no_other_process(monkeypatch,
                                                                                                tmp_path):
    """The NVIDIA driver knows no PID namespaces: in a container NVML gives host pids (NVIDIA/nvidia-docker#1483),
    so the calibration's own context was listed as another process and every rate refused as no ceiling."""
    import os
    import sys
    import types

    from hwbench.device.nvml import CudaDeviceIds, nvml_other_processes
    from tests.test_telemetry import fake_pynvml

    proc = tmp_path / "proc"  # this container's processes: this one and pid 7
    (proc / str(os.getpid())).mkdir(parents=True)
    (proc / "7").mkdir()
    listing = [types.SimpleNamespace(pid=918273, usedGpuMemory=3 << 30)]  # this process, by its host pid
    nv = fake_pynvml()
    nv.nvmlDeviceGetComputeRunningProcesses = lambda handle: listing
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    ids = CudaDeviceIds(cuda_index=0, uuid="0a1b", pci_bus_id="0000:3b:00.0")
    assert nvml_other_processes(ids, os.getpid(), computing=True, proc=str(proc)) == ([], None)
    # not bound to the GPU: the one process listed is another's
    assert nvml_other_processes(ids, os.getpid(), proc=str(proc)) == ([{"pid": 918273, "memory_bytes": 3 << 30}], None)
    # another container's process beside this one: which is this one cannot be told, so both stay listed
    listing.append(types.SimpleNamespace(pid=918000, usedGpuMemory=None))
    others, _ = nvml_other_processes(ids, os.getpid(), computing=True, proc=str(proc))
    assert [other["pid"] for other in others] == [918273, 918000]
    # this process listed under its own pid (no PID namespace): only the others are
    listing[:] = [types.SimpleNamespace(pid=pid, usedGpuMemory=1) for pid in (os.getpid(), 7)]
    others, _ = nvml_other_processes(ids, os.getpid(), computing=True, proc=str(proc))
    assert others == [{"pid": 7, "memory_bytes": 1}]


def test_every_device_kind_has_calibration_defaults():
    """`hwbench calibrate --device rocm` (or hpu) without --precisions/--sizes/--copy-size stopped with a
    KeyError traceback: the defaults named cpu, cuda and npu only."""
    from hwbench.calibration import DEFAULT_COPY_BYTES, DEFAULT_PRECISIONS, DEFAULT_SIZES
    from hwbench.device.kinds import DEVICE_KINDS

    for defaults in (DEFAULT_SIZES, DEFAULT_PRECISIONS, DEFAULT_COPY_BYTES):
        assert set(defaults) == set(DEVICE_KINDS)
