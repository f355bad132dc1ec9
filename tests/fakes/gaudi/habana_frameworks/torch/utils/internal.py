"""STAND-IN for habana_frameworks.torch.utils.internal: the execution mode."""

import os


def is_lazy() -> bool:
    return os.environ.get("PT_HPU_LAZY_MODE", "1") == "1"
