"""--engine deepspeed with --tp / --pp: DeepSpeed's pipeline engine, as
Megatron-DeepSpeed trained the published Table 2 (the Ascend ModelZoo GPT-2 README).

The GPT is a list of layer specs for deepspeed.pipe.PipelineModule, as
Megatron-DeepSpeed's GPTModelPipe builds it: the embedding (a TiedLayerSpec),
one spec per transformer block, the final norm, and the output layer as
the same tied embedding module applied through its word-embedding weight, so
the first and last stage each hold a copy whose gradients DeepSpeed sums
(``_exec_reduce_tied_grads``). An untied output layer (Llama 3.1 8B, 70B) is a
layer of its own on the last stage, column-parallel over the vocabulary, with
nothing to sum. Llama's blocks (RMSNorm, rotary positions, SwiGLU, grouped-query
attention split by key/value heads) are hwbench.engine.tensor_parallel's as GPT-2's
are; with rotary positions the embedding has no position table. Blocks are split over the stages by type
(``partition_method='type:ParallelBlockPipe'``, Megatron-DeepSpeed's
``type:transformer``). Tensor parallelism is Megatron's column/row parallel
layers (hwbench.engine.tensor_parallel) on the ``model`` axis of DeepSpeed's
PipeModelDataParallelTopology; DeepSpeed lays ranks out as hwbench's mesh does
(tensor innermost, then data, pipeline outermost). DeepSpeed runs the rest: its
1F1B TrainSchedule (``train_batch``), gradient reduction over data
parallelism, fp16 with dynamic loss scaling, ZeRO 0 or 1, activation
checkpointing of the blocks (``activation_checkpoint_interval`` 1, DeepSpeed's
own checkpoint function) and clipping.

One deliberate difference from DeepSpeed as it ships: with fp32 and ZeRO 0,
DeepSpeed clips with ``runtime.utils.clip_grad_norm_``, which counts replicated
parameters on model-parallel rank 0 only (on a pipeline, that is the first
stage: the other stages' LayerNorms go uncounted) and the tied embedding on
both stages. That path is replaced here by the norm DeepSpeed's fp16 and ZeRO
optimizers use (every stage, each tensor-parallel duplicate and the tied copy
once), which is also the native engine's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hwbench.device import Backend
from hwbench.device.deepspeed_support import deepspeed_version, prepare_deepspeed
from hwbench.engine.base import StepOutcome, total_grad_norm
from hwbench.engine.deepspeed import DeepSpeedCommon, accelerator_name
from hwbench.engine.distributed import DistContext
from hwbench.engine.tensor_parallel import (
    ColumnParallelLinear,
    ParallelBlock,
    TensorGroup,
    VocabParallelEmbedding,
    copy_to_group,
    gather_last_dim,
    load_host_values,
)
from hwbench.spec import RunSpec
from hwbench.workload.config import GPTConfig
from hwbench.workload.data import Batch
from hwbench.workload.model import lm_loss

TIED_KEY = "embed"  # the TiedLayerSpec key of the word embedding (first stage) and output layer (last stage)
BLOCK_TYPE = "ParallelBlockPipe"  # what partition_method 'type:' and checkpointable_layers match


class EmbeddingPipe(nn.Module):
    """Token ids -> word (+ learned position) embeddings (B, S, h). With a tied output layer
    the last stage holds a second instance only for its word embedding, the output layer's weight."""

    def __init__(self, config: GPTConfig, tp: TensorGroup, seed: int) -> None:
        super().__init__()
        self.wte = VocabParallelEmbedding(config.padded_vocab_size(tp.size), config.hidden_size, tp)
        # rotary positions (Llama) rotate q and k inside each block: no table here
        self.wpe = None if config.rope else nn.Embedding(config.max_position_embeddings, config.hidden_size)
        load_host_values(self, "", config, seed, tp)
        self.tp = tp

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = self.wte(tokens)
        if self.wpe is None:
            return embedded
        return embedded + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))


