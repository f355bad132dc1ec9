"""The Ascend NPU backend through torch_npu, with npu-smi telemetry.

Without an Ascend machine it is exercised through a stand-in ``torch_npu``
(tests/fakes) that declares itself with ``__hwbench_stand_in__``; results from
such a run are marked simulated and the compute runs on the CPU.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import re
from typing import Any

import torch

from hwbench.device.accelerator import AcceleratorBackend
from hwbench.device.kinds import KINDS
from hwbench.device.npu_smi import NpuSmiSampler
from hwbench.device.telemetry import TelemetrySampler
from hwbench.errors import SetupError

DEFAULT_TOOLKIT = "/usr/local/Ascend/ascend-toolkit"
DEFAULT_DRIVER = "/usr/local/Ascend/driver"


def import_torch_npu():
    """Import torch_npu or raise SetupError saying what is missing and the fix.

    hwbench switches torch's backend autoload off (hwbench/__init__.py), so this
    explicit import is where torch_npu's failures surface, with the cause."""
    try:
        return importlib.import_module("torch_npu")
    except ModuleNotFoundError as error:
        if error.name != "torch_npu":
            raise SetupError(f"--device npu: torch_npu cannot import its dependency {error.name}: {error}") from None
        torch_version = torch.__version__.split("+")[0]
        raise SetupError(
            f"--device npu: torch_npu is not installed (pip install torch-npu=={torch_version}, "
            "the version of the installed torch)"
        ) from None
    except (ImportError, OSError) as error:
        missing = re.search(r"(lib[\w.+-]+\.so[\w.]*)", str(error))
        what = missing.group(1) if missing else str(error)
        raise SetupError(
            f"--device npu: CANN runtime not found: {what} "
            f"(source {DEFAULT_TOOLKIT}/set_env.sh)"
        ) from None
    except RuntimeError as error:  # torch_npu raises RuntimeError for a torch it cannot share
        raise SetupError(_torch_npu_runtime_error(error)) from None


def _torch_npu_runtime_error(error: RuntimeError) -> str:
    """One line for a RuntimeError from ``import torch_npu``. The wheel's
    _check_device_conflict refuses a torch built for another accelerator
    ("Two accelerators cannot be used at the same time in PyTorch: npu and cuda")."""
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    conflict = re.search(r"Two accelerators cannot be used at the same time in PyTorch: npu and (\w+)", first_line)
    if conflict:
        torch_version = torch.__version__.split("+")[0]
        return (f"--device npu: torch_npu refuses this torch {torch.__version__}, a {conflict.group(1)} build; "
                f"install the CPU build of torch {torch_version} beside torch-npu "
                f"(pip install torch=={torch_version} --index-url https://download.pytorch.org/whl/cpu)")
    return f"--device npu: torch_npu failed to import: {first_line}"


def _read_version(paths: list[str], key: str) -> str | None:
    """The value of the first ``key=value`` (or ``key: value``) line (key matched case-insensitively, at the
    start of a line, so ``innerversion=`` or ``ascendhal_version=`` never pass for
    ``version=``) in the first of ``paths`` (globs) that has one. CANN's version.cfg
    writes ``toolkit_installed_version=[7.3.0.1.231:8.0.RC2]``, one bracket per installed
    release: the CANN version is the part after the colon of the last bracket."""
    line = re.compile(rf"^[ \t]*{re.escape(key)}[ \t]*[=:][ \t]*(\S[^\n]*?)[ \t]*$", re.IGNORECASE | re.MULTILINE)
    for pattern in paths:
        for path in sorted(glob.glob(pattern)):
            try:
                text = open(path, errors="replace").read()
            except OSError:
                continue
            match = line.search(text)
            if match:
                value = match.group(1)
                releases = re.findall(r"\[([^\]]+)\]", value)  # [package:CANN] or [CANN]
                return releases[-1].rsplit(":", 1)[-1] if releases else value
    return None


