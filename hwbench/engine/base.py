"""What every engine gives the harness: one optimizer step, a validation pass,
and a description of itself for the result.

An engine owns the model, the optimizer and the parallel wrapping of both; the
worker (hwbench.harness.worker) only calls these three methods, so the timed
loop is the same for the native engine and the DeepSpeed one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Protocol

import torch

from hwbench.workload.data import Batch


@dataclasses.dataclass
class StepOutcome:
    """What one optimizer step leaves behind. Tensors stay on the device and are
    read after the timed loop, so the loop never waits for the host."""

    loss: torch.Tensor  # mean loss over this rank's share of the global batch (0-dim, detached);
    #                     NaN on pipeline stages that do not compute the loss
    grad_norm: torch.Tensor  # global norm before clipping (0-dim); not finite when fp16 overflowed
    lr: float  # the learning rate this step used
    loss_scale: float | None  # fp16 loss scale this step used; None without fp16
    skipped: bool  # the optimizer step was skipped (fp16 overflow)


class Engine(Protocol):
    def train_step(self, next_batch: Callable[[], Batch]) -> StepOutcome:
        """One optimizer step over this rank's share of the global batch; calls
        ``next_batch`` once per micro-batch (gradient_accumulation_steps times)."""

    def evaluate(self, batches: Iterable[Batch]) -> tuple[float, int]:
        """Token-weighted mean loss over ``batches`` on every data-parallel rank
        together, and the global token count (the same on every rank)."""

    def describe(self) -> dict[str, Any]:
        """The engine's settings as the result records them (``engine`` key)."""

    def close(self) -> None:
        """Release what the engine set up for itself (a one-rank process group)."""
