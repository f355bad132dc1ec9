"""Telemetry samplers: NVML through a fake pynvml (the calls of NVIDIA's NVML API reference), and the base
sampler's summary, energy and error handling."""

from __future__ import annotations

import itertools
import os
import pathlib
import sys
import threading
import time
import types

import pytest

from hwbench.device.base import MemoryStats
from hwbench.device.nvml import (
    INTEGRATED_AVERAGED,
    INTEGRATED_INSTANT,
    CudaDeviceIds,
    NvmlSampler,
    decode_throttle_reasons,
    pci_bus_id,
)
from hwbench.device.telemetry import MEAN_AND_MAX, TelemetrySampler
from hwbench.result.model import Telemetry, TelemetryDevice

NO_MEMORY = MemoryStats(None, None, None, None, None, source="test")  # a rank's memory statistics without figures


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


# --- a fake pynvml --------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # the name pynvml gives it
    pass


def field_value(milliwatts: int, nvml_return: int = 0) -> types.SimpleNamespace:
    """One nvmlFieldValue_t as nvidia-ml-py returns it: value type 1 (unsigned int), in mW."""
    return types.SimpleNamespace(fieldId=186, nvmlReturn=nvml_return, valueType=1,
                                 value=types.SimpleNamespace(uiVal=milliwatts))


def fake_pynvml(*, clock_event_mask: int | None = None, init_error: Exception | None = None,
                uuid_works: bool = True, pci_works: bool = True, gpus: dict[str, str] | None = None,
                instant_mw=None, energy_step_mj: dict[str, int] | None = None) -> types.ModuleType:
    """A pynvml where power, temperature, SM clock, memory and utilisation answer;
    energy, ECC and (unless clock_event_mask is given) clock events raise
    NVMLError_NotSupported, as on a GPU without those counters.

    gpus maps PCI bus id -> NVML UUID (one GPU, 0000:3b:00.0, by default); a handle
    found by UUID or bus id is that GPU's UUID. instant_mw, a callable, answers the
    NVML_FI_DEV_POWER_INSTANT field (absent: the constant is not there, as in an older
    nvidia-ml-py). energy_step_mj gives a GPU an energy counter that grows by its step
    at every read. clock_event_mask may be a callable, called at every read."""
    gpus = gpus if gpus is not None else {"0000:3b:00.0": "GPU-0a1b"}
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU = 0
    nv.NVML_CLOCK_SM = 1
    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    nv.NVML_VOLATILE_ECC = 0
    nv.NVMLError = NVMLError
    nv.NVMLError_NotSupported = NVMLError_NotSupported
    nv.calls = {"init": 0, "by_uuid": [], "by_pci": [], "by_index": []}
    nv.power_mw_returned = []
    nv.energy_mj = {uuid: 1_000_000 for uuid in (energy_step_mj or {})}
    powers_mw = itertools.cycle([180_000, 240_000, 300_000, 270_000])
    lock = threading.Lock()

    def not_supported(*args):
        raise NVMLError_NotSupported("Not Supported")

    def init():
        nv.calls["init"] += 1
        if init_error is not None:
            raise init_error

    def by_uuid(text):
        nv.calls["by_uuid"].append(text)
        if not uuid_works or text not in gpus.values():
            raise NVMLError("Not Found")
        return ("handle", text)

    def by_pci(bus_id):
        nv.calls["by_pci"].append(bus_id)
        if not pci_works or bus_id not in gpus:
            raise NVMLError("Not Found")
        return ("handle", gpus[bus_id])

    def by_index(index):  # NVML's own numbering: hwbench must never use it for a CUDA index
        nv.calls["by_index"].append(index)
        return ("handle", sorted(gpus)[index])

    def power(handle):
        with lock:
            value = next(powers_mw)
            nv.power_mw_returned.append(value)
        return value

    def temperature(handle, sensor):
        assert sensor == nv.NVML_TEMPERATURE_GPU
        return 67

    def clock(handle, kind):
        assert kind == nv.NVML_CLOCK_SM
        return 1410

    def energy(handle):
        uuid = handle[1]
        if uuid not in nv.energy_mj:
            not_supported()
        nv.energy_mj[uuid] += energy_step_mj[uuid]
        return nv.energy_mj[uuid]

    def field_values(handle, fields):
        assert fields == [nv.NVML_FI_DEV_POWER_INSTANT]
        return [instant_mw()]

    nv.nvmlInit = init
    nv.nvmlDeviceGetHandleByUUID = by_uuid
    nv.nvmlDeviceGetHandleByPciBusId = by_pci
    nv.nvmlDeviceGetHandleByIndex = by_index
    nv.nvmlDeviceGetUUID = lambda handle: handle[1]
    nv.nvmlDeviceGetPowerUsage = power
    nv.nvmlDeviceGetTemperature = temperature
    nv.nvmlDeviceGetClockInfo = clock
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=5 * 2**30, total=80 * 2**30, free=75 * 2**30)
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97, memory=41)
    nv.nvmlDeviceGetTotalEnergyConsumption = energy
    nv.nvmlDeviceGetTotalEccErrors = not_supported
    if instant_mw is not None:
        nv.NVML_FI_DEV_POWER_INSTANT = 186
        nv.nvmlDeviceGetFieldValues = field_values
    if clock_event_mask is None:
        nv.nvmlDeviceGetCurrentClocksEventReasons = not_supported
        nv.nvmlDeviceGetCurrentClocksThrottleReasons = not_supported
    elif callable(clock_event_mask):
        nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: clock_event_mask()
    else:
        nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: clock_event_mask
    return nv