def _cann_version(toolkit: str) -> str | None:
    """CANN's version from the toolkit folder: version.cfg (the running, else the
    newest installed release), else ascend_toolkit_install.info (``version=8.0.RC2``)."""
    return (_read_version([f"{toolkit}/version.cfg"], "toolkit_running_version")
            or _read_version([f"{toolkit}/version.cfg"], "toolkit_installed_version")
            or _read_version([f"{toolkit}/*/ascend_toolkit_install.info", f"{toolkit}/ascend_toolkit_install.info"],
                             "version"))


class NpuBackend(AcceleratorBackend):
    name = "npu"
    device_type = "npu"
    dist_backend = KINDS["npu"].dist_backend
    deepspeed_accelerator = KINDS["npu"].deepspeed_accelerator

    def __init__(self) -> None:
        self.torch_npu = import_torch_npu()
        self._mark_stand_in(self.torch_npu)
        if not hasattr(torch, "npu"):
            raise SetupError("--device npu: torch_npu imported but torch.npu is missing; reinstall torch-npu")
        super().__init__(torch.npu)
        if self.device_count() == 0:
            raise SetupError(
                "--device npu: torch_npu sees no NPU; check npu-smi info and ASCEND_RT_VISIBLE_DEVICES"
            )

    @staticmethod
    def installed() -> bool:
        """torch_npu is installed (usable or not): an Ascend machine, or one meant to be."""
        return importlib.util.find_spec("torch_npu") is not None

    @staticmethod
    def unavailable_reason() -> str | None:
        """None when torch_npu imports and sees an NPU; otherwise why not."""
        try:
            import_torch_npu()
            if int(torch.npu.device_count()) > 0:  # type: ignore[attr-defined]  # added by torch_npu
                return None
            return "torch_npu sees no NPU (check npu-smi info and ASCEND_RT_VISIBLE_DEVICES)"
        except SetupError as error:
            return str(error).removeprefix("--device npu: ")
        except Exception as error:  # any driver or runtime trouble, named
            return f"torch_npu failed: {type(error).__name__}: {error}"

    def smi_device_id(self) -> int:
        """This rank's device id as npu-smi prints it (the NPU id of a 910B, the
        Phy-ID of an A3 die, the device id of a 310P/310B chip):
        ASCEND_RT_VISIBLE_DEVICES lists those ids and torch_npu numbers the
        listed ones from 0. Assumes logical id = physical id, as npu-smi info -m
        shows on hosts without phyid-remap."""
        return self.visible_id("ASCEND_RT_VISIBLE_DEVICES")

    def precision_problem(self, precision: str) -> str | None:
        if precision == "bf16" and not self.api.is_bf16_supported():
            return "this NPU has no bf16 support (Ascend 910 first generation); use --precision fp16"
        return None

    def telemetry_sampler(self, interval_s: float) -> TelemetrySampler:
        return NpuSmiSampler([self.smi_device_id()], interval_s)

    def driver(self) -> tuple[str | None, str | None]:
        if self.simulated:
            return None, "the device is simulated (a stand-in torch_npu on the host CPU)"
        version = _read_version([f"{DEFAULT_DRIVER}/version.info"], "version")
        if version is None:
            return None, f"{DEFAULT_DRIVER}/version.info names no version"
        return version, None

    def fingerprint(self) -> dict[str, Any]:
        toolkit = os.environ.get("ASCEND_TOOLKIT_HOME", f"{DEFAULT_TOOLKIT}/latest")
        return {
            "device_models": self.device_names(),
            "device_count": self.device_count(),
            "simulated": self.simulated,
            "torch_npu_version": getattr(self.torch_npu, "__version__", None),
            "cann_version": _cann_version(toolkit),
            "driver_version": _read_version([f"{DEFAULT_DRIVER}/version.info"], "version"),
            "hccl_version": _read_version([f"{toolkit}/*/hccl/version.info", f"{toolkit}/hccl/version.info"],
                                          "version"),
        }
