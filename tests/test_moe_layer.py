"""hwbench's mixture of experts without a reference model: the router's capacity and figures,
the recompute, the auxiliary loss's place in the objective, the parameter counts of the catalog's
MoE models, and bad catalog input refused (the numerics against transformers: tests/test_moe.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from hwbench.workload import GPTConfig
from hwbench.workload.model import GPT, build_model
from hwbench.workload.moe import MoE, Router, moe_layers

CPU = torch.device("cpu")
# A small Mixtral (tests/test_moe.py's shape): 4 SwiGLU experts of width 32, top-2
MIXTRAL = GPTConfig(
    num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, swiglu=True, normalization="RMSNorm",
    position_embedding_type="rope", rotary_base=1e6, add_bias_linear=False, untie_embeddings_and_output_weights=True,
    max_position_embeddings=256, vocab_size=512, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
    moe_aux_loss_coeff=0.1,
)


# --- the router: capacity, the figures, the recompute -------------------------------------------


def one_expert_router(tokens: int, capacity_factor: float | None, top_k: int = 1) -> tuple[Router, torch.Tensor]:
    """A router of 4 experts whose logits make every token prefer expert 0, token t more than t - 1."""
    config = dataclasses.replace(MIXTRAL, moe_router_topk=top_k, moe_expert_capacity_factor=capacity_factor)
    router = Router(config)
    with torch.no_grad():
        router.weight.zero_()
        router.weight[0, 0] = 1.0
    x = torch.zeros(tokens, 64)
    x[:, 0] = torch.linspace(0.5, 4.0, tokens)
    return router, x


def test_dropless_routing_keeps_every_assignment():
    router, x = one_expert_router(8, None)
    routing = router(x)
    assert routing.kept is None and routing.routed.tolist() == [8, 0, 0, 0]
    torch.testing.assert_close(routing.weights, torch.ones(8, 1))  # top-1: the renormalised weight is 1


def test_capacity_keeps_each_experts_highest_weights_and_drops_the_rest():
    """capacity = ceil(8 tokens x top-1 / 4 experts x 1.0) = 2: expert 0 keeps the 2 tokens it
    weighs most (the last two), drops 6; their outputs are 0 (no shared experts)."""
    router, x = one_expert_router(8, 1.0, top_k=1)
    router.pre_softmax = True  # top-1 weights are all 1 once renormalised: rank by softmax's own
    routing = router(x)
    assert routing.kept is not None and routing.kept.flatten().tolist() == [False] * 6 + [True] * 2
    assert (routing.weights[:6] == 0).all() and (routing.weights[6:] > 0).all()
    moe = MoE(dataclasses.replace(MIXTRAL, moe_router_topk=1, moe_router_pre_softmax=True,
                                  moe_expert_capacity_factor=1.0))
    with torch.no_grad():
        moe.router.weight.copy_(router.weight)
        for parameter in moe.experts.parameters():
            parameter.normal_()
    y = moe(x.unsqueeze(0)).squeeze(0)
    assert (y[:6] == 0).all() and (y[6:].abs() > 0).all()
    taken = moe.figures.take(4, CPU)
    assert taken[:5].tolist() == [8, 0, 0, 0, 6]  # routed per expert, dropped
    assert moe.figures.take(4, CPU).tolist() == [0] * 6  # taken once: a second take finds nothing new


def test_a_large_capacity_drops_nothing():
    router, x = one_expert_router(8, 4.0, top_k=2)  # capacity ceil(8 x 2 / 4 x 4) = 16 >= 8 tokens
    assert router(x).kept.all()


def test_the_figures_count_each_forward_once_and_the_recompute_not_again():
    """Two training forwards (micro-batches): routed assignments summed (2 x T x k per layer),
    the auxiliary loss averaged; with activation recompute the same figures, the same loss and
    the same gradients, the router's (its auxiliary gradient) too."""
    tokens = torch.randint(0, 512, (2, 17))
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = GPT(MIXTRAL, recompute=recompute)
        losses = [model(tokens[:, :-1], tokens[:, 1:]) for _ in range(2)]
        sum(losses).backward()
        figures = torch.stack([layer.figures.take(4, CPU) for layer in moe_layers(model)])
        results.append((losses[0].item(), model.blocks["0"].mlp.router.weight.grad.clone(), figures))
    (loss, grad, figures), (loss_recomputed, grad_recomputed, figures_recomputed) = results
    assert figures[:, :4].sum(dim=1).tolist() == [2 * 32 * 2] * 2
    assert (figures[:, 4] == 0).all() and (figures[:, 5] > 0).all()
    torch.testing.assert_close(figures, figures_recomputed)
    assert loss == pytest.approx(loss_recomputed, rel=1e-6)
    torch.testing.assert_close(grad, grad_recomputed)


