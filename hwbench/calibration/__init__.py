"""Measured ceilings (`hwbench calibrate`): the GEMM rate and copy bandwidth a device
really reaches (measure.py), kept per device model and driver in a JSON store
(store.py) that a run reads when its result is assembled (docs/methodology.md,
"Measured ceiling").

The defaults of a calibration are read here from the device-kind registry, without torch, so
that `hwbench calibrate --help` names them without importing it.
"""

from hwbench.device.kinds import KINDS

# each kind's defaults, from its registry entry (device/kinds.py)
DEFAULT_SIZES = {name: kind.calibration.sizes for name, kind in KINDS.items()}
DEFAULT_PRECISIONS = {name: kind.calibration.precisions for name, kind in KINDS.items()}
DEFAULT_COPY_BYTES = {name: kind.calibration.copy_bytes for name, kind in KINDS.items()}
DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 3
# Each size is timed for at least this long, its repetitions together: a training step runs for
# seconds at the clocks sustained work settles at, and a burst of a few milliseconds is not that.
DEFAULT_MIN_TIME_S = 1.0
# Seconds of the largest GEMM before the first measurement, so the device starts at the clocks
# and temperature of sustained work rather than idle ones.
DEFAULT_DEVICE_WARMUP_S = 2.0