def output_logits(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """The tied output layer: hidden states times this rank's vocabulary rows of the
    tied word embedding, the slices gathered into (B, S, V) logits."""
    local = torch.nn.functional.linear(copy_to_group(hidden, embedding.tp), embedding.wte.weight)
    return gather_last_dim(local, embedding.tp)


class OutputPipe(nn.Module):
    """An untied output layer (hwbench.workload.model.GPT's ``output``): this rank's rows of the
    vocabulary, the same rows its word embedding holds, the slices gathered into (B, S, V) logits."""

    def __init__(self, config: GPTConfig, tp: TensorGroup, seed: int) -> None:
        super().__init__()
        self.output = ColumnParallelLinear(config.hidden_size, config.padded_vocab_size(tp.size), tp, bias=False)
        load_host_values(self, "", config, seed, tp)
        self.tp = tp

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return gather_last_dim(self.output(hidden), self.tp)


class ParallelBlockPipe(ParallelBlock):
    """Transformer block ``number`` with that block's weights."""

    def __init__(self, config: GPTConfig, tp: TensorGroup, seed: int, number: int) -> None:
        super().__init__(config, tp)
        load_host_values(self, f"blocks.{number}.", config, seed, tp)


class FinalLayerNormPipe(nn.LayerNorm):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config.hidden_size, eps=config.norm_epsilon)  # ones and zeros, as host_values gives


class FinalRMSNormPipe(nn.RMSNorm):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config.hidden_size, eps=config.norm_epsilon)  # unit gains, as host_values gives


