"""STAND-IN for ``habana_frameworks.torch`` (Intel Gaudi's PyTorch bridge), for hwbench's tests
only: it drives no Gaudi.

Importing it attaches ``torch.hpu`` (the torch.cuda-like API the real bridge adds) over the
host CPU and declares itself with ``__hwbench_stand_in__``; hwbench then runs on the host CPU
and marks every result simulated. What it reports:

* device name 'GAUDI2' (torch.hpu.get_device_name on a Gaudi 2), one device per module listed
  in HABANA_VISIBLE_MODULES (unset: one);
* memory_stats() with the bridge's keys (Limit, InUse, MaxInUse, NumAllocs, ...; Intel Gaudi
  documentation, "Memory Stats APIs"), fixed values: Limit 98,304 MiB as hl-smi prints a
  Gaudi 2's memory (optimum-habana issue #614), MaxInUse 1,234,567,936 bytes;
* lazy mode by default (PT_HPU_LAZY_MODE=0 selects eager), through
  habana_frameworks.torch.utils.internal.is_lazy();
* habana_frameworks.torch.core.mark_step() appends a line to the file named by
  HWBENCH_STANDIN_MARK_STEP_LOG, so a test can count the steps hwbench marked.
"""

import types

import torch
from standin_device import device_api

__hwbench_stand_in__ = True
__version__ = "1.13.0+standin"

MIB = 2**20
PROPERTIES = types.SimpleNamespace(name="GAUDI2", total_memory=98304 * MIB)
RECORDED_MEMORY_STATS = {"Limit": 98304 * MIB, "InUse": 805_306_368, "MaxInUse": 1_234_567_936, "NumAllocs": 120,
                         "NumFrees": 40, "ActiveAllocs": 80, "MaxAllocSize": 268_435_456}

hpu = device_api("torch.hpu", "HABANA_VISIBLE_MODULES", "GAUDI2", PROPERTIES, RECORDED_MEMORY_STATS)
torch.hpu = hpu