def gpu(cuda_index: int = 0, uuid: str | None = "0a1b", bus: str | None = "0000:3b:00.0") -> CudaDeviceIds:
    """A CUDA device as the CUDA runtime describes it (torch's UUID text has no "GPU-")."""
    return CudaDeviceIds(cuda_index=cuda_index, uuid=uuid, pci_bus_id=bus)


# --- NvmlSampler ---------------------------------------------------------------


def test_nvml_sampler_without_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    sampler = NvmlSampler([gpu()], interval_s=0.01)
    reason = sampler.unavailable_reason()
    assert reason is not None and "nvidia-ml-py" in reason
    sampler.start()
    summary = sampler.stop()
    assert summary["available"] is False
    assert summary["reason"] == reason
    assert summary["source"] == "nvml"
    assert summary["devices"] == []


def test_nvml_sampler_when_nvml_init_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=NVMLError("Driver Not Loaded")))
    sampler = NvmlSampler([gpu()])
    assert sampler.unavailable_reason() == "NVML unavailable: NVMLError: Driver Not Loaded"
    assert sampler.stop()["available"] is False


def test_nvml_readings_are_none_where_not_supported(monkeypatch):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler([gpu(uuid="0a1b")])
    assert sampler.unavailable_reason() is None
    assert nv.calls["by_uuid"] == ["GPU-0a1b"]  # the "GPU-" prefix NVML wants is added
    (reading,) = sampler.read()
    assert reading["power_w"] == 180.0  # mW -> W
    assert reading["temperature_c"] == 67
    assert reading["sm_clock_mhz"] == 1410
    assert reading["utilization_percent"] == 97
    assert reading["memory_used_mib"] == 5 * 1024  # bytes / 2^20
    assert reading["ecc_uncorrected"] is None
    assert "throttle_reasons" not in reading  # clock events not supported: no key at all
    assert sampler.energy_counter_j() == [None]


def test_nvml_finds_the_gpu_by_uuid_and_records_it(monkeypatch):
    nv = fake_pynvml(gpus={"0000:3b:00.0": "GPU-aaaa", "0000:5e:00.0": "GPU-bbbb"})
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler([gpu(cuda_index=0, uuid="bbbb", bus="0000:5e:00.0")])
    assert sampler.unavailable_reason() is None
    assert nv.calls["by_pci"] == [] and nv.calls["by_index"] == []
    assert sampler.device_details(0) == {"name": "gpu:0", "uuid": "GPU-bbbb", "pci_bus_id": "0000:5e:00.0",
                                         "identified_by": "uuid", "power_method": None}


def test_nvml_falls_back_to_the_pci_bus_id_when_the_uuid_is_not_found(monkeypatch):
    """A MIG instance's UUID is no GPU's: NVML is asked by PCI bus id, never by the CUDA
    index (NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES: index 0 is
    another GPU here)."""
    nv = fake_pynvml(gpus={"0000:3b:00.0": "GPU-aaaa", "0000:5e:00.0": "GPU-bbbb"})
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler([gpu(cuda_index=0, uuid="ffff", bus="0000:5e:00.0")])
    assert sampler.unavailable_reason() is None
    assert nv.calls["by_uuid"] == ["GPU-ffff"] and nv.calls["by_pci"] == ["0000:5e:00.0"]
    assert nv.calls["by_index"] == []
    details = sampler.device_details(0)
    assert details["identified_by"] == "pci_bus_id"
    assert details["uuid"] == "GPU-bbbb"  # NVML's UUID of the GPU found: what ranks are merged by
    sampler.start()
    (device,) = sampler.stop()["devices"]
    assert (device["uuid"], device["identified_by"], device["pci_bus_id"]) == ("GPU-bbbb", "pci_bus_id",
                                                                               "0000:5e:00.0")


