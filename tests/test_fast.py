"""--settings fast and the two model options it turns on: --cross-entropy chunked and
--fused-qkv. Each option trains like the published model (same losses and gradients to
float tolerance), the chunked loss never holds the whole logits, and fast chooses recompute
and the micro batch with the planner for the memory it is given."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import parity_run

from hwbench.catalog import load_catalog
from hwbench.fast import DeviceMemory, choose_fast, given_options, resolve_settings
from hwbench.planner import DEFAULT_HEADROOM, plan_memory
from hwbench.spec import build_run_spec
from hwbench.units import GIB
from hwbench.workload.config import CROSS_ENTROPY_CHUNK_TOKENS, GPTConfig
from hwbench.workload.model import QKV_PARTS, build_model, chunked_lm_loss, lm_loss
from tests.allocator_peak import peak_allocated_bytes

# Small enough to train in milliseconds; 32 tokens a batch, in chunks of 12, 12 and 8.
CONFIG = GPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, max_position_embeddings=32, vocab_size=1000)
CHUNK = 12
CPU = torch.device("cpu")


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, CONFIG.vocab_size, (2, 17), generator=generator) for _ in range(steps)]
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def _assert_same_gradients(reference: torch.nn.Module, other: dict[str, torch.Tensor]) -> None:
    """Every gradient within 1e-5 of its parameter's largest one (measured: 2e-7). The floor
    is for k_proj's bias, whose gradient is zero in exact arithmetic (softmax ignores a shift
    of every key) and rounding noise of about 1e-11 in both."""
    for name, parameter in reference.named_parameters():
        scale = parameter.grad.abs().max().item()
        difference = (other[name] - parameter.grad).abs().max().item()
        assert difference <= 1e-5 * scale + 1e-9, f"{name}: gradients differ by {difference} (largest {scale})"


def _train_side_by_side(standard, other, steps: int, grads_of_other) -> None:
    """SGD on both (AdamW would magnify the noise of the zero gradients above into
    diverging weights, whatever the loss); losses and gradients compared at every step."""
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.5) for model in (standard, other)]
    for step, (inputs, labels) in enumerate(_batches(steps), start=1):
        losses = [model(inputs, labels) for model in (standard, other)]
        for loss in losses:
            loss.backward()
        assert losses[1].item() == pytest.approx(losses[0].item(), rel=1e-6), f"step {step}"
        _assert_same_gradients(standard, grads_of_other(other))
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()


# --- the chunked cross-entropy ---------------------------------------------------------


def test_chunked_cross_entropy_trains_like_the_standard_one_in_fp32():
    standard = build_model(CONFIG, device=CPU, seed=7)
    chunked = build_model(CONFIG, device=CPU, seed=7, cross_entropy="chunked")
    chunked.chunk_tokens = CHUNK  # several chunks, the last one short
    _train_side_by_side(standard, chunked, steps=4,
                        grads_of_other=lambda model: {n: p.grad for n, p in model.named_parameters()})


def test_chunked_cross_entropy_under_bf16_autocast_matches_the_standard_one():
    """The products in bf16, the softmax in fp32, as autocast runs the standard loss."""
    standard = build_model(CONFIG, device=CPU, seed=7)
    chunked = build_model(CONFIG, device=CPU, seed=7, cross_entropy="chunked")
    chunked.chunk_tokens = CHUNK
    inputs, labels = _batches(1)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = [model(inputs, labels) for model in (standard, chunked)]
    for loss in losses:
        loss.backward()
    assert losses[1].dtype == losses[0].dtype == torch.float32
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=1e-3)
    norms = [torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in m.parameters()])).item()
             for m in (standard, chunked)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-2)


def test_without_labels_the_chunked_model_returns_the_hidden_states_its_loss_projects():
    """A pipeline's last stage: forward gives (B, S, h), model.loss does the rest."""
    model = build_model(CONFIG, device=CPU, seed=7, cross_entropy="chunked")
    inputs, labels = _batches(1)[0]
    hidden = model(inputs)
    assert hidden.shape == (2, 16, CONFIG.hidden_size)
    expected = lm_loss(model.output(hidden), labels)
    assert model.loss(hidden, labels).item() == pytest.approx(expected.item(), rel=1e-6)


# Llama with its own output layer (Llama 3.1 8B and 70B): GQA, SwiGLU, RMSNorm, RoPE, no biases.
LLAMA_UNTIED_CONFIG = dataclasses.replace(
    CONFIG, num_query_groups=2, ffn_hidden_size=96, swiglu=True, normalization="RMSNorm",
    position_embedding_type="rope", rotary_base=500000.0, add_bias_linear=False,
    untie_embeddings_and_output_weights=True)


