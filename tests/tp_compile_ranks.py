"""One rank of a tensor-parallel Llama-architecture model (rotary positions, so the vocab-parallel
embedding feeds the first block directly; RMSNorm, SwiGLU, grouped-query attention, no biases)
run eagerly and with its blocks compiled, from the same weights on the same tokens
(tests/test_tp_compile.py runs it):

    python -m torch.distributed.run --nproc-per-node 2 --standalone tests/tp_compile_ranks.py OUT_DIR BACKEND

BACKEND is torch.compile's (``inductor``, what ``--compile`` uses, or ``aot_eager``: the same
AOTAutograd graphs without code generation). Each rank writes OUT_DIR/rank<N>.json:
{"first_block_input": the type of the tensor the embedding gave the first block, "loss": [eager, compiled],
"max_gradient_difference": the largest absolute difference of this rank's gradient shards}, or
{"error": "Type: message"} when the compiled forward or backward raised."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from hwbench.engine.parallelize import apply_tensor_parallel
from hwbench.workload.config import GPTConfig
from hwbench.workload.model import GPT, init_parameters

SEED = 1234
CONFIG = GPTConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=128,
                   swiglu=True, normalization="RMSNorm", position_embedding_type="rope", add_bias_linear=False,
                   max_position_embeddings=64, vocab_size=256, make_vocab_size_divisible_by=64)


def tensor_parallel_model(mesh) -> GPT:
    with torch.device("meta"):
        model = GPT(CONFIG, tensor_parallel=mesh.size())
    apply_tensor_parallel(model, mesh, loss_parallel=False)
    model.to_empty(device="cpu")
    model.tie_output_to_embedding()
    init_parameters(model, SEED)
    return model


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def main(out: Path, backend: str) -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(SEED))
    labels = tokens.roll(-1, dims=1)
    eager, compiled = tensor_parallel_model(mesh), tensor_parallel_model(mesh)
    inputs: list[str] = []
    # what the embedding hands the first block (the hook runs after tensor parallelism's own)
    assert compiled.wte is not None
    compiled.wte.register_forward_hook(lambda _module, _args, output: inputs.append(type(output).__name__))
    for block in compiled.blocks.values():
        block.compile(backend=backend)
    eager_loss = eager(tokens, labels)
    eager_loss.backward()
    report: dict[str, object]
    try:
        compiled_loss = compiled(tokens, labels)
        compiled_loss.backward()
    except Exception as error:  # the failure is the finding: recorded for the test to name
        report = {"error": f"{type(error).__name__}: {error}"}
    else:
        gradients = dict(eager.named_parameters())
        difference = max(float((local(p.grad) - local(gradients[name].grad)).abs().max())
                         for name, p in compiled.named_parameters())
        report = {"loss": [eager_loss.item(), compiled_loss.item()], "max_gradient_difference": difference}
    report["first_block_input"] = inputs[0] if inputs else None
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
