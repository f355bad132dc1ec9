"""STAND-IN for Huawei's ``torch_npu``, for hwbench's tests only. It is not torch_npu
and drives no Ascend hardware.

It lets the NPU code path of hwbench (hwbench/device/npu.py) run on a machine
without an Ascend NPU. Put ``tests/fakes`` first on PYTHONPATH (the
``standin_npu_env`` fixture in tests/conftest.py does) and ``import torch_npu``
finds this module instead of the real one.

What it fakes:

* ``torch.npu`` (also ``sys.modules["torch.npu"]``): the part of the torch.cuda
  mirror that hwbench uses (torch_npu's documented API), implemented over the host CPU.
  ``device_count`` honours ``ASCEND_RT_VISIBLE_DEVICES`` (a comma list; unset
  means one device); ``Event`` times with ``time.perf_counter``; the device is
  reported as an ``Ascend910B3`` with 64 GiB (65536 MiB) of HBM.
* The memory statistics: ``memory_stats()`` and the ``*_memory_*`` functions
  return the fixed recorded values below, never a measurement, so tests can
  compare results against these constants.
* The way the real wheel loads: it registers a torch backend entry point
  (torch_npu-*.dist-info/entry_points.txt beside this package: ``[torch.backends]
  torch_npu = torch_npu:_autoload``), so with tests/fakes on the path a plain
  ``import torch`` imports this module, unless TORCH_DEVICE_BACKEND_AUTOLOAD=0.
  Like the wheel it sets that switch to 0 while it imports torch and restores
  it in ``_autoload``.
* A missing CANN runtime: with ``HWBENCH_STANDIN_NO_CANN=1`` in the environment
  the import fails exactly as the real torch_npu 2.13.0 does without CANN
  (``ImportError: libhccl.so: cannot open shared object file: ...``); under
  autoload torch turns that into ``RuntimeError: Failed to load the backend
  extension: torch_npu`` at ``import torch``, as on a real host.
* A torch built for another accelerator: the wheel's ``_check_device_conflict``
  is copied below; ``HWBENCH_STANDIN_TORCH_ACCELERATOR=cuda`` makes it see a
  CUDA build of torch (this machine has only the CPU build).

The module declares itself with ``__hwbench_stand_in__ = True``; hwbench reads
that flag and marks every result produced through this stand-in as simulated
(``device.simulated``, ``environment.simulated`` and a warning). The training
computation itself runs on the CPU: no figure produced through it describes an
NPU.
"""

from __future__ import annotations

import os
import sys
import time
import types

__hwbench_stand_in__ = True
__version__ = "2.13.0+standin"

NO_CANN_ENV = "HWBENCH_STANDIN_NO_CANN"
NO_CANN_MESSAGE = "libhccl.so: cannot open shared object file: No such file or directory"
ACCELERATOR_ENV = "HWBENCH_STANDIN_TORCH_ACCELERATOR"
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"

# As the wheel does: autoload off while this module imports torch (a circular
# import otherwise), restored by _autoload() once the import has succeeded. A
# failed import leaves it at 0, as the wheel's does.
ORG_AUTOLOAD = os.getenv(AUTOLOAD_ENV, "1")
os.environ[AUTOLOAD_ENV] = "0"

import torch  # noqa: E402  (the wheel's order: the switch, torch, the conflict check, CANN)


def _accelerator_type() -> str:
    return os.environ.get(ACCELERATOR_ENV) or torch._C._get_accelerator().type


def _check_device_conflict() -> None:
    """The wheel's check (torch_npu/__init__.py of torch-npu 2.13.0), reading the
    accelerator through _accelerator_type so a test can fake a CUDA build."""
    acc_type = _accelerator_type()
    if acc_type not in ("cpu", "npu"):
        raise RuntimeError(
            f"Two accelerators cannot be used at the same time "
            f"in PyTorch: npu and {acc_type}. You can install "
            f"the cpu version of PyTorch to use your npu device, "
            f"or use the {acc_type} device with "
            f"'export TORCH_DEVICE_BACKEND_AUTOLOAD=0'.\n"
            f"[ERROR] {time.strftime('%Y-%m-%d-%H:%M:%S', time.localtime())} "
            f"(PID:{os.getpid()}, Device:-1, RankID:-1) "
            f"ERR00007 PTA feature not supported"
        )


_check_device_conflict()

if os.environ.get(NO_CANN_ENV) == "1":
    raise ImportError(NO_CANN_MESSAGE)

# The device this stand-in reports.
DEVICE_NAME = "Ascend910B3"
TOTAL_MEMORY_BYTES = 65536 * 2**20  # 65536 MiB of HBM, as npu-smi reports for a 910B3

