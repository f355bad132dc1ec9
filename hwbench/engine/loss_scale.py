"""fp16 loss scaling as Megatron and DeepSpeed do it.

The scaler decides from the global gradient norm, which every rank computes
the same (hwbench.engine.native), so all ranks of any layout skip the same
steps; torch's GradScaler decides per rank from its own gradients, which
would let pipeline stages or tensor-parallel shards disagree.
"""

from __future__ import annotations

LOSS_SCALE_WINDOW = 1000  # clean steps before the scale doubles (Megatron, DeepSpeed default)
HYSTERESIS = 2  # overflows tolerated before the scale halves (same defaults)
MIN_LOSS_SCALE = 1.0


class LossScaler:
    """Dynamic: halve after HYSTERESIS overflows, double after LOSS_SCALE_WINDOW
    clean steps. Fixed (``dynamic=False``): the scale never changes, overflowed
    steps are still skipped."""

    def __init__(self, initial_scale: float, dynamic: bool) -> None:
        self.scale = float(initial_scale)
        self.dynamic = dynamic
        self._clean_steps = 0
        self._hysteresis_left = HYSTERESIS

    def update(self, overflowed: bool) -> None:
        if not self.dynamic:
            return
        if overflowed:
            self._clean_steps = 0
            self._hysteresis_left -= 1
            if self._hysteresis_left <= 0:
                self.scale = max(self.scale / 2.0, MIN_LOSS_SCALE)
        else:
            self._clean_steps += 1
            if self._clean_steps == LOSS_SCALE_WINDOW:
                self._clean_steps = 0
                self._hysteresis_left = HYSTERESIS
                self.scale *= 2.0