def test_nvml_telemetry_is_unavailable_when_neither_uuid_nor_bus_id_finds_the_gpu(monkeypatch):
    nv = fake_pynvml(uuid_works=False, pci_works=False)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler([gpu(cuda_index=2, uuid="ffff", bus="0000:af:00.0")], interval_s=0.01)
    reason = sampler.unavailable_reason()
    assert reason == ("NVML does not find CUDA device 2 (UUID GPU-ffff: NVMLError: Not Found; "
                      "PCI bus id 0000:af:00.0: NVMLError: Not Found); its index is not used, since NVML "
                      "numbers GPUs in PCI order, not CUDA's")
    assert nv.calls["by_index"] == []  # no guess: index 2 would be whichever GPU NVML numbers 2
    sampler.start()
    assert sampler.stop() == {"source": "nvml", "available": False, "reason": reason, "devices": []}


def test_nvml_without_any_id_from_the_cuda_runtime_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    reason = NvmlSampler([gpu(uuid=None, bus=None)]).unavailable_reason()
    assert "no UUID from the CUDA runtime; no PCI bus id from the CUDA runtime" in reason


def test_pci_bus_id_is_the_form_nvml_accepts():
    assert pci_bus_id(0, 0x3B, 0) == "0000:3b:00.0"
    assert pci_bus_id(1, 0xC1, 0x1F) == "0001:c1:1f.0"


def test_cuda_backend_gives_the_sampler_torch_s_uuid_and_pci_address(monkeypatch):
    """CudaBackend.telemetry_sampler hands NVML what torch's device properties say
    (torch 2.13: uuid, pci_domain_id, pci_bus_id, pci_device_id)."""
    from hwbench.device import cuda

    nv = fake_pynvml(uuid_works=False, gpus={"0000:3b:00.0": "GPU-aaaa", "0000:5e:00.0": "GPU-bbbb"})
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    props = types.SimpleNamespace(uuid="cafe", pci_domain_id=0, pci_bus_id=0x5E, pci_device_id=0)
    monkeypatch.setattr(cuda.torch.cuda, "get_device_properties", lambda index: props)
    backend = cuda.CudaBackend.__new__(cuda.CudaBackend)  # no CUDA device needed for the ids
    backend.local_index = 1
    sampler = backend.telemetry_sampler(0.5)
    assert nv.calls["by_uuid"] == ["GPU-cafe"] and nv.calls["by_pci"] == ["0000:5e:00.0"]
    assert sampler.device_details(0)["name"] == "gpu:1" and sampler.device_details(0)["uuid"] == "GPU-bbbb"


def test_nvml_summary_integrates_averaged_power_without_an_energy_counter(monkeypatch):
    """No energy counter, no instantaneous power field (an older nvidia-ml-py): the
    1 s-averaged nvmlDeviceGetPowerUsage is integrated, and labelled approximate."""
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler([gpu()], interval_s=0.01)
    sampler.start()
    time.sleep(0.1)
    summary = sampler.stop()

    assert summary["available"] is True and summary["source"] == "nvml"
    assert summary["errors"] == []
    assert summary["samples"] == len(sampler.samples) == len(nv.power_mw_returned) >= 3
    (device,) = summary["devices"]
    watts = [mw / 1000 for mw in nv.power_mw_returned]
    assert device["power_w_mean"] == pytest.approx(sum(watts) / len(watts))
    assert device["power_w_max"] == max(watts)
    assert device["temperature_c_mean"] == 67 and device["sm_clock_mhz_max"] == 1410
    assert device["ecc_uncorrected_delta"] is None
    assert device["throttle_reasons"] is None
    assert device["energy_method"] == INTEGRATED_AVERAGED == "integrated 1 s-averaged power samples (approximate)"
    assert device["power_method"] == "nvmlDeviceGetPowerUsage (a 1 s average on Ampere and newer)"
    # Trapezoids over the sample times, bounded by the lowest and highest power.
    times = [t for t, _ in sampler.samples]
    span = times[-1] - times[0]
    expected = sum((t1 - t0) * (p0 + p1) / 2 for t0, t1, p0, p1 in zip(times, times[1:], watts, watts[1:]))
    assert device["energy_j"] == pytest.approx(expected)
    assert min(watts) * span <= device["energy_j"] <= max(watts) * span
    assert 0.05 < summary["window_s"] < 5
    assert "energy_warning" not in device


def test_nvml_prefers_instantaneous_power_over_the_1_s_average(monkeypatch):
    """No energy counter: the NVML_FI_DEV_POWER_INSTANT field is sampled and integrated
    instead of the averaged nvmlDeviceGetPowerUsage, and the energy is about the mean
    power times the window."""
    nv = fake_pynvml(instant_mw=lambda: field_value(250_000))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler([gpu()], interval_s=0.01)
    assert sampler.read()[0]["power_w"] == 250.0
    assert nv.power_mw_returned == []  # the averaged call is never made
    sampler.start()
    time.sleep(0.1)
    summary = sampler.stop()
    (device,) = summary["devices"]
    assert device["power_w_mean"] == device["power_w_max"] == 250.0
    assert device["energy_method"] == INTEGRATED_INSTANT == "integrated instantaneous power samples"
    assert device["power_method"] == "instantaneous power (NVML field NVML_FI_DEV_POWER_INSTANT)"
    assert device["energy_j"] == pytest.approx(device["power_w_mean"] * summary["window_s"], rel=0.05)


