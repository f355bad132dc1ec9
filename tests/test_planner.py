"""hwbench.planner against hand-computed bytes (docs/planner.md has the model)."""

import dataclasses
from pathlib import Path

import pytest

from hwbench.cli import run_command
from hwbench.commands.run import parse_run_spec
from hwbench.errors import UsageError
from hwbench.planner import (
    GIB,
    OVERHEAD_BYTES,
    activation_bytes_per_layer,
    fits,
    microbatches_in_flight,
    parse_size,
    plan_for_all_stages,
    plan_memory,
    plan_stage,
    qkv_input_copies,
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
CPU = OVERHEAD_BYTES["cpu"]


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
    # + (q,k 8 + v 4 + proj in 4 + gelu in 16 + fc2 in 16) = 16 + 48 = 64 bytes per s*b*h
    assert activation_bytes_per_layer(S, B, H, 1, 4, 4) == SBH * 64 == 131_072
    head = SBH * (4 + 4)  # final LN input (fp32) + output layer input
    assert plan.activations_bytes == 2 * SBH * 64 + head == 278_528
    sv = S * B * 128
    assert plan.logits_bytes == sv * 4 + sv * (4 + 4) == 49_152  # log-softmax kept; logits + gradient
    assert plan.buffers_bytes == plan.gathered_bytes == plan.step_transient_bytes == 0
    assert plan.overhead_bytes == CPU
    assert plan.total_bytes == 16 * N + 278_528 + 49_152 + CPU
    assert plan.stage == 0 and plan.microbatches_in_flight == 1


def test_autocast_activations_keep_an_fp32_residual_stream():
    plan = plan_memory(spec_for(precision="bf16"), CONFIG, "cpu")
    assert plan.weights_bytes == 4 * N and plan.optimizer_bytes == 8 * N  # fp32 weights and states
    # act 2, residual 4, separate q/k/v: 2*4 + (3 + 1)*2 + 12*2 = 40 per s*b*h (Korthikanti's 34 - 2 masks
    # + 4 for fp32 LN inputs + 4 for the two more 16-bit copies of the first LN's output q, k and v keep)
    assert plan.activations_bytes == 2 * SBH * 40 + SBH * (4 + 2)
    # one fused q/k/v projection reads one copy: 2*4 + 2*2 + 12*2 = 36
    fused = plan_memory(dataclasses.replace(spec_for(precision="bf16"), fused_qkv=True), CONFIG, "cpu")
    assert fused.activations_bytes == 2 * SBH * 36 + SBH * (4 + 2)
    # deepspeed converts the model: all 16-bit, the paper's 8 + 24/t (no dropout masks)
    assert activation_bytes_per_layer(S, B, H, 1, 2, 2) == SBH * 32
    assert activation_bytes_per_layer(S, B, H, 2, 2, 2) == SBH * (8 + 12)


@pytest.mark.parametrize("precision,fused_qkv", [("fp32", False), ("bf16", False), ("bf16", True)])
def test_a_planned_block_keeps_what_the_real_block_saves_for_its_backward(precision, fused_qkv):
    """Every tensor one real block saves for its backward (autograd's saved-tensor hooks, each
    storage once; parameters and autocast's copies of them are counted apart, as cast_weights),
    on the CPU under bf16 autocast or in fp32, against activation_bytes_per_layer. Separate q, k
    and v projections under autocast each cast the LayerNorm output again (autocast caches the
    casts of parameters only): three 16-bit copies of it are kept, one with the fused projection.
    The block's input counts (the first LayerNorm keeps it); what the planner leaves out is the
    LayerNorms' per-token statistics and attention's log-sum-exp, under 1 s*b*h byte."""
    torch = pytest.importorskip("torch")
    from hwbench.workload.model import Block
    from tests.autocast_copies import ParameterCasts

    batch, seq = 2, 48  # batch x seq apart from h and 4h, so no activation has a weight's shape
    torch.manual_seed(0)
    block = Block(CONFIG, fused_qkv=fused_qkv)
    x = torch.randn(batch, seq, H, requires_grad=True)
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    casts = ParameterCasts()
    with casts, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = block(x)
        weights = {p.untyped_storage().data_ptr() for p in block.parameters()}
        weights |= {copy().untyped_storage().data_ptr() for copy, _ in casts.copies if copy() is not None}
        kept = sum(size for pointer, size in saved.items() if pointer not in weights)
    out.float().sum().backward()  # the graph was whole
    sbh = batch * seq * H
    spec = dataclasses.replace(spec_for(precision=precision), fused_qkv=fused_qkv)
    act, residual = (2, 4) if precision == "bf16" else (4, 4)
    planned = activation_bytes_per_layer(seq, batch, H, 1, act, residual, qkv_input_copies(spec))
    assert qkv_input_copies(spec) == (3 if precision == "bf16" and not fused_qkv else 1)
    assert planned <= kept <= planned + sbh


# what the linear layers read at TP1: a block less its two LayerNorms, and the output weight (wte)
LINEAR = 2 * (BLOCK - 4 * 64) + 128 * 64


def test_autocast_16bit_copies_of_the_linear_parameters_are_counted_once_per_rank():
    bf16 = plan_memory(spec_for(precision="bf16"), CONFIG, "cpu")
    assert bf16.cast_weights_bytes == 2 * LINEAR
    assert bf16.total_bytes == (bf16.weights_bytes + bf16.gradients_bytes + bf16.optimizer_bytes + CPU
                                + bf16.activations_bytes + bf16.logits_bytes + 2 * LINEAR)
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
    assert plan.activations_bytes == 4 * SBH * 64  # one block on stage 0, 4 micro-batches
    assert plan_stage(one_f, CONFIG, "cpu", 0).activations_bytes == 2 * SBH * 64


def test_recompute_keeps_block_inputs_and_one_block():
    plan = plan_memory(spec_for(recompute=True), CONFIG, "cpu")
    assert plan.activations_bytes == 2 * SBH * 4 + SBH * 64 + SBH * 8
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
    assert z[0].activations_bytes == 2 * SBH * 32 + SBH * 4


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
    static = plan.weights_bytes + plan.gradients_bytes + plan.optimizer_bytes + plan.overhead_bytes
    assert plan.total_bytes == static + max(plan.activations_bytes + plan.logits_bytes, plan.step_transient_bytes)


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
    assert fits(plan_memory(spec_for(), CONFIG, "cpu"), GIB) and not fits(plan_memory(spec_for(), CONFIG, "cpu"),
                                                                              GIB // 2)


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
    end = next(i for i, word in enumerate(row) if word.split("+")[0] in ("fp32", "bf16", "fp16"))
    return " ".join(row[1:end])


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