def test_the_chunked_loss_of_an_untied_output_layer_projects_with_that_layers_weight():
    """Losses and every gradient as the standard loss's, step by step: the chunked projection uses
    the output layer's own weight (a run that used the word embedding's would part at step 1), and
    its gradient lands there, not on the embedding."""
    standard = build_model(LLAMA_UNTIED_CONFIG, device=CPU, seed=7)
    chunked = build_model(LLAMA_UNTIED_CONFIG, device=CPU, seed=7, cross_entropy="chunked")
    chunked.chunk_tokens = CHUNK
    assert not torch.equal(chunked.output.weight, chunked.wte.weight)
    _train_side_by_side(standard, chunked, steps=3,
                        grads_of_other=lambda model: {name: p.grad for name, p in model.named_parameters()})


def test_the_chunked_loss_never_holds_the_whole_logits():
    """Forward and backward of the loss of 1,024 tokens over GPT-2's padded vocabulary: the
    standard loss holds at least the fp32 logits (206 MB); the chunked one, in chunks of
    128 tokens, less than a third of the standard one's peak and less than those logits."""
    tokens, hidden_size, vocab, chunk = 1024, 64, 50304, 128
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(vocab, hidden_size, generator=generator) * 0.02).requires_grad_()
    hidden = torch.randn(1, tokens, hidden_size, generator=generator).requires_grad_()
    labels = torch.randint(0, vocab, (1, tokens), generator=generator)

    def standard():
        lm_loss(torch.nn.functional.linear(hidden, weight), labels).backward()

    def chunked():
        chunked_lm_loss(hidden, weight, labels, chunk).backward()

    logits_bytes = tokens * vocab * 4
    standard_peak, chunked_peak = peak_allocated_bytes(standard), peak_allocated_bytes(chunked)
    assert standard_peak >= logits_bytes
    assert chunked_peak < logits_bytes
    assert chunked_peak < standard_peak / 3, (standard_peak, chunked_peak)


def test_the_planner_counts_one_chunk_of_logits_instead_of_all_of_them():
    options = {"model": "345m", "precision": "bf16", "micro_batch_size": 16, "global_batch_size": 16,
               "recompute": False}
    catalog = load_catalog()
    config = catalog.workloads["345m"].model
    standard = plan_memory(build_run_spec(options, catalog, check_paths=False), config, "cuda")
    chunked = plan_memory(build_run_spec({**options, "cross_entropy": "chunked"}, catalog, check_paths=False),
                          config, "cuda")
    tokens, vocab = 16 * 1024, 50304
    # the fp32 log-softmax kept, and in its backward the fp32 gradient it gets and the one it makes
    assert standard.logits_bytes == tokens * vocab * (4 + 4 + 4)
    # each token's fp32 log-sum-exp; one chunk's fp32 logits and log-sum-exp's fp32 temporary
    assert chunked.logits_bytes == tokens * 4 + CROSS_ENTROPY_CHUNK_TOKENS * vocab * (4 + 4)
    assert standard.total_bytes - chunked.total_bytes == standard.logits_bytes - chunked.logits_bytes


# --- the fused q/k/v projection --------------------------------------------------------


def test_fused_qkv_starts_from_the_separate_weights_laid_out_per_head():
    separate = build_model(CONFIG, device=CPU, seed=7)
    fused = build_model(CONFIG, device=CPU, seed=7, fused_qkv=True)
    head_dim = CONFIG.head_dim
    for number in range(CONFIG.num_layers):
        attention, fused_attention = separate.blocks[str(number)].attn, fused.blocks[str(number)].attn
        for kind in ("weight", "bias"):
            rows = getattr(fused_attention.qkv_proj, kind)
            for head in range(CONFIG.num_attention_heads):
                for offset, part in enumerate(QKV_PARTS):  # [q_h, k_h, v_h] for each head h in turn
                    start = (3 * head + offset) * head_dim
                    expected = getattr(getattr(attention, part), kind)[head * head_dim:(head + 1) * head_dim]
                    assert torch.equal(rows[start:start + head_dim], expected), (number, kind, head, part)
    assert torch.equal(separate.wte.weight, fused.wte.weight)


