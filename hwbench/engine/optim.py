"""AdamW and Megatron's learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from hwbench.spec import OptimizerSpec


def learning_rate(spec: OptimizerSpec, iteration: int) -> float:
    """Megatron's schedule (``OptimizerParamScheduler.get_lr``) after ``iteration`` steps:
    linear warm-up from lr_warmup_init to lr over lr_warmup_iters, then cosine (or linear)
    decay to min_lr at lr_decay_iters."""
    if spec.lr_warmup_iters > 0 and iteration <= spec.lr_warmup_iters:
        return spec.lr_warmup_init + (spec.lr - spec.lr_warmup_init) * iteration / spec.lr_warmup_iters
    if spec.lr_decay_style == "constant":
        return spec.lr
    if iteration >= spec.lr_decay_iters:
        return spec.min_lr
    progress = (iteration - spec.lr_warmup_iters) / max(1, spec.lr_decay_iters - spec.lr_warmup_iters)
    if spec.lr_decay_style == "linear":
        coefficient = 1.0 - progress
    else:
        coefficient = 0.5 * (math.cos(math.pi * progress) + 1.0)
    return spec.min_lr + coefficient * (spec.lr - spec.min_lr)


def step_learning_rate(spec: OptimizerSpec, step: int) -> float:
    """The rate optimizer step ``step`` (1-based) trains at, as in Megatron-LM's training
    loop: it steps the scheduler after the optimizer (and ``step(0)`` at construction), so
    step k uses the schedule after k - 1 steps, and the first warm-up step runs at 0."""
    return learning_rate(spec, step - 1)


def build_optimizer(model: nn.Module, spec: OptimizerSpec, options: dict) -> torch.optim.AdamW:
    """AdamW; as in Megatron, biases and LayerNorm gains get no weight decay."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for parameter in model.parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 else decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": spec.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=step_learning_rate(spec, 1), betas=(spec.adam_beta1, spec.adam_beta2),
                             eps=spec.adam_eps, **options)
