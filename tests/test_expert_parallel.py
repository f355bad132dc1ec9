"""Expert parallelism (--ep) and the experts under tensor parallelism (--tp): the all-to-all dispatch
and the split experts against one process, real torchrun runs of moe-tiny against one process (EP2 in
the default run; EP2 x DP2, FSDP2, EP2 x FSDP2, TP2 and TP2 x FSDP2 heavy),
the all-to-all figures in the result, the summary and the report, and bad --ep values refused."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
import torch

from hwbench.cli import main
from hwbench.device.base import HostTimer, StepTimer
from hwbench.engine.expert_parallel import AllToAllClock
from hwbench.workload import GPTConfig
from hwbench.workload.moe import MoE

# A small Mixtral: 4 SwiGLU experts of width 32, top-2 (tests/test_moe_layer.py's shape)
MIXTRAL = GPTConfig(
    num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2, swiglu=True, normalization="RMSNorm",
    position_embedding_type="rope", add_bias_linear=False, untie_embeddings_and_output_weights=True,
    max_position_embeddings=256, vocab_size=512, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
    moe_aux_loss_coeff=0.1,
)
TOKENS = 24  # per rank


# --- the dispatch: two gloo ranks against one process ---------------------------------------------


def _layer(capacity_factor: float | None, shared: int | None = None) -> MoE:
    torch.manual_seed(0)
    layer = MoE(dataclasses.replace(MIXTRAL, moe_expert_capacity_factor=capacity_factor,
                                    moe_shared_expert_intermediate_size=shared))
    for parameter in layer.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    return layer


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Both ranks' tokens (2, TOKENS, h) and the gradient each output is given."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, TOKENS, 64, generator=generator), torch.randn(2, TOKENS, 64, generator=generator)


def _train_step(layer: MoE, x: torch.Tensor, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    """One forward and backward of ``x`` (1, T, h): the output, the input's and the router's gradients."""
    x = x.clone().requires_grad_()
    out = layer(x)
    ((out * grad).sum() + layer.aux_loss).backward()
    return {"out": out.detach(), "input_grad": x.grad}


def _ep2_rank(rank: int, folder: str) -> None:
    """Rank ``rank`` of 2: the layer with its experts split over both (EP2), its own tokens."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hwbench.engine.expert_parallel import apply_expert_parallel, apply_expert_tensor_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    try:
        saved = {}
        for name, capacity in (("dropless", None), ("capacity", 1.0)):
            layer = _layer(capacity)
            clock = AllToAllClock(HostTimer)
            apply_expert_parallel(layer, init_device_mesh("cpu", (2,), mesh_dim_names=("ep",)), clock)
            x, grad = _inputs()
            step = _train_step(layer, x[rank:rank + 1], grad[rank:rank + 1])
            clock.step_done()
            saved[name] = {**step, "router_grad": layer.router.weight.grad,
                           "expert_grads": [p.grad.to_local() for p in layer.experts.parameters()],
                           "kept": layer.figures.take(4, torch.device("cpu")), "seconds": clock.step_seconds()}
        for name, capacity in (("tp-dropless", None), ("tp-capacity", 1.0)):
            layer = _layer(capacity, shared=32)  # with shared experts, split as a dense MLP
            apply_expert_tensor_parallel(layer, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
            x, grad = _inputs()
            step = _train_step(layer, x[:1], grad[:1])  # tensor parallelism: both ranks take the same tokens
            saved[name] = {**step, "grads": {n: p.grad.to_local() for n, p in layer.named_parameters()},
                           "kept": layer.figures.take(4, torch.device("cpu"))}
        torch.save(saved, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ep2_ranks(tmp_path_factory) -> list[dict]:
    """What each of two spawned gloo ranks computed with EP2 (dropless, then a capacity of 1.0)."""
    import torch.multiprocessing as mp

    folder = tmp_path_factory.mktemp("ep2")
    mp.spawn(_ep2_rank, args=(str(folder),), nprocs=2, join=True)
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(2)]


@pytest.mark.parametrize("name, capacity", [("dropless", None), ("capacity", 1.0)])
def test_the_all_to_all_dispatch_computes_what_one_process_does(ep2_ranks, name, capacity):
    """Each rank routes its own tokens and sends them to the rank of their experts: every output and
    input gradient is the one-process layer's for those tokens; each rank's expert gradients are the
    one-process gradients of its two experts over both ranks' tokens (the all-to-all's backward
    brings them back); the routers' gradients add up to the one-process router's. With a capacity
    the dropped assignments stay out as on one process (each rank's capacity from its own tokens)."""
    layer = _layer(capacity)
    x, grad = _inputs()
    steps = [_train_step(layer, x[rank:rank + 1], grad[rank:rank + 1]) for rank in range(2)]  # two micro-batches
    figures = layer.figures.take(4, torch.device("cpu"))
    ranks = [saved[name] for saved in ep2_ranks]
    if capacity is not None:
        assert figures[4] > 0, "the capacity drops assignments, or this case would test nothing"
    for rank, (ours, theirs) in enumerate(zip(ranks, steps, strict=True)):
        torch.testing.assert_close(ours["out"], theirs["out"])
        torch.testing.assert_close(ours["input_grad"], theirs["input_grad"])
        for local, whole in zip(ours["expert_grads"], layer.experts.parameters(), strict=True):
            torch.testing.assert_close(local, whole.grad[2 * rank:2 * rank + 2])
    torch.testing.assert_close(ranks[0]["router_grad"] + ranks[1]["router_grad"], layer.router.weight.grad)
    torch.testing.assert_close(ranks[0]["kept"][:5] + ranks[1]["kept"][:5], figures[:5])  # routed, dropped
    for saved in ranks:  # the clock timed this training step's all-to-alls
        (seconds,) = saved["seconds"]
        assert seconds > 0


# the dimension of each weight that tensor parallelism splits (None: replicated)
TP_SPLIT = {"router.weight": None, "experts.gate_proj.weight": 1, "experts.up_proj.weight": 1,
            "experts.down_proj.weight": 2, "shared_experts.gate_proj.weight": 0,
            "shared_experts.up_proj.weight": 0, "shared_experts.down_proj.weight": 1}


@pytest.mark.parametrize("capacity", [None, 1.0], ids=["dropless", "capacity"])
def test_tensor_parallel_experts_compute_what_one_process_does(ep2_ranks, capacity):
    """TP2: both ranks take the same tokens, each holds half of every expert's width (and of the
    shared experts'); the output and the input's gradient are the one-process layer's, each rank's
    weight gradients its half of the one-process ones, the replicated router's whole, and every rank
    routes alike."""
    layer = _layer(capacity, shared=32)
    x, grad = _inputs()
    step = _train_step(layer, x[:1], grad[:1])
    figures = layer.figures.take(4, torch.device("cpu"))
    for rank, saved in enumerate(ep2_ranks):
        ours = saved["tp-dropless" if capacity is None else "tp-capacity"]
        torch.testing.assert_close(ours["out"], step["out"])
        torch.testing.assert_close(ours["input_grad"], step["input_grad"])
        torch.testing.assert_close(ours["kept"], figures)
        assert set(ours["grads"]) == set(TP_SPLIT)
        for name, dim in TP_SPLIT.items():
            whole = layer.get_parameter(name).grad
            expected = whole if dim is None else whole.chunk(2, dim=dim)[rank]
            torch.testing.assert_close(ours["grads"][name], expected, msg=name)


# --- the clock ------------------------------------------------------------------------------------


class _LateTimer(StepTimer):
    """A device timer whose events have not all been reached until ``done`` is set."""

    done = False

    def __init__(self) -> None:
        self.marks: list[float] = []

    def mark(self) -> None:
        self.marks.append(float(len(self.marks)))

    def intervals_s(self) -> list[float]:
        assert _LateTimer.done, "read before its events completed: the host would wait"
        return [b - a for a, b in zip(self.marks, self.marks[1:])]

    def ready(self) -> bool:
        return _LateTimer.done


def test_the_clock_sums_each_steps_calls_and_reads_no_event_before_it_completed():
    clock = AllToAllClock(_LateTimer)
    for calls in (2, 3):
        for _ in range(calls):
            with clock.timing():
                pass
        clock.step_done()  # not ready: kept, not read
    _LateTimer.done = True
    try:
        assert clock.step_seconds() == [2.0, 3.0]  # each call 1 "second" inside, the gaps between left out
    finally:
        _LateTimer.done = False


# --- runs: real torchrun ranks against one process -------------------------------------------------

MOE_BASE = ["run", "--quiet", "--model", "moe-tiny", "--device", "cpu", "--data", "synthetic", "--steps", "2",
            "--warmup", "1", "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--eval-iters", "1"]


def _run(out: Path, *options: str) -> dict:
    assert main([*MOE_BASE, *options, "--out", str(out)]) == 0
    (file,) = out.glob("*.json")
    return json.loads(file.read_text())


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    """moe-tiny on one process: 4 micro-batches of 2 a step, EP1."""
    return _run(tmp_path_factory.mktemp("moe-one"))


@pytest.fixture(scope="module")
def ep2(tmp_path_factory) -> tuple[dict, Path]:
    """moe-tiny on 2 torchrun ranks with --ep 2: each rank 2 of the 4 experts, 2 micro-batches a step."""
    out = tmp_path_factory.mktemp("moe-ep2")
    return _run(out, "--nproc-per-node", "2", "--ep", "2"), out


def _assert_trains_as_one_process(result: dict, one: dict) -> None:
    """The same losses, gradient norms, load-balancing losses and validation loss to float rounding
    (the same global batch, summed in another order), and every assignment counted once."""
    assert result["status"] == "ok", result.get("error")
    for ours, theirs in zip(result["steps"], one["steps"], strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-6)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5)
        assert ours["moe_aux_loss"] == pytest.approx(theirs["moe_aux_loss"], rel=1e-5)
    assert result["metrics"]["valid_loss"] == pytest.approx(one["metrics"]["valid_loss"], rel=1e-6)
    assert result["metrics"]["routing"]["tokens_per_expert"] == one["metrics"]["routing"]["tokens_per_expert"]


