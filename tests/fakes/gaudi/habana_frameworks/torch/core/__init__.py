"""STAND-IN for habana_frameworks.torch.core: mark_step() logs each call (see ../__init__.py)."""

import os


def mark_step() -> None:
    log = os.environ.get("HWBENCH_STANDIN_MARK_STEP_LOG")
    if log:
        with open(log, "a") as file:
            file.write(f"{os.getpid()}\n")