def layer_specs(config: GPTConfig, tp: TensorGroup, seed: int) -> list:
    """GPTModelPipe's layer list: embedding, blocks, final norm, the output layer (tied: the
    embedding's module again; untied: its own)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    final_norm = FinalRMSNormPipe if config.normalization == "RMSNorm" else FinalLayerNormPipe
    if config.untie_embeddings_and_output_weights:
        output = LayerSpec(OutputPipe, config, tp, seed)
    else:
        output = TiedLayerSpec(TIED_KEY, EmbeddingPipe, config, tp, seed, forward_fn=output_logits,
                               tied_weight_attr="wte.weight")
    return [
        TiedLayerSpec(TIED_KEY, EmbeddingPipe, config, tp, seed, tied_weight_attr="wte.weight"),
        *[LayerSpec(ParallelBlockPipe, config, tp, seed, number) for number in range(config.num_layers)],
        LayerSpec(final_norm, config),
        output,
    ]


def _checkpoint_function():
    """DeepSpeed's activation checkpointing (Megatron-DeepSpeed's
    deepspeed.checkpointing.checkpoint), configured without an mpu: no
    partitioned activations, which the published runs did not use either."""
    import deepspeed

    deepspeed.checkpointing.configure(None, partition_activations=False, contiguous_checkpointing=False,
                                      checkpoint_in_cpu=False, synchronize=False, profile=False)
    return deepspeed.checkpointing.checkpoint


def build_pipeline_module(config: GPTConfig, spec: RunSpec, tp: TensorGroup):
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    dims = spec.parallel
    topology = PipeModelDataParallelTopology(num_pp=dims.pp, num_mp=dims.tp, num_dp=dims.dp)
    options: dict[str, Any] = {}
    if spec.recompute:
        options = {"activation_checkpoint_interval": 1, "activation_checkpoint_func": _checkpoint_function(),
                   "checkpointable_layers": [BLOCK_TYPE]}
    return PipelineModule(layers=layer_specs(config, tp, spec.seed), topology=topology, loss_fn=lm_loss,
                          partition_method=f"type:{BLOCK_TYPE}", **options)


class DeepSpeedPipelineEngine(DeepSpeedCommon):
    """hwbench's Engine (hwbench.engine.base) over DeepSpeed's PipelineEngine."""

    def __init__(self, config: GPTConfig, spec: RunSpec, backend: Backend, ctx: DistContext) -> None:
        self.spec, self.backend, self.ctx = spec, backend, ctx
        self.patches = prepare_deepspeed(backend)  # before deepspeed is imported
        import deepspeed

        # deepspeed.comm wraps the process group the worker joined; PipelineModule uses it before initialize
        deepspeed.init_distributed(dist_backend=backend.dist_backend, dist_init_required=False)
        tp = TensorGroup(ctx.group("tp"), spec.parallel.tp, ctx.tp_rank) if spec.parallel.tp > 1 else TensorGroup()
        self.module = build_pipeline_module(config, spec, tp)
        self._initialize(self.module, spec.parallel.dp)
        self.grid = self.engine.grid
        self._clipped_norm: torch.Tensor | None = None
        self.replaces_fp32_clip = not hasattr(self.engine.optimizer, "_global_grad_norm")  # fp32 ZeRO 0
        if self.replaces_fp32_clip:
            self.engine.clip_fp32_gradients = self._clip_fp32_gradients

    # the gradient norm ----------------------------------------------------------
    def _counted_grads(self) -> list[torch.Tensor]:
        """Each gradient of the model once: tensor-parallel duplicates on tensor
        rank 0 only, the last stage's copy of the tied embedding not at all
        (DeepSpeed marks it ds_pipe_replicated)."""
        tp_rank = self.grid.get_slice_parallel_rank()
        return [p.grad for p in self.module.parameters()
                if p.grad is not None and not getattr(p, "ds_pipe_replicated", False)
                and (tp_rank == 0 or getattr(p, "tensor_model_parallel", False))]

    def _global_grad_norm(self) -> torch.Tensor:
        """The L2 norm of all gradients of the model, the same on every rank of
        a pipeline (squares summed over the model-parallel group: stages and
        tensor ranks)."""
        squared = total_grad_norm(self._counted_grads(), self.backend.grad_norm_dtype).float() ** 2
        dist.all_reduce(squared, group=self.grid.get_model_parallel_group())
        return squared.sqrt()

    def _clip_fp32_gradients(self) -> None:
        norm = self._global_grad_norm()
        torch.nn.utils.clip_grads_with_norm_(self.module.parameters(), self.engine.gradient_clipping(), norm)
        self._clipped_norm = norm

    # training -----------------------------------------------------------------
    def train_step(self, next_batch: Callable[[], Batch]) -> StepOutcome:
        """One optimizer step: DeepSpeed's train_batch over this step's micro-batches
        (drawn on every rank, as the native engine does; DeepSpeed reads them on
        the first and last stage)."""
        return self._step(lambda: self._train_batch(next_batch))

    def _train_batch(self, next_batch: Callable[[], Batch]) -> tuple[torch.Tensor, torch.Tensor | None]:
        batches = [next_batch() for _ in range(self.engine.gradient_accumulation_steps())]
        self._clipped_norm = None
        loss = self.engine.train_batch(data_iter=iter(batches))  # the global batch's mean loss, on every rank
        clipped = None if self._clipped_norm is None else self._clipped_norm.detach().reshape(())
        return loss.detach().float().reshape(()), clipped

    @torch.no_grad()
    def evaluate(self, batches: Iterable[Batch]) -> tuple[float, int]:
        """Mean validation loss over every rank's ``batches`` (each micro-batch has
        the same tokens, so the token-weighted mean of Megatron is the plain
        mean), through DeepSpeed's eval_batch one global batch at a time."""
        batches = list(batches)
        per_step = self.engine.gradient_accumulation_steps()
        losses = []
        for start in range(0, len(batches), per_step):
            chunk = batches[start:start + per_step]
            loss = self.engine.eval_batch(iter(chunk), num_micro_batches=len(chunk))  # dp-averaged, every stage
            losses.append((float(loss), len(chunk)))
        micro_batches = sum(n for _, n in losses)
        tokens = sum(labels.numel() for _, labels in batches) * self.spec.parallel.dp
        mean = sum(loss * n for loss, n in losses) / max(micro_batches, 1)
        return mean, int(tokens)

    def describe(self) -> dict[str, Any]:
        """The result's ``engine``, in the fields docs/results.md names: the
        deepspeed engine's own, and the layout fields the native engine fills."""
        parts, specs = list(self.module.parts), self.module._layer_specs
        stage_blocks = [[i - 1 for i in range(parts[s], parts[s + 1])
                         if getattr(specs[i], "typename", None) is ParallelBlockPipe] for s in range(len(parts) - 1)]
        pipelined = self.spec.parallel.pp > 1
        return {
            "name": "deepspeed",
            "deepspeed_version": deepspeed_version(),
            "zero_stage": self.spec.zero_stage,
            "dp_size": self.spec.parallel.dp,
            "accelerator": accelerator_name(),
            "tensor_parallel": "megatron" if self.spec.parallel.tp > 1 else None,
            "vocab_parallel": self.spec.parallel.tp > 1,
            "loss_parallel": False,  # the logits are gathered before the loss, as the native engine does with pp
            "pipeline_schedule": "1f1b" if pipelined else None,  # DeepSpeed's TrainSchedule
            "pipeline_microbatches": self.engine.gradient_accumulation_steps() if pipelined else None,
            "pipeline_stage_layers": stage_blocks if pipelined else None,
            "loss_scaling": None if self.spec.precision != "fp16" else (
                "dynamic" if self.spec.loss_scale is None else "fixed"),
            "recompute": self.spec.recompute,
            "config": self.config,
            "patches": self.patches,
        }