def test_nvml_instant_field_not_supported_falls_back_to_averaged_power(monkeypatch):
    """The field call succeeds but the field itself answers NVML_ERROR_NOT_SUPPORTED (3)."""
    nv = fake_pynvml(instant_mw=lambda: field_value(0, nvml_return=3))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler([gpu()], interval_s=60.0)
    sampler.start()
    (device,) = sampler.stop()["devices"]
    assert device["power_w_max"] == 240.0 and nv.power_mw_returned == [180_000, 240_000]
    assert device["energy_method"] == INTEGRATED_AVERAGED


def test_nvml_energy_counter_is_preferred_over_any_power(monkeypatch):
    nv = fake_pynvml(instant_mw=lambda: field_value(250_000), energy_step_mj={"GPU-0a1b": 5_000})
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler([gpu()], interval_s=60.0)
    sampler.start()
    (device,) = sampler.stop()["devices"]
    assert (device["energy_j"], device["energy_method"]) == (pytest.approx(5.0), "energy counter")


def test_nvml_throttle_reasons_leave_out_gpu_idle_and_the_window_edges(monkeypatch):
    """The first and last samples are taken at the barriers around the timed steps, where
    the GPU idles: neither their reasons nor the gpu_idle bit are throttling of the run."""
    masks = iter([0x1 | 0x40,  # start, at a barrier: idle, and a thermal reason left from before
                  0x1 | 0x4,  # inside: idle between two steps, power capped
                  0x0,  # inside: nothing
                  0x1 | 0x8])  # stop, at a barrier
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(clock_event_mask=lambda: next(masks)))
    sampler = NvmlSampler([gpu()], interval_s=60.0)  # the test takes the samples inside the window
    sampler.start()
    sampler._take_sample()
    sampler._take_sample()
    summary = sampler.stop()
    (device,) = summary["devices"]
    assert device["throttle_reasons"] == ["sw_power_cap"]
    raw = [reading for _, (reading,) in sampler.samples]
    assert [r["gpu_idle"] for r in raw] == [True, True, False, True]  # kept in the raw readings
    assert raw[0]["throttle_reasons"] == ["hw_thermal_slowdown"]  # without gpu_idle


def test_nvml_throttle_reasons_of_a_window_with_only_its_edges_are_not_measured(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(clock_event_mask=0x1 | 0x4))
    sampler = NvmlSampler([gpu()], interval_s=60.0)
    sampler.start()
    (device,) = sampler.stop()["devices"]
    assert device["throttle_reasons"] is None
    assert device["unmeasured"]["throttle_reasons"] == "no sample inside the window, only its edges (at barriers)"


def test_nvml_throttle_reasons_decoded_when_clock_events_work(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(clock_event_mask=0x4 | 0x40))
    sampler = NvmlSampler([gpu()], interval_s=0.01)
    assert sampler.read()[0]["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    sampler.start()
    wait_for(lambda: len(sampler.samples) >= 3)
    (device,) = sampler.stop()["devices"]
    assert device["throttle_reasons"] == ["hw_thermal_slowdown", "sw_power_cap"]  # sorted union


def test_decode_throttle_reasons():
    assert decode_throttle_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle_reasons(0x1 | 0x8 | 0x20 | 0x80) == [
        "gpu_idle", "hw_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"]
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x10000) == []  # bits hwbench does not know are ignored


# --- the base sampler ---------------------------------------------------------


class CountingSampler(TelemetrySampler):
    """Two devices; the first has an energy counter, the second only power."""

    source = "test"

    def __init__(self) -> None:
        super().__init__(interval_s=60.0)  # one sample at start, one at stop: no timing in the figures
        self.counters = iter([[1000.0, None], [1042.5, None]])
        self.readings = iter([
            [{"power_w": 100.0, "temperature_c": 50.0, "ecc_uncorrected": 2, "throttle_reasons": []},
             {"power_w": 10.0}],
            [{"power_w": 300.0, "temperature_c": 70.0, "ecc_uncorrected": 5, "throttle_reasons": ["sw_power_cap"]},
             {"power_w": 30.0}],
        ])

    def read(self):
        return next(self.readings)

    def energy_counter_j(self):
        return next(self.counters)


