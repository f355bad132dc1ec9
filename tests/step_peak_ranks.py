"""One rank's measured peak over two training steps of hwbench's native engine on the CPU,
beside the planner's prediction for its pipeline stage (tests/test_planner.py runs it):

    python -m torch.distributed.run --nproc-per-node 2 --standalone tests/step_peak_ranks.py OUT_DIR \\
        MODEL TP PP DP {plain,fsdp} PRECISION [small-vocab] [ep=N]

Each rank writes OUT_DIR/rank<N>.json: {"stage", "measured", "planned", "gradients"} in bytes
(planned less the planner's per-device overhead, which is no tensor of the run). With
HWBENCH_TEST_MICROBATCHES a pipeline runs that many micro-batches a step (default 2), of 16
sequences of 128 tokens: enough that one unit more or less that gloo's timing leaves alive is a
few per cent of the peak. ``ep=N``: a mixture of experts' routed experts split over N of the dp
ranks (--ep)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from hwbench.catalog import load_catalog
from hwbench.device.cpu import CpuBackend
from hwbench.engine.distributed import RankEnvironment, init_distributed
from hwbench.spec import build_run_spec
from tests.allocator_peak import measured_step_peak

# 100 tokens in the vocabulary: the blocks' activations, not the logits, are most of the peak
SMALL_VOCAB = {"vocab_size": 100, "make_vocab_size_divisible_by": 64}


def main(argv: list[str]) -> int:
    out, model, tp, pp, dp, variant, precision = argv[0], argv[1], *map(int, argv[2:5]), argv[5], argv[6]
    catalog = load_catalog()
    microbatches = int(os.environ.get("HWBENCH_TEST_MICROBATCHES", "2")) if pp > 1 else 1
    ep = next((int(arg[3:]) for arg in argv[7:] if arg.startswith("ep=")), None)
    spec = build_run_spec({"model": model, "device": "cpu", "data": "synthetic", "precision": precision, "tp": tp,
                           "pp": pp, "fsdp": variant == "fsdp" or None, "micro_batch_size": 16, "seq_length": 128,
                           "global_batch_size": 16 * dp * microbatches, "nproc_per_node": tp * pp * dp, "ep": ep},
                          catalog, check_paths=False)
    config = catalog.workloads[model].model
    if "small-vocab" in argv:
        config = dataclasses.replace(config, **SMALL_VOCAB)
    backend = CpuBackend()
    env = RankEnvironment.from_environ()
    assert env is not None, "run under torchrun"
    backend.prepare_process(local_rank=env.local_rank, local_world_size=env.local_world_size)
    ctx = init_distributed(backend, spec.parallel, env, 300)
    peak = measured_step_peak(spec, config, ctx=ctx, backend=backend)
    figures = {"stage": ctx.pp_rank, "measured": peak.measured, "planned": peak.planned,
               "gradients": peak.plan.gradients_bytes}
    (Path(out) / f"rank{ctx.rank}.json").write_text(json.dumps(figures))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