def _unfused_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A fused model's gradients named and laid out as the separate projections'."""
    grads = {}
    heads, head_dim = CONFIG.num_attention_heads, CONFIG.head_dim
    for name, parameter in model.named_parameters():
        if ".qkv_proj." not in name:
            grads[name] = parameter.grad
            continue
        per_head = parameter.grad.view(heads, 3, head_dim, *parameter.shape[1:])
        for index, part in enumerate(QKV_PARTS):
            grads[name.replace("qkv_proj", part)] = per_head[:, index].reshape(-1, *parameter.shape[1:])
    return grads


def test_fused_qkv_trains_like_the_separate_projections():
    separate = build_model(CONFIG, device=CPU, seed=7)
    fused = build_model(CONFIG, device=CPU, seed=7, fused_qkv=True)
    _train_side_by_side(separate, fused, steps=3, grads_of_other=_unfused_gradients)


# Layouts that pad the vocabulary the same way (TP2) differ only in reduction order (test_parallel.py).
SAME_PADDING_TOLERANCE = 1e-5


@pytest.mark.slow
def test_fused_qkv_under_tp2_follows_the_separate_projections_tp2_curve(tmp_path, native_tp2_run):
    """Real torchrun ranks (gloo): the column split of the per-head layout gives each rank
    two whole heads, so the loss curve is TP2's with separate projections."""
    code, result = parity_run(tmp_path / "run", "--nproc-per-node", "2", "--tp", "2", "--fused-qkv")
    assert code == 0, result.get("error")
    assert result["spec"]["fused_qkv"] is True and result["spec"]["parallel"]["tp"] == 2
    for step, (got, want) in enumerate(zip(result["steps"], native_tp2_run["steps"], strict=True), start=1):
        assert got["loss"] == pytest.approx(want["loss"], rel=SAME_PADDING_TOLERANCE), f"step {step}"
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=SAME_PADDING_TOLERANCE), f"step {step}"
    assert result["metrics"]["valid_loss"] == pytest.approx(native_tp2_run["metrics"]["valid_loss"],
                                                            rel=SAME_PADDING_TOLERANCE)


# --- --settings fast -------------------------------------------------------------------


def _fast(options: dict, capacity_gib: float | None, kind: str = "cuda"):
    catalog = load_catalog()
    spec = build_run_spec({"settings": "fast", **options}, catalog, check_paths=False)
    memory = DeviceMemory(kind, None if capacity_gib is None else int(capacity_gib * GIB), "a test figure")
    return choose_fast(spec, given_options({"settings": "fast", **options}), catalog, memory)


def _planned(spec, micro: int | None = None, recompute: bool | None = None) -> int:
    candidate = dataclasses.replace(spec, micro_batch_size=micro or spec.micro_batch_size,
                                    recompute=spec.recompute if recompute is None else recompute)
    return plan_memory(candidate, load_catalog().workloads[spec.model].model, "cuda").total_bytes


@pytest.mark.parametrize("model,extra,small,large", [
    ("345m", {}, 16, 80),  # a 16 GiB card against an H100's 80
    ("1.3b", {"seq_length": 2048, "max_positions": 2048}, 80, 141),  # an H100 against an H200
])
def test_fast_takes_the_largest_micro_batch_that_fits_the_device(model, extra, small, large):
    published = build_run_spec({"model": model, "precision": "bf16", **extra}, load_catalog(), check_paths=False)
    chosen = {}
    for capacity in (small, large):
        spec = _fast({"model": model, "precision": "bf16", **extra}, capacity)
        usable = DEFAULT_HEADROOM * capacity * GIB
        assert spec.settings == "fast" and spec.device_memory_bytes == capacity * GIB
        assert spec.global_batch_size == published.global_batch_size  # kept: fewer accumulation steps
        assert not spec.recompute and spec.compile and spec.cross_entropy == "chunked" and spec.fused_qkv
        assert _planned(spec) <= usable
        larger = [m for m in range(spec.micro_batch_size + 1, spec.global_batch_size + 1)
                  if spec.global_batch_size % m == 0]
        if larger:  # the next micro batch up would not fit
            assert _planned(spec, micro=larger[0]) > usable
        assert f"micro batch {spec.micro_batch_size}" in spec.settings_choice
        assert "recompute off" in spec.settings_choice and "a test figure" in spec.settings_choice
        chosen[capacity] = spec.micro_batch_size
    assert chosen[small] < chosen[large]
    assert chosen[small] >= published.micro_batch_size


def test_options_the_user_gave_win_over_fast():
    options = {"model": "345m", "precision": "bf16", "micro_batch_size": 2, "recompute": True, "compile": False,
               "cross_entropy": "standard", "fused_qkv": False}
    spec = _fast(options, 80)
    assert (spec.micro_batch_size, spec.recompute, spec.compile, spec.cross_entropy, spec.fused_qkv) == (
        2, True, False, "standard", False)
    for part in ("recompute on (given)", "micro batch 2 (given)", "torch.compile off (given)",
                 "cross-entropy standard (given)", "fused QKV off (given)"):
        assert part in spec.settings_choice


