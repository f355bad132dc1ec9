"""Measured ceilings (`hwbench calibrate`): the GEMM rate and copy bandwidth a device
really reaches (measure.py), kept per device model and driver in a JSON store
(store.py) that a run reads when its result is assembled (docs/methodology.md,
"Measured ceiling").

The defaults of a calibration live here, without torch, so that `hwbench calibrate --help`
names them without importing it.
"""

# every device kind (hwbench.device.kinds.DEVICE_KINDS) has its defaults: the accelerators share the GPU's
_ACCELERATORS = ("cuda", "npu", "rocm", "hpu")
DEFAULT_SIZES = {"cpu": (512, 1024, 2048), **dict.fromkeys(_ACCELERATORS, (4096, 8192, 16384))}
DEFAULT_PRECISIONS = {"cpu": ("fp32", "bf16"), **dict.fromkeys(_ACCELERATORS, ("fp32", "bf16", "fp16"))}
DEFAULT_COPY_BYTES = {"cpu": 256 * 2**20, **dict.fromkeys(_ACCELERATORS, 2**30)}
DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 3
# Each size is timed for at least this long, its repetitions together: a training step runs for
# seconds at the clocks sustained work settles at, and a burst of a few milliseconds is not that.
DEFAULT_MIN_TIME_S = 1.0
# Seconds of the largest GEMM before the first measurement, so the device starts at the clocks
# and temperature of sustained work rather than idle ones.
DEFAULT_DEVICE_WARMUP_S = 2.0
