"""What every engine gives the harness: one optimizer step, a validation pass,
a description of itself for the result, and its state for a checkpoint.

An engine owns the model, the optimizer and the parallel wrapping of both; the
worker (hwbench.harness.worker) only calls these methods, so the timed loop and
the checkpoints (hwbench.checkpoint, which saves the state an engine hands it) are
the same for the native engine and the DeepSpeed one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
from torch.distributed.tensor import DTensor

from hwbench.checkpoint.state import EngineState
from hwbench.workload.data import Batch


@dataclasses.dataclass
class StepOutcome:
    """What one optimizer step leaves behind. Tensors stay on the device and are
    read after the timed loop, so the loop never waits for the host."""

    loss: torch.Tensor  # mean loss over this rank's share of the global batch (0-dim, detached);
    #                     NaN on pipeline stages that do not compute the loss
    grad_norm: torch.Tensor  # global norm before clipping (0-dim); not finite when fp16 overflowed
    lr: float  # the learning rate this step used
    loss_scale: torch.Tensor | float | None  # fp16 loss scale this step used (0-dim on the device in
    #                                          the native engine); None without fp16
    skipped: torch.Tensor | bool  # the optimizer step was skipped (fp16 overflow); the native engine's
    #                               fused AdamW gives the device's 0-dim overflow flag (1.0 = skipped)


class Engine(Protocol):
    def train_step(self, next_batch: Callable[[], Batch]) -> StepOutcome:
        """One optimizer step over this rank's share of the global batch; calls
        ``next_batch`` once per micro-batch (gradient_accumulation_steps times)."""

    def evaluate(self, batches: Iterable[Batch]) -> tuple[float, int]:
        """Token-weighted mean loss over ``batches`` on every data-parallel rank
        together, and the global token count (the same on every rank)."""

    def describe(self) -> dict[str, Any]:
        """The engine's settings as the result records them (``engine`` key)."""

    def checkpoint_state(self) -> EngineState:
        """What a checkpoint saves of this engine and loads into it: the model, optimizer and
        loss-scale state (hwbench.checkpoint.state saves and loads it)."""

    def resume_at(self, iteration: int) -> None:
        """After a load: the learning-rate schedule continues after ``iteration`` steps."""

    def close(self) -> None:
        """Release what the engine set up for itself (a one-rank process group)."""


def by_mesh(tensors: list[Any]) -> list[list[Any]]:
    """``tensors`` (parameters or gradients) in groups of one kind each, in order of first
    appearance: plain tensors, then DTensors of each device mesh apart. torch's multi-tensor
    kernels (AdamW's foreach and fused steps, _foreach_mul_, clipping) refuse a list that mixes
    plain tensors with DTensors or DTensors of two meshes, which expert parallelism makes (its
    experts are sharded on the "ep" mesh, the rest is not)."""
    groups: dict[Any, list[Any]] = {}
    for tensor in tensors:
        key = tensor.device_mesh if isinstance(tensor, DTensor) else None
        groups.setdefault(key, []).append(tensor)
    return list(groups.values())


# Elements per partial sum of squares in total_grad_norm: short enough that one fp32
# accumulator stays accurate (PyTorch's own fix attempt, PR 169996, chose the same).
NORM_CHUNK = 512


def total_grad_norm(grads: list[torch.Tensor], accumulate_dtype: torch.dtype | None) -> torch.Tensor:
    """The L2 norm of ``grads`` taken together (0-dim, float32 when ``accumulate_dtype``
    is given; a DTensor when the gradients are).

    ``accumulate_dtype`` is the backend's ``grad_norm_dtype``: None keeps torch's own
    ``get_total_norm``. Otherwise plain tensors have their squares summed in rows of
    NORM_CHUNK elements and the rows added in ``accumulate_dtype``: as accurate as casting
    each tensor, and faster than both that and torch's fp32 kernel on the CPU (docs/parallel.md).
    DTensor gradients (TP, FSDP2) are reduced in ``accumulate_dtype`` shard by shard and
    their norms stacked, so DTensor reduces them over the mesh in one collective."""
    if accumulate_dtype is None or not grads:
        return torch.nn.utils.get_total_norm(grads, 2.0)
    if any(isinstance(g, DTensor) for g in grads):
        norms = [torch.linalg.vector_norm(g, 2, dtype=accumulate_dtype) for g in grads]
        return torch.linalg.vector_norm(torch.stack(norms), 2).float()
    return torch.stack([_sum_of_squares(g, accumulate_dtype) for g in grads]).sum().sqrt().float()


def _sum_of_squares(tensor: torch.Tensor, accumulate_dtype: torch.dtype) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    row_dtype = torch.float32 if flat.dtype in (torch.bfloat16, torch.float16) else None  # rows never in 16 bits
    whole = flat.numel() // NORM_CHUNK * NORM_CHUNK
    total = torch.zeros((), dtype=accumulate_dtype, device=flat.device)
    if whole:
        rows = torch.linalg.vector_norm(flat[:whole].view(-1, NORM_CHUNK), 2, dim=1, dtype=row_dtype)
        total = total + (rows.to(accumulate_dtype) ** 2).sum()
    if whole < flat.numel():
        total = total + torch.linalg.vector_norm(flat[whole:], 2, dtype=row_dtype).to(accumulate_dtype) ** 2
    return total
