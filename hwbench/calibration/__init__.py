"""Measured ceilings (`hwbench calibrate`): the GEMM rate and copy bandwidth a device
really reaches (measure.py), kept per device model and driver in a JSON store
(store.py) that a run reads when its result is assembled (docs/methodology.md,
"Measured ceiling").

The defaults of a calibration live here, without torch, so that `hwbench calibrate --help`
names them without importing it.
"""

DEFAULT_SIZES = {"cpu": (512, 1024, 2048), "cuda": (4096, 8192, 16384), "npu": (4096, 8192, 16384)}
DEFAULT_PRECISIONS = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "bf16", "fp16"), "npu": ("fp32", "bf16", "fp16")}
DEFAULT_COPY_BYTES = {"cpu": 256 * 2**20, "cuda": 2**30, "npu": 2**30}
DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 3
