"""STAND-IN for a ROCm build of torch on AMD Instinct MI300X GPUs, for hwbench's tests
only: it drives no GPU.

With this folder on PYTHONPATH and HWBENCH_STANDIN_ROCM=1, Python imports this module at
start-up (site's sitecustomize hook) and it makes the installed CPU build of torch look like
a ROCm build: ``torch.version.hip`` set (``torch.version.cuda`` stays None, as on a real ROCm
build) and ``torch.cuda`` answering as HIP does on an MI300X, over the host CPU. It marks
``torch.cuda.__hwbench_stand_in__``; hwbench then runs on the host CPU and marks every result
simulated. Beside it, ``amdsmi/`` stands in for AMD SMI's Python library.

What the device reports, and where each figure comes from:

* name 'AMD Instinct MI300X', gcnArchName 'gfx942:sramecc+:xnack-', 304 compute units:
  HIP's device name and architecture for the MI300X, as ROCm's documentation lists them
  (rocm.docs.amd.com, "AMD GPU specifications": MI300X, CDNA3, LLVM target gfx942, 304 CUs,
  192 GiB); HIP_VISIBLE_DEVICES selects devices (unset: one).
* HIP 6.4 / RCCL 2.22.3: a ROCm 6.4 release's versions (fixed; tests compare with them).
* memory_stats(): fixed recorded values, never a measurement.
"""

import os

if os.environ.get("HWBENCH_STANDIN_ROCM") == "1":
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # as hwbench sets it; torch is imported here, first
    import types

    import torch
    from standin_device import replace_torch_cuda

    GIB = 2**30
    PROPERTIES = types.SimpleNamespace(
        name="AMD Instinct MI300X", gcnArchName="gfx942:sramecc+:xnack-", multi_processor_count=304,
        total_memory=192 * GIB, major=9, minor=4, pci_domain_id=0, pci_bus_id=0x0C, pci_device_id=0,
        uuid="GPU-a5c1d2e3f4051627")
    RECORDED_MEMORY_STATS = {"allocated_bytes.all.peak": 1_234_567_936, "reserved_bytes.all.peak": 2_147_483_648,
                             "num_alloc_retries": 0, "num_ooms": 0}
    HIP_VERSION = "6.4.43482-0f2d60242"
    RCCL_VERSION = (2, 22, 3)

    torch.version.hip = HIP_VERSION
    replace_torch_cuda(torch, "HIP_VISIBLE_DEVICES", PROPERTIES, RECORDED_MEMORY_STATS)
    torch.cuda.nccl.version = lambda: RCCL_VERSION
