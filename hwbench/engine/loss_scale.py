"""fp16 loss scaling as Megatron and DeepSpeed do it, decided on the device.

The scaler decides from the global gradient norm, which every rank computes
the same (hwbench.engine.native), so all ranks of any layout skip the same
steps; torch's GradScaler decides per rank from its own gradients, which
would let pipeline stages or tensor-parallel shards disagree.

Its state (the scale, the clean steps since the last change, the overflows
still tolerated) lives on the device as 0-dim tensors and is updated with
torch.where: reading whether a step overflowed would make the host wait for
the device once per step, and every published point is fp16, so the launch
gap that wait opens would be counted as step time. The engine reads the
overflow flag on the device too (fused AdamW's ``found_inf``).
"""

from __future__ import annotations

import torch

LOSS_SCALE_WINDOW = 1000  # clean steps before the scale doubles (Megatron, DeepSpeed default)
HYSTERESIS = 2  # overflows tolerated before the scale halves (same defaults)
MIN_LOSS_SCALE = 1.0


def overflow_flag(grad_norm: torch.Tensor) -> torch.Tensor:
    """1.0 where the global gradient norm is not finite (an fp16 overflow), else 0.0: a 0-dim
    float32 tensor on the norm's device, the form fused AdamW's ``found_inf`` takes."""
    return torch.logical_not(torch.isfinite(grad_norm)).to(torch.float32).reshape(())


class LossScaler:
    """Dynamic: halve after HYSTERESIS overflows, double after LOSS_SCALE_WINDOW clean
    steps, never below MIN_LOSS_SCALE. Fixed (``dynamic=False``): the scale never
    changes, overflowed steps are still skipped.

    ``scale`` and ``inverse_scale`` are 0-dim float32 tensors on ``device``. ``update``
    replaces them with new tensors rather than writing into them, so a step's own
    ``scale`` tensor keeps the value it used, to be read after the timed loop."""

    def __init__(self, initial_scale: float, dynamic: bool, device: torch.device | str = "cpu") -> None:
        self.dynamic = dynamic
        self.scale = torch.tensor(float(initial_scale), dtype=torch.float32, device=device)
        self.inverse_scale = 1.0 / self.scale
        self._clean_steps = torch.zeros((), dtype=torch.int32, device=device)
        self._hysteresis_left = torch.full((), HYSTERESIS, dtype=torch.int32, device=device)

    def update(self, found_inf: torch.Tensor) -> None:
        """The state after a step whose overflow flag (``overflow_flag``) is ``found_inf``."""
        if not self.dynamic:
            return
        overflowed = found_inf > 0
        clean_steps = torch.where(overflowed, 0, self._clean_steps + 1)
        hysteresis_left = self._hysteresis_left - overflowed.to(torch.int32)
        halve = overflowed & (hysteresis_left <= 0)  # and every overflow after, until the scale grows
        grow = clean_steps == LOSS_SCALE_WINDOW
        halved = torch.clamp(self.scale / 2.0, min=MIN_LOSS_SCALE)
        self.scale = torch.where(halve, halved, torch.where(grow, self.scale * 2.0, self.scale))
        self.inverse_scale = 1.0 / self.scale
        self._hysteresis_left = torch.where(grow, HYSTERESIS, hysteresis_left)
        self._clean_steps = torch.where(grow, 0, clean_steps)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The scale and the counters, as a checkpoint holds them (the live tensors)."""
        return {"scale": self.scale, "clean_steps": self._clean_steps, "hysteresis_left": self._hysteresis_left}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        device = self.scale.device
        self.scale = state["scale"].to(device=device, dtype=torch.float32)
        self.inverse_scale = 1.0 / self.scale
        self._clean_steps = state["clean_steps"].to(device=device, dtype=torch.int32)
        self._hysteresis_left = state["hysteresis_left"].to(device=device, dtype=torch.int32)
