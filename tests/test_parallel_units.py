"""The parts of parallel runs that need no processes: stage splits, loss
scaling, torchrun's environment, root-cause choice, rank merging."""

import pytest
import torch

from hwbench.device.base import MemoryStats
from hwbench.engine.distributed import RankEnvironment
from hwbench.engine.loss_scale import HYSTERESIS, LOSS_SCALE_WINDOW, LossScaler, overflow_flag
from hwbench.engine.parallelize import stage_layers
from hwbench.harness.agent import AgentFailure
from hwbench.harness.launcher import root_cause
from hwbench.harness.merge import RankReport, merge_memory, straggler


def test_stages_split_the_blocks_evenly_first_stages_taking_the_rest():
    assert [list(stage_layers(24, 2, s)) for s in range(2)] == [list(range(12)), list(range(12, 24))]
    assert [len(stage_layers(10, 4, s)) for s in range(4)] == [3, 3, 2, 2]
    assert sorted(i for s in range(4) for i in stage_layers(10, 4, s)) == list(range(10))


def _overflow(overflowed: bool) -> torch.Tensor:
    return overflow_flag(torch.tensor(float("nan") if overflowed else 1.0))


def test_dynamic_loss_scale_halves_after_hysteresis_and_grows_after_the_window():
    scaler = LossScaler(2.0 ** 12, dynamic=True)
    for _ in range(HYSTERESIS - 1):
        scaler.update(_overflow(True))
    assert scaler.scale == 2.0 ** 12  # Megatron and DeepSpeed tolerate one overflow first
    scaler.update(_overflow(True))
    assert scaler.scale == 2.0 ** 11
    for _ in range(LOSS_SCALE_WINDOW):
        scaler.update(_overflow(False))
    assert scaler.scale == 2.0 ** 12


def test_fixed_loss_scale_never_changes():
    scaler = LossScaler(65536.0, dynamic=False)
    for overflow in (True, True, True, False):
        scaler.update(_overflow(overflow))
    assert scaler.scale == 65536.0


def test_a_pod_with_only_rank_and_world_size_is_not_a_torchrun_worker():
    operator_pod = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}
    assert RankEnvironment.from_environ(operator_pod) is None  # it launches torchrun itself
    worker = {**operator_pod, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1",
              "TORCHELASTIC_RUN_ID": "x", "RANK": "9", "WORLD_SIZE": "16"}
    env = RankEnvironment.from_environ(worker)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (9, 16, 0, 8, 1)


def test_the_root_cause_is_the_rank_that_failed_first_not_its_peers():
    # rank 1 raised; rank 0 then lost its peer in a collective and was SIGTERMed by torchrun
    failures = [AgentFailure(rank=0, signal="SIGTERM", timestamp=100), AgentFailure(rank=1, signal=None, timestamp=100)]
    beats = {0: {"failed_at": 50.7}, 1: {"failed_at": 50.2}}
    assert root_cause(failures, beats).rank == 1
    # a rank killed by SIGKILL (the OOM killer, say) outranks the peers torchrun stopped
    failures = [AgentFailure(rank=0, signal="SIGTERM", timestamp=1),
                AgentFailure(rank=3, signal="SIGKILL", timestamp=2)]
    assert root_cause(failures, {}).rank == 3


def _report(rank, times, peak):
    return RankReport(rank=rank, step_times_s=times,
                      memory=MemoryStats(peak_allocated_bytes=peak, peak_reserved_bytes=peak, capacity_bytes=None,
                                         alloc_retries=None, ooms=0, source="x"))


def test_merged_memory_is_the_peak_over_ranks_and_names_it():
    merged = merge_memory([_report(0, [1.0], 10), _report(1, [1.0], 30), _report(2, [1.0], None)])
    assert merged.peak_allocated_bytes == 30 and merged.peak_allocated_rank == 1 and merged.ooms == 0


def test_the_straggler_is_the_rank_with_the_slowest_median_step():
    reports = [_report(0, [1.0, 1.0, 1.1], 1), _report(1, [1.5, 1.6, 1.4], 1), _report(2, [1.0, 0.9, 1.0], 1)]
    slow = straggler(reports)
    assert slow.rank == 1 and slow.ratio == pytest.approx(1.5 / 1.0)
    assert straggler(reports[:1]) is None


def test_oom_figures_are_read_from_the_cuda_and_npu_allocator_messages():
    from hwbench.device.base import oom_figures

    cuda = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which "
            "3.56 MiB is free. Process 1 has 79.09 GiB memory in use.")
    assert oom_figures(cuda) == {"requested_bytes": 20 * 2**20, "free_bytes": int(3.56 * 2**20)}
    npu = ("NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity; 57.28 GiB already "
           "allocated; 57.28 GiB current active; 1.23 GiB free; 58.00 GiB reserved in total by PyTorch)")
    assert oom_figures(npu) == {"requested_bytes": 2 * 2**30, "free_bytes": int(1.23 * 2**30)}
    assert oom_figures("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes") == {}


