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
(norms, row-parallel biases, positions) on tensor rank 0 only.

Both architectures of hwbench.workload.model: Megatron GPT-2's block, and Llama's with
the layers module's RMSNorm, rotary tables (made on each rank, nothing to split) and
SwiGLU, no biases, and grouped-query attention split by key/value heads (q_proj keeps
this rank's H / TP query heads, k_proj and v_proj its KV / TP key/value heads: the groups
of those query heads, since query head i reads key/value head i // G).

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
from hwbench.workload.layers import RotaryEmbedding, apply_rotary, norm
from hwbench.workload.model import Rotary, host_values


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

    def __init__(self, in_features: int, out_features: int, tp: TensorGroup, bias: bool = True) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp.size))
        _mark_sliced(self.weight, 1)
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None  # added once, after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_group(F.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


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
    """hwbench.workload.model.Attention with q, k, v column-parallel (this rank's query heads
    and the key/value heads of their groups) and out_proj row-parallel."""

    def __init__(self, config: GPTConfig, tp: TensorGroup) -> None:
        super().__init__()
        h, bias = config.hidden_size, config.add_bias_linear
        self.head_dim = config.head_dim
        self.group_size = config.num_attention_heads // config.kv_heads  # G
        q_size, kv_size = config.num_attention_heads * self.head_dim, config.kv_heads * self.head_dim
        self.q_proj = ColumnParallelLinear(h, q_size, tp, bias)
        self.k_proj = ColumnParallelLinear(h, kv_size, tp, bias)
        self.v_proj = ColumnParallelLinear(h, kv_size, tp, bias)
        self.out_proj = RowParallelLinear(q_size, h, tp, bias)
        # --qk-layernorm's per-head norms: whole on every rank (the spec runs them at TP1 only: each
        # rank's gradient of their gain would hold its own heads' part alone)
        self.q_norm = norm(config, self.head_dim) if config.qk_layernorm else None
        self.k_norm = norm(config, self.head_dim) if config.qk_layernorm else None

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, -1, self.head_dim)  # (B, S, H / TP, D)
        k = self.k_proj(x).view(B, S, -1, self.head_dim)  # (B, S, KV / TP, D)
        v = self.v_proj(x).view(B, S, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, S, D)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.group_size > 1)
        return self.out_proj(y.transpose(1, 2).reshape(B, S, -1))


class ParallelMLP(nn.Module):
    """Megatron GPT-2's MLP: fc1 column-parallel, fc2 row-parallel."""

    def __init__(self, config: GPTConfig, tp: TensorGroup) -> None:
        super().__init__()
        bias = config.add_bias_linear
        self.fc1 = ColumnParallelLinear(config.hidden_size, config.ffn_size, tp, bias)
        self.fc2 = RowParallelLinear(config.ffn_size, config.hidden_size, tp, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class ParallelSwiGLU(nn.Module):
    """hwbench.workload.layers.SwiGLU: gate and up column-parallel (the same slice of the inner
    width on each, so the product stays local), down row-parallel."""

    def __init__(self, config: GPTConfig, tp: TensorGroup) -> None:
        super().__init__()
        h, f, bias = config.hidden_size, config.ffn_size, config.add_bias_linear
        self.gate_proj = ColumnParallelLinear(h, f, tp, bias)
        self.up_proj = ColumnParallelLinear(h, f, tp, bias)
        self.down_proj = RowParallelLinear(f, h, tp, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ParallelBlock(nn.Module):
    """hwbench.workload.model.Block with tensor-parallel attention and MLP (GELU or SwiGLU), the
    config's norm replicated; the same parameter names. With rotary positions the block makes
    (once per length, then keeps) the tables itself: DeepSpeed's pipeline passes it the hidden
    states alone."""

    def __init__(self, config: GPTConfig, tp: TensorGroup) -> None:
        super().__init__()
        self.ln_1 = norm(config)
        self.attn = ParallelAttention(config, tp)
        self.ln_2 = norm(config)
        self.mlp: nn.Module = ParallelSwiGLU(config, tp) if config.swiglu else ParallelMLP(config, tp)
        self.rotary = RotaryEmbedding(config) if config.rope else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rotary = self.rotary.tables(x.shape[1], x.device) if self.rotary is not None else None
        x = x + self.attn(self.ln_1(x), rotary)
        return x + self.mlp(self.ln_2(x))