def test_evaluation_neither_counts_nor_adds_the_auxiliary_loss():
    model = GPT(MIXTRAL).eval()
    tokens = torch.randint(0, 512, (2, 17))
    with torch.no_grad():
        model(tokens[:, :-1], tokens[:, 1:])
    assert all(layer.aux_loss is None for layer in moe_layers(model))
    assert torch.equal(moe_layers(model)[0].figures.take(4, CPU), torch.zeros(6, dtype=torch.float64))


def test_the_auxiliary_loss_leaves_the_loss_value_and_adds_its_gradient():
    """The training loss's value is the language-model loss alone (the auxiliary loss is recorded
    apart); its gradient is that of LM + auxiliary: the router's gradient differs from a model
    without the coefficient, the output layer's does not."""
    tokens = torch.randint(0, 512, (2, 17))
    grads = {}
    for coeff in (0.0, 0.1):
        torch.manual_seed(0)
        model = GPT(dataclasses.replace(MIXTRAL, moe_aux_loss_coeff=coeff))
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        grads[coeff] = (loss.item(), model.blocks["0"].mlp.router.weight.grad, model.output.weight.grad)
    assert grads[0.0][0] == grads[0.1][0]
    assert not torch.allclose(grads[0.0][1], grads[0.1][1])
    torch.testing.assert_close(grads[0.0][2], grads[0.1][2])


# --- the catalog: the model cards' counts, bad input refused -----------------------------------

# the model cards' figures (config.json shapes; count_parameters gives them exactly)
CARD_PARAMETERS = {"mixtral-8x7b": (46_702_792_704, 12_879_925_248), "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704)}


@pytest.mark.parametrize("name", sorted(CARD_PARAMETERS))
def test_the_catalogs_moe_models_have_the_model_cards_total_and_active_parameters(name):
    from hwbench.catalog import load_catalog
    from hwbench.workload.params import count_parameters

    config = load_catalog().workloads[name].model
    counts = count_parameters(config)
    assert (counts.total, counts.active) == CARD_PARAMETERS[name]
    with torch.device("meta"):
        model = GPT(config)
    assert sum(p.numel() for p in model.parameters()) == counts.total
    experts = moe_layers(model)
    assert len(experts) == config.num_layers and experts[0].experts.gate_proj.weight.shape == (
        config.num_experts, config.moe_ffn_size, config.hidden_size)
    # active: everything but the experts a token is not sent to, (E - k) of each layer's
    idle = sum(p.numel() for p in experts[0].experts.parameters()) // config.num_experts * (
        config.num_experts - config.moe_router_topk) * config.num_layers
    assert counts.active == counts.total - idle


@pytest.mark.parametrize("name", ["moe-tiny", "moe-small"])
def test_the_cpu_sizes_build_the_counted_parameters(name):
    from hwbench.catalog import load_catalog
    from hwbench.workload.params import count_parameters

    config = load_catalog().workloads[name].model
    model = build_model(config, device=CPU, seed=1)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(config).total
    assert count_parameters(config).active < count_parameters(config).total


def test_shared_experts_and_dense_layers_are_counted_as_built():
    """--moe-layer-freq 2: layers 0 and 2 MoE, 1 and 3 dense; shared experts count as active."""
    config = dataclasses.replace(MIXTRAL, num_layers=4, moe_layer_freq=2, moe_shared_expert_intermediate_size=48,
                                 ffn_hidden_size=96)
    from hwbench.workload.params import count_parameters

    model = build_model(config, device=CPU, seed=1)
    assert [type(block.mlp).__name__ for block in model.blocks.values()] == ["MoE", "SwiGLU", "MoE", "SwiGLU"]
    counts = count_parameters(config)
    assert sum(p.numel() for p in model.parameters()) == counts.total
    assert counts.total - counts.active == 2 * (4 - 2) * 3 * 64 * 32  # two MoE layers, two idle experts each
    tokens = torch.randint(0, 512, (2, 9))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    assert model.blocks["0"].mlp.shared_experts.down_proj.weight.grad.abs().sum() > 0


def test_sigmoid_scores_renormalise_the_top_k_and_train():
    model = GPT(dataclasses.replace(MIXTRAL, moe_router_score_function="sigmoid"))
    routing = moe_layers(model)[0].router(torch.randn(16, 64))
    torch.testing.assert_close(routing.weights.sum(dim=-1), torch.ones(16))
    assert routing.aux_loss > 0
    tokens = torch.randint(0, 512, (2, 9))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    assert model.blocks["0"].mlp.router.weight.grad.abs().sum() > 0


def _moe_catalog(tmp_path, monkeypatch, **changes):
    from hwbench.catalog import _cached, load_catalog

    entry = yaml.safe_load(open(load_catalog().workloads["moe-tiny"].path))
    entry["name"] = "mine"
    entry["model"].update(changes)
    (tmp_path / "workloads").mkdir()
    (tmp_path / "workloads" / "mine.yaml").write_text(yaml.safe_dump(entry))
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    _cached.cache_clear()
    try:
        return load_catalog()
    finally:
        _cached.cache_clear()