def test_fast_turns_recompute_on_only_when_nothing_fits_without_it():
    """1.3B at seq 2048 on a card between what micro batch 1 needs with and without recompute."""
    options = {"model": "1.3b", "precision": "bf16", "seq_length": 2048, "max_positions": 2048}
    published = build_run_spec({"settings": "fast", **options}, load_catalog(), check_paths=False)
    needs = [_planned(published, micro=1, recompute=recompute) for recompute in (True, False)]
    assert needs[0] < needs[1]
    capacity_gib = (needs[0] + needs[1]) / 2 / DEFAULT_HEADROOM / GIB
    spec = _fast(options, capacity_gib)
    assert spec.recompute and _planned(spec) <= DEFAULT_HEADROOM * capacity_gib * GIB
    assert "recompute on (no micro batch fits without it" in spec.settings_choice


@pytest.mark.parametrize("capacity,reason", [(16, "no candidate is predicted to fit"),
                                             (None, "memory per device unknown")])
def test_fast_keeps_the_published_batch_when_it_cannot_choose(capacity, reason):
    spec = _fast({"model": "1.3b", "precision": "bf16"}, capacity)
    published = build_run_spec({"model": "1.3b"}, load_catalog(), check_paths=False)
    assert (spec.micro_batch_size, spec.recompute) == (published.micro_batch_size, published.recompute)
    assert reason in spec.settings_choice and spec.compile  # the device-independent part still applies


def test_fast_keeps_the_micro_batch_under_pipeline_parallelism():
    spec = _fast({"model": "345m", "precision": "bf16", "nproc_per_node": 2, "pp": 2}, 80)
    assert spec.parallel.pp == 2 and spec.micro_batch_size == 4 and not spec.recompute
    assert "kept under pipeline parallelism" in spec.settings_choice


def test_fast_leaves_out_what_the_engine_or_layout_cannot_run():
    spec = _fast({"model": "tiny", "nproc_per_node": 2, "tp": 2}, 80)
    assert spec.cross_entropy == "standard" and spec.fused_qkv and spec.compile
    assert "chunked runs on the native engine with --tp 1" in spec.settings_choice
    spec = _fast({"model": "tiny", "nproc_per_node": 2, "tp": 2, "engine": "deepspeed"}, 80)
    assert (spec.cross_entropy, spec.fused_qkv, spec.compile) == ("standard", False, False)


def test_fast_gives_llama_the_fused_gqa_projection_and_the_chunked_loss_where_they_run():
    """Llama 3.1 8B (8 key/value heads, untied output layer): fused q/k/v (Megatron's per-group
    layout, whole groups per rank) on one device and at TP8, the chunked loss at TP1 only; DeepSpeed's
    pipeline engine keeps separate projections."""
    one = _fast({"model": "llama3.1-8b", "precision": "bf16"}, 141)
    assert (one.cross_entropy, one.fused_qkv, one.compile) == ("chunked", True, True)
    tp8 = _fast({"model": "llama3.1-8b", "precision": "bf16", "nproc_per_node": 8, "tp": 8}, 80)
    assert tp8.parallel.tp == 8 and (tp8.cross_entropy, tp8.fused_qkv) == ("standard", True)
    assert "micro batch 2, the largest" in tp8.settings_choice
    pipeline = _fast({"model": "llama3.1-8b", "precision": "bf16", "nproc_per_node": 8, "tp": 2, "pp": 4,
                      "engine": "deepspeed"}, 80)
    assert (pipeline.cross_entropy, pipeline.fused_qkv) == ("standard", False)
    assert "fused QKV off (DeepSpeed's pipeline engine has separate projections)" in pipeline.settings_choice


def test_every_rank_makes_the_parents_choice_without_asking_its_device(monkeypatch):
    """The launcher passes the memory it found as --device-memory: a rank resolves the same
    spec before binding its device, and asks no device for it."""
    import hwbench.device
    from hwbench.cli import command_parser
    from hwbench.commands.run import options_from_namespace, parse, parse_run_spec
    from hwbench.fast import rank_options

    argv = ["--model", "tiny", "--settings", "fast", "--nproc-per-node", "2", "--no-compile"]
    _, parser = command_parser("run")
    options = options_from_namespace(parse(parser, argv))
    catalog = load_catalog()
    spec = build_run_spec(options, catalog, check_paths=False)
    parent = choose_fast(spec, given_options(options), catalog, DeviceMemory("cpu", 3 * GIB, "the parent's device"))
    rank_argv = rank_options(options, parent).to_argv()
    assert rank_argv[rank_argv.index("--device-memory") + 1] == str(3 * GIB)

    def no_device(*_args):
        raise AssertionError("a rank asked its device for its memory")

    monkeypatch.setattr(hwbench.device, "select_backend", no_device)
    rank_options = options_from_namespace(parse(parser, rank_argv))
    rank = resolve_settings(parse_run_spec(rank_argv, check_paths=False), rank_options, catalog)
    assert dataclasses.replace(rank, settings_choice=None) == dataclasses.replace(parent, settings_choice=None)
    assert "--device-memory" in rank.settings_choice


