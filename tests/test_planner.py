"""hwbench.planner against hand-computed bytes (docs/planner.md has the model)."""

import dataclasses
from pathlib import Path

import pytest

from hwbench.catalog import load_catalog
from hwbench.cli import run_command
from hwbench.commands.run import parse_run_spec
from hwbench.errors import UsageError
from hwbench.planner import (
    GIB,
    OVERHEAD_BYTES,
    SaveRules,
    activation_bytes_per_layer,
    microbatches_in_flight,
    parse_size,
    plan_for_all_stages,
    plan_memory,
    plan_stage,
    save_rules,
    stage_parameters,
)
from hwbench.spec import ParallelDims
from hwbench.workload.config import GPTConfig
from hwbench.workload.params import count_parameters


def main(argv):
    return run_command("plan", argv)


# 2 layers, h = 64, 4 heads, 32 positions, vocab 100 -> padded 128 at TP1, 256 at TP2.
CONFIG = GPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, max_position_embeddings=32,
                   vocab_size=100, make_vocab_size_divisible_by=128)
# one block at TP1: LN 2*64 + q,k,v 3*(64*64 + 64) + out_proj 64*64 + 64 + LN 2*64
#                   + fc1 64*256 + 256 + fc2 256*64 + 64
BLOCK = 128 + 3 * (4096 + 64) + 4096 + 64 + 128 + 16384 + 256 + 16384 + 64
assert BLOCK == 49_984  # = 12h^2 + 13h
EMBEDDING = 128 * 64 + 32 * 64  # wte (padded vocab x h) + wpe = 10_240
LN_F = 2 * 64
N = EMBEDDING + 2 * BLOCK + LN_F  # 110_336; the output layer is tied to wte
S, B, H = 16, 2, 64
SBH = S * B * H  # 2048
TOKENS = S * B  # 32
# per token and block: two LayerNorms' fp32 mean and rstd (16 bytes), SDPA's fp32 log-sum-exp per head (16)
STATS = 2 * 2 * 4 + 4 * 4
CPU = OVERHEAD_BYTES["cpu"]
FP32_RULES = SaveRules(act=4, residual=4)


def spec_for(tp=1, pp=1, dp=1, precision="fp32", recompute=False, engine="native", zero=0, fsdp=False,
             schedule="1f1b", global_batch=None):
    base = parse_run_spec(["--model", "tiny", "--data", "synthetic"], check_paths=False)
    return dataclasses.replace(base, parallel=ParallelDims(tp=tp, pp=pp, dp=dp), precision=precision,
                               recompute=recompute, engine=engine, zero_stage=zero, fsdp=fsdp, pp_schedule=schedule,
                               seq_length=S, micro_batch_size=B, global_batch_size=global_batch or B * dp,
                               max_positions=None)  # None: CONFIG's own 32 positions, not tiny's 128


def test_single_device_fp32_breakdown_by_hand():
    plan = plan_memory(spec_for(), CONFIG, "cpu")
    assert plan.parameters == N == count_parameters(CONFIG).total == 110_336
    assert plan.weights_bytes == 4 * N and plan.gradients_bytes == 4 * N
    assert plan.optimizer_bytes == 8 * N  # AdamW: two fp32 moments
    # per layer, fp32 (act = residual = 4 bytes): LN inputs 2*4 + qkv/fc1 inputs 2*4
    # + (q,k 8 + v 4 + proj in 4 + gelu in 16 + fc2 in 16) = 16 + 48 = 64 bytes per s*b*h,
    # and 32 bytes per token of statistics
    assert activation_bytes_per_layer(S, B, CONFIG, 1, FP32_RULES) == SBH * 64 + TOKENS * STATS == 132_096
    head = SBH * (4 + 4) + TOKENS * 8  # final LN input (fp32) and its mean and rstd + output layer input
    assert plan.activations_bytes == 2 * 132_096 + head == 280_832
    sv = S * B * 128
    # the fp32 log-softmax kept; in its backward the fp32 gradient nll_loss gives it and the one it makes
    assert plan.logits_bytes == sv * 4 + sv * (4 + 4) == 49_152
    assert plan.buffers_bytes == plan.gathered_bytes == plan.step_transient_bytes == 0
    assert plan.overhead_bytes == CPU
    # one micro-batch: no gradients yet when the backward starts, all of them when it ends
    assert plan.gradients_before_backward_bytes == 0
    assert plan.total_bytes == 12 * N + max(280_832 + 49_152, 4 * N) + CPU == 16 * N + CPU
    assert plan.stage == 0 and plan.microbatches_in_flight == 1
    accumulating = plan_memory(spec_for(global_batch=2 * B), CONFIG, "cpu")  # two micro-batches: the gradients stay
    assert accumulating.gradients_before_backward_bytes == 4 * N
    assert accumulating.total_bytes == 16 * N + 280_832 + 49_152 + CPU


