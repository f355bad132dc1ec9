"""hwbench: benchmark GPT training across NVIDIA GPUs, Ascend NPUs and CPUs.

The way one benchmark point travels (docs/architecture.md):
CLI -> RunSpec (hwbench.spec) -> worker (hwbench.harness.worker) using a device
backend (hwbench.device), a workload (hwbench.workload) and an engine
(hwbench.engine) -> RunResult written by hwbench.results.
"""

__version__ = "0.1.0"

# Version of the result-file layout (docs/results.md). Bump on any incompatible change.
RESULT_SCHEMA_VERSION = 1

# The Python API (hwbench.api, docs/api.md), imported on first use so that `import hwbench`
# and the command line stay quick.
_API = ("run", "sweep", "plan", "load_results", "report", "RunOptions", "RunResult")


def __getattr__(name: str):
    if name in _API:
        from hwbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'hwbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
