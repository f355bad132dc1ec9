"""Parallelism applied to an unchanged GPT, one function per kind, in a fixed
order (as torchtitan does): cut the pipeline stage, then tensor parallelism,
then FSDP2. Every function works on a model still on the meta device; the
engine materialises and initialises the parameters afterwards
(hwbench.workload.model.init_parameters), so each rank only ever allocates its
own part.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwbench.engine.expert_parallel import apply_expert_tensor_parallel
from hwbench.workload.config import stage_layers  # noqa: F401  (the engines and planner share it)
from hwbench.workload.model import GPT
from hwbench.workload.moe import MoE


def cut_pipeline_stage(model: GPT, stage: int, stages: int) -> GPT:
    """Keep what pipeline ``stage`` of ``stages`` computes: the embeddings on the
    first (the word embedding alone with rotary positions: there is no position
    table), its blocks, the final norm and output layer on the last. A tied output
    layer on a last stage other than the first gets its own copy of the weight (the
    first stage holds the word embedding it is tied to); the engine keeps the two
    equal by summing their gradients, as Megatron does. An untied output layer has a
    weight of its own already: it lives on the last stage alone, with no sum."""
    keep = {str(i) for i in stage_layers(len(model.blocks), stages, stage)}
    for name in [n for n in model.blocks if n not in keep]:
        del model.blocks[name]
    if stage > 0:
        model.wte = None
        model.wpe = None
    if stage < stages - 1:
        model.ln_f = None
        model.output = None
    elif stage > 0 and not model.config.untie_embeddings_and_output_weights:
        assert model.output is not None
        model.output.weight = nn.Parameter(model.output.weight.detach().clone())
    return model


def _replicate(module: nn.Module, mesh) -> None:
    """Parameters that tensor parallelism does not split (norms, positions)
    become replicated DTensors, so every parameter of the model is a DTensor on
    one mesh (optimizer and gradient-norm code then need no special cases); the
    module still takes and returns plain tensors."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module

    def inputs_to_dtensor(_module, inputs, device_mesh):
        return tuple(DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
                     if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)

    def output_to_local(_module, output, _device_mesh):
        return output.to_local() if isinstance(output, DTensor) else output

    distribute_module(module, mesh, input_fn=inputs_to_dtensor, output_fn=output_to_local)


class _Finished(torch.autograd.Function):
    """An async collective's output as the plain tensor it becomes once waited on, the gradient
    passed through unchanged: a tensor-parallel style's output (to_local of a redistribute with
    async_op=True) is an AsyncCollectiveTensor, which torch.compile mishandles as a graph input.
    Tracing records it as a subclass input, and the compiled block's backward then hands the
    collective's backward a plain gradient where a DTensor belongs (AttributeError:
    '_local_tensor'); at run time a compiled kernel can read it without waiting
    (both described in https://github.com/pytorch/pytorch/pull/179849, read 2026-11-29)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor

        value = x.trigger_wait() if isinstance(x, AsyncCollectiveTensor) else x
        return value.view_as(value)  # a new tensor object for autograd to mark, as DTensor.to_local does

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _finish_output(module: nn.Module) -> None:
    """``module`` returns its collective's finished output (``_Finished``): the embedding feeds
    the first block directly when there is no position table to add (rotary positions), and a
    compiled block must get a plain tensor."""
    module.register_forward_hook(lambda _module, _inputs, output: _Finished.apply(output))


def block_plan(block: nn.Module, swiglu: bool) -> dict[str, Any]:
    """One block's DTensor plan, Megatron's split: the attention's input projections
    column-parallel and out_proj row-parallel; the MLP's input projections (fc1, or
    SwiGLU's gate and up) column-parallel and its output projection (fc2, down)
    row-parallel. One all-reduce after attention and one after the MLP.

    Column-parallel q_proj keeps this rank's H / TP query heads and k_proj, v_proj its
    KV / TP key/value heads (the spec refuses a TP that does not divide KV): rank r holds
    query heads r H/TP .. (r+1) H/TP - 1, whose groups (query head i reads key/value head
    i // G) are exactly its key/value heads r KV/TP .., so the local grouped-query
    attention pairs them as the whole model does. A fused qkv_proj is laid out per
    key/value group, so its column split gives each rank whole groups the same way."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    attention: Any = block.get_submodule("attn")  # nn.Module's attributes are typed Tensor | Module
    qkv = ("attn.qkv_proj",) if attention.fused_qkv else ("attn.q_proj", "attn.k_proj", "attn.v_proj")
    plan = {**{name: ColwiseParallel() for name in qkv}, "attn.out_proj": RowwiseParallel()}
    if isinstance(block.get_submodule("mlp"), MoE):  # its own split: apply_expert_tensor_parallel
        return plan
    mlp_in, mlp_out = (("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj") if swiglu else (("mlp.fc1",), "mlp.fc2")
    return {**plan, **{name: ColwiseParallel() for name in mlp_in}, mlp_out: RowwiseParallel()}


def apply_tensor_parallel(model: GPT, tp_mesh, loss_parallel: bool) -> None:
    """Megatron's split with DTensor: each block by ``block_plan``, its norms (LayerNorm or
    RMSNorm) replicated; the word embedding vocab-parallel, its all-reduced output handed on
    finished (``_finish_output``: with rotary positions it is the first block's input, and a
    compiled block needs a plain tensor), a position table replicated (rotary positions have
    none: their tables are made on each rank, like any activation).
    The output layer, tied or untied, is column-parallel over the vocabulary: with
    ``loss_parallel`` its logits stay sharded and the loss is computed on the shards
    (hwbench.workload.model.lm_loss under torch.distributed.tensor.parallel.loss_parallel),
    otherwise they are gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, block_plan(block, model.config.swiglu))
        layer = block.get_submodule("mlp")
        if isinstance(layer, MoE):
            apply_expert_tensor_parallel(layer, tp_mesh)
        _replicate(block.get_submodule("ln_1"), tp_mesh)
        _replicate(block.get_submodule("ln_2"), tp_mesh)
    if model.wte is not None:
        parallelize_module(model.wte, tp_mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
        _finish_output(model.wte)
    if model.wpe is not None:
        _replicate(model.wpe, tp_mesh)
    if model.output is not None and model.ln_f is not None:
        _replicate(model.ln_f, tp_mesh)
        parallelize_module(model.output, tp_mesh, ColwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel))
    # tied: both are the (vocab, hidden) weight sharded on the vocabulary: one parameter again
    model.tie_output_to_embedding()


def apply_fsdp(model: GPT, dp_mesh, reshard_after_forward: bool) -> None:
    """FSDP2 over the data-parallel mesh: each block is one unit (gathered before
    its forward, resharded after), the root holds the rest."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)

