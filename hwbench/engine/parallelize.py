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

from hwbench.workload.config import stage_layers  # noqa: F401  (the engines and planner share it)
from hwbench.workload.model import GPT


def cut_pipeline_stage(model: GPT, stage: int, stages: int) -> GPT:
    """Keep what pipeline ``stage`` of ``stages`` computes: the embeddings on the
    first, its blocks, the final LayerNorm and output layer on the last. The
    last stage's output layer gets its own weight (the first stage holds the
    word embedding it is tied to); the engine keeps the two equal by summing
    their gradients, as Megatron does."""
    keep = {str(i) for i in stage_layers(len(model.blocks), stages, stage)}
    for name in [n for n in model.blocks if n not in keep]:
        del model.blocks[name]
    if stage > 0:
        model.wte = None
        model.wpe = None
    if stage < stages - 1:
        model.ln_f = None
        model.output = None
    elif stage > 0:
        assert model.output is not None
        model.output.weight = nn.Parameter(model.output.weight.detach().clone())
    return model


def _replicate(module: nn.Module, mesh) -> None:
    """Parameters that tensor parallelism does not split (LayerNorms, positions)
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


def apply_tensor_parallel(model: GPT, tp_mesh, loss_parallel: bool) -> None:
    """Megatron's split with DTensor: q, k, v (or the fused qkv) and fc1 column-parallel, out_proj and
    fc2 row-parallel (one all-reduce after attention and one after the MLP);
    the word embedding vocab-parallel. The output layer is column-parallel over
    the vocabulary: with ``loss_parallel`` its logits stay sharded and the loss
    is computed on the shards (hwbench.workload.model.lm_loss under
    torch.distributed.tensor.parallel.loss_parallel), otherwise they are gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in model.blocks.values():
        # a fused qkv_proj is laid out per head, so its column split gives each rank whole heads
        attention: Any = block.attn  # nn.Module's attributes are typed Tensor | Module
        qkv = ("attn.qkv_proj",) if attention.fused_qkv else ("attn.q_proj", "attn.k_proj", "attn.v_proj")
        parallelize_module(block, tp_mesh, {
            **{name: ColwiseParallel() for name in qkv},
            "attn.out_proj": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(),
            "mlp.fc2": RowwiseParallel(),
        })
        _replicate(block.get_submodule("ln_1"), tp_mesh)
        _replicate(block.get_submodule("ln_2"), tp_mesh)
    if model.wte is not None and model.wpe is not None:
        parallelize_module(model.wte, tp_mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
        _replicate(model.wpe, tp_mesh)
    if model.output is not None and model.ln_f is not None:
        _replicate(model.ln_f, tp_mesh)
        parallelize_module(model.output, tp_mesh, ColwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel))
    # both are the (vocab, hidden) weight sharded on the vocabulary: one parameter again
    model.tie_output_to_embedding()


def apply_fsdp(model: GPT, dp_mesh, reshard_after_forward: bool) -> None:
    """FSDP2 over the data-parallel mesh: each block is one unit (gathered before
    its forward, resharded after), the root holds the rest."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)