def test_base_summary_prefers_the_energy_counter():
    sampler = CountingSampler()
    sampler.start()
    wait_for(lambda: len(sampler.samples) == 1)  # the loop's first sample, before stop's
    summary = sampler.stop()
    assert summary["samples"] == 2 and summary["errors"] == []
    counted, integrated = summary["devices"]

    assert counted["energy_j"] == pytest.approx(42.5)  # counter at stop minus counter at start
    assert counted["energy_method"] == "energy counter"
    assert counted["power_w_mean"] == 200.0 and counted["power_w_max"] == 300.0
    assert counted["temperature_c_mean"] == 60.0 and counted["temperature_c_max"] == 70.0
    assert counted["ecc_uncorrected_delta"] == 3
    assert counted["throttle_reasons"] is None  # two samples: both at the window's edges
    assert set(counted["unmeasured"]) == set(MEAN_AND_MAX) - {"power_w", "temperature_c"} | {"throttle_reasons"}
    assert "energy_warning" not in counted  # two samples: too few to judge the energy by

    (t0, _), (t1, _) = sampler.samples
    assert integrated["energy_method"] == "integrated power samples"  # no counter on this one
    assert integrated["energy_j"] == pytest.approx((t1 - t0) * (10.0 + 30.0) / 2)
    assert integrated["throttle_reasons"] is None and integrated["ecc_uncorrected_delta"] is None


class SteadySampler(TelemetrySampler):
    """One device drawing 50 W; its energy counter (when given) grows by counter_step_j per read."""

    source = "test"

    def __init__(self, counter_step_j: float | None = None) -> None:
        super().__init__(interval_s=0.01)
        self.counter_step_j = counter_step_j
        self.counter_j = 0.0

    def read(self):
        return [{"power_w": 50.0}]

    def energy_counter_j(self):
        if self.counter_step_j is None:
            return [None]
        self.counter_j += self.counter_step_j
        return [self.counter_j]


@pytest.mark.parametrize("counter_step_j, warned", [(None, False), (1e6, True)])
def test_energy_far_from_mean_power_times_window_is_flagged(counter_step_j, warned):
    """Energy should be about the mean power times the window; a counter that says 1 MJ
    while the device drew 50 W for a fraction of a second is not this device's."""
    sampler = SteadySampler(counter_step_j)
    sampler.start()
    wait_for(lambda: len(sampler.samples) >= 12)
    summary = sampler.stop()
    (device,) = summary["devices"]
    if warned:
        assert device["energy_j"] == pytest.approx(1e6)
        assert device["energy_warning"].startswith("energy 1e+06 J is ")
        assert "the mean power x window (50 W x " in device["energy_warning"]
    else:
        assert device["energy_j"] == pytest.approx(50.0 * summary["window_s"], rel=0.1)
        assert "energy_warning" not in device


class ScriptedSampler(TelemetrySampler):
    """One device whose readings come from a list; an exception in it is raised by read."""

    source = "test"

    def __init__(self, script) -> None:
        super().__init__(interval_s=60.0)  # the test takes the samples inside the window
        self.script = iter(script)

    def read(self):
        step = next(self.script)
        if isinstance(step, Exception):
            raise step
        return [step]


def test_throttle_reasons_edges_are_the_samples_at_start_and_stop_not_the_first_that_worked():
    """The sample at start failed: the first reading kept is from inside the window and counts."""
    sampler = ScriptedSampler([RuntimeError("busy"), {"throttle_reasons": ["sw_power_cap"]},
                               {"throttle_reasons": []}, {"throttle_reasons": ["hw_slowdown"]}])
    sampler.start()
    sampler._take_sample()
    sampler._take_sample()
    summary = sampler.stop()
    assert summary["errors"] == ["RuntimeError: busy"]
    assert summary["devices"][0]["throttle_reasons"] == ["sw_power_cap"]


class FailingSampler(TelemetrySampler):
    source = "test"

    def __init__(self, fail_every: int = 1) -> None:
        super().__init__(interval_s=0.01)
        self.calls = 0
        self.fail_every = fail_every

    def read(self):
        self.calls += 1
        if self.calls % self.fail_every == 0:
            raise RuntimeError(f"sensor gone (call {self.calls})")
        return [{"power_w": 50.0}]


def test_a_sampler_whose_read_raises_keeps_running_and_keeps_five_errors():
    sampler = FailingSampler()
    sampler.start()
    wait_for(lambda: sampler.calls >= 8)  # still sampling after the fifth error
    assert sampler._thread.is_alive()
    summary = sampler.stop()  # no exception reaches the caller
    assert summary["available"] is True
    assert summary["samples"] == 0 and summary["devices"] == []
    assert len(summary["errors"]) == 5
    assert summary["errors"][0] == "RuntimeError: sensor gone (call 1)"
    assert summary["errors"][4] == "RuntimeError: sensor gone (call 5)"