# Recorded memory statistics: fixed values, chosen to be recognisable in a
# result file. memory_stats() returns them whatever was (or was not) allocated.
PEAK_ALLOCATED_BYTES = 1_234_567_936  # 'allocated_bytes.all.peak'
PEAK_ACTIVE_BYTES = 1_234_567_936  # 'active_bytes.all.peak'
PEAK_RESERVED_BYTES = 2_147_483_648  # 'reserved_bytes.all.peak' (2 GiB)
CURRENT_ALLOCATED_BYTES = 1_048_576_000  # 'allocated_bytes.all.current'
CURRENT_RESERVED_BYTES = 1_610_612_736  # 'reserved_bytes.all.current' (1.5 GiB)
# 'num_alloc_retries' counts since the process started, as torch's does: RETRIES_BEFORE_RESET until
# the first peak reset (the warm-up's), NUM_ALLOC_RETRIES more after it (the timed window's)
NUM_ALLOC_RETRIES = 3
RETRIES_BEFORE_RESET = 2
NUM_OOMS = 0  # 'num_ooms'

RECORDED_MEMORY_STATS = {
    "allocated_bytes.all.current": CURRENT_ALLOCATED_BYTES,
    "allocated_bytes.all.peak": PEAK_ALLOCATED_BYTES,
    "active_bytes.all.peak": PEAK_ACTIVE_BYTES,
    "reserved_bytes.all.current": CURRENT_RESERVED_BYTES,
    "reserved_bytes.all.peak": PEAK_RESERVED_BYTES,
    "num_alloc_retries": NUM_ALLOC_RETRIES,
    "num_ooms": NUM_OOMS,
}

VISIBLE_DEVICES_ENV = "ASCEND_RT_VISIBLE_DEVICES"
DEFAULT_DEVICE_COUNT = 1


# --- the torch.npu mirror ---------------------------------------------------

npu = types.ModuleType("torch.npu", "Stand-in torch.npu (tests/fakes/torch_npu): the torch.cuda mirror over the CPU.")
npu.__hwbench_stand_in__ = True

_state = {"device": 0, "peak_resets": 0}


def device_count() -> int:
    visible = os.environ.get(VISIBLE_DEVICES_ENV)
    if visible is None:
        return DEFAULT_DEVICE_COUNT
    return len([part for part in visible.split(",") if part.strip()])


def _index(device) -> int:
    if device is None:
        return _state["device"]
    if isinstance(device, torch.device):
        return device.index if device.index is not None else _state["device"]
    if isinstance(device, str):
        _, _, number = device.partition(":")
        return int(number) if number else _state["device"]
    return int(device)


def _check(index: int) -> int:
    count = device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"stand-in torch.npu: invalid device ordinal {index} (device_count() is {count})")
    return index


def is_available() -> bool:
    return device_count() > 0


def set_device(device) -> None:
    _state["device"] = _check(_index(device))


def current_device() -> int:
    return _state["device"]


def synchronize(device=None) -> None:
    """Work on the host is finished when the call returns: nothing to wait for."""


class Event:
    """torch.npu.Event over time.perf_counter; elapsed_time in milliseconds."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream=None) -> None:
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("stand-in torch.npu.Event: both events need enable_timing=True")
        if self._time is None or end_event._time is None:
            raise RuntimeError("stand-in torch.npu.Event: both events must be recorded before elapsed_time")
        return (end_event._time - self._time) * 1e3


def memory_stats(device=None) -> dict:
    _check(_index(device))
    retries = RETRIES_BEFORE_RESET + (NUM_ALLOC_RETRIES if _state["peak_resets"] else 0)
    return {**RECORDED_MEMORY_STATS, "num_alloc_retries": retries}


def reset_peak_memory_stats(device=None) -> None:
    _check(_index(device))
    _state["peak_resets"] += 1  # the recorded peaks stay as they are


def memory_allocated(device=None) -> int:
    return CURRENT_ALLOCATED_BYTES


def max_memory_allocated(device=None) -> int:
    return PEAK_ALLOCATED_BYTES


def memory_reserved(device=None) -> int:
    return CURRENT_RESERVED_BYTES


def max_memory_reserved(device=None) -> int:
    return PEAK_RESERVED_BYTES


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) in bytes."""
    return TOTAL_MEMORY_BYTES - CURRENT_RESERVED_BYTES, TOTAL_MEMORY_BYTES


def get_device_name(device=None) -> str:
    _check(_index(device))
    return DEVICE_NAME


class _DeviceProperties(types.SimpleNamespace):
    pass


def get_device_properties(device=None) -> _DeviceProperties:
    _check(_index(device))
    return _DeviceProperties(name=DEVICE_NAME, total_memory=TOTAL_MEMORY_BYTES)


def is_bf16_supported() -> bool:
    return True


for _name in ("device_count", "is_available", "set_device", "current_device", "synchronize", "Event",
              "memory_stats", "reset_peak_memory_stats", "memory_allocated", "max_memory_allocated",
              "memory_reserved", "max_memory_reserved", "mem_get_info", "get_device_name",
              "get_device_properties", "is_bf16_supported"):
    setattr(npu, _name, globals()[_name])

torch.npu = npu
sys.modules["torch.npu"] = npu


def _autoload() -> None:
    """The entry point torch calls at ``import torch``; like the wheel's, it only
    restores the autoload switch (children inherit it)."""
    os.environ[AUTOLOAD_ENV] = ORG_AUTOLOAD


_autoload()  # when `import torch_npu` came first, torch skipped the autoload