def _assert_all_to_all_figures(result: dict, ep: int) -> None:
    figures = result["metrics"]["expert_parallel"]
    assert figures["ep"] == ep and 0 < figures["all_to_all_share"] < 1
    assert figures["all_to_all_share"] <= figures["all_to_all_share_max"] < 1
    assert figures["all_to_all_share_max_rank"] in range(result["metrics"]["world_size"])
    timed = [step for step in result["steps"] if step["phase"] == "timed"]
    assert all(0 < step["all_to_all_s"] < step["time_s"] for step in timed)
    assert figures["all_to_all_s_median"] == pytest.approx(statistics.median(s["all_to_all_s"] for s in timed))


@pytest.mark.slow
def test_ep2_on_two_ranks_trains_as_one_process_and_times_its_all_to_alls(ep2, one_process):
    result, _ = ep2
    _assert_trains_as_one_process(result, one_process)
    assert result["spec"]["parallel"] == {**result["spec"]["parallel"], "dp": 2, "ep": 2}
    assert result["engine"]["expert_parallel"] == "all-to-all" and result["engine"]["data_parallel"] == "ddp"
    _assert_all_to_all_figures(result, ep=2)
    from test_docs import undocumented

    assert not undocumented(result)


@pytest.mark.slow
def test_a_run_without_expert_parallelism_has_no_all_to_all_figures(one_process):
    assert "expert_parallel" not in one_process["metrics"] and one_process["engine"]["expert_parallel"] is None
    assert all("all_to_all_s" not in step for step in one_process["steps"])
    assert one_process["metrics"]["routing"]["imbalance_median"] >= 1  # the imbalance is any MoE run's