def test_a_flaky_sampler_summarises_the_readings_it_got():
    sampler = FailingSampler(fail_every=2)
    sampler.start()
    wait_for(lambda: sampler.calls >= 6)
    summary = sampler.stop()
    assert summary["errors"] and len(summary["errors"]) <= 5
    assert all(error.startswith("RuntimeError: sensor gone") for error in summary["errors"])
    (device,) = summary["devices"]
    assert summary["samples"] >= 3
    assert device["power_w_mean"] == 50.0
    assert device["energy_method"] == "integrated power samples"


# --- RAPL package energy on the CPU (a fake powercap tree) ------------------------

from hwbench.device.rapl import ENERGY_METHOD, POWERCAP, RaplSampler, counter_increment_uj  # noqa: E402

RANGE_UJ = 262_143_328_850  # max_energy_range_uj of a real Intel package zone


def powercap_tree(root, packages=(0,), energy_uj=1_000_000):
    """/sys/class/powercap as the kernel lays it out: a package zone per socket, its
    core sub-zone (intel-rapl:N:0) and a psys zone, which are not package energy."""
    for n in packages:
        zone = root / f"intel-rapl:{n}"
        (zone / f"intel-rapl:{n}:0").mkdir(parents=True)
        (zone / "name").write_text(f"package-{n}\n")
        (zone / "energy_uj").write_text(f"{energy_uj}\n")
        (zone / "max_energy_range_uj").write_text(f"{RANGE_UJ}\n")
        (zone / f"intel-rapl:{n}:0" / "name").write_text("core\n")
        (zone / f"intel-rapl:{n}:0" / "energy_uj").write_text("5\n")
    psys = root / f"intel-rapl:{len(packages)}"
    psys.mkdir()
    (psys / "name").write_text("psys\n")
    (psys / "energy_uj").write_text("7\n")
    (psys / "max_energy_range_uj").write_text(f"{RANGE_UJ}\n")
    return root


def set_energy(root, package, microjoules):
    (root / f"intel-rapl:{package}" / "energy_uj").write_text(f"{microjoules}\n")


def test_rapl_counter_increment_across_the_wrap():
    assert counter_increment_uj(100, 250, RANGE_UJ) == 150
    assert counter_increment_uj(RANGE_UJ - 1_000_000, 2_000_000, RANGE_UJ) == 3_000_000


def test_rapl_energy_over_the_window_counts_every_wrap(tmp_path):
    root = powercap_tree(tmp_path / "powercap", energy_uj=RANGE_UJ - 5_000_000)
    sampler = RaplSampler(interval_s=60.0, root=root)  # the test drives the readings
    assert [d.name for d in sampler.domains] == ["package-0"]  # not the core sub-zone, not psys
    sampler.start()
    set_energy(root, 0, 10_000_000)  # wrapped: 15 J since the start
    sampler.read()
    set_energy(root, 0, RANGE_UJ - 1_000_000)
    sampler.read()
    set_energy(root, 0, 4_000_000)  # wrapped again: a start/end difference alone would miss both
    summary = sampler.stop()

    assert summary["available"] is True and summary["source"] == "rapl"
    (device,) = summary["devices"]
    assert device["energy_j"] == pytest.approx(15 + (RANGE_UJ - 11_000_000) / 1e6 + 5)
    assert device["energy_method"] == ENERGY_METHOD == "rapl-package"
    assert device["name"] == "package-0" and device["package"] == 0
    assert "whole CPU socket" in device["energy_scope"] and "other" not in device["unmeasured"]
    assert device["power_w_mean"] == pytest.approx(device["energy_j"] / summary["window_s"])


def test_rapl_reads_only_the_packages_the_ranks_may_run_on(tmp_path):
    root = powercap_tree(tmp_path / "powercap", packages=(0, 1))
    assert [d.package for d in RaplSampler(root=root).domains] == [0, 1]
    assert [d.package for d in RaplSampler(root=root, packages=[1]).domains] == [1]
    reason = RaplSampler(root=root, packages=[2]).unavailable_reason()
    assert reason == f"no RAPL: {root} has no intel-rapl package domain for CPU package 2"


def test_rapl_energy_unreadable_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    """Since Linux 5.10 energy_uj is 0400 root. Root ignores file modes, so when this
    test runs as root the read is refused as the kernel refuses it to anyone else."""
    root = powercap_tree(tmp_path / "powercap")
    energy = root / "intel-rapl:0" / "energy_uj"
    energy.chmod(0o000)
    if os.access(energy, os.R_OK):
        real_read_text = pathlib.Path.read_text

        def refused(path, *args, **kwargs):
            if path == energy:
                raise PermissionError(13, "Permission denied", str(path))
            return real_read_text(path, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, "read_text", refused)
    sampler = RaplSampler(root=root)
    sampler.start()
    summary = sampler.stop()
    assert summary["available"] is False and summary["devices"] == []
    assert str(energy) in summary["reason"] and "root-only" in summary["reason"]