@pytest.mark.parametrize("text", ["bogus", "1:2:explode", "one:2:raise"])
def test_a_malformed_fault_is_one_clear_line(monkeypatch, text):
    from hwbench.errors import UsageError
    from hwbench.harness.faults import Fault

    monkeypatch.setenv("HWBENCH_FAULT", text)
    with pytest.raises(UsageError, match="HWBENCH_FAULT"):
        Fault.from_environ()


def test_the_cpu_gradient_norm_is_reduced_in_fp64():
    """torch's fp32 L2-norm kernel on the CPU sums into one float (pytorch/pytorch#169237):
    the tiny model's 6.4M-element embedding gradient read 2.4e-4 low; 20M equal elements
    read 5.9e-5 low here. The engines' norm, reduced in the backend's grad_norm_dtype, must
    match an fp64 reference."""
    from hwbench.device.cpu import CpuBackend
    from hwbench.engine.base import total_grad_norm

    grads = [torch.full((20_000_000,), 1e-3), torch.ones(4096)]
    exact = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
    got = total_grad_norm(grads, CpuBackend.grad_norm_dtype)
    assert got.dtype == torch.float32 and abs(got.item() - exact) / exact < 1e-6
    assert total_grad_norm([], CpuBackend.grad_norm_dtype).item() == 0.0


# --- the tensor-parallel plan of the Llama block, each rank's shard computed alone ---------------

def _llama_config(heads: int, kv_heads: int):
    from hwbench.workload import GPTConfig

    return GPTConfig(num_layers=1, hidden_size=64, num_attention_heads=heads, max_position_embeddings=64,
                     vocab_size=256, num_query_groups=kv_heads, ffn_hidden_size=96, swiglu=True,
                     normalization="RMSNorm", position_embedding_type="rope", rotary_base=500000.0,
                     add_bias_linear=False)


def _rank_shard(block: torch.nn.Module, plan: dict, rank: int, tp: int) -> torch.nn.Module:
    """``block`` as rank ``rank`` of ``tp`` holds it under ``plan``: DTensor's Shard of a
    ColwiseParallel weight is torch.chunk over the output features, of a RowwiseParallel one over
    the input features."""
    import copy

    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    shard = copy.deepcopy(block)
    for name, style in plan.items():
        linear = shard.get_submodule(name)
        assert isinstance(style, ColwiseParallel | RowwiseParallel) and linear.bias is None
        dim = 0 if isinstance(style, ColwiseParallel) else 1
        linear.weight = torch.nn.Parameter(linear.weight.detach().chunk(tp, dim=dim)[rank].clone())
    return shard


@pytest.mark.parametrize("heads,kv_heads,tp", [(8, 4, 2), (8, 2, 2), (8, 4, 4), (4, 4, 2)],
                         ids=["gqa-g2-tp2", "gqa-g4-tp2", "gqa-g2-tp4", "mha-tp2"])
@pytest.mark.parametrize("fused_qkv", [False, True], ids=["qkv", "fused-qkv"])
def test_each_rank_of_the_llama_tp_plan_pairs_its_query_heads_with_their_key_value_heads(heads, kv_heads, tp,
                                                                                         fused_qkv):
    """The engine's plan (parallelize.block_plan) split over ``tp`` ranks: q_proj by query heads,
    k_proj/v_proj (or the fused per-group qkv_proj) by key/value heads, SwiGLU's gate/up by
    columns and down by rows. Each rank's attention and MLP computed alone, on its shard, sum to
    the whole block's: a rank's query heads read exactly the key/value heads it holds (query head
    i reads head i // G), with rotary positions applied per rank. Trained-scale weights, so a
    query head paired with another head's keys and values would show."""
    from hwbench.engine.parallelize import block_plan
    from hwbench.workload.layers import RotaryEmbedding
    from hwbench.workload.model import Block

    config = _llama_config(heads, kv_heads)
    torch.manual_seed(0)
    block = Block(config, fused_qkv=fused_qkv)
    with torch.no_grad():
        for parameter in block.parameters():
            if parameter.ndim == 2:
                parameter.normal_(0.0, parameter.shape[1] ** -0.5)
    plan = block_plan(block, swiglu=True)
    assert set(plan) == {*(("attn.qkv_proj",) if fused_qkv else ("attn.q_proj", "attn.k_proj", "attn.v_proj")),
                         "attn.out_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    x = torch.randn(2, 12, 64)
    rotary = RotaryEmbedding(config).tables(12, x.device)
    shards = [_rank_shard(block, plan, rank, tp) for rank in range(tp)]
    with torch.no_grad():
        attention = sum(shard.attn(x, rotary) for shard in shards)  # out_proj's all-reduce
        mlp = sum(shard.mlp(x) for shard in shards)  # down_proj's all-reduce
        torch.testing.assert_close(attention, block.attn(x, rotary), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mlp, block.mlp(x), rtol=1e-5, atol=1e-5)
        assert block.attn(x, rotary).abs().mean() > 0.1  # outputs of trained scale, not near zero