@pytest.mark.slow
def test_hwbench_run_fast_trains_the_published_curve_and_records_its_choice(tmp_path, single_process_run):
    """`tiny` fast on the CPU: one micro batch of 8 instead of two of 4, no recompute, chunked
    loss, fused q/k/v (compile left off: its build time is not what this checks). The same
    global batches, so the same losses as the published run to float tolerance."""
    code, result = parity_run(tmp_path / "run", "--settings", "fast", "--device-memory", "8GiB", "--no-compile")
    assert code == 0, result.get("error")
    spec = result["spec"]
    assert spec["settings"] == "fast" and spec["device_memory_bytes"] == 8 * GIB
    assert (spec["micro_batch_size"], spec["global_batch_size"]) == (8, 8)
    assert (spec["recompute"], spec["compile"], spec["cross_entropy"], spec["fused_qkv"]) == (
        False, False, "chunked", True)
    assert "8.0 GiB per device (--device-memory)" in spec["settings_choice"]
    for step, (got, want) in enumerate(zip(result["steps"], single_process_run["steps"], strict=True), start=1):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), f"step {step}"
    assert result["metrics"]["valid_loss"] == pytest.approx(single_process_run["metrics"]["valid_loss"], rel=1e-5)
    from test_docs import undocumented

    assert not undocumented(result)


@pytest.mark.heavy  # the default run keeps Llama's chunked loss and fused GQA projection in process, above
def test_hwbench_run_fast_trains_llama_on_pp2_to_its_single_process_curve(tmp_path, llama_untied,
                                                                        llama_untied_single_process_run):
    """The untied Llama on PP2 with fast's choices: the fused per-group q/k/v, and the chunked loss on
    the last stage (outside forward, through the output layer's own weight); the micro batch kept
    under pipelining. The same losses and norms as one process with the standard settings."""
    code, result = parity_run(tmp_path / "run", "--model", llama_untied, "--nproc-per-node", "2", "--pp", "2",
                              "--settings", "fast", "--device-memory", "8GiB", "--no-compile")
    assert code == 0, result.get("error")
    spec = result["spec"]
    assert (spec["cross_entropy"], spec["fused_qkv"], spec["micro_batch_size"]) == ("chunked", True, 4)
    reference = llama_untied_single_process_run
    for step, (got, want) in enumerate(zip(result["steps"], reference["steps"], strict=True), start=1):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), f"step {step}"
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), f"step {step}"
    assert result["metrics"]["valid_loss"] == pytest.approx(reference["metrics"]["valid_loss"], rel=1e-5)


# The chunked loss in the layouts whose last stage or data parallelism it meets (heavy: python -m
# pytest -m heavy). It computes its loss inside forward (where FSDP2 has gathered the output weight)
# and, on a pipeline's last stage, outside it with that stage's own copy of the tied weight.
CHUNKED_LAYOUTS = [
    pytest.param(["--nproc-per-node", "2", "--pp", "2", "--fused-qkv"], id="pp2"),
    pytest.param(["--nproc-per-node", "2"], id="dp2-ddp"),
    pytest.param(["--nproc-per-node", "2", "--fsdp", "--fused-qkv"], id="dp2-fsdp"),
]


@pytest.mark.heavy
@pytest.mark.parametrize("layout", CHUNKED_LAYOUTS)
def test_chunked_cross_entropy_follows_the_single_process_curve_in_every_layout(tmp_path, single_process_run,
                                                                                layout):
    code, result = parity_run(tmp_path / "run", "--cross-entropy", "chunked", *layout)
    assert code == 0, result.get("error")
    assert result["spec"]["cross_entropy"] == "chunked"
    for step, (got, want) in enumerate(zip(result["steps"], single_process_run["steps"], strict=True), start=1):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), f"step {step}"
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), f"step {step}"
    assert result["metrics"]["valid_loss"] == pytest.approx(single_process_run["metrics"]["valid_loss"], rel=1e-5)
