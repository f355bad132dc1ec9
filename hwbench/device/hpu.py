"""Intel Gaudi through ``habana_frameworks.torch`` (device ``hpu``, process group ``hccl``),
with HLML telemetry.

The bridge runs in one of two modes: lazy (operations gathered into graphs that run at each
``mark_step``) or eager (PT_HPU_LAZY_MODE=0). The result names the mode, and in lazy mode the
backend marks a step after every training step (Backend.step_done), inside the timed interval.

Without a Gaudi it is exercised through a stand-in ``habana_frameworks`` (tests/fakes/gaudi)
that declares itself with ``__hwbench_stand_in__``: results are then simulated and computed on
the host CPU."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from typing import Any

import torch

from hwbench.device.accelerator import AcceleratorBackend
from hwbench.device.base import MemoryStats
from hwbench.device.fingerprint import package_version
from hwbench.device.hlml import HlmlSampler, hlml_driver_version
from hwbench.device.kinds import KINDS
from hwbench.device.telemetry import TelemetrySampler
from hwbench.errors import SetupError

GAUDI_SOFTWARE = ("install the Intel Gaudi software's PyTorch packages (habana-torch-plugin, from Intel's Gaudi "
                  "installer or its PyTorch container)")
LAZY_ENV = "PT_HPU_LAZY_MODE"


def import_habana():
    """Import habana_frameworks.torch (it attaches torch.hpu) or raise SetupError naming
    what is missing."""
    try:
        return importlib.import_module("habana_frameworks.torch")
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] == "habana_frameworks":
            raise SetupError(f"--device hpu: habana_frameworks is not installed ({GAUDI_SOFTWARE})") from None
        raise SetupError(
            f"--device hpu: habana_frameworks cannot import its dependency {error.name}: {error}"
        ) from None
    except (ImportError, OSError) as error:
        missing = re.search(r"(lib[\w.+-]+\.so[\w.]*)", str(error))
        raise SetupError(
            f"--device hpu: the Gaudi runtime failed to load: {missing.group(1) if missing else error}"
        ) from None
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SetupError(f"--device hpu: habana_frameworks failed to import: {first}") from None


def execution_mode() -> tuple[str | None, str]:
    """("lazy" or "eager", how it was found), or (None, why not known)."""
    try:
        internal = importlib.import_module("habana_frameworks.torch.utils.internal")
        return ("lazy" if internal.is_lazy() else "eager"), "habana_frameworks.torch.utils.internal.is_lazy()"
    except Exception:
        pass
    value = os.environ.get(LAZY_ENV)
    if value in ("0", "1"):
        return ("lazy" if value == "1" else "eager"), f"{LAZY_ENV}={value}"
    return None, f"the bridge does not say, and {LAZY_ENV} is not set"


class HpuBackend(AcceleratorBackend):
    name = "hpu"
    dist_backend = KINDS["hpu"].dist_backend
    deepspeed_accelerator = KINDS["hpu"].deepspeed_accelerator

    def __init__(self) -> None:
        self.habana = import_habana()
        self._mark_stand_in(self.habana)
        if not self.simulated and importlib.util.find_spec("habana_frameworks.torch.distributed.hccl") is not None:
            importlib.import_module("habana_frameworks.torch.distributed.hccl")  # registers the hccl backend
        if not hasattr(torch, "hpu"):
            raise SetupError("--device hpu: habana_frameworks imported but torch.hpu is missing; reinstall it")
        super().__init__(torch.hpu)
        if self.device_count() == 0:
            raise SetupError("--device hpu: habana_frameworks sees no Gaudi; check hl-smi and HABANA_VISIBLE_MODULES")
        self.mode, self.mode_basis = execution_mode()

    @staticmethod
    def installed() -> bool:
        return importlib.util.find_spec("habana_frameworks") is not None

    @staticmethod
    def unavailable_reason() -> str | None:
        try:
            import_habana()
            if int(torch.hpu.device_count()) > 0:  # type: ignore[attr-defined]  # added by habana_frameworks
                return None
            return "habana_frameworks sees no Gaudi (check hl-smi and HABANA_VISIBLE_MODULES)"
        except SetupError as error:
            return str(error).removeprefix("--device hpu: ")
        except Exception as error:
            return f"habana_frameworks failed: {type(error).__name__}: {error}"

    def _set_device(self, local_rank: int) -> torch.device:
        self.local_index = local_rank
        if self.simulated:
            self.api.set_device(local_rank)
            return torch.device("cpu")
        return torch.device("hpu")  # the bridge gives each process its own module

    def step_done(self) -> None:
        if self.mode == "lazy":  # run the graph gathered during the step
            importlib.import_module("habana_frameworks.torch.core").mark_step()

    def module_id(self) -> int:
        """This rank's Gaudi as HLML numbers it: its entry in HABANA_VISIBLE_MODULES, else its
        local rank (module id = local index where no list is given)."""
        return self.visible_id("HABANA_VISIBLE_MODULES")

    def device_identity(self) -> dict[str, Any]:
        return {"hpu_mode": self.mode, "hpu_mode_basis": self.mode_basis}

    def memory_stats(self) -> MemoryStats:
        """The bridge's allocator statistics: MaxInUse (peak bytes in use) and Limit (bytes the
        allocator may use); it keeps no reserved peak, retry or OOM counts."""
        unmeasured: dict[str, str] = {}
        try:
            stats = dict(self.api.memory_stats())
        except Exception as error:
            stats, unmeasured["memory_stats"] = {}, f"{type(error).__name__}: {error}"
        peak, limit = stats.get("MaxInUse"), stats.get("Limit")
        for field, value in (("peak_allocated_bytes", peak), ("capacity_bytes", limit)):
            if value is None:
                unmeasured.setdefault(field, "torch.hpu.memory_stats() did not report it")
        for field in ("peak_reserved_bytes", "alloc_retries", "ooms"):
            unmeasured[field] = "the Gaudi allocator does not report it"
        return MemoryStats(
            peak_allocated_bytes=int(peak) if peak is not None else None,
            peak_reserved_bytes=None,
            capacity_bytes=int(limit) if limit is not None else None,
            alloc_retries=None,
            ooms=None,
            source="torch.hpu.memory_stats() (MaxInUse, Limit)",
            unmeasured=unmeasured,
        )

    def telemetry_sampler(self, interval_s: float) -> TelemetrySampler:
        return HlmlSampler([self.module_id()], interval_s)

    def driver(self) -> tuple[str | None, str | None]:
        if self.simulated:
            return None, "the device is simulated (a stand-in habana_frameworks on the host CPU)"
        version = hlml_driver_version()
        if version is None:
            return None, "HLML did not answer (habana-pyhlml missing or the Gaudi driver not loaded)"
        return version, None

    def fingerprint(self) -> dict[str, Any]:
        return {
            "device_models": self.device_names(),
            "device_count": self.device_count(),
            "simulated": self.simulated,
            "habana_frameworks_version": getattr(self.habana, "__version__", None)
            or package_version("habana-torch-plugin"),
            "driver_version": self.driver()[0],
            "hpu_mode": self.mode,
        }