@pytest.mark.slow
def test_the_summary_and_the_report_show_the_all_to_all_share_and_the_imbalance(ep2, one_process, tmp_path):
    from hwbench.report.summary import run_summary_rows
    from hwbench.result.model import RunResult

    result, folder = ep2
    rows = dict(run_summary_rows(RunResult.from_dict(result)))
    share = result["metrics"]["expert_parallel"]["all_to_all_share"]
    assert rows["layout"].startswith("TP1 PP1 DP2 EP2, native (ddp)")
    assert rows["all-to-all share"].startswith(f"{share:.1%} of the step time (EP2; rank ")
    imbalance = result["metrics"]["routing"]["imbalance_median"]
    assert rows["expert routing"].startswith(f"imbalance {imbalance:.3g}x median")
    assert "all-to-all share" not in dict(run_summary_rows(RunResult.from_dict(one_process)))
    (tmp_path / "one.json").write_text(json.dumps(one_process))
    assert main(["report", str(folder), str(tmp_path / "one.json"), "--out", str(tmp_path / "report.md")]) == 0
    table = (tmp_path / "report.md").read_text().split("\n### moe-tiny\n")[1].strip().split("\n\n")[0]  # per model
    header, _, *lines = table.splitlines()
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert columns[-3:] == ["expert imbalance", "dropped", "all-to-all share"]
    by_layout = {cells[2]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}
    assert by_layout["TP1 PP1 DP2 EP2"][-1] == f"{share:.1%}" and by_layout["TP1 PP1 DP2 EP2"][-2] == "0.0%"
    assert by_layout["TP1 PP1 DP1"][-1].startswith("-")  # EP1: no all-to-all (with its note)


# heavy (python -m pytest -m heavy): 4 ranks, or FSDP2's sharding; the default run's EP2 takes the dispatch
LAYOUTS = [
    pytest.param(["--nproc-per-node", "4", "--ep", "2"], 2, "ddp", id="dp2xep2", marks=pytest.mark.heavy),
    pytest.param(["--nproc-per-node", "2", "--ep", "2", "--fsdp"], 2, "fsdp2", id="ep2-fsdp",
                 marks=pytest.mark.heavy),
    pytest.param(["--nproc-per-node", "4", "--ep", "2", "--fsdp"], 2, "fsdp2", id="dp2xep2-fsdp",
                 marks=pytest.mark.heavy),
    pytest.param(["--nproc-per-node", "2", "--fsdp"], 1, "fsdp2", id="ep1-fsdp", marks=pytest.mark.heavy),
    # tensor parallelism: every expert's width split (the default run's layer test takes its path)
    pytest.param(["--nproc-per-node", "2", "--tp", "2"], 1, None, id="tp2", marks=pytest.mark.heavy),
    pytest.param(["--nproc-per-node", "4", "--tp", "2", "--fsdp"], 1, "fsdp2", id="tp2xdp2-fsdp",
                 marks=pytest.mark.heavy),
]


