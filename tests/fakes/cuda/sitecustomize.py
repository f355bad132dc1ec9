"""STAND-IN for a CUDA build of torch on an NVIDIA H100 SXM5 80GB, for hwbench's tests only: it
drives no GPU.

With this folder and ../common on PYTHONPATH and HWBENCH_STANDIN_CUDA=1, Python imports this
module at start-up (site's sitecustomize hook) and it makes the installed CPU build of torch look
like a CUDA build: ``torch.version.cuda`` set (``torch.version.hip`` stays None, as on a real CUDA
build) and ``torch.cuda`` answering as CUDA does on an H100, over the host CPU. It marks
``torch.cuda.__hwbench_stand_in__``; hwbench then runs on the host CPU and marks every result
simulated. Beside it, ``pynvml/`` stands in for NVML's Python bindings (nvidia-ml-py).

What the device reports, and where each figure comes from:

* name 'NVIDIA H100 80GB HBM3', 81,559 MiB, PCI 00000000:18:00.0, CUDA 12.4: GPU 0 of the
  nvidia-smi table in NVIDIA/nccl issue #1264 ("Only ~783GByte/s out of theoretical 900GB/s HGX
  H100 SXM Nvlink4"; driver 550.54.15, CUDA Version 12.4); CUDA_VISIBLE_DEVICES selects devices
  (unset: one).
* compute capability 9.0 and 132 SMs: NVIDIA's CUDA GPU list (developer.nvidia.com/cuda-gpus,
  H100: 9.0) and the H100 Tensor Core GPU Architecture white paper (H100 SXM5: 132 SMs).
* the UUID and memory_stats(): fixed test values, never a measurement.
"""

import os

if os.environ.get("HWBENCH_STANDIN_CUDA") == "1":
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # as hwbench sets it; torch is imported here, first
    import types

    import torch
    from standin_device import replace_torch_cuda

    MIB = 2**20
    PROPERTIES = types.SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", total_memory=81559 * MIB, major=9, minor=0, multi_processor_count=132,
        pci_domain_id=0, pci_bus_id=0x18, pci_device_id=0, uuid="5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9")
    RECORDED_MEMORY_STATS = {"allocated_bytes.all.peak": 1_234_567_936, "reserved_bytes.all.peak": 2_147_483_648,
                             "num_alloc_retries": 0, "num_ooms": 0}

    torch.version.cuda = "12.4"
    replace_torch_cuda(torch, "CUDA_VISIBLE_DEVICES", PROPERTIES, RECORDED_MEMORY_STATS)
