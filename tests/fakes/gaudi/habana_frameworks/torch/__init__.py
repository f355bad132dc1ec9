"""STAND-IN for ``habana_frameworks.torch`` (Intel Gaudi's PyTorch bridge), for hwbench's tests
only: it drives no Gaudi.

Importing it attaches ``torch.hpu`` (the torch.cuda-like API the real bridge adds) over the
host CPU and declares itself with ``__hwbench_stand_in__``; hwbench then runs on the host CPU
and marks every result simulated. What it reports:

* a Gaudi 2 by default, a Gaudi 3 with HWBENCH_STANDIN_GAUDI=gaudi3, one device per module
  listed in HABANA_VISIBLE_MODULES (unset: one);
* device name 'GAUDI2' or 'GAUDI3', as torch.hpu.get_device_name names them (Intel's
  neural-compressor tells the two apart by these names: test/3x/torch/algorithms/fp8_quant/
  test_hpu_utils.py, is_gaudi2/is_gaudi3);
* memory_stats() with the bridge's keys (Limit, InUse, MaxInUse, NumAllocs, ...; Intel Gaudi
  documentation, "Memory Stats APIs"), fixed values: Limit 98,304 MiB for a Gaudi 2, as hl-smi
  prints its memory (optimum-habana issue #614), 131,072 MiB for a Gaudi 3 (its 128 GB HBM2e in
  Intel's Gaudi 3 spec table, Hot Chips 2024, counted in MiB as hl-smi counts the Gaudi 2's
  96 GB); MaxInUse 1,234,567,936 bytes. The HLML stand-in (pyhlml) answers with its Gaudi 2
  figures whatever the model: run a Gaudi 3 with --no-telemetry;
* lazy mode by default (PT_HPU_LAZY_MODE=0 selects eager), through
  habana_frameworks.torch.utils.internal.is_lazy();
* habana_frameworks.torch.core.mark_step() appends a line to the file named by
  HWBENCH_STANDIN_MARK_STEP_LOG, so a test can count the steps hwbench marked.
"""

import os
import types

import torch
from standin_device import device_api

__hwbench_stand_in__ = True
__version__ = "1.13.0+standin"

MIB = 2**20
MODELS = {"gaudi2": ("GAUDI2", 98304 * MIB), "gaudi3": ("GAUDI3", 131072 * MIB)}  # name, memory
MODEL = os.environ.get("HWBENCH_STANDIN_GAUDI", "gaudi2")
if MODEL not in MODELS:
    raise ImportError(f"stand-in habana_frameworks: HWBENCH_STANDIN_GAUDI={MODEL!r}; accepted: {', '.join(MODELS)}")
NAME, MEMORY_BYTES = MODELS[MODEL]
PROPERTIES = types.SimpleNamespace(name=NAME, total_memory=MEMORY_BYTES)
RECORDED_MEMORY_STATS = {"Limit": MEMORY_BYTES, "InUse": 805_306_368, "MaxInUse": 1_234_567_936, "NumAllocs": 120,
                         "NumFrees": 40, "ActiveAllocs": 80, "MaxAllocSize": 268_435_456}

hpu = device_api("torch.hpu", "HABANA_VISIBLE_MODULES", NAME, PROPERTIES, RECORDED_MEMORY_STATS)
torch.hpu = hpu
