"""The native engine: plain torch on one device, with gradient accumulation,
autocast mixed precision and fp16 loss scaling.

Parallel layouts (DDP, FSDP2, DTensor TP, pipelining) compose on top of this
same step (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import torch
from torch import nn

from hwbench.device import Backend
from hwbench.engine.optim import build_optimizer, learning_rate
from hwbench.spec import RunSpec
from hwbench.workload.data import Batch
from hwbench.workload.model import lm_loss


@dataclasses.dataclass
class StepOutcome:
    """What one optimizer step leaves on the device (read after the timed loop,
    so the loop never waits for the host)."""

    loss: torch.Tensor  # mean loss over the global batch, detached
    grad_norm: torch.Tensor  # before clipping; not finite when fp16 overflowed
    lr: float
    loss_scale: float | None


class NativeEngine:
    def __init__(self, model: nn.Module, spec: RunSpec, backend: Backend) -> None:
        self.spec = spec
        self.backend = backend
        self.model = model
        self.model.train()
        self.optimizer = build_optimizer(model, spec.optimizer, backend.optimizer_options())
        self.forward: Callable[..., torch.Tensor] = torch.compile(model) if spec.compile else model
        self.scaler = None
        if spec.precision == "fp16":
            dynamic = spec.loss_scale is None
            init_scale = float(2 ** spec.initial_scale_power) if dynamic else float(spec.loss_scale)
            self.scaler = backend.grad_scaler(init_scale, dynamic)
        self.iteration = 0

    def train_step(self, next_batch: Callable[[], Batch]) -> StepOutcome:
        """One optimizer step over the global batch (micro-batches accumulated)."""
        self.iteration += 1
        lr = learning_rate(self.spec.optimizer, self.iteration)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        accumulation = self.spec.gradient_accumulation_steps
        total_loss = torch.zeros((), device=self.backend.torch_device)
        for _ in range(accumulation):
            tokens, labels = next_batch()
            with self.backend.autocast(self.spec.precision):
                loss = lm_loss(self.forward(tokens), labels) / accumulation
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            total_loss += loss.detach()
        scale = self.scaler.get_scale() if self.scaler else None
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.optimizer.clip_grad)
        if self.scaler:
            self.scaler.step(self.optimizer)  # skipped when the gradients overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(loss=total_loss, grad_norm=grad_norm.detach(), lr=lr, loss_scale=scale)

    @torch.no_grad()
    def evaluate(self, batches: Iterable[Batch]) -> tuple[float, int]:
        """Token-weighted mean loss over ``batches`` and the token count, as
        Megatron's validation computes it (sum of loss x tokens / tokens)."""
        self.model.eval()
        total = torch.zeros((), device=self.backend.torch_device, dtype=torch.float64)
        tokens = 0
        try:
            for inputs, labels in batches:
                with self.backend.autocast(self.spec.precision):
                    loss = lm_loss(self.model(inputs), labels)
                total += loss.double() * labels.numel()
                tokens += labels.numel()
        finally:
            self.model.train()
        return (total / max(tokens, 1)).item(), tokens
