"""End-to-end `hwbench run` on the CPU: real training, a real result file."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch
from conftest import FP16_TINY_RUN, kill_tree, sigint_as_usual

from hwbench.catalog import load_catalog
from hwbench.cli import main
from hwbench.device.cpu import CpuBackend
from hwbench.engine.native import NativeEngine
from hwbench.options import RUN_OPTIONS
from hwbench.result.store import load_result
from hwbench.spec import build_run_spec
from hwbench.workload.data import SyntheticTokens


def _only_result(folder):
    files = sorted(folder.glob("*.json"))
    assert len(files) == 1, files
    return files[0], load_result(files[0])


@pytest.fixture(scope="module")
def embedded_default(tmp_path_factory):
    """The README's main command, shortened to 5 timed steps after 1 warm-up step, run once for
    this module: the finished process and its folder."""
    out = tmp_path_factory.mktemp("embedded-default")
    done = subprocess.run([sys.executable, "-m", "hwbench", "run", "--quiet", "--steps", "5", "--warmup", "1",
                           "--eval-iters", "2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    return done, out


def test_embedded_default_trains_and_writes_a_result(embedded_default):
    """The README's main command, shortened to 5 timed steps after 1 warm-up step
    (the loss falls within them: the learning rate is 0 at the first step, as in Megatron-LM,
    and warms up over the next 2)."""
    done, out = embedded_default
    assert done.returncode == 0, done.stderr
    path, result = _only_result(out)
    assert result.status == "ok" and result.spec.model == RUN_OPTIONS["model"].default
    metrics = result.metrics
    assert metrics.tokens_per_s > 0 and metrics.samples_per_s > 0
    assert metrics.tokens_per_s == pytest.approx(metrics.samples_per_s * result.spec.seq_length)
    assert metrics.loss_end < metrics.loss_start  # it learned something
    assert metrics.loss_end > metrics.loss_floor  # and nothing impossible
    # one validation after the last step, over --eval-iters x global batch x seq tokens
    assert [v.step for v in metrics.validation] == [6] and metrics.valid_ppl_step == 6
    assert metrics.validation[-1].tokens == 2 * result.spec.global_batch_size * result.spec.seq_length
    assert metrics.loss_floor < metrics.valid_loss < metrics.loss_start
    assert [s.phase for s in result.steps] == ["warmup"] + ["timed"] * 5
    assert all(s.time_s > 0 for s in result.steps if s.phase == "timed")
    assert metrics.step_time_s.n == 5
    assert metrics.memory.peak_reserved_bytes > 0
    assert metrics.mfu is None and "no catalog entry" in metrics.unmeasured["mfu"]
    assert result.environment.torch_version == torch.__version__
    assert result.environment.tuning["intra_op_threads"] >= 1
    # the tuned heap is bounded: the bound is recorded and trims are counted over the timed steps
    assert result.environment.tuning["allocator"].startswith("glibc: mmap off")
    assert isinstance(metrics.memory.heap_trims, int) and 0 <= metrics.memory.heap_trims <= 4
    bound_gib = float(metrics.memory.source.split("bounded at ")[1].split(" GiB")[0])
    assert 0 < bound_gib * 2**30 < metrics.memory.capacity_bytes
    assert "tuned heap bounded at" in metrics.memory.source
    assert result.started_at < result.finished_at
    assert "tokens/s" in done.stdout and str(path) in done.stdout
    # the CPU has no device for the host to wait for: no count, and why (tests/test_host_syncs.py has the CUDA count)
    assert metrics.host_syncs is None
    assert "no device for the host to wait for" in metrics.unmeasured["host_syncs"]


def test_mfu_uses_a_user_catalog_entry_for_this_cpu(tmp_path, monkeypatch, capsys):
    from hwbench.device.cpu import _cpu_model

    catalog_dir = tmp_path / "catalog" / "devices"
    catalog_dir.mkdir(parents=True)
    (catalog_dir / "this-cpu.yaml").write_text(
        "name: this-cpu\nvendor: test\nbackend: cpu\ntitle: this machine\n"
        f"match: ['^{_cpu_model().replace('(', '.').replace(')', '.')}$']\n"
        "peak_flops:\n  fp32: {dense: 1.0e12, listed: 1.0e12, sparsity: false, source: a test figure,"
        " read: 2026-11-25}\n"
        "  bf16: {dense: null, unavailable: not in the test}\n  fp16: {dense: null, unavailable: not in the test}\n"
    )
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path / "catalog"))
    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                "--quiet",
                "--model",
                "tiny",
                "--seq-length",
                "32",
                "--steps",
                "3",
                "--warmup",
                "1",
                "--eval-iters",
                "1",
                "--flops-formula",
                "megatron-lm",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    _, result = _only_result(out)
    assert result.device.catalog_entry == "this-cpu"
    assert result.metrics.mfu == pytest.approx(result.metrics.tflops_per_device / 1.0)
    assert "MFU" in capsys.readouterr().out
    # the old name is taken, and the canonical one recorded; every formula's figures beside it
    assert result.spec.flops_formula == result.metrics.flops_formula == "megatron-core-v0.7"
    by_formula = result.metrics.by_formula
    assert set(by_formula) == {"megatron-core-v0.12", "megatron-core-v0.7", "megatron-deepspeed", "palm", "torchtitan"}
    chosen = by_formula["megatron-core-v0.7"]
    assert (chosen.flops_per_iteration, chosen.tflops_per_device, chosen.mfu) == (
        result.metrics.flops_per_iteration,
        result.metrics.tflops_per_device,
        result.metrics.mfu,
    )
    causal = by_formula["megatron-core-v0.12"]
    assert causal.mfu == pytest.approx(causal.tflops_per_device / 1.0)
    # tiny (h 128, 2 layers, seq 32): the causal count is below the full one by s/(12h) of its factor
    assert causal.flops_per_iteration < chosen.flops_per_iteration
    assert chosen.mfu / causal.mfu == pytest.approx(chosen.flops_per_iteration / causal.flops_per_iteration)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs_record_their_loss_scale(tmp_path, request, precision):
    if precision == "fp16":  # conftest's FP16_TINY_RUN, which tests/test_docs.py reads too
        folder = request.getfixturevalue("fp16_tiny_run").parent
    else:  # the same run in bf16
        folder, argv = tmp_path, list(FP16_TINY_RUN)
        argv[argv.index("fp16")] = precision
        assert main([*argv, "--out", str(folder)]) == 0
    _, result = _only_result(folder)
    assert result.status == "ok"
    scales = [s.loss_scale for s in result.steps]
    if precision == "fp16":
        assert scales[0] == 2.0**12  # initial_scale_power 12, as published
        assert result.metrics.skipped_steps == sum(s.skipped for s in result.steps)
    else:
        assert scales == [None] * 4


def _engine(micro, global_batch):
    catalog = load_catalog()
    spec = build_run_spec(
        {"model": "tiny", "micro_batch_size": micro, "global_batch_size": global_batch, "device": "cpu"}, catalog
    )
    # no warm-up, so that the first step (which a warm-up runs at lr 0, as Megatron-LM) moves the weights
    spec = dataclasses.replace(spec, optimizer=dataclasses.replace(spec.optimizer, lr_warmup_iters=0))
    backend = CpuBackend()
    backend.prepare_process()
    engine = NativeEngine(catalog.workloads["tiny"].model, spec, backend)  # same seed, same weights
    return spec, engine.model, engine


def _clipped_gradient(engine, parameter):
    """The gradient the optimizer steps with (after the global-norm clip), captured
    just before its step (the engine sets gradients to None after it)."""
    captured = []
    engine.optimizer.register_step_pre_hook(lambda *_: captured.append(parameter.grad.detach().clone()))
    return captured


def test_gradient_accumulation_matches_one_large_batch():
    """Four micro batches of 2 accumulate to the gradient of one batch of 8: the same
    loss, gradient norm and gradients (up to float summation order, which differs
    between CPUs), and so the same first AdamW step within the bound that float
    rounding of the gradients allows."""
    _, model_a, engine_a = _engine(micro=8, global_batch=8)
    _, model_b, engine_b = _engine(micro=2, global_batch=8)
    weight_a, weight_b = model_a.blocks["1"].mlp.fc2.weight, model_b.blocks["1"].mlp.fc2.weight
    initial = weight_a.detach().clone()
    torch.testing.assert_close(initial, weight_b, rtol=0, atol=0)  # same seed, same weights
    grads_a, grads_b = _clipped_gradient(engine_a, weight_a), _clipped_gradient(engine_b, weight_b)
    data_a = SyntheticTokens(50257, 128, 8, 8, seed=3)
    tokens, labels = data_a.train_batch()
    halves = iter([(tokens[i : i + 2], labels[i : i + 2]) for i in range(0, 8, 2)])
    out_a = engine_a.train_step(lambda: (tokens, labels))
    out_b = engine_b.train_step(lambda: next(halves))
    assert out_a.loss.item() == pytest.approx(out_b.loss.item(), rel=1e-5)
    assert out_a.grad_norm.item() == pytest.approx(out_b.grad_norm.item(), rel=1e-5)
    # What accumulation must preserve: the gradients, to float summation order.
    grad_a, grad_b = grads_a[0], grads_b[0]
    torch.testing.assert_close(grad_b, grad_a, rtol=1e-4, atol=1e-5 * grad_a.abs().max().item())
    # AdamW's first update is lr * g / (|g| + eps) (m and v bias-corrected to g and g^2),
    # whose slope eps / (|g| + eps)^2 reaches 1/eps at g = 0: a rounding difference in a
    # tiny gradient moves the weight by up to lr * |dg| / eps. Bound each element by the
    # mean value theorem over the interval between the two gradients (containing 0 when
    # their signs differ), plus float rounding of the update itself.
    eps = engine_a.optimizer.param_groups[0]["eps"]
    lr = out_a.lr
    nearest_zero = torch.where(
        grad_a.sign() == grad_b.sign(), torch.minimum(grad_a.abs(), grad_b.abs()), torch.zeros_like(grad_a)
    )
    bound = lr * (grad_a - grad_b).abs() * eps / (nearest_zero + eps) ** 2
    rounding = 4 * torch.finfo(torch.float32).eps * (initial.abs() + lr)
    difference = (weight_a - weight_b).detach().abs()
    excess = difference - (bound + rounding)
    assert excess.max().item() <= 0, (
        f"{int((excess > 0).sum())} weights differ beyond the bound; worst "
        f"{difference.flatten()[excess.argmax()].item():.3g}"
    )
    assert (weight_a - initial).abs().median().item() > 0.5 * lr  # the step did move them: by about lr each


def test_result_file_is_valid_json_with_documented_top_level_fields(embedded_default):
    """The embedded default's result file (one process, in the module's run above)."""
    done, out = embedded_default
    assert done.returncode == 0, done.stderr
    path, _ = _only_result(out)
    data = json.loads(path.read_text())
    assert set(data) == {
        "schema_version",
        "run_id",
        "status",
        "spec",
        "workload",
        "device",
        "metrics",
        "steps",
        "ranks",
        "engine",
        "launch",
        "environment",
        "nodes",
        "sweep",
        "checkpoint",
        "profile",
        "error",
        "warnings",
        "started_at",
        "finished_at",
        "hwbench_version",
    }
    assert data["error"] is None and data["profile"] is None and data["ranks"][0]["rank"] == 0
    assert data["engine"]["name"] == "native" and data["launch"] == {}  # one process: nothing launched
    assert [n["node_rank"] for n in data["nodes"]] == [0]


def test_interrupted_run_exits_130_and_leaves_nothing(tmp_path):
    import signal

    out = tmp_path / "runs"
    process = subprocess.Popen(
        [sys.executable, "-m", "hwbench", "run", "--model", "tiny", "--data", "synthetic", "--seq-length", "32",
         "--steps", "10000", "--warmup", "0", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_usual,
    )
    try:
        said = []  # the progress lines on stderr: interrupted once the first step is done, not at a guessed time
        for line in process.stderr:
            said.append(line)
            if ": step 1/10000 (timed)" in line:
                break
        assert process.poll() is None, (said, process.communicate())
        process.send_signal(signal.SIGINT)
        stdout, rest = process.communicate(timeout=60)
    finally:
        kill_tree(process.pid)
    stderr = "".join(said) + rest
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1].startswith("hwbench: interrupted")
    assert not out.exists() or list(out.iterdir()) == []


def test_heap_bound_trims_only_past_its_bound(monkeypatch):
    """The tuned CPU heap: the first step sets the bound (1.5x its resident set),
    later steps past the bound hand free pages back and are counted."""
    from hwbench.device import cpu

    # after each step, and after each trim, the resident set the bound reads
    resident = iter(
        [1000, 1400, 1500, 1501, 900, 1200, 2000, 900, 2100, 1200]
    )  # memory in use grew: 1200 stays after a trim
    monkeypatch.setattr(cpu, "_resident_bytes", lambda: next(resident))
    calls = []
    bound = cpu.HeapBound(calls.append)
    for _ in range(6):
        bound.step_done()
    assert bound.bound_bytes == 1500
    assert calls == [0, 0] and bound.trims == 2  # 1501 and 2000 are past it; 1500 is not
    bound.step_done()  # 2100: trimmed, 1200 left; 1.5 x 1200 = 1800 becomes the bound
    assert bound.trims == 3 and bound.bound_bytes == 1800


def test_no_heap_bound_without_the_tuning_and_a_resident_size(monkeypatch):
    from hwbench.device import cpu

    assert cpu._resident_bytes() > 0  # this process's, from /proc/self/statm
    monkeypatch.setattr(cpu, "_resident_bytes", lambda: None)
    text, bound = cpu.keep_freed_memory_in_heap()
    assert bound is None and "statm unreadable" in text
    monkeypatch.undo()
    monkeypatch.setenv(cpu.ALLOCATOR_TUNING_ENV, "0")
    text, bound = cpu.keep_freed_memory_in_heap()
    assert bound is None and cpu.ALLOCATOR_TUNING_ENV in text
    backend = CpuBackend()
    backend.prepare_process()
    backend.step_done()  # nothing to bound
    assert backend.memory_stats().heap_trims is None


def _llama_tiny_run(out, *options: str):
    """`hwbench run --model llama-tiny` on the CPU with the built-in data: exit 0 and its result."""
    assert main(["run", "--quiet", "--model", "llama-tiny", "--device", "cpu", "--out", str(out), *options]) == 0
    return _only_result(out)[1]


def _check_llama_tiny_result(result):
    assert result.status == "ok" and result.spec.model == "llama-tiny"
    workload = result.workload
    assert workload.parameters == 16_810_624 and workload.vocab_size == 128_256  # the Llama 3 vocabulary
    assert (workload.swiglu, workload.normalization, workload.position_embedding_type) == (True, "RMSNorm", "rope")
    assert workload.rope_scaling["factor"] == 8.0 and workload.num_query_groups == 2
    # a fresh model over 128,256 tokens starts near log(V): the init and the whole vocabulary are in use
    assert abs(result.metrics.loss_start - math.log(128_256)) < 0.1
    assert result.metrics.loss_end < result.metrics.loss_start and result.metrics.valid_loss is not None


def test_llama_tiny_runs_end_to_end_with_recompute_chunked_loss_and_fused_qkv(tmp_path):
    """The Llama path through the native engine at a short sequence: the built-in data at
    vocabulary 128,256, activation checkpointing, the chunked loss, the per-group fused qkv."""
    result = _llama_tiny_run(tmp_path / "out", "--steps", "2", "--warmup", "1", "--seq-length", "32",
                             "--micro-batch-size", "1", "--global-batch-size", "2", "--eval-iters", "1",
                             "--recompute", "--cross-entropy", "chunked", "--fused-qkv")
    _check_llama_tiny_result(result)
    assert (result.spec.recompute, result.spec.cross_entropy, result.spec.fused_qkv) == (True, "chunked", True)


@pytest.mark.heavy
def test_llama_tiny_runs_end_to_end_at_its_catalog_settings(tmp_path):
    """`hwbench run --model llama-tiny --steps 2 --warmup 1 --device cpu` as written: seq 128,
    global batch 8 (the default-run test above takes the same path at a short sequence)."""
    _check_llama_tiny_result(_llama_tiny_run(tmp_path / "out", "--steps", "2", "--warmup", "1"))
