"""Megatron's tensor parallelism as plain modules over one process group, for
DeepSpeed's pipeline engine (hwbench.engine.deepspeed_pipeline), which moves
plain tensors between stages and reduces plain gradients (DTensor parameters
would not pass through it).

As megatron/core/tensor_parallel/{layers,mappings}.py: a column-parallel linear
keeps a slice of the output features (its input copied to the group: identity
forward, all-reduce backward), a row-parallel linear a slice of the input
features (its output all-reduced forward, identity backward), the word
embedding a slice of the vocabulary (rows outside the slice give zeros, then
one all-reduce). Sliced parameters carry ``tensor_model_parallel = True``, so
DeepSpeed's gradient norms count them on every rank and the replicated ones
(LayerNorms, row-parallel biases, positions) on tensor rank 0 only.

Every parameter is filled with its slice of the values the whole model has on
one device (hwbench.workload.model.host_values), so a layout starts from the
same weights as one process and as the native engine.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hwbench.workload.config import GPTConfig
from hwbench.workload.model import LAYERNORM_EPS, host_values


@dataclasses.dataclass(frozen=True)
class TensorGroup:
    """This rank's tensor-parallel group: ``size`` ranks, this one ``rank``; group None when size 1."""

    group: object = None
    size: int = 1
    rank: int = 0


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; the gradients of the group summed backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromGroup(torch.autograd.Function):
    """The partial results of the group summed forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherLastDim(torch.autograd.Function):
    """Every rank's slice of the last dimension concatenated forward; this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, tp: TensorGroup):
        ctx.tp = tp
        parts = [torch.empty_like(x) for _ in range(tp.size)]
        dist.all_gather(parts, x.contiguous(), group=tp.group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.tp.size, dim=-1)[ctx.tp.rank].contiguous(), None


def copy_to_group(x: torch.Tensor, tp: TensorGroup) -> torch.Tensor:
    return _CopyToGroup.apply(x, tp.group) if tp.size > 1 else x


def reduce_from_group(x: torch.Tensor, tp: TensorGroup) -> torch.Tensor:
    return _ReduceFromGroup.apply(x, tp.group) if tp.size > 1 else x


def gather_last_dim(x: torch.Tensor, tp: TensorGroup) -> torch.Tensor:
    return _GatherLastDim.apply(x, tp) if tp.size > 1 else x


def _mark_sliced(parameter: nn.Parameter, dim: int) -> None:
    # DeepSpeed's (and Megatron's) marker for a sliced parameter: attributes set on the tensor
    parameter.tensor_model_parallel = True  # type: ignore[attr-defined]
    parameter.partition_dim = dim  # type: ignore[attr-defined]


@torch.no_grad()
def load_host_values(module: nn.Module, prefix: str, config: GPTConfig, seed: int, tp: TensorGroup) -> None:
    """Fill each parameter of ``module`` with this rank's slice of the values the
    whole model's parameter ``prefix + name`` has (the whole tensor is drawn on
    the host, as hwbench.workload.model.init_parameters does for DTensor shards)."""
    for name, parameter in module.named_parameters():
        dim = getattr(parameter, "partition_dim", None)
        shape = list(parameter.shape)
        if dim is not None:
            shape[dim] *= tp.size
        values = host_values(prefix + name, torch.Size(shape), parameter.dtype, config, seed)
        if dim is not None:
            values = values.chunk(tp.size, dim=dim)[tp.rank]
        parameter.copy_(values)


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A and b sliced on the output features; y stays sliced."""

    def __init__(self, in_features: int, out_features: int, tp: TensorGroup, bias: bool = True) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features // tp.size, in_features))
        _mark_sliced(self.weight, 0)
        self.bias = nn.Parameter(torch.empty(out_features // tp.size)) if bias else None
        if self.bias is not None:
            _mark_sliced(self.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_group(x, self.tp), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A sliced on the input features, x already sliced so; y whole (one all-reduce)."""

    def __init__(self, in_features: int, out_features: int, tp: TensorGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp.size))
        _mark_sliced(self.weight, 1)
        self.bias = nn.Parameter(torch.empty(out_features))  # added once, after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_group(F.linear(x, self.weight), self.tp) + self.bias


class VocabParallelEmbedding(nn.Module):
    """The word embedding with this rank's rows of the (padded) vocabulary."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorGroup) -> None:
        super().__init__()
        self.tp = tp
        rows = vocab_size // tp.size
        self.first, self.end = tp.rank * rows, (tp.rank + 1) * rows
        self.weight = nn.Parameter(torch.empty(rows, hidden_size))
        _mark_sliced(self.weight, 0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(tokens, self.weight)
        outside = (tokens < self.first) | (tokens >= self.end)
        local = (tokens - self.first).masked_fill(outside, 0)
        embedded = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_group(embedded, self.tp)


class ParallelAttention(nn.Module):
    """hwbench.workload.model.Attention with q, k, v column-parallel (this rank's heads) and out_proj row-parallel."""

    def __init__(self, config: GPTConfig, tp: TensorGroup) -> None:
        super().__init__()
        h = config.hidden_size
        self.head_dim = config.head_dim
        self.q_proj = ColumnParallelLinear(h, h, tp)
        self.k_proj = ColumnParallelLinear(h, h, tp)
        self.v_proj = ColumnParallelLinear(h, h, tp)
        self.out_proj = RowParallelLinear(h, h, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(B, S, -1))


class ParallelMLP(nn.Module):
    def __init__(self, config: GPTConfig, tp: TensorGroup) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(config.hidden_size, config.ffn_size, tp)
        self.fc2 = RowParallelLinear(config.ffn_size, config.hidden_size, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class ParallelBlock(nn.Module):
    """hwbench.workload.model.Block with tensor-parallel attention and MLP; the same parameter names."""

    def __init__(self, config: GPTConfig, tp: TensorGroup) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=LAYERNORM_EPS)
        self.attn = ParallelAttention(config, tp)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=LAYERNORM_EPS)
        self.mlp = ParallelMLP(config, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))