@pytest.mark.slow
@pytest.mark.parametrize("options, ep, data_parallel", LAYOUTS)
def test_expert_parallel_layouts_train_as_one_process(tmp_path, one_process, options, ep, data_parallel):
    """EP2 beside a second expert-data-parallel rank (the experts' gradients all-reduced over it),
    EP2 with FSDP2 (the experts sharded over the ranks holding them, the rest over dp), MoE on
    FSDP2 without EP, and TP2 (alone and beside FSDP2): the one-process losses."""
    result = _run(tmp_path, *options)
    _assert_trains_as_one_process(result, one_process)
    assert result["engine"]["data_parallel"] == data_parallel and result["spec"]["parallel"]["ep"] == ep
    if ep > 1:
        _assert_all_to_all_figures(result, ep)
    else:
        assert "expert_parallel" not in result["metrics"]


@pytest.mark.slow
@pytest.mark.heavy  # three runs; the default run's EP2 takes the sharded experts' path, checkpoints theirs
def test_an_ep2_checkpoint_resumes_on_one_process_as_the_uninterrupted_run(tmp_path):
    """The experts' DTensor shards saved by two EP2 ranks load into one process's whole [E, out, in]
    weights (and AdamW's moments): steps 4 and 5 after the load are the uninterrupted run's."""
    saved = _run(tmp_path / "ep2", "--nproc-per-node", "2", "--ep", "2", "--save", str(tmp_path / "checkpoints"))
    manifest = json.loads(next((tmp_path / "checkpoints").glob("iter_*/hwbench_checkpoint.json")).read_text())
    assert manifest["layout"]["ep"] == 2 and saved["status"] == "ok"
    resumed = _run(tmp_path / "resumed", "--load", str(tmp_path / "checkpoints"), "--steps", "1")
    whole = _run(tmp_path / "whole", "--steps", "4")
    assert [step["step"] for step in resumed["steps"]] == [4, 5]
    for ours, theirs in zip(resumed["steps"], whole["steps"][3:], strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-6)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5)
    assert any("random-number generator states not restored" in warning for warning in resumed["warnings"])


# --- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, line", [
    (["--model", "tiny", "--nproc-per-node", "2", "--ep", "2"],
     "--ep 2 with --model tiny: expert parallelism splits the experts of a mixture-of-experts model, and tiny is "
     "dense; accepted: --ep 1, or a model with experts (`hwbench models` lists their experts)"),
    (["--model", "moe-tiny", "--nproc-per-node", "3", "--ep", "3"],
     "--ep 3 does not divide the 4 experts of --model moe-tiny; accepted: 1 (divisors of the experts and of the "
     "data-parallel size 3)"),
    (["--model", "moe-tiny", "--nproc-per-node", "2", "--ep", "4"],
     "--ep 4 does not divide the data-parallel size 2: expert-parallel ranks are data-parallel ones; accepted: "
     "1, 2 (divisors of the experts and of dp), or more ranks (--nproc-per-node)"),
    (["--model", "moe-tiny", "--nproc-per-node", "4", "--tp", "2", "--ep", "2"],
     "--ep 2 with --tp 2 --pp 1: expert parallelism runs beside data parallelism only so far; accepted: --tp 1 "
     "--pp 1 with --ep, or --ep 1"),
    (["--model", "moe-tiny", "--ep", "0"], None),
], ids=["dense", "experts", "dp", "tp", "zero"])
def test_a_bad_ep_is_one_line_naming_it_and_nothing_is_written(tmp_path, capsys, options, line):
    code = main(["run", "--quiet", "--device", "cpu", "--out", str(tmp_path / "out"), *options])
    error = capsys.readouterr().err.strip()
    assert code == 2 and error.count("\n") == 0 and "--ep" in error
    if line is not None:
        assert error.endswith(line)
    assert not (tmp_path / "out").exists()


def test_ep_is_megatrons_option_and_a_spec_field():
    from hwbench.catalog import load_catalog
    from hwbench.options import RUN_OPTIONS, RunOptions
    from hwbench.spec import build_run_spec

    assert RUN_OPTIONS["ep"].megatron == ("--expert-model-parallel-size",)
    spec = build_run_spec(RunOptions(model="moe-tiny", nproc_per_node=4, ep=2), load_catalog(), check_paths=False)
    assert (spec.parallel.dp, spec.parallel.ep, spec.parallel.expert_dp, spec.parallel.world_size) == (4, 2, 2, 4)

