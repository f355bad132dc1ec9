"""Megatron's GPT-2 architecture (FACTS.md §3) in plain PyTorch.

Pre-LayerNorm blocks, GELU MLP of width 4h, learned absolute positions, biases
on every linear layer, a final LayerNorm and an output layer tied to the word
embedding over the padded vocabulary. q, k and v are separate projections and
the blocks sit in one ModuleList, so tensor-parallel plans can split them and
pipelining can cut the list without changing this file.

Shapes: B batch, S sequence, h hidden, H heads, D = h / H head size, V padded vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hwbench.workload.config import GPTConfig

INIT_STD = 0.02  # Megatron --init-method-std default
LAYERNORM_EPS = 1e-5


class Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        h = config.hidden_size
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(h, h)
        self.k_proj = nn.Linear(h, h)
        self.v_proj = nn.Linear(h, h)
        self.out_proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        # (B, S, h) -> (B, H, S, D); -1 lets a tensor-parallel shard keep H / TP heads
        q = self.q_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        # Fused attention on every device that has a kernel for it (flash / memory-efficient).
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, S, D)
        y = y.transpose(1, 2).reshape(B, S, -1)  # (B, S, h)
        return self.out_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.ffn_hidden_size)
        self.fc2 = nn.Linear(config.ffn_hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Megatron's fused bias-GELU uses the tanh approximation.
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=LAYERNORM_EPS)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=LAYERNORM_EPS)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """forward(tokens (B, S) int64, labels (B, S) int64) -> mean cross-entropy loss."""

    def __init__(self, config: GPTConfig, *, tensor_parallel: int = 1, recompute: bool = False):
        super().__init__()
        self.config = config
        self.recompute = recompute
        self.vocab_size = config.padded_vocab_size(tensor_parallel)
        self.wte = nn.Embedding(self.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=LAYERNORM_EPS)
        if not any(p.is_meta for p in self.parameters()):
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Megatron's init: N(0, 0.02) weights, the two output projections of each
        block scaled by 1/sqrt(2L), zero biases, unit LayerNorm gains.

        Values are drawn on the host (from ``generator``, or torch's default CPU
        generator) one tensor at a time and copied to the parameter's device, so
        the same seed gives the same weights on every device."""
        scaled_std = INIT_STD / math.sqrt(2.0 * self.config.num_layers)

        def normal_(parameter: torch.Tensor, std: float) -> None:
            host = torch.empty(parameter.shape, dtype=parameter.dtype).normal_(0.0, std, generator=generator)
            parameter.copy_(host)

        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                normal_(module.weight, scaled_std if name.endswith(("out_proj", "fc2")) else INIT_STD)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                normal_(module.weight, INIT_STD)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        B, S = tokens.shape
        positions = torch.arange(S, device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)  # (B, S, h)
        for block in self.blocks:
            if self.recompute and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight)  # (B, S, V), tied output layer
        # Megatron computes the loss in fp32 (autocast keeps cross_entropy in fp32 too).
        return F.cross_entropy(logits.float().view(B * S, -1), labels.reshape(B * S))


def build_model(config: GPTConfig, *, device: torch.device, seed: int, tensor_parallel: int = 1,
                recompute: bool = False) -> GPT:
    """The model on ``device`` with weights that depend on ``seed`` alone (not on
    the device): built without storage, then filled tensor by tensor."""
    with torch.device("meta"):
        model = GPT(config, tensor_parallel=tensor_parallel, recompute=recompute)
    model.to_empty(device=device)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model
