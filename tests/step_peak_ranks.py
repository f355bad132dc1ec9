"""One rank's measured peak over two training steps of hwbench's native engine on the CPU,
beside the planner's prediction for its pipeline stage (tests/test_planner.py runs it):

    python -m torch.distributed.run --nproc-per-node 2 --standalone tests/step_peak_ranks.py OUT_DIR \\
        MODEL TP PP DP {plain,fsdp} PRECISION [small-vocab] [ep=N]

Each rank writes OUT_DIR/rank<N>.json: {"stage", "measured", "planned", "gradients"} in bytes
(planned less the planner's per-device overhead, which is no tensor of the run), and with expert
parallelism "routed": the most rows this rank's experts received in one forward, over its own
tokens' assignments (1 when the routing is balanced, which the plan assumes). With
HWBENCH_TEST_MICROBATCHES a pipeline runs that many micro-batches a step (default 2), of 16
sequences of 128 tokens: enough that one unit more or less that gloo's timing leaves alive is a
few per cent of the peak. ``ep=N``: a mixture of experts' routed experts split over N of the dp
ranks (--ep)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
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
    for name in ("all_to_all_single", "all_reduce"):  # expert parallelism's and the native engine's own
        setattr(dist, name, _last_reference_here(getattr(dist, name)))
    received = _count_received_rows()
    peak = measured_step_peak(spec, config, ctx=ctx, backend=backend)
    figures = {"stage": ctx.pp_rank, "measured": peak.measured, "planned": peak.planned,
               "gradients": peak.plan.gradients_bytes}
    if received:  # the dispatch's exchanges are every other one (combine's and the backward's between)
        assignments = spec.micro_batch_size * spec.seq_length * config.moe_router_topk
        figures["routed"] = max(received) / assignments
    (Path(out) / f"rank{ctx.rank}.json").write_text(json.dumps(figures))
    dist.destroy_process_group()
    return 0


def _last_reference_here(collective):
    """``collective`` (a blocking call), keeping its tensors here a moment after it returns: gloo's
    worker thread drops its own references to them as it finishes, and a temporary whose last
    reference went there would be freed unseen by the profiler (tests/allocator_peak.py). The
    main thread waits, so nothing is allocated meanwhile: the peak is not changed."""

    @functools.wraps(collective)
    def call(*args, **kwargs):
        work = collective(*args, **kwargs)
        if not kwargs.get("async_op"):
            time.sleep(0.002)
        return work

    return call


def _count_received_rows() -> list[int]:
    """The rows each dispatch of expert parallelism hands this rank's experts, as they happen."""
    import hwbench.engine.expert_parallel as expert_parallel

    received: list[int] = []
    exchange = expert_parallel._exchange
    dispatch = expert_parallel.ExpertParallelDispatch.dispatch

    def counting_dispatch(self, module, args):
        def counted(rows, receive, send, group, clock):
            received.append(sum(receive))
            return exchange(rows, receive, send, group, clock)

        expert_parallel._exchange = counted
        try:
            return dispatch(self, module, args)
        finally:
            expert_parallel._exchange = exchange

    expert_parallel.ExpertParallelDispatch.dispatch = counting_dispatch  # type: ignore[method-assign]
    return received


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
