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
import zlib

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
    """forward(tokens (B, S) int64) -> logits (B, S, V); the loss is lm_loss(logits, labels).

    A pipeline stage is this same class with the parts it does not hold set to
    None (wte/wpe before the first stage, ln_f/output after the last) and the
    other stages' blocks removed from the ``blocks`` dict, whose keys keep the
    layer numbers, so parameter names are the same in every layout."""

    def __init__(self, config: GPTConfig, *, tensor_parallel: int = 1, recompute: bool = False):
        super().__init__()
        self.config = config
        self.recompute = recompute
        self.vocab_size = config.padded_vocab_size(tensor_parallel)
        self.wte: nn.Embedding | None = nn.Embedding(self.vocab_size, config.hidden_size)
        self.wpe: nn.Embedding | None = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleDict({str(i): Block(config) for i in range(config.num_layers)})
        self.ln_f: nn.LayerNorm | None = nn.LayerNorm(config.hidden_size, eps=LAYERNORM_EPS)
        self.output: nn.Linear | None = nn.Linear(config.hidden_size, self.vocab_size, bias=False)
        self.tie_output_to_embedding()
        if not any(p.is_meta for p in self.parameters()):
            init_parameters(self, torch.initial_seed())  # follows torch.manual_seed

    def tie_output_to_embedding(self) -> None:
        """The output layer uses the word embedding's weight (Megatron's GPT-2).
        Moving a model off the meta device (to_empty) gives each module its own
        new tensor, so this is called again after it. A pipeline stage that has
        only one of the two keeps its own copy (hwbench.engine.parallelize)."""
        if self.wte is not None and self.output is not None and self.output.weight is not self.wte.weight:
            self.output.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.wte is not None:  # first stage: token ids in
            S = tokens.shape[1]
            positions = torch.arange(S, device=tokens.device)
            x = self.wte(tokens) + self.wpe(positions)  # (B, S, h)
        else:  # a later stage: hidden states in
            x = tokens
        for block in self.blocks.values():
            if self.recompute and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.output is None:  # not the last stage: hidden states out
            return x
        return self.output(self.ln_f(x))  # (B, S, V)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy. Megatron computes it in fp32 (autocast keeps
    cross_entropy in fp32 too). ``logits`` may be a vocab-sharded DTensor under
    tensor parallelism's loss_parallel."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def _init_seed(seed: int, name: str) -> int:
    """Each parameter draws from its own stream, keyed by the run seed and the
    parameter's name, so a pipeline stage or a shard gets the same values as the
    whole model on one device. The last stage's output weight is the tied word
    embedding, so it draws as ``wte.weight``."""
    key = "wte.weight" if name == "output.weight" else name
    return (seed * 0x9E3779B1 + zlib.crc32(key.encode())) % (2 ** 63)


def _host_values(name: str, shape: torch.Size, dtype: torch.dtype, config: GPTConfig, seed: int) -> torch.Tensor:
    """Megatron's init of one parameter, drawn on the host: N(0, 0.02) weights, the
    two output projections of each block scaled by 1/sqrt(2L), zero biases, unit
    LayerNorm gains. Rows of the word embedding past the real vocabulary (the
    tensor-parallel padding) draw from a second stream, so the real rows do not
    depend on the padding."""
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=dtype)
    if name.startswith("ln_") or ".ln_" in name:
        return torch.ones(shape, dtype=dtype)
    std = INIT_STD / math.sqrt(2.0 * config.num_layers) if name.endswith(("out_proj.weight", "fc2.weight")) else INIT_STD
    generator = torch.Generator().manual_seed(_init_seed(seed, name))
    if name in ("wte.weight", "output.weight") and shape[0] > config.vocab_size:
        real = torch.empty((config.vocab_size, *shape[1:]), dtype=dtype).normal_(0.0, std, generator=generator)
        generator.manual_seed(_init_seed(seed, "wte.weight/padding"))
        padding = torch.empty((shape[0] - config.vocab_size, *shape[1:]), dtype=dtype).normal_(0.0, std, generator=generator)
        return torch.cat([real, padding])
    return torch.empty(shape, dtype=dtype).normal_(0.0, std, generator=generator)


@torch.no_grad()
def init_parameters(model: GPT, seed: int) -> None:
    """Fill every parameter the model (or stage, or shard) holds with the values
    the whole model would have on one device for ``seed``. Sharded parameters
    (DTensors of tensor parallelism or FSDP) draw the whole tensor on the host
    and keep their own shard of it, so every layout starts from the same weights."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, parameter in model.named_parameters():
        values = _host_values(name, parameter.shape, parameter.dtype, model.config, seed)
        if isinstance(parameter, DTensor):
            full = values.to(parameter.device_mesh.device_type)
            shard = distribute_tensor(full, parameter.device_mesh, parameter.placements, src_data_rank=None)
            parameter.to_local().copy_(shard.to_local())
        else:
            parameter.copy_(values)


def build_model(config: GPTConfig, *, device: torch.device, seed: int, tensor_parallel: int = 1,
                recompute: bool = False) -> GPT:
    """The whole model on ``device`` with weights that depend on ``seed`` alone
    (not on the device): built without storage, then filled tensor by tensor."""
    with torch.device("meta"):
        model = GPT(config, tensor_parallel=tensor_parallel, recompute=recompute)
    model.to_empty(device=device)
    model.tie_output_to_embedding()
    init_parameters(model, seed)
    return model
