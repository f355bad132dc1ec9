"""Measured ceilings (`hwbench calibrate`): the GEMM rate and copy bandwidth a device
really reaches (measure.py), kept per device model and driver in a JSON store
(store.py) that a run reads when its result is assembled (docs/methodology.md,
"Measured ceiling")."""