def test_rapl_on_this_machine(tmp_path):
    """The real /sys/class/powercap: absent on most VMs (this one included), then the
    telemetry is unavailable and says so; where it is there and readable, it measures."""
    sampler = RaplSampler(interval_s=0.05)
    sampler.start()
    time.sleep(0.2)
    summary = sampler.stop()
    if not POWERCAP.is_dir():
        assert summary == {"source": "rapl", "available": False, "devices": [],
                           "reason": f"no RAPL: {POWERCAP} does not exist (no powercap driver: an older kernel, "
                                     "or a virtual machine)"}
    elif summary["available"]:
        assert all(d["energy_j"] >= 0 and d["energy_method"] == "rapl-package" for d in summary["devices"])
    else:
        assert summary["reason"].startswith(("no RAPL", "RAPL energy unreadable"))


def test_cpu_backend_telemetry_is_rapl():
    from hwbench.device.cpu import CpuBackend

    assert isinstance(CpuBackend().telemetry_sampler(0.5), RaplSampler)


def test_the_report_reads_rapl_energy_of_a_cpu_run(tmp_path):
    """What the report charges (hwbench.report.cost.measured_energy) from a CPU run's
    telemetry: two ranks of one node sample the same package, counted once."""
    from hwbench.harness.merge import RankReport, merge_telemetry
    from hwbench.report.cost import measured_energy
    from hwbench.result.model import RunResult

    root = powercap_tree(tmp_path / "powercap", energy_uj=0)
    sampler = RaplSampler(interval_s=60.0, root=root)
    sampler.start()
    set_energy(root, 0, 30_000_000)
    one_rank = sampler.stop()
    result = RunResult(run_id="r", status="ok", spec={}, metrics={"telemetry": one_rank})
    energy, power, reason = measured_energy(result, world=1)
    assert (energy, reason) == (pytest.approx(30.0), None) and power == pytest.approx(30.0 / one_rank["window_s"])

    ranks = [RankReport(rank=r, step_times_s=[1.0], memory=NO_MEMORY, host="h",
                        telemetry=Telemetry.model_validate(one_rank)) for r in (0, 1)]
    merged = merge_telemetry(ranks)
    assert len(merged.devices) == 1 and merged.energy_j == pytest.approx(30.0)


def test_merged_gpu_telemetry_keeps_every_rank_s_device():
    """Each GPU rank samples its own device at summary index 0: the name tells them apart
    where no UUID is known (before, a node's ranks merged into one device and the report
    missed the others' energy)."""
    from hwbench.harness.merge import RankReport, merge_telemetry

    def reading(name, joules):
        return {"source": "nvml", "available": True, "devices": [
            {"index": 0, "name": name, "energy_j": joules, "power_w_mean": joules / 10}]}

    ranks = [RankReport(rank=r, step_times_s=[1.0], memory=NO_MEMORY, host="h",
                        telemetry=Telemetry.model_validate(reading(f"gpu:{r}", 100.0 * (r + 1)))) for r in (0, 1)]
    merged = merge_telemetry(ranks)
    assert [d.name for d in merged.devices] == ["gpu:0", "gpu:1"]
    assert merged.energy_j == pytest.approx(300.0) and merged.power_w_mean_total == pytest.approx(30.0)


EIGHT_GPUS = {f"0000:{0x18 + 0x10 * n:02x}:00.0": f"GPU-{n:04d}" for n in range(8)}


def rank_telemetry(monkeypatch, nv, ids: CudaDeviceIds) -> dict:
    """What one rank's NvmlSampler reports over a window (one sample at each edge)."""
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler([ids], interval_s=60.0)
    sampler.start()
    return sampler.stop()


def test_eight_ranks_of_one_node_report_eight_gpus_and_their_summed_energy(monkeypatch):
    """torchrun with one GPU per rank, each rank bound by its own CUDA_VISIBLE_DEVICES (as
    Slurm's --gpu-bind does): every rank sees its GPU as CUDA device 0, named gpu:0; the
    UUIDs tell the eight apart, and the run's energy is all eight's."""
    from hwbench.harness.merge import RankReport, merge_telemetry

    steps_mj = {uuid: 1000 * (n + 1) for n, uuid in enumerate(EIGHT_GPUS.values())}  # GPU n: n + 1 J
    nv = fake_pynvml(gpus=EIGHT_GPUS, energy_step_mj=steps_mj)
    reports = []
    for rank, (bus, uuid) in enumerate(EIGHT_GPUS.items()):
        telemetry = rank_telemetry(monkeypatch, nv, gpu(cuda_index=0, uuid=uuid.removeprefix("GPU-"), bus=bus))
        reports.append(RankReport(rank=rank, local_rank=rank, step_times_s=[1.0], memory=NO_MEMORY, host="node0",
                                  telemetry=Telemetry.model_validate(telemetry)))
    assert {r.telemetry.devices[0].name for r in reports} == {"gpu:0"}  # the name alone would merge them

    merged = merge_telemetry(reports)
    assert [d.uuid for d in merged.devices] == list(EIGHT_GPUS.values())
    assert all(d.host == "node0" and d.identified_by == "uuid" for d in merged.devices)
    assert merged.energy_j == pytest.approx(sum(range(1, 9)))  # 36 J
    assert merged.ranks == merged.ranks_available == 8


