"""STAND-IN for HLML's Python wrapper (PyPI ``habana-pyhlml``, module ``pyhlml``), for hwbench's
tests only: the calls hwbench's HLML sampler makes (hwbench/device/hlml.py), with the names and
units of habana-pyhlml 1.24.2 (pyhlml/main.py: power in mW, energy in mJ, memory in bytes).

It answers for two Gaudi 2 cards as hl-smi printed them in optimum-habana issue #614
(HL-SMI hl-1.13.0, driver 1.13.0-ee32e42): module 0 at 0000:33:00.0, 27 C, 75 W of 600 W,
768 MiB of 98,304 MiB in use, 0 % AIP utilization; module 1 at 0000:9a:00.0, 27 C, 90 W.
The energy counter grows at those powers with wall-clock time; clocks (SOC 1,800 MHz) and a
clear throttle mask are fixed test values.

Health before a run (hwbench preflight, hwbench accept), with habana-pyhlml's names and return
shapes (pyhlml/main.py): ECC counts (hlmlDeviceGetTotalECCErrors(device, error_type,
counter_type)) 0; replaced rows (hlmlDeviceGetReplacedRowsCount(device, cause)) 0, none pending
(hlmlDeviceGetReplacedRowsPendingStatus); 24 NIC ports (hlmlDeviceGetMacAddrInfo's port mask,
((mask, mask), (external, external))), each up (hlmlDeviceNicGetLink): a Gaudi 2 has 24 100 GbE
RoCE ports, 3 of them external (Intel Gaudi 2 AI accelerator white paper); PCIe gen4 x16
(hlmlDeviceGetCurrPCIELinkGeneration / ...Width), the Gaudi 2 mezzanine card's host interface in
the same paper.

HWBENCH_STANDIN_HLML_HEALTH sets faults for tests, comma-separated: ``ecc_uncorrected=N``,
``rows_pending``, ``nic_down=P`` (port P down), ``pcie_width=N``."""

from __future__ import annotations

import os
import time
import types

__hwbench_stand_in__ = True

MIB = 2**20
DRIVER = b"1.13.0-ee32e42"
CARDS = [  # module id, bus id, power mW, temperature C
    (0, b"0000:33:00.0", 75_000, 27),
    (1, b"0000:9a:00.0", 90_000, 27),
]
_START = time.monotonic()


class HLMLError(Exception):
    pass


def hlmlInit() -> None:
    pass


def hlmlShutdown() -> None:
    pass


def hlmlDeviceGetCount() -> int:
    return len(CARDS)


def hlmlDeviceGetHandleByIndex(index: int):
    if not 0 <= index < len(CARDS):
        raise HLMLError("HLML Error with code 2")
    return CARDS[index]


def hlmlDeviceGetModuleID(handle) -> int:
    return handle[0]


def hlmlDeviceGetPCIInfo(handle):
    return types.SimpleNamespace(bus_id=handle[1])


def hlmlDeviceGetPowerUsage(handle) -> int:
    return handle[2]


def hlmlDeviceGetTemperature(handle, sensor_type) -> int:
    return handle[3]


def hlmlDeviceGetClockInfo(handle, clock_type=0) -> int:
    return 1800


def hlmlDeviceGetUtilizationRates(handle):
    return types.SimpleNamespace(aip=0, memory=0)


def hlmlDeviceGetMemoryInfo(handle):
    return types.SimpleNamespace(total=98304 * MIB, used=768 * MIB, free=(98304 - 768) * MIB)


def hlmlDeviceGetCurrentClocksThrottleReasons(handle) -> int:
    return 0


def hlmlDeviceGetTotalEnergyConsumption(handle) -> int:
    return int(handle[2] * (time.monotonic() - _START))  # mW x s = mJ


def hlmlGetDriverVersion() -> bytes:
    return DRIVER


# --- health (see the module's docstring) -------------------------------------------------------------

HEALTH_ENV = "HWBENCH_STANDIN_HLML_HEALTH"
NIC_PORTS = 24
EXTERNAL_PORTS = (8, 22, 23)  # fixed test values: which three of the 24 are external is not read


def _faults() -> dict[str, int]:
    faults = {}
    for item in os.environ.get(HEALTH_ENV, "").split(","):
        name, _, number = item.strip().partition("=")
        if name:
            faults[name] = int(number) if number else 1
    return faults


def hlmlDeviceGetTotalECCErrors(device, error_type, counter_type) -> int:
    return _faults().get("ecc_uncorrected", 0) if error_type == 1 else 0


def hlmlDeviceGetReplacedRowsCount(device, cause) -> int:
    return 0


def hlmlDeviceGetReplacedRowsPendingStatus(device) -> int:
    return _faults().get("rows_pending", 0)


def hlmlDeviceGetMacAddrInfo(device):
    external = sum(1 << port for port in EXTERNAL_PORTS)
    return ((1 << NIC_PORTS) - 1, 0), (external, 0)


def hlmlDeviceNicGetLink(device, port: int) -> bool:
    if not 0 <= port < NIC_PORTS:
        raise HLMLError("HLML Error with code 2")
    return port != _faults().get("nic_down")


def hlmlDeviceGetCurrPCIELinkGeneration(device) -> int:
    return 4


def hlmlDeviceGetCurrPCIELinkWidth(device) -> int:
    return _faults().get("pcie_width", 16)
