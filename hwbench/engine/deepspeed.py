"""The DeepSpeed engine: data parallelism over the whole world with ZeRO 0-3
(``--engine deepspeed --zero N``), as Megatron-DeepSpeed trains.

The model, the AdamW parameter groups and Megatron's learning-rate schedule
are hwbench's own (the same as the native engine's); DeepSpeed wraps them and
does the rest: mixed precision (it converts the module to fp16/bf16), loss
scaling, gradient accumulation (it divides the loss by the accumulation steps
and steps the optimizer at the boundary only), gradient reduction, clipping
and ZeRO partitioning. The device-specific preparation (DS_ACCELERATOR, the
torch._six shim, Ascend's adaptor) is hwbench.device.deepspeed_support.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hwbench.checkpoint.deepspeed import DeepSpeedState
from hwbench.device import Backend
from hwbench.device.deepspeed_support import deepspeed_version, prepare_deepspeed
from hwbench.engine.base import StepOutcome, total_grad_norm
from hwbench.engine.distributed import DistContext
from hwbench.engine.loss_scale import HYSTERESIS, LOSS_SCALE_WINDOW, MIN_LOSS_SCALE  # DeepSpeed's defaults too
from hwbench.engine.optim import build_optimizer, step_learning_rate
from hwbench.spec import OptimizerSpec, RunSpec
from hwbench.workload.config import accumulation_steps
from hwbench.workload.data import Batch
from hwbench.workload.model import lm_loss

# DeepSpeed prints a progress line every steps_per_print steps; inside a timed run
# that would be host work (and output) mid-measurement, so never.
NEVER_PRINT = 2 ** 31 - 1



def deepspeed_config(spec: RunSpec, dp_size: int) -> dict[str, Any]:
    """The DeepSpeed config dict for ``spec`` on ``dp_size`` data-parallel ranks.
    DeepSpeed checks train_batch_size = micro x accumulation x dp_size itself."""
    config: dict[str, Any] = {
        "train_batch_size": spec.global_batch_size,
        "train_micro_batch_size_per_gpu": spec.micro_batch_size,
        "gradient_accumulation_steps": accumulation_steps(spec.global_batch_size, spec.micro_batch_size, dp_size),
        "gradient_clipping": spec.optimizer.clip_grad,
        "zero_optimization": {"stage": spec.zero_stage},
        "steps_per_print": NEVER_PRINT,
        "wall_clock_breakdown": False,
        # We hand DeepSpeed a client torch.optim.AdamW (hwbench's parameter groups);
        # ZeRO refuses optimizers it has not tested unless told.
        "zero_allow_untested_optimizer": True,
    }
    if spec.precision == "fp16":
        config["fp16"] = {
            "enabled": True,
            "loss_scale": 0 if spec.loss_scale is None else spec.loss_scale,  # 0 = dynamic
            "initial_scale_power": spec.initial_scale_power,
            "loss_scale_window": LOSS_SCALE_WINDOW,
            "hysteresis": HYSTERESIS,
            "min_loss_scale": int(MIN_LOSS_SCALE),
        }
    elif spec.precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def megatron_scheduler(optimizer: torch.optim.Optimizer, spec: OptimizerSpec) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR that sets the lr of Megatron's schedule: optimizer step k
    (0-based, as LambdaLR counts) uses step_learning_rate(spec, k + 1). DeepSpeed
    steps it after every applied optimizer step (not after skipped ones), as
    Megatron-LM's loop steps its scheduler."""
    for group in optimizer.param_groups:
        group["lr"] = spec.lr  # LambdaLR multiplies the group's base lr
        group.pop("initial_lr", None)

    def factor(step: int) -> float:
        return step_learning_rate(spec, step + 1) / spec.lr if spec.lr else 0.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _as_norm_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """DeepSpeed's global grad norm (float, tensor or None) as a 0-dim fp32 tensor;
    None (not computed, or an overflow) becomes NaN."""
    if value is None:
        return torch.full((), math.nan, device=device)
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).float()
    return torch.tensor(float(value), device=device)


def current_loss_scale(engine, precision: str) -> float | None:
    """DeepSpeed's fp16 loss scale now (None unless fp16): newer releases keep it in the
    optimizer's loss_scale_config, older ones as optimizer.cur_scale."""
    if precision != "fp16":
        return None
    optimizer = engine.optimizer
    config = getattr(optimizer, "loss_scale_config", None)
    scale = config.cur_scale if config is not None else getattr(optimizer, "cur_scale", None)
    return None if scale is None else float(scale)