def test_two_ranks_sampling_one_gpu_count_it_once(monkeypatch):
    """Two ranks on one GPU (two slices of it, found by PCI bus id since a slice's UUID is no
    GPU's, or two processes sharing it): one device, its energy once."""
    from hwbench.harness.merge import RankReport, merge_telemetry

    nv = fake_pynvml(gpus=EIGHT_GPUS, energy_step_mj={"GPU-0003": 7_000})
    bus = next(b for b, u in EIGHT_GPUS.items() if u == "GPU-0003")
    shared = [rank_telemetry(monkeypatch, nv, gpu(cuda_index=r, uuid=f"slice-{r}", bus=bus)) for r in (0, 1)]
    assert [t["devices"][0]["name"] for t in shared] == ["gpu:0", "gpu:1"]  # different CUDA devices
    merged = merge_telemetry([RankReport(rank=r, step_times_s=[1.0], memory=NO_MEMORY, host="node0",
                                         telemetry=Telemetry.model_validate(t)) for r, t in enumerate(shared)])
    (device,) = merged.devices
    assert (device.uuid, device.identified_by) == ("GPU-0003", "pci_bus_id")
    assert merged.energy_j == pytest.approx(7.0)


def test_one_uuid_on_two_hosts_is_one_device_and_names_repeat_across_hosts():
    """A UUID is unique everywhere (hosts of one name, as containers often are, cannot merge
    two GPUs); a name or bus id is only unique on its host."""
    from hwbench.harness.merge import device_key

    def device(**fields):
        return TelemetryDevice.model_validate(fields)

    assert device_key("a", device(uuid="GPU-1", name="gpu:0")) == device_key("b", device(uuid="GPU-1", name="gpu:3"))
    assert device_key("a", device(uuid=None, name="gpu:0")) != device_key("b", device(uuid=None, name="gpu:0"))
    assert device_key("a", device(pci_bus_id="0000:01:00.0", chip=0)) != device_key(
        "a", device(pci_bus_id="0000:01:00.0", chip=1))  # two chips of one card


def test_each_gpu_and_npu_sampler_names_its_device(monkeypatch):
    from hwbench.device.npu_smi import NpuSmiSampler

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    assert NvmlSampler([gpu(cuda_index=3)]).device_details(0)["name"] == "gpu:3"
    assert NpuSmiSampler([5]).device_details(0) == {"name": "npu:5", "pci_bus_id": None, "chip": None,
                                                   "identified_by": "npu-smi device id"}


def test_npu_ranks_merge_by_bus_id_and_chip(monkeypatch):
    """npu-smi's identity of a chip: its bus id and chip number (a 310P Duo's two chips
    share the bus id, recorded in tests/fakes/npu-smi). Ranks on the two chips are two
    devices; two ranks on one chip are one."""
    from hwbench.device.npu_smi import NpuSmiSampler
    from hwbench.harness.merge import RankReport, merge_telemetry

    fakes = pathlib.Path(__file__).resolve().parent / "fakes"
    monkeypatch.setenv("PATH", os.pathsep.join([str(fakes / "bin"), os.environ.get("PATH", "")]))
    monkeypatch.setenv("HWBENCH_STANDIN_NPU_SMI", "info-310p-duo.txt")

    def rank(number, device_id):
        sampler = NpuSmiSampler([device_id], interval_s=60.0)
        sampler.start()
        return RankReport(rank=number, step_times_s=[1.0], memory=NO_MEMORY, host="h",
                          telemetry=Telemetry.model_validate(sampler.stop()))

    both_chips = merge_telemetry([rank(0, 0), rank(1, 1)])
    assert [(d.pci_bus_id, d.chip, d.name) for d in both_chips.devices] == [
        ("0000:01:00.0", 0, "npu:0"), ("0000:01:00.0", 1, "npu:1")]
    assert all(d.identified_by == "npu-smi device id" for d in both_chips.devices)
    one_chip = merge_telemetry([rank(0, 1), rank(1, 1)])
    assert [d.chip for d in one_chip.devices] == [1]
