"""Megatron-LM's GPTModel in plain PyTorch: Megatron GPT-2 (``megatron/model/gpt_model.py``
with its GPT-2 defaults) and the Llama 3 architecture, as switches of GPTConfig.

GPT-2: pre-LayerNorm blocks, GELU MLP of width 4h, learned absolute positions, biases on
every linear layer, a final LayerNorm and an output layer tied to the word embedding over
the padded vocabulary. Llama 3: RMSNorm, rotary positions (with Llama 3.1's frequency
scaling) instead of a position table, grouped-query attention (kv_heads key/value heads
shared by the query heads), a SwiGLU MLP, no biases, and an output layer tied or untied
(hwbench.workload.layers). Mixtral and Qwen3-MoE: that architecture with a mixture of SwiGLU
experts for the MLP (hwbench.workload.moe), Qwen3 with its queries and keys normalised per head.
q, k and v are separate projections, or one fused projection in Megatron's per-group layout
(``fused_qkv``); the blocks sit in one dict keyed by layer number, so tensor-parallel plans can
split them and pipelining can cut them without changing this file.

Shapes: B batch, S sequence, h hidden, H heads, KV key/value heads, G = H / KV query heads
per key/value head, D = h / H head size (or kv_channels), V padded vocab.
"""

from __future__ import annotations

import concurrent.futures
import math
import zlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hwbench.workload.config import CROSS_ENTROPY_CHOICES, CROSS_ENTROPY_CHUNK_TOKENS, GPTConfig
from hwbench.workload.in_order import in_order
from hwbench.workload.layers import RotaryEmbedding, apply_rotary, mlp, norm
from hwbench.workload.moe import MoE

INIT_STD = 0.02  # Megatron --init-method-std default
QKV_PARTS = ("q_proj", "k_proj", "v_proj")  # the separate projections a fused qkv_proj stands for
# Each block's projections back onto the residual stream: Megatron scales their init by 1/sqrt(2L).
OUTPUT_PROJECTIONS = ("out_proj.weight", "fc2.weight", "down_proj.weight")  # the MoE experts' down_proj too
QK_NORMS = ("q_norm.weight", "k_norm.weight")  # --qk-layernorm's gains

Rotary = tuple[torch.Tensor, torch.Tensor]  # RoPE's (cos, sin) tables, (S, D) each


