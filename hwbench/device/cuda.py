"""The CUDA backend (NVIDIA GPUs), with NVML telemetry.

Without an NVIDIA GPU it is exercised through a stand-in (tests/fakes/cuda) that makes a CPU
build of torch look like a CUDA build and marks ``torch.cuda.__hwbench_stand_in__``: results
are then simulated and computed on the host CPU (as the ROCm backend's, which shares this code)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from hwbench.device.accelerator import AcceleratorBackend
from hwbench.device.base import HostSyncCount
from hwbench.device.kinds import KINDS, choose_allocator_setting
from hwbench.device.nvml import (
    CudaDeviceIds,
    NvmlSampler,
    nvml_driver_version,
    nvml_other_processes,
    nvml_power_limit_w,
    pci_bus_id,
)
from hwbench.device.telemetry import TelemetrySampler
from hwbench.errors import SetupError

SYNC_WARNING = "called a synchronizing CUDA operation"  # c10/cuda warn_or_error_on_sync
SYNC_SITES_KEPT = 5


def expandable_segments_in_effect(memory_module: Any) -> bool | None:
    """Whether the initialised allocator runs with expandable segments, as its snapshot reports
    them (``torch.cuda.memory``, a parameter for tests); None where this torch does not say."""
    try:
        settings = memory_module._snapshot().get("allocator_settings") or {}
    except Exception:
        return None
    value = settings.get("expandable_segments")
    return value if isinstance(value, bool) else None


def count_sync_warnings(caught: list[warnings.WarningMessage], record: HostSyncCount) -> None:
    """Count torch's sync-debug warnings into ``record`` (with their first call sites) and
    pass every other warning on, as if it had not been caught."""
    for warning in caught:
        if SYNC_WARNING in str(warning.message):
            record.count = (record.count or 0) + 1
            site = f"{warning.filename}:{warning.lineno}"
            if len(record.where) < SYNC_SITES_KEPT and site not in record.where:
                record.where.append(site)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def turn_tf32_off(backends: Any) -> str:
    """Make fp32 matmuls (cuBLAS) and cuDNN convolutions and RNNs use full fp32, through
    ``backends`` (the ``torch.backends`` namespace, a parameter so that tests need no GPU).
    Returns the API used: "fp32_precision" or "allow_tf32".

    torch 2.9 added the per-backend ``fp32_precision`` settings and deprecated the
    ``allow_tf32`` flags: setting a legacy flag warns there, and once the two APIs are mixed
    (a library using the new one, hwbench the old) reading a legacy flag raises. So the new
    API is used wherever it exists, the legacy flags only on older torch.
    """
    matmul, cudnn = backends.cuda.matmul, backends.cudnn
    if hasattr(matmul, "fp32_precision") and hasattr(cudnn, "conv"):
        matmul.fp32_precision = "ieee"
        cudnn.fp32_precision = "ieee"  # the parent of conv and rnn
        # Set one by one as well: a setting of conv or rnn overrides their parent's.
        cudnn.conv.fp32_precision = "ieee"
        cudnn.rnn.fp32_precision = "ieee"
        return "fp32_precision"
    matmul.allow_tf32 = False
    cudnn.allow_tf32 = False
    return "allow_tf32"


def nccl_version() -> str | None:
    """The NCCL (on a ROCm build: RCCL) version torch was built with."""
    try:
        return ".".join(str(part) for part in torch.cuda.nccl.version())
    except Exception:
        return None


class CudaBackend(AcceleratorBackend):
    name = "cuda"
    device_type = "cuda"
    bound = False  # prepare_process bound this process to its GPU
    dist_backend = KINDS["cuda"].dist_backend
    deepspeed_accelerator = KINDS["cuda"].deepspeed_accelerator

    def __init__(self) -> None:
        self.allocator_settings = self._choose_allocator_setting()  # first: before CUDA can be initialised
        if torch.version.cuda is None:
            raise SetupError(
                f"--device cuda: this torch build ({torch.__version__}) has no CUDA support; "
                "install a CUDA build of torch: on Linux, `pip install torch==<version>` from PyPI is one "
                "(README, 'Which torch you get')"
            )
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            raise SetupError(
                "--device cuda: torch sees no CUDA device; check nvidia-smi, the driver "
                "and CUDA_VISIBLE_DEVICES"
            )
        self._mark_stand_in(torch.cuda)
        super().__init__(torch.cuda)

    @staticmethod
    def installed() -> bool:
        """A CUDA build of torch on a machine with the NVIDIA driver loaded: a GPU machine."""
        return torch.version.cuda is not None and os.path.exists("/proc/driver/nvidia/version")

    @staticmethod
    def unavailable_reason() -> str | None:
        """None when torch sees a CUDA device; otherwise why not."""
        if torch.version.cuda is None:
            return f"this torch build ({torch.__version__}) has no CUDA support"
        try:
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                return None
        except Exception as error:  # a broken driver raises from is_available on some versions
            return f"CUDA failed: {type(error).__name__}: {error}"
        return "torch sees no CUDA device (check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES)"

    def prepare_process(self, local_rank: int = 0, local_world_size: int = 1,
                        threads: int | None = None) -> torch.device:
        device = super().prepare_process(local_rank, local_world_size, threads)
        self.bound = True
        # fp32 runs are measured against the non-tensor fp32 peak: keep TF32 off. The API used
        # follows from the torch version the fingerprint records, so tuning does not repeat it.
        turn_tf32_off(torch.backends)
        self.tuning = {"tf32": False, "allocator": self.allocator_settings,
                       "expandable_segments": expandable_segments_in_effect(torch.cuda.memory)}
        return device

    def _choose_allocator_setting(self) -> str | None:
        """The kind's allocator setting made (or the user's kept), before any call that could
        initialise the device, in this process and in every rank; None where the kind has none."""
        allocator = KINDS[self.name].allocator
        if allocator is None:
            return None
        return choose_allocator_setting(allocator, os.environ, torch.cuda.is_initialized())

    def counting_host_syncs(self) -> contextlib.AbstractContextManager[HostSyncCount]:
        if self.simulated:  # no sync debug mode without a device
            return contextlib.nullcontext(HostSyncCount(
                reason=f"the device is simulated: torch's sync debug mode, which counts the host's waits, needs a "
                       f"{self.name} device"))
        return self._counting_host_syncs()

    @contextlib.contextmanager
    def _counting_host_syncs(self) -> Iterator[HostSyncCount]:
        """torch's sync debug mode, set to warn, flags every operation that makes the host wait
        for the stream (.item(), .cpu(), bool() of a tensor, nonzero, a copy to pageable host
        memory...; not torch.cuda.synchronize(), which the timed region's edges call)."""
        record = HostSyncCount(count=0)
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield record
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        count_sync_warnings(caught, record)

    def to_device(self, host_tensor: torch.Tensor) -> torch.Tensor:
        # From pageable memory the copy would block the host until the stream drains,
        # serialising host and GPU once per micro-batch; pinned memory (cached by
        # torch's host allocator) lets it queue like a kernel.
        if self.simulated:  # no pinned memory without a device
            return host_tensor
        return host_tensor.pin_memory().to(self.torch_device, non_blocking=True)

    def precision_problem(self, precision: str) -> str | None:
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            return "this GPU has no bf16 support (compute capability below 8.0); use --precision fp16"
        return None

    def slow_precision(self, precision: str) -> str | None:
        # fp16 runs at full rate (or more) from compute capability 7.0 (tensor cores), on the
        # P100 (6.0) and on the Tegra 5.3/6.2 parts; the other Maxwell and Pascal GPUs (6.1: GTX 10x0,
        # P40, P4) run fp16 arithmetic at 1/64 of fp32 (NVIDIA CUDA C++ Programming Guide,
        # "Arithmetic Instructions", throughput table).
        if precision != "fp16":
            return None
        capability = torch.cuda.get_device_capability(self.local_index)
        if capability >= (7, 0) or capability in ((5, 3), (6, 0), (6, 2)):
            return None
        return (f"this GPU (compute capability {capability[0]}.{capability[1]}) runs fp16 arithmetic at a "
                "fraction of its fp32 rate")

    def fp8_units(self, block_scaled: bool) -> tuple[bool | None, str]:
        # FP8 tensor cores from compute capability 8.9 (Ada) and 9.0 (Hopper); the MX formats' block-scaled
        # GEMMs on the data-centre Blackwell GPUs, compute capability 10.x (torchtitan's and torchao's checks)
        major, minor = torch.cuda.get_device_capability(self.local_index)
        where = f"this GPU (compute capability {major}.{minor})"
        if block_scaled:
            return (True, f"{where} has MXFP8 tensor cores") if major == 10 else (
                False, f"{where} has no MXFP8 tensor cores (compute capability 10.x: B200, GB200)")
        return (True, f"{where} has FP8 tensor cores") if (major, minor) >= (8, 9) else (
            False, f"{where} has no FP8 tensor cores (compute capability 8.9 or more: L40S, H100, H200, B200)")

    def bus_id(self) -> str | None:
        props = torch.cuda.get_device_properties(self.local_index)
        return pci_bus_id(*(getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")))

    def _nvml_ids(self) -> CudaDeviceIds:
        # The UUID and PCI address find this GPU in NVML, whose numbering ignores CUDA_VISIBLE_DEVICES.
        uuid = getattr(torch.cuda.get_device_properties(self.local_index), "uuid", None)
        return CudaDeviceIds(cuda_index=self.local_index, uuid=str(uuid) if uuid is not None else None,
                             pci_bus_id=self.bus_id())

    def telemetry_sampler(self, interval_s: float) -> TelemetrySampler:
        return NvmlSampler([self._nvml_ids()], interval_s)

    def power_limit_watts(self) -> tuple[float | None, str]:
        return nvml_power_limit_w(self._nvml_ids())

    def other_processes(self) -> tuple[list[dict[str, Any]] | None, str | None]:
        # bound to its GPU by prepare_process (set_device initialises CUDA there): NVML lists this process
        return nvml_other_processes(self._nvml_ids(), os.getpid(), computing=self.bound)

    def driver(self) -> tuple[str | None, str | None]:
        version = nvml_driver_version()
        if version is None:
            return None, "NVML did not answer (nvidia-ml-py missing or the driver unreadable)"
        return version, None

    def fingerprint(self) -> dict[str, Any]:
        count = self.device_count()
        props = [torch.cuda.get_device_properties(i) for i in range(count)]
        return {
            "device_models": self.device_names(),
            "device_count": count,
            "compute_capability": [f"{p.major}.{p.minor}" for p in props],
            "driver_version": nvml_driver_version(),
            "cuda_version": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version(),
            "nccl_version": nccl_version(),
        }
