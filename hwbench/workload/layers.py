"""The layers in which Megatron GPT-2 and Llama 3 differ, chosen by GPTConfig's switches as
Megatron-LM's GPTModel chooses them: the norm (LayerNorm or RMSNorm), the MLP (GELU of width
ffn_size, SwiGLU, or a mixture of SwiGLU experts: hwbench.workload.moe) and the rotary position
embedding (RoPE, with Llama 3.1's frequency scaling) that replaces the learned position table.

Parameter names follow transformers' Llama where Llama has the layer (gate_proj, up_proj,
down_proj), so weights copy across by name; the norms keep hwbench's ln_1/ln_2/ln_f names in
both architectures, so the init (hwbench.workload.model.host_values) and the engines' plans
find them the same way.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hwbench.workload.config import GPTConfig, RopeScaling
from hwbench.workload.moe import MoE


def norm(config: GPTConfig, size: int | None = None) -> nn.Module:
    """Megatron's --normalization: LayerNorm (gain and bias) or RMSNorm (gain only), eps norm_epsilon,
    over ``size`` features (the hidden size; the head size for --qk-layernorm)."""
    size = size or config.hidden_size
    if config.normalization == "RMSNorm":
        return nn.RMSNorm(size, eps=config.norm_epsilon)
    return nn.LayerNorm(size, eps=config.norm_epsilon)


class MLP(nn.Module):
    """Megatron GPT-2's MLP: fc2(gelu(fc1(x))), inner width ffn_size (4h)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        bias = config.add_bias_linear
        self.fc1 = nn.Linear(config.hidden_size, config.ffn_size, bias=bias)
        self.fc2 = nn.Linear(config.ffn_size, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Megatron's fused bias-GELU uses the tanh approximation.
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SwiGLU(nn.Module):
    """Llama's MLP (Megatron's --swiglu): down(silu(gate(x)) * up(x)), inner width ffn_size.
    gate and up are separate column-splittable projections (Megatron fuses them into one
    linear_fc1; the product is the same)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        h, f, bias = config.hidden_size, config.ffn_size, config.add_bias_linear
        self.gate_proj = nn.Linear(h, f, bias=bias)
        self.up_proj = nn.Linear(h, f, bias=bias)
        self.down_proj = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def mlp(config: GPTConfig, layer: int = 0) -> nn.Module:
    """Layer ``layer``'s MLP: the mixture of experts where the config puts one (--num-experts,
    --moe-layer-freq), else SwiGLU or GELU."""
    if config.is_moe_layer(layer):
        return MoE(config)
    return SwiGLU(config) if config.swiglu else MLP(config)


def inverse_frequencies(head_dim: int, base: float, scaling: RopeScaling | None,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """RoPE's D/2 inverse frequencies base^(-2i/D), in fp32 as Megatron-LM's RotaryEmbedding
    and transformers compute them, with Llama 3.1's scaling applied (transformers'
    ``_compute_llama3_parameters``, rope_type "llama3"). Elementwise ops only, so on an
    accelerator nothing is copied from the host and the host never waits."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (base ** exponents)
    if scaling is None:
        return inv_freq
    low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths (low frequencies) divided by factor, short ones kept, the band between interpolated
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding:
    """The cos and sin tables of rotary position embedding, (S, D) in fp32, for positions
    0..S-1. Made on the device the first time a sequence length is seen there (nothing
    copied from the host) and kept, so the timed steps do not recompute them. Not a module
    and not a buffer: the tables are derived, so they take no part in the state dict, the
    meta-device build or a sharding plan, and every pipeline stage makes its own."""

    def __init__(self, config: GPTConfig):
        self.head_dim, self.base, self.scaling = config.head_dim, config.rotary_base, config.rope_scaling
        self._tables: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, seq_length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (device, seq_length)
        if key not in self._tables:
            with torch.inference_mode(False), torch.no_grad():  # plain tensors, even when first made in an eval
                self._tables[key] = self._make(seq_length, device)
        return self._tables[key]

    def _make(self, seq_length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = inverse_frequencies(self.head_dim, self.base, self.scaling, device)
        freqs = torch.outer(torch.arange(seq_length, device=device, dtype=torch.float32), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)  # (S, D): the rotate-half layout of transformers' Llama
        return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the head dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, heads, S, D) queries or keys by their positions' angles, in x's dtype
    (Megatron casts the tables to the activations' dtype; transformers likewise)."""
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)