@pytest.mark.parametrize("changes, expected", [
    ({"moe_router_topk": 5}, r"mine.yaml: model: moe_router_topk 5 is above num_experts 4; accepted: 1 to 4$"),
    ({"moe_expert_capacity_factor": 0}, r"mine.yaml: field model.moe_expert_capacity_factor: must be > 0, not 0$"),
    ({"moe_aux_loss_coeff": -0.1}, r"mine.yaml: field model.moe_aux_loss_coeff: must be >= 0.0, not -0.1$"),
    ({"moe_router_score_function": "sinkhorn"}, r"field model.moe_router_score_function: must be one of softmax, "
                                                r"sigmoid, not 'sinkhorn'"),
    ({"moe_ffn_hidden_size": 100}, r"model: the experts' width 100: an MoE model's widths must be multiples of 8"),
], ids=["top-k-above-experts", "capacity-0", "negative-coefficient", "unknown-score-function", "unaligned-width"])
def test_bad_moe_fields_are_refused_in_one_line_naming_the_field(tmp_path, monkeypatch, changes, expected):
    from hwbench.catalog import CatalogError

    with pytest.raises(CatalogError, match=expected) as refused:
        _moe_catalog(tmp_path, monkeypatch, **changes)
    assert "\n" not in str(refused.value)


def test_a_capacity_factor_and_a_zero_coefficient_are_accepted(tmp_path, monkeypatch):
    config = _moe_catalog(tmp_path, monkeypatch, moe_expert_capacity_factor=1.25).workloads["mine"].model
    assert config.moe_expert_capacity_factor == 1.25
    (tmp_path / "workloads" / "mine.yaml").unlink()
    (tmp_path / "workloads").rmdir()
    text_config = _moe_catalog(tmp_path, monkeypatch).workloads["mine"].model
    assert dataclasses.replace(text_config, moe_aux_loss_coeff=0.0).problems() == []


# --- a run: refused layouts, the figures the result records -------------------------------------


@pytest.mark.parametrize("options, line", [
    (["--nproc-per-node", "2", "--engine", "deepspeed"],
     "--engine deepspeed with --model moe-tiny: a mixture-of-experts model runs on the native engine, over "
     "data-parallel ranks (DDP or --fsdp), expert-parallel ones (--ep) or tensor-parallel ones (--tp), so far; "
     "accepted: --engine native --pp 1"),
    (["--nproc-per-node", "2", "--pp", "2"],
     "--pp 2 with --model moe-tiny: a mixture-of-experts model runs on the native engine, over data-parallel ranks "
     "(DDP or --fsdp), expert-parallel ones (--ep) or tensor-parallel ones (--tp), so far; accepted: --engine "
     "native --pp 1"),
], ids=["deepspeed", "pp"])
def test_layouts_the_moe_layers_do_not_run_yet_are_refused_in_one_line(tmp_path, capsys, options, line):
    from hwbench.cli import main

    code = main(["run", "--quiet", "--model", "moe-tiny", "--device", "cpu", "--out", str(tmp_path), *options])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.endswith(line)
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_tensor_parallel_size_that_does_not_split_every_experts_width_is_refused():
    """Each tensor-parallel rank holds an equal share of every expert's width: a width of 255 takes
    no --tp but 1 (the heads would take 2)."""
    import copy

    from hwbench.catalog import load_catalog
    from hwbench.errors import UsageError
    from hwbench.options import RunOptions
    from hwbench.spec import build_run_spec

    catalog = copy.deepcopy(load_catalog())  # the loaded catalog is shared: a copy to change
    tiny = catalog.workloads["moe-tiny"]
    odd = tiny.model_copy(update={"model": dataclasses.replace(tiny.model, moe_ffn_hidden_size=255)})
    catalog.workloads["moe-tiny"] = odd
    with pytest.raises(UsageError) as error:
        build_run_spec(RunOptions(model="moe-tiny", nproc_per_node=2, tp=2), catalog, check_paths=False)
    assert str(error.value) == ("--tp 2 does not divide the experts' width 255 (moe_ffn_hidden_size) of --model "
                                "moe-tiny; accepted: 1")
    spec = build_run_spec(RunOptions(model="moe-tiny", nproc_per_node=2, tp=2), load_catalog(), check_paths=False)
    assert (spec.parallel.tp, spec.parallel.ep) == (2, 1)