class Attention(nn.Module):
    """Causal self-attention with H query heads and KV key/value heads (grouped-query
    attention when KV < H; multi-head when equal). With ``fused_qkv`` one [(H + 2 KV) D, h]
    linear ``qkv_proj`` replaces q_proj, k_proj and v_proj; its output features are laid
    out per key/value group, [q of the group's G heads, k, v] for group 0, then group 1, ...
    (Megatron's query_key_value; per head, [q_h0, k_h0, v_h0, ...], without GQA), so a
    column split over tensor-parallel ranks gives each rank whole groups."""

    def __init__(self, config: GPTConfig, fused_qkv: bool = False):
        super().__init__()
        h, bias = config.hidden_size, config.add_bias_linear
        self.head_dim = config.head_dim
        self.group_size = config.num_attention_heads // config.kv_heads  # G
        q_size, kv_size = config.num_attention_heads * self.head_dim, config.kv_heads * self.head_dim
        self.fused_qkv = fused_qkv
        if fused_qkv:
            self.qkv_proj = nn.Linear(h, q_size + 2 * kv_size, bias=bias)
        else:
            self.q_proj = nn.Linear(h, q_size, bias=bias)
            self.k_proj = nn.Linear(h, kv_size, bias=bias)
            self.v_proj = nn.Linear(h, kv_size, bias=bias)
        self.out_proj = nn.Linear(q_size, h, bias=bias)
        # Megatron's --qk-layernorm (Qwen3's q_norm, k_norm): each head's query and key normalised
        # over the head size, before RoPE
        self.q_norm = norm(config, self.head_dim) if config.qk_layernorm else None
        self.k_norm = norm(config, self.head_dim) if config.qk_layernorm else None

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        B, S, _ = x.shape
        D, G = self.head_dim, self.group_size
        # -1 heads (and groups) throughout, so a tensor-parallel shard keeps H / TP query heads
        # and KV / TP key/value heads
        if self.fused_qkv:
            groups = self.qkv_proj(x).view(B, S, -1, G + 2, D)  # (B, S, KV, G + 2, D)
            q = groups[:, :, :, :G].reshape(B, S, -1, D)  # query head g*G + j is group g's j-th
            k, v = groups[:, :, :, G], groups[:, :, :, G + 1]
        else:
            q = self.q_proj(x).view(B, S, -1, D)
            k = self.k_proj(x).view(B, S, -1, D)
            v = self.v_proj(x).view(B, S, -1, D)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H or KV, S, D)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        # Fused attention on every device that has a kernel for it (flash / memory-efficient). With
        # GQA, SDPA shares each key/value head with its G query heads (query head i reads key/value
        # head i // G) without copying k and v; torch runs that in the flash and math kernels.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=G > 1)  # (B, H, S, D)
        y = y.transpose(1, 2).reshape(B, S, -1)  # (B, S, H D)
        return self.out_proj(y)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, fused_qkv: bool = False, layer: int = 0):
        super().__init__()
        self.ln_1 = norm(config)
        self.attn = Attention(config, fused_qkv)
        self.ln_2 = norm(config)
        self.mlp = mlp(config, layer)  # layer: which MLP, dense or MoE (--moe-layer-freq)

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rotary)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """forward(tokens (B, S) int64) -> logits (B, S, V); forward(tokens, labels) -> the mean
    loss, computed inside forward, where FSDP2 holds the output weight gathered. With
    ``cross_entropy="chunked"`` forward without labels stops after the final norm and
    returns its (B, S, h) output, and ``loss(output, labels)`` does the output projection
    chunk by chunk, so the whole logits never exist (a pipeline's last stage computes its
    loss so, outside forward).

    A pipeline stage is this same class with the parts it does not hold set to
    None (wte/wpe before the first stage, ln_f/output after the last) and the
    other stages' blocks removed from the ``blocks`` dict, whose keys keep the
    layer numbers, so parameter names are the same in every layout. With rotary
    positions wpe is None in every layout, and every stage holds the rotary tables."""

    def __init__(self, config: GPTConfig, *, tensor_parallel: int = 1, recompute: bool = False,
                 cross_entropy: str = "standard", fused_qkv: bool = False):
        super().__init__()
        if cross_entropy not in CROSS_ENTROPY_CHOICES:
            raise ValueError(f"cross_entropy {cross_entropy!r}; accepted: {', '.join(CROSS_ENTROPY_CHOICES)}")
        self.config = config
        self.recompute = recompute
        self.cross_entropy = cross_entropy
        self.chunk_tokens = CROSS_ENTROPY_CHUNK_TOKENS  # tokens per chunk of the chunked loss
        self.vocab_size = config.padded_vocab_size(tensor_parallel)
        self.wte: nn.Embedding | None = nn.Embedding(self.vocab_size, config.hidden_size)
        self.wpe: nn.Embedding | None = (
            None if config.rope else nn.Embedding(config.max_position_embeddings, config.hidden_size))
        self.rotary = RotaryEmbedding(config) if config.rope else None
        self.blocks = nn.ModuleDict({str(i): Block(config, fused_qkv, i) for i in range(config.num_layers)})
        self.ln_f: nn.Module | None = norm(config)
        self.output: nn.Linear | None = nn.Linear(config.hidden_size, self.vocab_size, bias=False)
        self.tie_output_to_embedding()
        if not any(p.is_meta for p in self.parameters()):
            init_parameters(self, torch.initial_seed())  # follows torch.manual_seed

    def tie_output_to_embedding(self) -> None:
        """The output layer uses the word embedding's weight (Megatron's GPT-2, Llama 3.2),
        unless the config unties them (Llama 3.1 8B and 70B: an output weight of its own).
        Moving a model off the meta device (to_empty) gives each module its own
        new tensor, so this is called again after it. A pipeline stage that has
        only one of the two keeps its own copy (hwbench.engine.parallelize)."""
        if self.config.untie_embeddings_and_output_weights:
            return
        if self.wte is not None and self.output is not None and self.output.weight is not self.wte.weight:
            self.output.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        S = tokens.shape[1]
        if self.wte is not None:  # first stage: token ids in (a stage has both embeddings or neither)
            x = self.wte(tokens)  # (B, S, h)
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(S, device=tokens.device))
        else:  # a later stage: hidden states in
            x = tokens
        rotary = self.rotary.tables(S, x.device) if self.rotary is not None else None
        for block in self.blocks.values():
            if self.recompute and self.training:
                x = checkpoint(block, x, rotary, use_reentrant=False)
            else:
                x = block(x, rotary)
        if self.output is None:  # not the last stage: hidden states out
            return x
        assert self.ln_f is not None  # the last stage has both
        if self.cross_entropy == "chunked":  # the loss projects onto the vocabulary, chunk by chunk
            output = self.ln_f(x)  # (B, S, h)
        else:
            output = self.output(self.ln_f(x))  # (B, S, V)
        return output if labels is None else self.loss(output, labels)

    def loss(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of what forward returned without labels; in training, with
        the MoE layers' load-balancing losses in its gradient (``with_aux_losses``)."""
        if self.cross_entropy == "chunked":
            assert self.output is not None, "the loss is the last stage's"
            loss = chunked_lm_loss(output, self.output.weight, labels, self.chunk_tokens)
        else:
            loss = lm_loss(output, labels)
        return self.with_aux_losses(loss)

    def with_aux_losses(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` whose backward also takes the gradient of every MoE layer's load-balancing
        loss of this forward, as one objective loss + sum of the layers' losses, while its value
        stays the language-model loss. Megatron does the same (MoEAuxLossAutoScaler: the loss it
        reports is the LM loss, the auxiliary losses only add gradients); adding ``aux - aux``
        (the second detached) to the loss scales the auxiliary gradient by whatever scales the
        loss (gradient accumulation, fp16 loss scaling) with no scale to keep in step. The values
        are recorded apart (RoutingFigures). Only this stage's layers: a pipeline stage without
        the loss would drop its layers' gradient (pipelining refuses MoE models: hwbench.spec)."""
        layers = [block.mlp for block in self.blocks.values() if isinstance(block.mlp, MoE)]
        pending = [layer.aux_loss for layer in layers if layer.aux_loss is not None]
        for layer in layers:
            layer.aux_loss = None  # taken: its graph is freed with the loss's
        if not pending:
            return loss
        from torch.distributed.tensor import DTensor, Replicate

        aux = torch.stack(pending).sum()
        if isinstance(loss, DTensor):  # tensor parallelism's loss_parallel: every tp rank routed alike
            aux = DTensor.from_local(aux, loss.device_mesh, [Replicate()] * loss.device_mesh.ndim, run_check=False)
        return loss + (aux - aux.detach())


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy. Megatron computes it in fp32 (autocast keeps
    cross_entropy in fp32 too). ``logits`` may be a vocab-sharded DTensor under
    tensor parallelism's loss_parallel."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def chunked_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                    chunk_tokens: int = CROSS_ENTROPY_CHUNK_TOKENS) -> torch.Tensor:
    """lm_loss(F.linear(hidden, weight), labels) without the whole logits: the output
    projection, the fp32 upcast and the loss run ``chunk_tokens`` tokens at a time, and
    the backward recomputes each chunk's logits instead of keeping them. Under autocast
    the products run in its dtype (the weight cast once per call, as autocast's F.linear
    casts it), the softmax in fp32, as in lm_loss. ``hidden`` (B, S, h), ``weight`` (V, h)."""
    device_type = hidden.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
    return _ChunkedCrossEntropy.apply(hidden.flatten(0, 1), weight, labels.flatten(0, 1), chunk_tokens, dtype)


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of (hidden @ weight.T) against labels, chunk by chunk over tokens.
    Kept for the backward: the inputs in the compute dtype and each token's log-sum-exp
    (4 bytes a token), never a [tokens, vocab] tensor."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_tokens: int, dtype: torch.dtype):
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are explicit here
            x, w = hidden.to(dtype), weight.to(dtype)
            tokens = x.shape[0]
            logsumexp = torch.empty(tokens, dtype=torch.float32, device=x.device)
            total = torch.zeros((), dtype=torch.float32, device=x.device)
            for start in range(0, tokens, chunk_tokens):
                end = min(start + chunk_tokens, tokens)
                logits = F.linear(x[start:end], w).float()
                torch.logsumexp(logits, dim=-1, out=logsumexp[start:end])
                target = logits.gather(1, labels[start:end, None]).squeeze(1)
                total += (logsumexp[start:end] - target).sum()
        ctx.save_for_backward(x, w, labels, logsumexp)
        ctx.chunk_tokens, ctx.hidden_dtype, ctx.weight_dtype = chunk_tokens, hidden.dtype, weight.dtype
        return total / tokens

    @staticmethod
    def backward(ctx, grad_loss):
        x, w, labels, logsumexp = ctx.saved_tensors
        tokens = x.shape[0]
        with torch.autocast(x.device.type, enabled=False):
            scale = grad_loss.float() / tokens
            grad_x = torch.empty_like(x)
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device)  # summed over chunks in fp32
            for start in range(0, tokens, ctx.chunk_tokens):
                end = min(start + ctx.chunk_tokens, tokens)
                # d loss / d logits = (softmax - one_hot) / tokens, from the recomputed chunk
                grad = F.linear(x[start:end], w).float().sub_(logsumexp[start:end, None]).exp_()
                grad[torch.arange(end - start, device=grad.device), labels[start:end]] -= 1.0
                grad = grad.mul_(scale).to(x.dtype)
                torch.mm(grad, w, out=grad_x[start:end])
                if grad.dtype == grad_w.dtype:
                    grad_w.addmm_(grad.t(), x[start:end])
                else:
                    grad_w += torch.mm(grad.t(), x[start:end])
        return grad_x.to(ctx.hidden_dtype), grad_w.to(ctx.weight_dtype), None, None, None


def _init_seed(seed: int, stream: str) -> int:
    """Each parameter draws from its own stream, keyed by the run seed and the
    parameter's name (``_stream``), so a pipeline stage or a shard gets the same
    values as the whole model on one device."""
    return (seed * 0x9E3779B1 + zlib.crc32(stream.encode())) % (2 ** 63)


def _stream(name: str, config: GPTConfig) -> str:
    """The stream a parameter draws from: its name, except that a tied output weight (the
    last pipeline stage's copy of the word embedding) draws as ``wte.weight``. An untied
    output layer is a parameter of its own and draws from its own stream."""
    if name == "output.weight" and not config.untie_embeddings_and_output_weights:
        return "wte.weight"
    return name


def host_values(name: str, shape: torch.Size, dtype: torch.dtype, config: GPTConfig, seed: int) -> torch.Tensor:
    """Megatron's init of one parameter, drawn on the host: N(0, 0.02) weights (the word
    embedding and the output layer, tied or not, the MoE router and the experts' [E, out, in]
    weights too), each block's two output projections (attention's out_proj, the MLP's fc2 or
    down_proj, every expert's down_proj) scaled by 1/sqrt(2L), zero biases, unit norm gains
    (LayerNorm's, RMSNorm's, QK-norm's). Rows of the word embedding or output layer
    past the real vocabulary (the tensor-parallel padding) draw from a second stream, so
    the real rows do not depend on the padding. A fused qkv_proj gets exactly the values
    of the separate q, k and v projections, interleaved per key/value group."""
    if ".qkv_proj." in name:
        return _fused_qkv_values(name, shape, dtype, config, seed)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=dtype)
    if name.startswith("ln_") or ".ln_" in name or name.endswith(QK_NORMS):
        return torch.ones(shape, dtype=dtype)
    std = INIT_STD / math.sqrt(2.0 * config.num_layers) if name.endswith(OUTPUT_PROJECTIONS) else INIT_STD
    stream = _stream(name, config)
    generator = torch.Generator().manual_seed(_init_seed(seed, stream))
    if name in ("wte.weight", "output.weight") and shape[0] > config.vocab_size:
        real = torch.empty((config.vocab_size, *shape[1:]), dtype=dtype).normal_(0.0, std, generator=generator)
        generator.manual_seed(_init_seed(seed, f"{stream}/padding"))
        padding = torch.empty((shape[0] - config.vocab_size, *shape[1:]), dtype=dtype).normal_(
            0.0, std, generator=generator
        )
        return torch.cat([real, padding])
    return torch.empty(shape, dtype=dtype).normal_(0.0, std, generator=generator)


def _fused_qkv_values(name: str, shape: torch.Size, dtype: torch.dtype, config: GPTConfig, seed: int) -> torch.Tensor:
    """q_proj's, k_proj's and v_proj's values (each drawn as the separate parameter),
    rearranged from [q; k; v] to Megatron's per-group [q_g0 (G heads), k_g0, v_g0, q_g1, ...]
    on the output dimension (per head, [q_h0, k_h0, v_h0, ...], without GQA): a fused run
    starts from the same weights as an unfused one."""
    kv_heads, head_dim = config.kv_heads, config.head_dim
    q_size, kv_size = config.num_attention_heads * head_dim, kv_heads * head_dim
    rest = shape[1:]
    q, k, v = (host_values(name.replace(".qkv_proj.", f".{part}."), torch.Size((size, *rest)), dtype, config, seed)
               for part, size in zip(QKV_PARTS, (q_size, kv_size, kv_size), strict=True))
    grouped = [part.view(kv_heads, -1, *rest) for part in (q, k, v)]  # (KV, G D | D | D[, h])
    return torch.cat(grouped, dim=1).reshape(shape)  # (KV, (G + 2) D[, h]) -> ((H + 2 KV) D[, h])


@torch.no_grad()
def init_parameters(model: GPT, seed: int) -> None:
    """Fill every parameter the model (or stage, or shard) holds with the values
    the whole model would have on one device for ``seed``. Sharded parameters
    (DTensors of tensor parallelism or FSDP) draw the whole tensor on the host
    and keep their own shard of it, so every layout starts from the same weights.

    Each parameter draws from a generator of its own (seeded by ``seed`` and its name), so the
    draws run on the process's intra-op threads at once without changing a value: torch's CPU
    normal_ is serial, and drawing 1.3B values one tensor after another took seconds of every
    point's start (on an accelerator, seconds of device time)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    parameters = list(model.named_parameters())

    def draw(item: tuple[str, torch.nn.Parameter]) -> torch.Tensor:
        name, parameter = item
        return host_values(name, parameter.shape, parameter.dtype, model.config, seed)

    workers = max(1, torch.get_num_threads())  # a rank's share of the cores, as its own ops use
    for (_, parameter), values in zip(parameters, _in_order(draw, parameters, workers), strict=True):
        if isinstance(parameter, DTensor):
            full = values.to(parameter.device_mesh.device_type)
            shard = distribute_tensor(full, parameter.device_mesh, parameter.placements, src_data_rank=None)
            parameter.to_local().copy_(shard.to_local())
        else:
            parameter.copy_(values)


def _in_order(draw, items: list, workers: int):
    """``draw(item)`` for each item, in order, computed by ``workers`` threads with at most twice
    that many results held at once (host memory stays a few tensors, not the model)."""
    if workers == 1:
        yield from map(draw, items)
        return
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="hwbench-init") as pool:
        yield from in_order(pool, draw, items, 2 * workers)


def build_model(config: GPTConfig, *, device: torch.device, seed: int, **options: Any) -> GPT:
    """The whole model on ``device`` with weights that depend on ``seed`` alone
    (not on the device): built without storage, then filled tensor by tensor.
    ``options``: GPT's (tensor_parallel, recompute, cross_entropy, fused_qkv)."""
    with torch.device("meta"):
        model = GPT(config, **options)
    model.to_empty(device=device)
    model.tie_output_to_embedding()
    init_parameters(model, seed)
    return model
