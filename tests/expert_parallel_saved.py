"""What one MoE block keeps for its backward on each rank of an expert-parallel group, beside
the planner's figure (tests/test_planner.py runs it):

    python -m torch.distributed.run --nproc-per-node EP --standalone tests/expert_parallel_saved.py OUT_DIR PRECISION

moe-tiny's block (its first layer, an MoE one), experts split over the EP ranks as the native engine
splits them (hwbench.engine.expert_parallel.apply_expert_parallel), 16 sequences of 128 tokens
of each rank's own. Each rank writes OUT_DIR/rank<N>.json: {"saved", "planned", "received_rows",
"assignments"}: the bytes autograd's saved-tensor hooks hold at the end of the forward (each
storage once, parameters and autocast's casts of them left out), the planner's
``activation_bytes_per_layer`` for the block (RoPE's casts left out: no rotary is passed), the
rows this rank's experts received and the assignments its own tokens made (tokens x top k)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import hwbench.engine.expert_parallel as expert_parallel
from hwbench.catalog import load_catalog
from hwbench.planner import activation_bytes_per_layer, save_rules
from hwbench.spec import build_run_spec
from hwbench.workload.model import Block
from tests.saved_tensors import SavedTensors

BATCH, SEQ = 16, 128


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def main(argv: list[str]) -> int:
    out, precision = Path(argv[0]), argv[1]
    dist.init_process_group("gloo")
    rank, ep = dist.get_rank(), dist.get_world_size()
    config = dataclasses.replace(load_catalog().workloads["moe-tiny"].model, vocab_size=100)
    received: list[int] = []
    exchange = expert_parallel._exchange

    def counted(rows, receive, send, group, clock):  # the dispatch's rows are its first exchange of each call
        received.append(sum(receive))
        return exchange(rows, receive, send, group, clock)

    expert_parallel._exchange = counted
    with torch.device("meta"):
        block = Block(config, layer=0)
    expert_parallel.apply_expert_parallel(block, init_device_mesh("cpu", (ep,), mesh_dim_names=("ep",))["ep"], None)
    block.to_empty(device="cpu")
    torch.manual_seed(0)
    for parameter in block.parameters():
        torch.nn.init.normal_(_local(parameter), std=0.02)
    torch.manual_seed(1 + rank)
    x = torch.randn(BATCH, SEQ, config.hidden_size, requires_grad=True)
    # autocast's casts of the experts' DTensor weights are casts of their local tensors, which
    # ParameterCasts does not see as parameters: E / ep experts' gate, up and down, 16-bit
    local = {tuple(_local(p).shape) for p in block.mlp.experts.parameters()}

    def expert_cast(tensors: list[torch.Tensor]) -> bool:
        return precision == "bf16" and any(tuple(t.shape) in local and t.dtype == torch.bfloat16 for t in tensors)

    with SavedTensors() as saved:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            output = block(x)
        kept = saved.held_bytes([_local(p) for p in block.parameters()], leave_out=expert_cast)
    output.float().sum().backward()  # the graph was whole
    spec = build_run_spec({"model": "moe-tiny", "device": "cpu", "data": "synthetic", "precision": precision,
                           "micro_batch_size": BATCH, "seq_length": SEQ}, load_catalog(), check_paths=False)
    planned = activation_bytes_per_layer(SEQ, BATCH, config, 1, save_rules(spec, "cpu", config), 0, ep)
    figures = {"saved": kept, "planned": planned, "received_rows": received[0],
               "assignments": BATCH * SEQ * config.moe_router_topk}
    (out / f"rank{rank}.json").write_text(json.dumps(figures))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