def test_autocast_activations_keep_an_fp32_residual_stream():
    plan = plan_memory(spec_for(precision="bf16"), CONFIG, "cpu")
    assert plan.weights_bytes == 4 * N and plan.optimizer_bytes == 8 * N  # fp32 weights and states
    # act 2, residual 4, separate q/k/v: 2*4 + (3 + 1)*2 + 12*2 = 40 per s*b*h (Korthikanti's 34 - 2 masks
    # + 4 for fp32 LN inputs + 4 for the two more 16-bit copies of the first LN's output q, k and v keep)
    head = SBH * (4 + 2) + TOKENS * 8
    assert plan.activations_bytes == 2 * (SBH * 40 + TOKENS * STATS) + head
    # one fused q/k/v projection reads one copy: 2*4 + 2*2 + 12*2 = 36
    fused = plan_memory(dataclasses.replace(spec_for(precision="bf16"), fused_qkv=True), CONFIG, "cpu")
    assert fused.activations_bytes == 2 * (SBH * 36 + TOKENS * STATS) + head
    # deepspeed converts the model: all 16-bit, the paper's 8 + 24/t (no dropout masks); the statistics stay fp32
    half = SaveRules(act=2, residual=2)
    assert activation_bytes_per_layer(S, B, CONFIG, 1, half) == SBH * 32 + TOKENS * STATS
    assert activation_bytes_per_layer(S, B, CONFIG, 2, half) == SBH * (8 + 12) + TOKENS * (16 + 16 // 2)


def saved_by_one_block(config, precision, fused_qkv, batch, seq, rotary=None):
    """The bytes one real block keeps for its backward at the end of its forward (autograd's
    saved-tensor hooks, each storage once, those still held: a node of a branch the forward
    dropped, such as a capacity's choice of tokens, frees what it saved), on the CPU under bf16
    autocast or in fp32. Parameters and their 16-bit copies (autocast's, the experts' casts) are
    left out: the planner counts those apart (weights, cast_weights). The block's input counts
    (the first norm keeps it)."""
    import torch

    from hwbench.workload.model import Block
    from tests.saved_tensors import SavedTensors

    torch.manual_seed(0)
    block = Block(config, fused_qkv=fused_qkv)
    for parameter in block.parameters():  # the experts' and the router's weights are made empty
        torch.nn.init.normal_(parameter, std=0.02)
    x = torch.randn(batch, seq, config.hidden_size, requires_grad=True)
    with SavedTensors() as saved:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = block(x) if rotary is None else block(x, rotary)
        kept = saved.held_bytes(block.parameters())
    out.float().sum().backward()  # the graph was whole
    return kept


@pytest.mark.parametrize("precision,fused_qkv", [("fp32", False), ("bf16", False), ("bf16", True)])
def test_a_planned_block_keeps_what_the_real_block_saves_for_its_backward(precision, fused_qkv):
    """Every byte one real GPT block saves for its backward, to the byte, against
    activation_bytes_per_layer. Separate q, k and v projections under autocast each cast the
    LayerNorm output again (autocast caches the casts of parameters only): three 16-bit copies
    of it are kept, one with the fused projection."""
    pytest.importorskip("torch")
    batch, seq = 2, 48  # batch x seq apart from h and 4h, so no activation has a weight's shape
    kept = saved_by_one_block(CONFIG, precision, fused_qkv, batch, seq)
    spec = dataclasses.replace(spec_for(precision=precision), fused_qkv=fused_qkv)
    rules = save_rules(spec, "cpu", CONFIG)
    assert rules.attention_input_copies == (3 if precision == "bf16" and not fused_qkv else 1)
    assert kept == activation_bytes_per_layer(seq, batch, CONFIG, 1, rules)


@pytest.mark.parametrize("precision,fused_qkv", [("fp32", False), ("bf16", False), ("bf16", True)])
@pytest.mark.parametrize("groups", [2, 4], ids=["gqa", "mha"])
def test_a_planned_llama_block_keeps_what_the_real_block_saves(precision, fused_qkv, groups):
    """The same for a Llama block (RMSNorm, RoPE, SwiGLU; grouped-query or multi-head attention):
    every byte it saves, to the byte. RMSNorm runs torch's composite on the CPU; the rotation keeps
    the tables (fp32: the shared tables themselves, in buffers; bf16: their casts, per block)."""
    torch = pytest.importorskip("torch")
    from hwbench.planner import rope_tables_bytes
    from hwbench.workload.layers import RotaryEmbedding

    config = dataclasses.replace(LLAMA, num_query_groups=groups)
    batch, seq = 2, 48
    rotary = RotaryEmbedding(config).tables(seq, torch.device("cpu"))
    kept = saved_by_one_block(config, precision, fused_qkv, batch, seq, rotary)
    rules = save_rules(dataclasses.replace(spec_for(precision=precision), fused_qkv=fused_qkv), "cpu", config)
    assert (rules.mlp_input_copies, rules.fused_rms_norm) == ((2 if precision == "bf16" else 1), False)
    shared_tables = rope_tables_bytes(config, seq) if precision == "fp32" else 0
    assert kept == activation_bytes_per_layer(seq, batch, config, 1, rules) + shared_tables


# what the linear layers read at TP1: a block less its two LayerNorms, and the output weight (wte)
LINEAR = 2 * (BLOCK - 4 * 64) + 128 * 64


def test_autocast_16bit_copies_of_the_linear_parameters_are_counted_once_per_rank():
    bf16 = plan_memory(spec_for(precision="bf16"), CONFIG, "cpu")
    assert bf16.cast_weights_bytes == 2 * LINEAR
    working = bf16.activations_bytes + bf16.logits_bytes + 2 * LINEAR  # the copies are alive as the backward starts
    assert bf16.total_bytes == (bf16.weights_bytes + bf16.optimizer_bytes + CPU
                                + max(working, bf16.gradients_bytes))
    assert plan_memory(spec_for(), CONFIG, "cpu").cast_weights_bytes == 0  # fp32: nothing is cast
    # DeepSpeed holds the weights in 16 bits itself: no copies
    assert plan_memory(spec_for(precision="bf16", engine="deepspeed"), CONFIG, "cuda").cast_weights_bytes == 0
    # FSDP2: autocast casts the unsharded parameters, and the copies outlive the reshard: not / dp
    fsdp = plan_memory(spec_for(precision="bf16", dp=4, fsdp=True), CONFIG, "cuda")
    assert fsdp.cast_weights_bytes == 2 * LINEAR and fsdp.weights_bytes == 4 * N // 4
    # TP2: this rank's shares (block biases of the row-parallel layers whole), vocab 256 / 2
    tp2 = plan_memory(spec_for(precision="bf16", tp=2), CONFIG, "cpu")
    assert tp2.cast_weights_bytes == 2 * (2 * (25_184 - 4 * 64) + 256 * 64 // 2)
    # PP2: the first stage's block; the last stage's block and its own output weight
    first, last = plan_for_all_stages(spec_for(precision="bf16", pp=2, global_batch=4 * B), CONFIG, "cpu")
    assert (first.cast_weights_bytes, last.cast_weights_bytes) == (2 * (BLOCK - 256), 2 * (BLOCK - 256 + 128 * 64))


@pytest.mark.parametrize("recompute", [False, True])
def test_the_planned_copies_are_what_autocast_keeps_alive_at_the_end_of_the_forward(recompute):
    """The real model under bf16 autocast on the CPU: every 16-bit copy the planner counts is
    alive when the forward ends (autocast's cache holds it, with or without recompute). Without
    recompute the weights' copies then stay for the backward (saved for the input gradients),
    with recompute only the output layer's (its block copies are made again, one block at a time)."""
    torch = pytest.importorskip("torch")
    from hwbench.engine.parallelize import cut_pipeline_stage
    from hwbench.workload.model import GPT, build_model, init_parameters, lm_loss
    from tests.autocast_copies import forward_backward

    tokens = torch.randint(0, CONFIG.vocab_size, (B, S), generator=torch.Generator().manual_seed(0))
    model = build_model(CONFIG, device=torch.device("cpu"), seed=1, recompute=recompute)
    alive = forward_backward(model, tokens, lambda logits: lm_loss(logits, torch.roll(tokens, -1, 1)))
    plan = plan_memory(spec_for(precision="bf16", recompute=recompute), CONFIG, "cpu")
    assert alive["end_of_forward"] == plan.cast_weights_bytes > 0
    biases = 2 * 2 * (3 * 64 + 64 + 256 + 64)  # 2 blocks' linear biases, 2 bytes each: not saved
    output = 2 * 128 * 64
    assert alive["after_autocast"] == (output if recompute else plan.cast_weights_bytes - biases)
    assert alive["after_backward"] == 0

    # a pipeline's first stage: its blocks only, no output layer
    with torch.device("meta"):
        first = cut_pipeline_stage(GPT(CONFIG, recompute=recompute), 0, 2)
    first.to_empty(device=torch.device("cpu"))
    init_parameters(first, 1)
    alive = forward_backward(first, tokens, lambda hidden: hidden.float().square().mean())
    planned = plan_stage(spec_for(precision="bf16", recompute=recompute, pp=2, global_batch=4 * B), CONFIG, "cpu", 0)
    assert alive["end_of_forward"] == planned.cast_weights_bytes == 2 * (BLOCK - 256)


def test_under_fsdp2_each_rank_keeps_the_copies_of_every_unsharded_block(tmp_path):
    """Two real ranks with hwbench's FSDP2 units: at the end of the forward each rank holds
    16-bit copies of the whole model's linear parameters, not of one gathered block."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
         str(root / "tests" / "autocast_copies.py"), str(tmp_path), "--recompute"],
        capture_output=True, text=True, timeout=300, cwd=root)
    assert completed.returncode == 0, completed.stderr[-3000:]
    plan = plan_memory(spec_for(precision="bf16", recompute=True, dp=2, fsdp=True), CONFIG, "cuda")
    for rank in (0, 1):
        alive = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert alive["end_of_forward"] == plan.cast_weights_bytes == 2 * LINEAR
        assert alive["end_of_forward"] > plan.weights_bytes // 2  # more than this rank's fp32 shard in 16 bits


def test_tensor_parallel_halves_block_weights_but_not_layernorms():
    p1, p2 = stage_parameters(CONFIG, 1, 1, 0), stage_parameters(CONFIG, 2, 1, 0)
    # TP2: (q,k,v,fc1 weights+biases, out_proj/fc2 weights) / 2; 2 LNs (4h) and 2 row biases (2h) whole
    assert p2.block == (3 * (4096 + 64) + 4096 + 16384 + 256 + 16384) // 2 + 4 * 64 + 2 * 64 == 25_184
    assert p1.block == BLOCK
    assert p2.embedding == 256 * 64 // 2 + 32 * 64  # vocab padded to 256 at TP2, split; positions whole
    plan = plan_memory(spec_for(tp=2), CONFIG, "cpu")
    assert plan.weights_bytes == 4 * (p2.embedding + 2 * 25_184 + LN_F)


def test_pipeline_first_and_last_stage():
    first, last = (stage_parameters(CONFIG, 1, 2, s) for s in (0, 1))
    assert first.total == EMBEDDING + BLOCK and first.head == 0
    assert last.total == BLOCK + LN_F + 128 * 64  # own copy of the tied output weight
    plans = plan_for_all_stages(spec_for(pp=2, global_batch=4 * B), CONFIG, "cpu")
    assert [p.logits_bytes > 0 for p in plans] == [False, True]
    assert plan_memory(spec_for(pp=2, global_batch=4 * B), CONFIG, "cpu").stage == \
        max(plans, key=lambda p: p.total_bytes).stage


def test_in_flight_microbatches_1f1b_vs_gpipe():
    one_f = spec_for(pp=2, global_batch=4 * B)  # 4 micro-batches
    gpipe = spec_for(pp=2, global_batch=4 * B, schedule="gpipe")
    assert [microbatches_in_flight(one_f, s) for s in (0, 1)] == [2, 1]
    assert [microbatches_in_flight(gpipe, s) for s in (0, 1)] == [4, 4]
    assert microbatches_in_flight(spec_for(global_batch=4 * B), 0) == 1  # accumulation, no pipeline
    plan = plan_stage(gpipe, CONFIG, "cpu", 0)
    # one block on stage 0, and the stage's output the pipeline keeps for the backward, 4 micro-batches
    assert plan.activations_bytes == 4 * (SBH * 64 + TOKENS * STATS + SBH * 4)
    assert plan_stage(one_f, CONFIG, "cpu", 0).activations_bytes == 2 * (SBH * 64 + TOKENS * STATS + SBH * 4)
    # receive buffers, fp32 (b, s, h): stage 0 one for each micro-batch's output gradient; stage 1 one
    # for each micro-batch's input, less the one in flight (the first block's saved input), and the
    # 3 input gradients the micro-batches done keep until the next step
    assert [plan_stage(one_f, CONFIG, "cpu", stage).buffers_bytes for stage in (0, 1)] == [4 * SBH * 4,
                                                                                           (3 + 3) * SBH * 4]
    # a pipeline interleaves micro-batches: the earlier ones' gradients are there as a backward starts
    assert plan.gradients_before_backward_bytes == plan.gradients_bytes > 0


def test_recompute_keeps_block_inputs_and_one_block():
    plan = plan_memory(spec_for(recompute=True), CONFIG, "cpu")
    # two block inputs, one block recomputed, the final LN's input and statistics and the output layer's input
    assert plan.activations_bytes == 2 * SBH * 4 + (SBH * 64 + TOKENS * STATS) + SBH * 8 + TOKENS * 8
    assert plan.activations_bytes < plan_memory(spec_for(), CONFIG, "cpu").activations_bytes


def test_zero_stages_divide_the_right_states():
    dp = 4
    z = {k: plan_memory(spec_for(dp=dp, engine="deepspeed", zero=k, precision="fp16"), CONFIG, "cuda")
         for k in range(4)}
    # ZeRO paper: 2 (fp16 weights) + 2 (fp16 grads) + 12 (fp32 master, m, v) bytes per parameter
    assert (z[0].weights_bytes, z[0].gradients_bytes, z[0].optimizer_bytes) == (2 * N, 2 * N, 12 * N)
    assert (z[1].weights_bytes, z[1].gradients_bytes, z[1].optimizer_bytes) == (2 * N, 2 * N, 12 * N // dp)
    assert (z[2].weights_bytes, z[2].gradients_bytes, z[2].optimizer_bytes) == (2 * N, 2 * N // dp, 12 * N // dp)
    assert (z[3].weights_bytes, z[3].gradients_bytes, z[3].optimizer_bytes) == (2 * N // dp, 2 * N // dp,
                                                                                12 * N // dp)
    assert z[3].gathered_bytes > 0 and z[2].gathered_bytes == 0
    # 16-bit deepspeed activations: everything 2 bytes
    assert z[0].activations_bytes == 2 * (SBH * 32 + TOKENS * STATS) + SBH * 4 + TOKENS * 8
    assert z[0].gradients_before_backward_bytes == z[0].gradients_bytes  # DeepSpeed's counted as there


def test_fsdp_shards_everything_and_gathers_units():
    dp = 4
    plain = plan_memory(spec_for(dp=dp), CONFIG, "cuda")
    fsdp = plan_memory(spec_for(dp=dp, fsdp=True), CONFIG, "cuda")
    assert (fsdp.weights_bytes, fsdp.gradients_bytes, fsdp.optimizer_bytes) == (N, N, 2 * N)  # 4N, 4N, 8N / 4
    assert plain.buffers_bytes == 4 * N  # DDP's gradient buckets
    # root unit (embeddings + final LN) + 2 blocks (computing, prefetched) + 1 block's gradients, fp32
    assert fsdp.gathered_bytes == 4 * (EMBEDDING + LN_F + 2 * BLOCK) + 4 * BLOCK


def test_flat_gradient_allreduce_is_a_transient_after_backward():
    plan = plan_memory(spec_for(tp=2, dp=2), CONFIG, "cuda")
    assert plan.step_transient_bytes == plan.gradients_bytes
    static = plan.weights_bytes + plan.optimizer_bytes + plan.overhead_bytes
    # after the backward: every gradient and the flat buffer; before it, no gradient yet (one micro-batch)
    assert plan.total_bytes == static + max(plan.activations_bytes + plan.logits_bytes,
                                            plan.gradients_bytes + plan.step_transient_bytes)


def test_stage_parameters_match_the_real_model():
    torch = pytest.importorskip("torch")
    from hwbench.engine.parallelize import cut_pipeline_stage
    from hwbench.workload.model import GPT

    for stages in (1, 2):
        for stage in range(stages):
            with torch.device("meta"):
                model = cut_pipeline_stage(GPT(CONFIG), stage, stages) if stages > 1 else GPT(CONFIG)
            real = sum(p.numel() for p in model.parameters())  # tied weights counted once
            assert real == stage_parameters(CONFIG, 1, stages, stage).total


def test_sizes():
    assert parse_size("32GiB") == 32 * 2 ** 30 and parse_size("24G") == 24 * 2 ** 30
    assert parse_size("80GB") == 80 * 10 ** 9 and parse_size("1024") == 1024
    assert parse_size("1.3KiB") == 1331  # a unit's fraction of a byte is dropped
    for bytes_with_a_fraction in ("4.5", "4.5B"):  # a number of bytes is whole, not truncated
        with pytest.raises(UsageError, match=r"--device-memory '4\.5B?' is not a size; .*whole bytes with no unit"):
            parse_size(bytes_with_a_fraction)
    plan = plan_memory(spec_for(), CONFIG, "cpu")
    assert plan.fits(GIB) and not plan.fits(GIB // 2)


NO_FLOAT_COMMANDS = [["plan", "--model", "tiny", "--devices", "2"], ["tune", "--model", "tiny", "--devices", "2"],
                     ["run", "--model", "tiny", "--settings", "fast"]]


def _no_float_argv(command: list[str], size: str, out: Path) -> list[str]:
    return [*command, "--device-memory", size, "--out", str(out)][: None if command[0] == "run" else -2]


def _assert_refused_in_one_line(code: int, stderr: str, size: str, out: Path) -> None:
    assert code == 2 and len(stderr.splitlines()) == 1, stderr
    assert f"--device-memory {size[:30]!r}"[:-1] in stderr and "80GB" in stderr  # an accepted size
    assert not out.exists()


@pytest.mark.parametrize("command", NO_FLOAT_COMMANDS)
@pytest.mark.parametrize("size", ["9" * 400 + "GB", "9" * 300 + "TB", "0.1", "\u0668\u0660GB"],
                         ids=["400-digits", "inf-after-the-unit", "under-a-byte", "arabic-indic-digits"])
def test_a_device_memory_no_float_holds_is_one_line_exit_2(tmp_path, capsys, command, size):
    """400 digits were a float's inf and int() of it an OverflowError traceback (exit 1) in plan,
    tune and run; under a byte was 0 bytes; digits other than 0-9 were read as a number. Through
    hwbench's main() (an exception it did not turn into a line would fail the test); a real
    process of each command below."""
    from hwbench.cli import main as hwbench_main

    out = tmp_path / "out"
    code = hwbench_main(_no_float_argv(command, size, out))
    _assert_refused_in_one_line(code, capsys.readouterr().err, size, out)


@pytest.mark.parametrize("command", NO_FLOAT_COMMANDS)
def test_a_device_memory_no_float_holds_is_one_line_exit_2_in_a_real_process(tmp_path, command):
    """The 400 digits, which were an OverflowError traceback and exit 1, in a real `hwbench` process."""
    import subprocess
    import sys

    size, out = "9" * 400 + "GB", tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "hwbench", *_no_float_argv(command, size, out)], capture_output=True,
                          text=True, timeout=60)
    _assert_refused_in_one_line(done.returncode, done.stderr, size, out)


def _rows(out):
    return [line.split() for line in out.splitlines() if line[:1].isdigit() and "x" in line.split()[0]]


def _variant(row):
    """The row's variant, and "+recompute" after it where the row recomputes."""
    end = next(i for i, word in enumerate(row) if word.split("+")[0] in ("fp32", "bf16", "fp16"))
    return " ".join(row[1:end]) + ("+recompute" if row[end].endswith("+recompute") else "")


def test_main_lists_layouts(capsys):
    assert main(["--model", "1.3b", "--devices", "8", "--device-memory", "32GiB"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert {r[0] for r in rows} >= {"2x2x2", "8x1x1", "1x8x1"}
    totals = [float(r[-2]) for r in rows]
    assert totals == sorted(totals)


def test_main_marks_what_does_not_fit(capsys):
    # 3.7B params x 16 bytes (fp32 weights + grads + 2 moments) = 59 GB: no 32 GiB device holds DP8 plain
    assert main(["--model", "3.7b", "--devices", "8", "--device-memory", "32GiB", "--precision", "fp16",
                 "--micro-batch-size", "1", "--global-batch-size", "64"]) == 0
    by_variant = {(r[0], _variant(r)): r[-1] for r in _rows(capsys.readouterr().out)}
    assert by_variant[("1x1x8", "native")] == "no"
    assert by_variant[("1x1x8", "deepspeed zero0")] == "no"  # 16 bytes/param as well
    assert by_variant[("1x1x8", "deepspeed zero3")] == "yes"
    assert by_variant[("8x1x1", "native")] == "yes"


def test_a_decimal_device_memory_is_said_as_it_was_read(capsys):
    """80GB is 80 x 10^9 bytes, 74.5 GiB: the plan says so and how to give 80 GiB; a binary unit needs no word."""
    assert main(["--model", "1.3b", "--devices", "8", "--device-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "device memory 74.51 GiB" in out
    assert ("note: --device-memory 80GB is read as 80 x 10^9 bytes = 74.5 GiB (GB is a power of 10, as disks "
            "count); for 80 x 2^30 bytes give 80GiB\n") in out
    assert main(["--model", "1.3b", "--devices", "8", "--device-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "device memory 80.00 GiB" in out and "is read as" not in out


def test_main_one_layout_every_stage(capsys):
    assert main(["--model", "1.3b", "--layout", "2x2x2", "--device-model", "h100-sxm"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [r[3] for r in rows] == ["0", "1"]


@pytest.mark.parametrize("argv, option", [
    (["--device-memory", "32XB"], "--device-memory"),
    (["--device-memory", "32GiB", "--layout", "2x2"], "--layout"),
    (["--device-memory", "32GiB", "--devices", "0"], "--devices"),
    (["--device-model", "nope"], "--device-model"),
    (["--device-model", "a100-sxm"], "--device-memory"),
    ([], "--device-memory"),
    (["--device-memory", "32GiB", "--backend", "tpu"], "--backend"),
    (["--device-memory", "32GiB", "--model", "1.3b", "--layout", "3x1x1"], "--tp"),
    # a line per layout and exit 0
    (["--device-memory", "32GiB", "--devices", "4", "--model", "nosuch"], "--model 'nosuch' is not in the catalog"),
    # a minute enumerating the splits of 30000, then refused as --nproc-per-node
    (["--device-memory", "32GiB", "--devices", "30000"], "--devices 30000 is not accepted; give an integer from 1 to"),
    (["--device-memory", "32GiB", "--layout", "100x100x1"], "--layout 100x100x1 has 10000 ranks"),
    (["--device-memory", "32GiB", "--layout", "1x1x" + "9" * 5000], "--layout '1x1x999"),  # beyond int()'s digits
])
def test_bad_input_is_one_line(argv, option):
    with pytest.raises(UsageError) as error:
        main(argv)
    assert option in str(error.value) and "\n" not in str(error.value)


# --- the Llama architecture ----------------------------------------------------------------
# GQA (4 query heads, 2 key/value heads of 16), SwiGLU of width 192, RMSNorm, RoPE, no biases
LLAMA = dataclasses.replace(CONFIG, num_query_groups=2, ffn_hidden_size=192, swiglu=True, normalization="RMSNorm",
                            position_embedding_type="rope", add_bias_linear=False)
KV = 2 * 16  # key/value width: kv_heads x head size


def test_llama_block_and_stage_parameters_by_hand():
    # RMSNorms 2*64; q and out_proj 64*64 each; k and v 64*32 each; gate, up, down 64*192 each; no biases
    block = 2 * 64 + 2 * 64 * 64 + 2 * 64 * KV + 3 * 64 * 192
    assert stage_parameters(LLAMA, 1, 1, 0).block == block == 49_280
    # TP2 splits every projection (k and v by key/value heads), the norms stay whole
    assert stage_parameters(LLAMA, 2, 1, 0).block == (block - 128) // 2 + 128
    tied = stage_parameters(LLAMA, 1, 1, 0)
    assert tied.embedding == 128 * 64  # no position table with RoPE
    assert tied.head == 64  # the final RMSNorm; the tied output layer is the word embedding
    assert tied.total == count_parameters(LLAMA).total
    assert tied.linear == 2 * (block - 128) + 128 * 64
    untied = dataclasses.replace(LLAMA, untie_embeddings_and_output_weights=True)
    assert stage_parameters(untied, 1, 1, 0).head == 64 + 128 * 64  # an output weight of its own
    assert stage_parameters(untied, 1, 1, 0).total == count_parameters(untied).total
    # pp 2: the untied output layer is the last stage's, vocab-parallel over TP (V/t rows)
    first, last = (stage_parameters(untied, 2, 2, stage) for stage in (0, 1))
    assert first.embedding == 256 * 64 // 2 and first.head == 0
    assert last.embedding == 0 and last.head == 64 + 256 * 64 // 2


@pytest.mark.parametrize("name", ["llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b", "llama-tiny",
                                  "llama-small", "1.3b", "mixtral-8x7b", "qwen3-30b-a3b", "moe-tiny", "moe-small"])
def test_every_stage_split_adds_up_to_the_model_cards_count(name):
    """One rank at TP1 holds the whole model (count_parameters: the model cards' figures); a
    pipeline's stages hold it once, and a tied output layer's copy on the last stage once more."""
    from hwbench.catalog import load_catalog

    config = load_catalog().workloads[name].model
    total = count_parameters(config).total
    assert stage_parameters(config, 1, 1, 0).total == total
    stages = [stage_parameters(config, 1, 4, stage) for stage in range(4)]
    copy = 0 if config.untie_embeddings_and_output_weights else config.padded_vocab_size() * config.hidden_size
    assert sum(stage.total for stage in stages) == total + copy


def test_llama_8b_parameters_per_tp_rank_by_hand():
    from hwbench.catalog import load_catalog

    config = load_catalog().workloads["llama3.1-8b"].model
    assert count_parameters(config).total == 8_030_261_248  # the model card's
    h, kv, f = 4096, 8 * 128, 14336
    assert stage_parameters(config, 8, 1, 0).block == (2 * h * h + 2 * h * kv + 3 * h * f) // 8 + 2 * h == 27_271_168
    whole = stage_parameters(config, 8, 1, 0)
    # the vocabulary padded to a multiple of 128 x 8 = 129,024; the word embedding and the untied
    # output layer (on the last stage) hold V/8 rows each
    assert config.padded_vocab_size(8) == 129_024
    assert whole.embedding == whole.head - h == 129_024 * h // 8


def test_gqa_keeps_narrower_keys_and_values():
    """Per token, fp32: q 4 x 64 and k, v 4 x 32 each (2 key/value heads of 16), against 4 x 64 each
    with multi-head attention; a fused projection keeps its whole output (the views of v hold it) and
    the copies made of it: q (rotated, or gathered from its groups) and k (rotated)."""
    from hwbench.planner import qkv_saved_per_token

    assert qkv_saved_per_token(LLAMA, FP32_RULES) == 4 * (64 + 2 * KV) == 512
    mha = dataclasses.replace(LLAMA, num_query_groups=None)
    assert qkv_saved_per_token(mha, FP32_RULES) == 4 * 3 * 64
    fused = dataclasses.replace(FP32_RULES, fused_qkv=True)
    assert qkv_saved_per_token(LLAMA, fused) == 4 * (64 + 2 * KV) + 4 * 64 + 4 * KV
    no_rope = dataclasses.replace(LLAMA, position_embedding_type="learned_absolute")
    assert qkv_saved_per_token(no_rope, fused) == 4 * (64 + 2 * KV) + 4 * 64  # q gathered from the groups
    assert qkv_saved_per_token(CONFIG, fused) == 4 * 3 * 64  # GPT: q, k, v are views of the one output


def test_swiglu_rmsnorm_and_rope_terms_by_hand():
    from hwbench.planner import norm_saved_per_token, rope_saved_per_layer, rope_tables_bytes, saved_per_token

    bf16 = save_rules(spec_for(precision="bf16"), "cpu", LLAMA)
    assert (bf16.act, bf16.residual, bf16.attention_input_copies, bf16.mlp_input_copies) == (2, 4, 3, 2)
    per_token = saved_per_token(LLAMA, 1, bf16)
    # SwiGLU: gate's output (SiLU's input), SiLU's output, up's output, their product (down's input)
    assert per_token.mlp == 4 * 2 * 192
    assert per_token.mlp_inputs == 2 * 2 * 64  # gate and up each cast the fp32 norm output
    assert per_token.attention == 2 * 64 + 4 * 4  # SDPA's output, and its fp32 log-sum-exp for 4 heads
    # RMSNorm: composite on the CPU (fp32 input, fp32 normalised output, rstd), fused on CUDA (input, rstd)
    assert norm_saved_per_token(LLAMA, bf16) == 2 * 4 * 64 + 4
    assert norm_saved_per_token(LLAMA, save_rules(spec_for(precision="bf16"), "cuda", LLAMA)) == 4 * 64 + 4
    assert norm_saved_per_token(CONFIG, bf16) == 4 * 64 + 8  # LayerNorm: input, mean, rstd
    # RoPE: the cos and sin tables (s, 16) in fp32, once; in bf16 each block keeps q's and k's casts of both
    assert rope_tables_bytes(LLAMA, S) == 2 * S * 16 * 4
    assert rope_saved_per_layer(LLAMA, S, bf16) == 4 * S * 16 * 2
    assert rope_saved_per_layer(LLAMA, S, FP32_RULES) == rope_saved_per_layer(CONFIG, S, bf16) == 0
    plan = plan_memory(spec_for(precision="bf16"), LLAMA, "cpu")
    assert plan.buffers_bytes == 2 * S * 16 * 4
    assert plan.activations_bytes == (2 * (TOKENS * per_token.total + 4 * S * 16 * 2)
                                      + TOKENS * ((2 * 4 * 64 + 4) + 2 * 64))  # final norm, output layer's input


def test_llama_8b_logits_over_the_llama_3_vocabulary():
    """8192 tokens x 128256 x 4 bytes = 4.2 GB a copy: the kept fp32 log-softmax and, in its
    backward, the two fp32 gradients: 12.6 GB on the last stage."""
    from hwbench.catalog import load_catalog
    from hwbench.spec import build_run_spec

    catalog = load_catalog()
    spec = build_run_spec({"model": "llama3.1-8b", "device": "cuda"}, catalog, check_paths=False)
    plan = plan_memory(spec, catalog.workloads["llama3.1-8b"].model, "cuda")
    assert (spec.seq_length, spec.micro_batch_size, spec.precision) == (8192, 1, "bf16")
    assert plan.logits_bytes == 8192 * 128256 * 12 == 12_608_077_824


def test_plan_llama_8b_on_8_cards_of_80gib(capsys):
    """8.03e9 parameters x 16 bytes (fp32 weights, gradients, two moments) are 128 GB: no
    layout without sharding fits an 80 GiB card, ZeRO-3 over 8 does (FSDP2 too with recompute),
    and the lines under the table say what each layout that does not fit would need."""
    assert main(["--model", "llama3.1-8b", "--devices", "8", "--device-memory", "80GiB", "--device", "cuda",
                 "--no-recompute"]) == 0
    out = capsys.readouterr().out
    fitting = {(r[0], _variant(r)): r[-1] for r in _rows(out)}
    assert fitting[("1x1x8", "native")] == fitting[("1x1x8", "deepspeed zero0")] == "no"
    assert fitting[("1x1x8", "deepspeed zero3")] == "yes"
    # tensor and pipeline parallelism run the Llama layers: planned as the rest, none skipped; TP8 (one of
    # the 8 key/value heads a rank) fits with the least, no pipeline does at this micro batch
    assert "skipped" not in out and len({name for name, _ in fitting}) == 10
    assert fitting[("8x1x1", "native")] == "yes" and _rows(out)[0][:2] == ["8x1x1", "native"]
    assert all(fit == "no" for (name, _), fit in fitting.items() if name.split("x")[1] != "1")
    # seq 8192 without recompute: 51 GiB of activations a rank leave FSDP2 over 8 out
    assert fitting[("1x1x8", "native fsdp")] == "no"
    lines = {line.split(":")[1].split(" stage")[0].strip(): line for line in out.splitlines()
             if line.startswith("does not fit: ")}
    assert set(lines) == {f"{name} {variant}" for (name, variant), fit in fitting.items() if fit == "no"}
    # 8 bytes x 8.03e9 of moments, 51 GiB of activations, DDP's buckets: a second copy of the gradients
    assert lines["1x1x8 native"] == ("does not fit: 1x1x8 native: 227.77 GiB > 72.00 GiB usable; largest: "
                                     "optimizer 59.83, activations 51.47, buffers 29.92")
    assert main(["--model", "llama3.1-8b", "--devices", "8", "--device-memory", "80GiB", "--device", "cuda",
                 "--recompute"]) == 0
    fitting = {(r[0], _variant(r)): r[-1] for r in _rows(capsys.readouterr().out)}
    assert fitting[("1x1x8", "native fsdp+recompute")] == "yes" and fitting[("1x1x8", "native+recompute")] == "no"
    # given neither, every layout is planned without recompute and with it
    assert main(["--model", "llama3.1-8b", "--devices", "8", "--device-memory", "80GiB", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    both = {(r[0], _variant(r)): r[-1] for r in _rows(out)}
    assert both == {**fitting, **{key: fit for key, fit in both.items() if not key[1].endswith("+recompute")}}
    assert len(both) == 2 * len(fitting)
    assert "does not fit: 1x1x8 native fsdp: " in out and "does not fit: 1x1x8 native fsdp+recompute" not in out


# --- the mixture of experts ------------------------------------------------------------------
# LLAMA's attention with 4 SwiGLU experts of width 96, top-2, Megatron's load-balancing loss
MOE = dataclasses.replace(LLAMA, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=96, moe_aux_loss_coeff=0.01)
MOE_BLOCK = 2 * 64 + 2 * 64 * 64 + 2 * 64 * KV + 4 * 64 + 4 * 3 * 64 * 96  # norms, attention, router, experts
EXPERTS = 4 * 3 * 64 * 96  # one layer's routed experts


def _with_ep(spec, ep, **changes):
    """``spec`` with the expert-parallel degree ``ep`` (--ep)."""
    return dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, ep=ep), **changes)


def test_moe_block_and_stage_parameters_by_hand():
    """An MoE block: the attention and norms as Llama's, the router (E x h) and every expert;
    expert parallelism keeps E / ep experts a rank; --moe-layer-freq 2 makes layer 1 dense."""
    assert MOE_BLOCK == 86_400
    assert stage_parameters(MOE, 1, 1, 0).block == MOE_BLOCK
    assert stage_parameters(MOE, 1, 1, 0).experts == 2 * EXPERTS
    assert stage_parameters(MOE, 1, 1, 0).total == count_parameters(MOE).total
    assert stage_parameters(MOE, 1, 1, 0, ep=2).block == MOE_BLOCK - EXPERTS // 2
    assert stage_parameters(MOE, 1, 1, 0, ep=4).experts == 2 * EXPERTS // 4
    alternating = dataclasses.replace(MOE, moe_layer_freq=2, moe_shared_expert_intermediate_size=32)
    stage = stage_parameters(alternating, 1, 1, 0)
    shared = 3 * 64 * 32
    assert (stage.block, stage.blocks) == (MOE_BLOCK + shared, MOE_BLOCK + shared + 49_280)  # layer 1: LLAMA's
    assert stage.total == count_parameters(alternating).total
    # the linear layers autocast reads: every block less its norms (the router and experts included)
    assert stage.linear == stage.blocks - 2 * 128 + 128 * 64
    # QK-norm (Qwen3) over a head size of its own: q and o 64 x 4 x 32, k and v 64 x 2 x 32, two norms of 32
    qwen = dataclasses.replace(MOE, kv_channels=32, qk_layernorm=True)
    assert stage_parameters(qwen, 1, 1, 0).block == 2 * 64 + 2 * 64 * 128 + 2 * 64 * 64 + 2 * 32 + 4 * 64 + EXPERTS
    assert stage_parameters(qwen, 1, 1, 0).total == count_parameters(qwen).total


def test_moe_stage_parameters_match_the_real_model():
    torch = pytest.importorskip("torch")
    from hwbench.workload.model import GPT

    for config in (MOE, dataclasses.replace(MOE, moe_layer_freq=2, moe_shared_expert_intermediate_size=32,
                                            kv_channels=32, qk_layernorm=True)):
        with torch.device("meta"):
            model = GPT(config)
        assert sum(p.numel() for p in model.parameters()) == stage_parameters(config, 1, 1, 0).total


# (config, fused_qkv) per routing: Mixtral's (softmax, renormalised), shared experts, a capacity
# (two masks of the kept assignments), sigmoid top-1 (nothing renormalised), OLMoE's unnormalised
# softmax, no load-balancing loss, and Qwen3's QK-norm over a head size of its own
MOE_BLOCKS = [
    pytest.param(MOE, id="mixtral"),
    pytest.param(dataclasses.replace(MOE, moe_shared_expert_intermediate_size=32), id="shared-experts"),
    pytest.param(dataclasses.replace(MOE, moe_expert_capacity_factor=1.0), id="capacity"),
    pytest.param(dataclasses.replace(MOE, moe_router_score_function="sigmoid", moe_router_topk=1), id="sigmoid-top1"),
    pytest.param(dataclasses.replace(MOE, moe_router_pre_softmax=True, moe_aux_loss_coeff=0.0), id="pre-softmax"),
    pytest.param(dataclasses.replace(MOE, kv_channels=32, qk_layernorm=True), id="qk-norm"),
]


@pytest.mark.parametrize("precision,fused_qkv", [("fp32", False), ("bf16", False), ("fp32", True), ("bf16", True)])
@pytest.mark.parametrize("config", MOE_BLOCKS)
def test_a_planned_moe_block_keeps_what_the_real_block_saves(config, precision, fused_qkv):
    """Every byte a real MoE block keeps for its backward, to the byte: the router's scores,
    choices and weights, the dispatch order, the grouped GEMMs' rows (cast once per projection
    under autocast), the experts' SwiGLU, combine's rows, the offsets; QK-norm's fp32 inputs and
    statistics. Dropless routing runs T k rows whatever the choices, so the count is exact."""
    torch = pytest.importorskip("torch")
    from hwbench.planner import rope_tables_bytes
    from hwbench.workload.layers import RotaryEmbedding

    batch, seq = 2, 48
    rotary = RotaryEmbedding(config).tables(seq, torch.device("cpu"))
    kept = saved_by_one_block(config, precision, fused_qkv, batch, seq, rotary)
    rules = save_rules(dataclasses.replace(spec_for(precision=precision), fused_qkv=fused_qkv), "cpu", config)
    shared_tables = rope_tables_bytes(config, seq) if precision == "fp32" else 0
    assert kept == activation_bytes_per_layer(seq, batch, config, 1, rules) + shared_tables


def test_moe_terms_by_hand():
    """Per token of an MoE layer under bf16 autocast (c = 2): the router's fp32 scores 4E, its top-2
    (int64) and their weights, renormalised (fp32: the two, their sum, the result), the dispatch's
    order and rows (int64); the rows cast for gate and up (2 x k x h x c), the experts' SwiGLU
    (4 x k x f_e x c), down's output and the unsorted rows (2 x k x h x c); the router's own cast
    of the norm output (one copy, not SwiGLU's two). Expert parallelism adds the rows combine's
    all-to-all brings back, concatenated (k x h x c), and dispatch's order of the received rows
    (int64, k); the grouped GEMMs keep the offsets of this rank's E / ep experts."""
    from hwbench.planner import saved_per_token

    bf16 = save_rules(spec_for(precision="bf16"), "cpu", MOE)
    per_token = saved_per_token(MOE, 1, bf16)
    assert per_token.router == 4 * 4 + 8 * 2 + 4 * 2 + (4 * 2 + 4) + 2 * 8 * 2
    assert per_token.experts == 2 * (2 * 2 * 64 + 4 * 2 * 96 + 2 * 2 * 64)
    assert (per_token.mlp_inputs, per_token.mlp) == (2 * 64, 0)
    assert saved_per_token(MOE, 1, bf16, ep=2).experts - per_token.experts == 2 * (64 * 2 + 8)
    assert (activation_bytes_per_layer(S, B, MOE, 1, bf16, ep=2) - activation_bytes_per_layer(S, B, MOE, 1, bf16)
            == TOKENS * 2 * (64 * 2 + 8) - 4 * 4 // 2)
    dense = saved_per_token(dataclasses.replace(MOE, moe_layer_freq=2), 1, bf16, layer=1)
    assert (dense.router, dense.experts, dense.mlp) == (0, 0, 4 * 2 * 192)  # layer 1: LLAMA's SwiGLU


def test_expert_parallelism_shards_the_experts_and_fsdp_over_the_rest():
    """--ep 2 over dp 4: each rank holds half the experts (all their states); under FSDP2 the
    experts are sharded over the 2 ranks holding the same ones and the rest over all 4, so each
    rank holds a quarter of every state, as without expert parallelism."""
    spec = spec_for(dp=4)
    plain, ep2 = plan_memory(spec, MOE, "cuda"), plan_memory(_with_ep(spec, 2), MOE, "cuda")
    assert plain.weights_bytes - ep2.weights_bytes == 4 * 2 * EXPERTS // 2  # two MoE layers, half their experts
    assert plain.optimizer_bytes - ep2.optimizer_bytes == 8 * 2 * EXPERTS // 2
    fsdp, fsdp_ep2 = (plan_memory(dataclasses.replace(s, fsdp=True), MOE, "cuda") for s in (spec, _with_ep(spec, 2)))
    assert fsdp_ep2.weights_bytes == fsdp.weights_bytes == 4 * count_parameters(MOE).total // 4
    assert fsdp_ep2.gathered_bytes < fsdp.gathered_bytes  # a gathered MoE block holds this rank's experts
    assert any(note.startswith("expert parallelism: balanced routing assumed") for note in ep2.notes)
    # DDP leaves the experts out of its buckets; their gradients are one flat all-reduce at the step
    assert plain.buffers_bytes - ep2.buffers_bytes == 4 * 2 * EXPERTS // 2 + 4 * 2 * EXPERTS // 2
    assert (plain.step_transient_bytes, ep2.step_transient_bytes) == (0, 4 * 2 * EXPERTS // 2)
    assert not any(note.startswith("expert parallelism") for note in plain.notes)


def test_plan_mixtral_on_8_cards_of_80gib(capsys):
    """46,702,792,704 parameters x 16 bytes (fp32 weights and gradients, AdamW's two moments) are
    747 GB, 695.93 GiB: more than 8 x 72 GiB usable however they are sharded, so no layout fits
    and the plan says so, with the devices the states alone need."""
    argv = ["--model", "mixtral-8x7b", "--devices", "8", "--device-memory", "80GiB", "--device", "cuda",
            "--no-recompute"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    fitting = {(r[0], _variant(r)): r[-1] for r in _rows(out)}
    assert fitting and set(fitting.values()) == {"no"}
    # DDP: every rank holds the whole model: 174 GiB of fp32 weights, their gradients, DDP's buckets, 348 of moments
    assert ("does not fit: 1x1x8 native: 1005.87 GiB > 72.00 GiB usable; largest: optimizer 347.96, buffers "
            "173.99, weights 173.98\n") in out
    assert ("no layout fits: the weights, gradients and optimizer state alone are 695.93 GiB, more than the 8 "
            "devices' 576.00 GiB usable; fully sharded they need at least 10 devices, before any activation\n") in out
    # what `hwbench run` refuses for a mixture of experts (pipelining, DeepSpeed) is listed with its reason,
    # not planned; tensor parallelism splits every expert's width (docs/parallel.md)
    assert ("1x2x4", "native") not in fitting and "skipped 1x2x4: --pp 2" in out
    tensor_parallel = {("8x1x1", "native"), ("4x1x2", "native"), ("4x1x2", "native fsdp"), ("2x1x4", "native"),
                       ("2x1x4", "native fsdp")}
    # expert parallelism over every degree dividing the 8 experts and the 8 data-parallel ranks, with
    # DDP and with FSDP2, at tp = pp = 1 only (the engine refuses it beside tensor or pipeline parallelism)
    assert set(fitting) == tensor_parallel | {("1x1x8", f"native{fsdp}{ep}") for fsdp in ("", " fsdp")
                                              for ep in ("", " ep2", " ep4", " ep8")}
    assert not any(": --ep " in line for line in out.splitlines() if line.startswith("skipped "))
    lines = [line for line in out.splitlines() if line.startswith("does not fit: ")]
    assert len(lines) == len(fitting)
    # TP8 needs the least (an eighth of every state, 87 GiB, and an eighth of the experts' activations), and
    # still more than a card; of the expert-parallel layouts FSDP2 with EP8, twice a card
    assert lines[0] == ("does not fit: 8x1x1 native: 119.10 GiB > 72.00 GiB usable; largest: optimizer 43.51, "
                        "weights 21.75, grads 21.75")
    assert ("does not fit: 1x1x8 native fsdp ep8: 154.87 GiB > 72.00 GiB usable; largest: activations 48.75, "
            "optimizer 43.50, weights 21.75\n") in out
    # DDP with EP8: the experts an eighth, attention and the embeddings whole; DDP's buckets hold the rest's
    # gradients, the experts' go in one flat all-reduce over their edp ranks at the step
    assert ("does not fit: 1x1x8 native ep8: 178.37 GiB > 72.00 GiB usable; largest: optimizer 53.96, activations "
            "48.75, weights 26.98\n") in out


def test_plan_mixtral_on_16_cards_fits_fsdp2_with_ep8_and_recompute(capsys):
    """On 16 cards of 80 GiB two layouts fit, both with recompute: TP8 over FSDP2 of 2 (60.42 GiB a
    rank) and FSDP2 with EP8 (66.24 GiB): FSDP2 alone casts every expert of a block to 16 bits
    (86.75 GiB), EP4 two of each layer; without recompute FSDP2 with EP8 keeps 48.75 GiB of
    activations. Each layout is planned without recompute and with it, as neither --recompute nor
    --no-recompute is given."""
    assert main(["--model", "mixtral-8x7b", "--devices", "16", "--device-memory", "80GiB", "--device", "cuda"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows[0][:4] == ["8x1x2", "native", "fsdp", "bf16+recompute"] and rows[0][-2:] == ["60.42", "yes"]
    assert rows[1][:5] == ["1x1x16", "native", "fsdp", "ep8", "bf16+recompute"]
    assert rows[1][-2:] == ["66.24", "yes"] and [row for row in rows if row[-1] == "yes"] == rows[:2]
    assert sorted(_variant(row) for row in rows if row[0] == "1x1x16") == sorted(  # ep16 divides dp, not the experts
        f"native{fsdp}{ep}{recompute}" for fsdp in ("", " fsdp") for ep in ("", " ep2", " ep4", " ep8")
        for recompute in ("", "+recompute"))


@pytest.mark.parametrize("model, devices, degrees", [
    ("qwen3-30b-a3b", 8, (2, 4, 8)),  # 128 experts
    ("moe-small", 6, (2,)),  # 16 experts over 6 ranks: 3 and 6 divide dp, not the experts
    ("moe-tiny", 4, (2, 4)),  # 4 experts
])
def test_plan_offers_every_expert_parallel_degree_dividing_the_experts_and_dp(capsys, model, devices, degrees):
    assert main(["--model", model, "--devices", str(devices), "--device-memory", "80GiB"]) == 0
    variants = {_variant(row).removesuffix("+recompute") for row in _rows(capsys.readouterr().out)
                if row[0] == f"1x1x{devices}"}
    assert variants == {f"native{fsdp}{ep}" for fsdp in ("", " fsdp")
                        for ep in ("", *(f" ep{degree}" for degree in degrees))}


def test_a_dense_model_has_no_expert_parallel_layouts(capsys):
    assert main(["--model", "llama-tiny", "--devices", "4", "--device-memory", "80GiB"]) == 0
    assert not any(" ep" in _variant(row) for row in _rows(capsys.readouterr().out))


def test_mixtral_sharded_over_8_still_needs_more_than_a_card():
    """FSDP2 over 8 (and expert parallelism over 8, each rank its one expert of each layer) divide
    every state by 8: 87 GiB of them a rank, above 72 GiB before any activation."""
    from hwbench.spec import build_run_spec

    catalog = load_catalog()
    config = catalog.workloads["mixtral-8x7b"].model
    spec = dataclasses.replace(build_run_spec({"model": "mixtral-8x7b", "device": "cuda", "nproc_per_node": 8},
                                              catalog, check_paths=False), fsdp=True)
    for sharded in (spec, _with_ep(spec, 8)):
        plan = plan_memory(sharded, config, "cuda")
        states = plan.weights_bytes + plan.gradients_bytes + plan.optimizer_bytes
        assert states == pytest.approx(16 * 46_702_792_704 / 8, rel=1e-6) and states > 0.9 * 80 * GIB
        assert not plan.fits(80 * GIB)
    # expert parallelism leaves each rank one expert's 16-bit casts a layer, not eight
    assert plan.cast_weights_bytes < plan_memory(spec, config, "cuda").cast_weights_bytes / 4
    # on 16 cards: FSDP2 with EP8 and recompute fits (66.24 GiB a rank), FSDP2 alone does not
    sixteen = dataclasses.replace(build_run_spec({"model": "mixtral-8x7b", "device": "cuda", "nproc_per_node": 16},
                                                 catalog, check_paths=False), fsdp=True, recompute=True)
    assert plan_memory(_with_ep(sixteen, 8), config, "cuda").total_bytes / GIB == pytest.approx(66.24, abs=0.005)
    assert plan_memory(_with_ep(sixteen, 8), config, "cuda").fits(80 * GIB)
    assert not plan_memory(sixteen, config, "cuda").fits(80 * GIB)


# --- the prediction against whole training steps --------------------------------------------
def _cpu_point(model, config=None, **options):
    """A single-process CPU point of ``model``'s workload (``config``: another shape trained
    under its settings), as `hwbench run` resolves it."""
    from hwbench.catalog import load_catalog
    from hwbench.spec import build_run_spec

    catalog = load_catalog()
    spec = build_run_spec({"model": model, "device": "cpu", "data": "synthetic", **options}, catalog,
                          check_paths=False)
    return spec, config or catalog.workloads[model].model


# A shape where the blocks' activations outweigh the logits (100 tokens in the vocabulary): the
# block terms are held to the measurement here, the logits and the states in the catalog sizes.
GPT_SMALL_VOCAB = dataclasses.replace(CONFIG, num_layers=4, max_position_embeddings=128)
LLAMA_SMALL_VOCAB = dataclasses.replace(LLAMA, num_layers=4)
UNTIED_SMALL_VOCAB = dataclasses.replace(LLAMA_SMALL_VOCAB, untie_embeddings_and_output_weights=True)
# moe-tiny's MoE with a 100-token vocabulary, and with shared experts and dense layers between
MOE_TINY_SMALL_VOCAB = dataclasses.replace(load_catalog().workloads["moe-tiny"].model, vocab_size=100)
MOE_SHARED_SMALL_VOCAB = dataclasses.replace(MOE_TINY_SMALL_VOCAB, num_layers=4, moe_layer_freq=2,
                                             moe_shared_expert_intermediate_size=128)
MOE_SMALL_SMALL_VOCAB = dataclasses.replace(load_catalog().workloads["moe-small"].model, vocab_size=100)


# Each point trains two steps: the default run takes one of each kind, -m heavy the rest.
def _heavy(*values, id):
    return pytest.param(*values, id=id, marks=pytest.mark.heavy)


@pytest.mark.parametrize("model, config, options", [
    _heavy("tiny", None, {"precision": "fp32", "micro_batch_size": 2, "global_batch_size": 2, "seq_length": 64},
           id="gpt-fp32"),
    pytest.param("tiny", None, {"precision": "bf16", "micro_batch_size": 2, "global_batch_size": 4,
                                "seq_length": 64}, id="gpt-bf16-accumulating"),
    _heavy("tiny", GPT_SMALL_VOCAB, {"precision": "bf16", "micro_batch_size": 4, "global_batch_size": 4,
                                     "seq_length": 128, "fused_qkv": True}, id="gpt-activations-bf16-fused"),
    pytest.param("tiny", GPT_SMALL_VOCAB, {"precision": "fp32", "micro_batch_size": 4, "global_batch_size": 4,
                                           "seq_length": 128}, id="gpt-activations-fp32"),
    pytest.param("llama-tiny", None, {"precision": "bf16", "micro_batch_size": 2, "global_batch_size": 2,
                                      "seq_length": 64}, id="llama-bf16"),
    pytest.param("llama-tiny", LLAMA_SMALL_VOCAB, {"precision": "bf16", "micro_batch_size": 4,
                                                   "global_batch_size": 8, "seq_length": 128},
                 id="llama-activations-bf16-accumulating"),
    _heavy("llama-tiny", LLAMA_SMALL_VOCAB, {"precision": "fp32", "micro_batch_size": 4, "global_batch_size": 4,
                                             "seq_length": 128, "fused_qkv": True}, id="llama-activations-fp32-fused"),
    pytest.param("llama-tiny", UNTIED_SMALL_VOCAB, {"precision": "bf16", "micro_batch_size": 4,
                                                    "global_batch_size": 4, "seq_length": 128,
                                                    "cross_entropy": "chunked"}, id="llama-untied-chunked"),
    pytest.param("moe-tiny", None, {"precision": "fp32", "micro_batch_size": 4, "global_batch_size": 4,
                                    "seq_length": 128}, id="moe-tiny-fp32"),
    pytest.param("moe-tiny", MOE_TINY_SMALL_VOCAB, {"precision": "bf16", "micro_batch_size": 4,
                                                    "global_batch_size": 4, "seq_length": 128},
                 id="moe-activations-bf16"),
    _heavy("moe-tiny", None, {"precision": "bf16", "micro_batch_size": 4, "global_batch_size": 8, "seq_length": 128},
           id="moe-tiny-bf16-accumulating"),
    _heavy("moe-tiny", MOE_SHARED_SMALL_VOCAB, {"precision": "fp32", "micro_batch_size": 4, "global_batch_size": 8,
                                                "seq_length": 128}, id="moe-shared-dense-layers-fp32-accumulating"),
    _heavy("moe-small", None, {"precision": "fp32", "micro_batch_size": 2, "global_batch_size": 2,
                               "seq_length": 128}, id="moe-small-fp32"),
    _heavy("moe-small", MOE_SMALL_SMALL_VOCAB, {"precision": "bf16", "micro_batch_size": 4, "global_batch_size": 4,
                                                "seq_length": 128}, id="moe-small-activations-bf16"),
])
def test_the_planner_is_within_a_few_percent_of_a_whole_steps_measured_peak(model, config, options):
    """hwbench's native engine trains two steps on the CPU from an empty allocator; the most
    bytes the allocator held at once is the planner's total less its overhead (which is no
    tensor of the run), within 3 % (the project's goal is 10 %; every term counted, it is
    within 0.3 % on these points, and within 3 % on the MoE ones, whose backward's temporaries
    are not counted). GPT-2, Llama (GQA, SwiGLU, RMSNorm, RoPE, tied and untied) and the
    mixtures of experts (moe-tiny: Mixtral's; moe-small: Qwen3-MoE's QK-norm and head size;
    shared experts and dense layers between), one micro-batch or two, fp32 or bf16 autocast,
    fused q/k/v, the chunked loss."""
    pytest.importorskip("torch")
    from tests.allocator_peak import measured_step_peak

    peak = measured_step_peak(*_cpu_point(model, config, **options))
    assert abs(peak.error) < 0.03, (peak.measured, peak.planned, peak.plan)


def _ranks_peaks(tmp_path, *point, ranks=2, script="step_peak_ranks.py"):
    """``ranks`` torchrun ranks of tests/step_peak_ranks.py (or ``script``): what each rank wrote."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    import os

    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                           "--standalone", str(root / "tests" / script), str(tmp_path), *map(str, point)],
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})  # the scripts import tests.*
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(ranks)]


@pytest.mark.heavy
@pytest.mark.parametrize("model, tp, pp, dp, variant, precision", [
    ("tiny", 1, 1, 2, "plain", "bf16"),
    ("tiny", 1, 1, 2, "fsdp", "bf16"),
    ("tiny", 2, 1, 1, "plain", "fp32"),
    ("tiny", 1, 2, 1, "plain", "bf16"),
    ("llama-tiny", 1, 1, 2, "plain", "bf16"),
    ("llama-tiny", 1, 1, 2, "fsdp", "bf16"),
    ("moe-tiny", 2, 1, 1, "plain", "bf16"),  # every expert's width split: -7.1 %, -8.2 % (2026-11-29)
    ("moe-tiny", 2, 1, 1, "plain", "fp32"),  # -2.8 %, -2.9 %
], ids=["gpt-ddp", "gpt-fsdp", "gpt-tp", "gpt-pp", "llama-ddp", "llama-fsdp", "moe-tp-bf16", "moe-tp-fp32"])
def test_every_rank_of_a_layout_within_10_percent_of_its_measured_peak(tmp_path, model, tp, pp, dp, variant,
                                                                       precision):
    """Two real ranks (gloo) of hwbench's native engine, two steps each on a small-vocabulary shape
    of the workload: each rank's peak against its stage's prediction, within the project's 10 %.
    DDP within 1 %, but at times gloo's all-reduce holds one more copy of a gradient bucket as
    the backward starts (then the prediction with one more copy of the gradients is close); FSDP2
    within 4 %; tensor and pipeline parallelism a few % under (docs/planner.md, "Checking it")."""
    for rank in _ranks_peaks(tmp_path, model, tp, pp, dp, variant, precision, "small-vocab"):
        errors = [(rank["planned"] - rank["measured"]) / rank["measured"]]
        if variant == "plain" and dp > 1:
            errors.append((rank["planned"] + rank["gradients"] - rank["measured"]) / rank["measured"])
        assert min(abs(error) for error in errors) < 0.10, rank


@pytest.mark.heavy
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_expert_parallel_block_keeps_what_the_planner_counts(tmp_path, precision):
    """Two ranks of an expert-parallel group (gloo), one MoE block each: what the block keeps for
    its backward, against ``activation_bytes_per_layer`` with ep = 2 (the combine's concatenated
    received rows, k x h, and the dispatch's int64 order, k, a token more than without expert
    parallelism; the offsets of E / ep experts). The router sends each rank's experts more or
    fewer rows than its own tokens' assignments, and every routed term is per row: over the
    group the rows add up to the assignments, so the ranks' bytes add up to twice the plan, to the
    byte in fp32; under bf16 autocast within RoPE's casts, which the block run without its
    rotary does not make."""
    ranks = _ranks_peaks(tmp_path, precision, script="expert_parallel_saved.py")
    assert sum(rank["received_rows"] for rank in ranks) == sum(rank["assignments"] for rank in ranks)
    assert any(rank["received_rows"] != rank["assignments"] for rank in ranks)  # routing is not balanced
    rope_casts = 0 if precision == "fp32" else 4 * 128 * 32 * 2  # 4 (s, head size) 16-bit tables
    assert sum(rank["saved"] for rank in ranks) == 2 * (ranks[0]["planned"] - rope_casts)


@pytest.mark.heavy
@pytest.mark.parametrize("model, ranks, ep, variant, precision", [
    ("moe-tiny", 2, 2, "plain", "bf16"),
    ("moe-tiny", 2, 2, "fsdp", "bf16"),
    ("moe-tiny", 2, 2, "plain", "fp32"),
    ("moe-small", 2, 2, "plain", "bf16"),
    ("moe-small", 2, 2, "fsdp", "bf16"),
    ("moe-tiny", 4, 2, "plain", "bf16"),
    ("moe-tiny", 4, 2, "fsdp", "bf16"),
    ("moe-small", 4, 2, "fsdp", "bf16"),
], ids=["tiny-ep2", "tiny-fsdp-ep2", "tiny-ep2-fp32", "small-ep2", "small-fsdp-ep2", "tiny-dp4-ep2",
        "tiny-dp4-fsdp-ep2", "small-dp4-fsdp-ep2"])
def test_every_rank_of_an_expert_parallel_layout_within_10_percent_of_its_measured_peak(tmp_path, model, ranks, ep,
                                                                                        variant, precision):
    """Real expert-parallel ranks (gloo) of hwbench's native engine, DDP or FSDP2, two steps each on
    a small-vocabulary shape: each rank's peak against the plan, within the project's 10 %, as the
    dense layouts. The plan assumes balanced routing; in a forward a rank's experts here receive up
    to 25 % more rows than its tokens' assignments, which moves a rank's figure by a few % either
    way (docs/planner.md, "Checking it")."""
    for rank in _ranks_peaks(tmp_path, model, 1, 1, ranks, variant, precision, "small-vocab", f"ep={ep}",
                             ranks=ranks):
        assert abs(rank["planned"] - rank["measured"]) / rank["measured"] < 0.10, rank