def accelerator_name() -> str | None:
    """The DeepSpeed accelerator in use, by its name."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    return getattr(accelerator, "_name", None) or type(accelerator).__name__


class DeepSpeedCommon:
    """What both DeepSpeed engines share (this one and hwbench.engine.deepspeed_pipeline's):
    deepspeed.initialize over hwbench's AdamW and schedule, the figures of one step, the
    checkpoint state."""

    spec: RunSpec
    backend: Backend

    def _initialize(self, model: nn.Module, dp_size: int) -> None:
        import deepspeed

        self.config = deepspeed_config(self.spec, dp_size)
        optimizer = build_optimizer(model, self.spec.optimizer, self.backend.optimizer_options())
        scheduler = megatron_scheduler(optimizer, self.spec.optimizer)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.config,
            dist_init_required=False,  # reuse the process group torchrun's caller set up
        )

    def _step(self, forward_backward: Callable[[], tuple[torch.Tensor, torch.Tensor | None]]) -> StepOutcome:
        """One optimizer step's figures around ``forward_backward``, which trains the step and
        returns its mean loss and the gradient norm it took itself (None: DeepSpeed's). A step
        DeepSpeed skipped (an fp16 overflow) has an infinite norm."""
        engine = self.engine
        lr = float(self.optimizer.param_groups[0]["lr"])  # what this step's update uses
        loss_scale = current_loss_scale(engine, self.spec.precision)
        skipped_before = engine.skipped_steps
        loss, grad_norm = forward_backward()
        skipped = engine.skipped_steps > skipped_before
        device = self.backend.torch_device
        if skipped:
            grad_norm = torch.full((), math.inf, device=device)
        elif grad_norm is None:
            grad_norm = _as_norm_tensor(engine.get_global_grad_norm(), device)
        return StepOutcome(loss=loss, grad_norm=grad_norm, lr=lr, loss_scale=loss_scale, skipped=skipped)

    # checkpoints ----------------------------------------------------------------
    def checkpoint_state(self) -> DeepSpeedState:
        return DeepSpeedState(self.engine)

    def resume_at(self, iteration: int) -> None:
        """Nothing to do: the scheduler DeepSpeed's load_checkpoint restores continues."""

    def close(self) -> None:
        """Free DeepSpeed's state."""
        destroy = getattr(self.engine, "destroy", None)
        if destroy is not None:
            destroy()


class DeepSpeedEngine(DeepSpeedCommon):
    """hwbench's Engine (hwbench.engine.base) over deepspeed.initialize."""

    def __init__(self, model: nn.Module, spec: RunSpec, backend: Backend, ctx: DistContext) -> None:
        self.spec, self.backend, self.ctx = spec, backend, ctx
        self.patches = prepare_deepspeed(backend)  # before deepspeed is imported
        self._set_local_rank = False
        self._owns_process_group = self._ensure_process_group()
        self.dp_size = dist.get_world_size()  # tp = pp = 1: data parallel is the whole world
        self._initialize(model, self.dp_size)
        # DeepSpeed clips fp32 ZeRO-0 gradients without keeping the norm; only its
        # wrapping optimizers (fp16, bf16, ZeRO) record one.
        self._norm_from_grads = not hasattr(self.engine.optimizer, "_global_grad_norm")
        self.accelerator = accelerator_name()

    def _ensure_process_group(self) -> bool:
        """DeepSpeed needs a process group even on one process: make a one-rank
        group with an in-memory store (no port, no environment) when there is none."""
        if dist.is_initialized():
            return False
        dist.init_process_group(self.backend.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
        # deepspeed.initialize asserts LOCAL_RANK is set (torchrun sets it); close() removes ours.
        self._set_local_rank = "LOCAL_RANK" not in os.environ
        if self._set_local_rank:
            os.environ["LOCAL_RANK"] = "0"
        return True

    def _grads_norm(self) -> torch.Tensor:
        """The global norm of the module's (already reduced) gradients, computed as
        the native engine computes it. DeepSpeed's own ZeRO-0 clipping reduces in
        fp32 (runtime/utils.py), so on the CPU its clip factor can differ from
        1/this norm by as much as that fp32 norm errs (7.5e-4 on the tiny model; docs/parallel.md)."""
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        return total_grad_norm(grads, self.backend.grad_norm_dtype).detach().float()

    def train_step(self, next_batch: Callable[[], Batch]) -> StepOutcome:
        """One optimizer step: engine.step() after every micro-batch, as DeepSpeed
        wants; it applies the optimizer at the accumulation boundary only."""
        return self._step(lambda: self._forward_backward(next_batch))

    def _forward_backward(self, next_batch: Callable[[], Batch]) -> tuple[torch.Tensor, torch.Tensor | None]:
        engine = self.engine
        accumulation = engine.gradient_accumulation_steps()
        total = torch.zeros((), device=self.backend.torch_device)
        grad_norm = None
        for micro in range(accumulation):
            tokens, labels = next_batch()
            loss = lm_loss(engine(tokens), labels)
            engine.backward(loss)  # divides by the accumulation steps itself
            total += loss.detach().float()
            if micro == accumulation - 1 and self._norm_from_grads:
                grad_norm = self._grads_norm()
            engine.step()
        return total / accumulation, grad_norm

    @torch.no_grad()
    def evaluate(self, batches: Iterable[Batch]) -> tuple[float, int]:
        """Token-weighted mean loss over every rank's ``batches`` (Megatron's
        validation: sum of loss x tokens / tokens), the same on every rank."""
        self.engine.eval()
        total = torch.zeros(2, device=self.backend.torch_device, dtype=torch.float64)
        try:
            for inputs, labels in batches:
                loss = lm_loss(self.engine(inputs), labels)
                total[0] += loss.double() * labels.numel()
                total[1] += labels.numel()
        finally:
            self.engine.train()
        self.ctx.all_reduce_world(total)
        loss_sum, tokens = total.tolist()
        return loss_sum / max(tokens, 1.0), int(tokens)

    def describe(self) -> dict[str, Any]:
        return {
            "name": "deepspeed",
            "deepspeed_version": deepspeed_version(),
            "zero_stage": self.spec.zero_stage,
            "dp_size": self.dp_size,
            "config": self.config,
            "patches": self.patches,
            "accelerator": self.accelerator,
        }

    def close(self) -> None:
        """Free DeepSpeed's state and the one-rank process group this engine made
        (a group the caller made stays theirs)."""
        super().close()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_process_group = False
        if self._set_local_rank:
            os.environ.pop("LOCAL_RANK", None)
            self._set_local_rank = False