def test_a_moe_tiny_run_records_its_routing_step_by_step(moe_tiny_run):
    """`hwbench run --model moe-tiny` end to end, 2 micro-batches a step: each step's routing
    (every token's top-2 in each layer counted once), the timed steps' summary, the load-balancing
    loss beside the LM loss, and TFLOP/s on its active parameters (megatron-deepspeed's, which has
    no expert term, null with its reason)."""
    import json

    result = json.loads(moe_tiny_run.read_text())  # conftest's MOE_TINY_RUN
    assert result["status"] == "ok" and result["workload"]["num_experts"] == 4
    assert result["workload"]["parameters_active"] < result["workload"]["parameters"]
    steps, routing = result["steps"], result["metrics"]["routing"]
    assert [step["phase"] for step in steps] == ["warmup", "timed", "timed"]
    for step in steps:
        assert 0.005 < step["moe_aux_loss"] < 0.04  # 2 layers x coefficient 0.01 x (1 when balanced)
        assert 1.0 <= step["moe_imbalance"] <= 2.0 and step["moe_dropped_tokens"] == 0
    assert len(routing["tokens_per_expert"]) == 2  # layers
    assert [sum(layer) for layer in routing["tokens_per_expert"]] == [2 * 4 * 32 * 2] * 2  # steps x batch x seq x k
    assert routing["imbalance_max"] == max(step["moe_imbalance"] for step in steps[1:])
    assert routing["dropped_tokens"] == 0 and routing["dropped_fraction"] == 0.0
    assert routing["aux_loss_mean"] == pytest.approx(sum(step["moe_aux_loss"] for step in steps[1:]) / 2)
    metrics = result["metrics"]
    from hwbench.catalog import load_catalog
    from hwbench.workload.flops import model_flops_per_iteration

    config = load_catalog().workloads["moe-tiny"].model  # global batch 4 of 32 tokens
    assert metrics["flops_per_iteration"] == model_flops_per_iteration(config, 4, 32) > 0
    assert metrics["tflops_per_device"] > 0
    assert metrics["flops_counts"].startswith("active parameters: each token's 2 of 4 routed experts")
    assert metrics["by_formula"]["megatron-deepspeed"]["mfu"] is None
    assert "no mixture-of-experts term" in metrics["by_formula"]["megatron-deepspeed"]["unmeasured"]["mfu"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-autocast"])
def test_the_moe_layer_compiles_and_counts_as_eager(dtype):
    """torch.compile (as --compile): the grouped GEMM in bf16 inside the graph, in fp32 run eagerly
    (torch's meta function takes bf16 only), the figures' bookkeeping outside it; the same output,
    gradients and counts as eager, and a second step without recompiling."""
    torch.manual_seed(0)
    eager = MoE(MIXTRAL)
    for parameter in eager.parameters():
        torch.nn.init.normal_(parameter, std=0.1)
    compiled_layer = MoE(MIXTRAL)
    compiled_layer.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_layer, backend="aot_eager")
    torch._dynamo.utils.counters.clear()
    x = torch.randn(2, 16, 64)
    graphs = []
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        for _ in range(2):
            outputs = [layer(x) for layer in (eager, compiled)]
            for out, layer in zip(outputs, (eager, compiled), strict=True):
                (out.float().sum() + layer.aux_loss).backward()
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    torch.testing.assert_close(compiled_layer.router.weight.grad, eager.router.weight.grad, rtol=0, atol=0)
    assert torch.equal(compiled_layer.figures.take(4, CPU), eager.figures.take(4, CPU))
    assert graphs[0] > 0 and graphs[1] == graphs[0]  # compiled, and no recompile at the second step


@pytest.mark.heavy  # two torchrun ranks; test_a_moe_tiny_run_records_its_routing_step_by_step takes the same path
def test_a_ddp_run_of_moe_tiny_trains_and_routes_as_one_process(tmp_path):
    """2 DDP ranks against one process over the same global batch: the same losses and auxiliary
    losses (the ranks' routing summed, their auxiliary losses averaged), every token counted once."""
    import json

    from hwbench.cli import main

    common = ["run", "--quiet", "--model", "moe-tiny", "--device", "cpu", "--steps", "2", "--warmup", "1",
              "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--eval-iters", "0"]
    results = []
    for name, layout in (("one", []), ("ddp", ["--nproc-per-node", "2"])):
        assert main([*common, *layout, "--out", str(tmp_path / name)]) == 0
        results.append(json.loads(next((tmp_path / name).glob("*.json")).read_text()))
    one, ddp = results
    assert ddp["status"] == "ok" and ddp["metrics"]["world_size"] == 2
    for ours, theirs in zip(ddp["steps"], one["steps"], strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
        assert ours["moe_aux_loss"] == pytest.approx(theirs["moe_aux_loss"], rel=1e-3)
    assert [sum(layer) for layer in ddp["metrics"]["routing"]["tokens_per_expert"]] == [2 * 4 * 32 * 2] * 2
    assert "expert_parallel" not in ddp["metrics"]  # EP1: every rank holds every expert, no all-to-all
