"""hwbench: benchmark GPT training across NVIDIA and AMD GPUs, Ascend NPUs, Intel Gaudi and CPUs.

The way one benchmark point travels (docs/architecture.md):
CLI -> RunSpec (hwbench.spec) -> worker (hwbench.harness.worker) using a device
backend (hwbench.device), a workload (hwbench.workload) and an engine
(hwbench.engine) -> RunResult (hwbench.result) written to a file.
"""

import os

# Before any `import torch` in hwbench (the CLI, `python -m hwbench` and torchrun's
# `--module hwbench` ranks all enter through this file): torch_npu registers itself
# as a torch backend that plain `import torch` loads, and on a host without CANN that
# load raises "Failed to load the backend extension: torch_npu" before hwbench can
# say why, even for --device cpu. hwbench imports torch_npu itself where it is
# wanted (--device npu or auto, hwbench/device/npu.py) and reports its failure in
# one line. Children (torchrun ranks) inherit the switch. docs/npu.md.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

__version__ = "0.1.0"

# Version of the result-file layout (docs/results.md). Bump on any incompatible change, with
# the step that brings older files to it (hwbench.result.upgrade.UPGRADES).
RESULT_SCHEMA_VERSION = 4

# The Python API (hwbench.api, docs/api.md), imported on first use so that `import hwbench`
# and the command line stay quick.
_API = ("run", "sweep", "plan", "load_results", "write_report", "RunOptions", "RunResult",
        "export", "archive", "verify_archive", "preflight", "accept", "baseline_save")


def __getattr__(name: str):
    if name in _API:
        from hwbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'hwbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
