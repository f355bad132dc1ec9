"""--profile: torch.profiler over extra steps, each rank's breakdown of its step, and the rank the
others wait for (hwbench.harness.profile, hwbench.result.breakdown).

The real traces in tests/data/profile/ come from a 2-rank DDP run on this project's CPU machine
with rank 1 slowed (tests/data/profile/README.md says how they were made)."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from hwbench.cli import main
from hwbench.report.summary import run_summary_rows
from hwbench.result.breakdown import (
    STRAGGLER_WAIT_SHARE,
    SUM_TOLERANCE,
    breakdown,
    classify,
    complete_events,
    read_trace,
    waiting_straggler,
)
from hwbench.result.model import BREAKDOWN_CATEGORIES, TimeBreakdown
from hwbench.result.store import load_result

DATA = Path(__file__).resolve().parent / "data" / "profile"
SLOW_RUN = DATA / "dp2-slow-rank1.json"


def sums_to_step(figures: TimeBreakdown, tolerance: float = SUM_TOLERANCE) -> bool:
    """Whether the categories add up to the step within ``tolerance`` of it (profile.sum_tolerance)."""
    if figures.step_s is None:
        return False
    total = sum(figures.seconds(category) or 0.0 for category in BREAKDOWN_CATEGORIES)
    return abs(total - figures.step_s) <= tolerance * figures.step_s


def _x(name: str, start: float, duration: float, cat: str = "cpu_op", tid: int = 1, **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": start, "dur": duration, "pid": 1, "tid": tid, "args": args}


def _seconds(figures: TimeBreakdown) -> dict[str, float]:
    return {category: round((figures.seconds(category) or 0.0) * 1e6, 6) for category in BREAKDOWN_CATEGORIES}


# --- the classifier on hand-built traces ---------------------------------------------------------


def test_names_are_classified_on_the_cpu_and_on_a_gpu_alike():
    assert classify("aten::mm") == classify("aten::addmm") == classify("ampere_sgemm_128x64_tn") == "matmul"
    assert classify("sm90_xmma_gemm_bf16bf16_bf16f32") == classify("cutlass_80_tensorop_s1688gemm") == "matmul"
    assert classify("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert classify("flash_fwd_kernel") == "attention"
    assert classify("aten::bmm", ["aten::scaled_dot_product_attention"]) == "attention"  # inside SDPA
    assert classify("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == classify("gloo:all_reduce") == \
        classify("c10d_functional::wait_tensor") == "exposed_communication"
    assert classify("aten::broadcast_tensors") == "other_compute"  # a compute op, not a collective
    assert classify("aten::mul_", ["Optimizer.step#AdamW.step"]) == "optimizer"
    assert classify("aten::copy_") == classify("Memcpy HtoD (Pageable -> Device)") == "memory_copy"
    assert classify("aten::gelu") == classify("aten::native_layer_norm") == "other_compute"
    assert classify("aten::copy_", ["hwbench::data"]) == "data_loading"


def test_a_cpu_step_is_charged_to_its_innermost_ops_and_sums_to_the_step():
    """One 100 µs step on the training thread: a batch, a linear's mm, attention, an optimizer step, gaps;
    collectives on gloo's thread: 20-60 under compute but for the gap at 45-50, 80-90 in a gap (exposed)."""
    events = list(complete_events([
        _x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        _x("hwbench::data", 0, 5, cat="user_annotation"),
        _x("aten::copy_", 1, 3),  # inside the data annotation: data loading
        _x("aten::linear", 5, 30),
        _x("aten::mm", 10, 20),  # linear's self time 10 µs is other compute, the mm 20 µs
        _x("aten::scaled_dot_product_attention", 35, 10),
        _x("aten::bmm", 36, 8),  # inside SDPA: attention
        _x("Optimizer.step#AdamW.step", 50, 20, cat="user_annotation"),
        _x("aten::mul_", 52, 10),
        _x("gloo:all_reduce", 20, 40, cat="user_annotation", tid=2),  # 20-60: hidden, but for 45-50
        _x("gloo:all_reduce", 80, 10, cat="user_annotation", tid=2),  # in the gap: exposed
    ]))
    figures = breakdown(events, rank=0)
    assert figures.steps == 1 and figures.step_s == pytest.approx(100e-6)
    assert _seconds(figures) == {"matmul": 20, "attention": 10, "other_compute": 10, "exposed_communication": 15,
                                 "memory_copy": 0, "optimizer": 20, "data_loading": 5, "host_idle": 20}
    assert figures.communication_s == pytest.approx(50e-6)  # hidden or not
    assert sums_to_step(figures) and sum(figures.shares.values()) == pytest.approx(1.0)
    assert figures.timeline == "CPU ops of the thread that ran the steps"


def test_device_kernels_take_their_launching_ops_context_and_overlap_hides_communication():
    """A GPU-shaped trace: kernels linked to CPU ops by External id; an NCCL kernel on another stream
    runs 40 µs, 30 of them under a GEMM: 10 exposed, 40 in all."""
    events = list(complete_events([
        _x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        _x("Optimizer.step#AdamW.step", 60, 30, cat="user_annotation"),
        _x("aten::_foreach_mul_", 61, 5, **{"External id": 7}),
        _x("ampere_sgemm_128x64_tn", 10, 40, cat="kernel", tid=7, **{"External id": 3}),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, 40, cat="kernel", tid=8),
        _x("multi_tensor_apply_kernel", 70, 10, cat="kernel", tid=7, **{"External id": 7}),
        _x("Memcpy DtoH (Device -> Pageable)", 85, 5, cat="gpu_memcpy", tid=7),
    ]))
    figures = breakdown(events, rank=3)
    assert figures.rank == 3 and figures.timeline == "device kernels, copies and sets"
    assert _seconds(figures) == {"matmul": 40, "attention": 0, "other_compute": 0, "exposed_communication": 10,
                                 "memory_copy": 5, "optimizer": 10, "data_loading": 0, "host_idle": 35}
    assert figures.communication_s == pytest.approx(40e-6)
    assert sums_to_step(figures)


def test_a_trace_without_a_profiled_step_is_refused_by_name(tmp_path):
    path = tmp_path / "rank-0.json.gz"
    with gzip.open(path, "wt") as file:
        json.dump({"traceEvents": [_x("aten::mm", 0, 5)]}, file)
    with pytest.raises(ValueError, match="no ProfilerStep"):
        breakdown(read_trace(path), rank=0)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not a readable JSON trace"):
        read_trace(tmp_path / "bad.json")


# --- the straggler rule --------------------------------------------------------------------------


def _rank(rank: int, wait_s: float, step_s: float = 1.0) -> TimeBreakdown:
    return TimeBreakdown(rank=rank, step_s=step_s, exposed_communication_s=wait_s)


def test_the_rank_that_waits_least_while_the_others_wait_is_named():
    lagging = waiting_straggler([_rank(0, 0.7), _rank(1, 0.05), _rank(2, 0.8), _rank(3, 0.75)])
    assert lagging is not None and lagging.rank == 1
    assert lagging.peers_wait_s == pytest.approx(0.75) and lagging.lag_s == pytest.approx(0.70)
    assert lagging.lag_share == pytest.approx(0.70)


def test_nobody_is_named_below_the_threshold_or_alone():
    assert waiting_straggler([_rank(0, STRAGGLER_WAIT_SHARE), _rank(1, 0.0)]) is None  # a lag of the threshold
    assert waiting_straggler([_rank(0, STRAGGLER_WAIT_SHARE + 0.01), _rank(1, 0.0)]).rank == 1
    assert waiting_straggler([_rank(0, 0.3), _rank(1, 0.3)]) is None
    assert waiting_straggler([_rank(0, 0.9)]) is None


# --- real traces ---------------------------------------------------------------------------------


def test_the_real_traces_of_a_slow_rank_name_it_and_sum_to_their_steps():
    """tests/data/profile: --dp 2 with HWBENCH_FAULT=1:1:slow (rank 1 sleeps 2 s a step). Rank 0 waits in
    DDP's all-reduces (gloo's threads) while rank 1 sleeps (host/idle): rank 1 is named."""
    result = load_result(SLOW_RUN)
    ranks = [breakdown(read_trace(SLOW_RUN.parent / trace), rank=index, trace=trace)
             for index, trace in enumerate(result.profile.traces)]
    for figures in ranks:
        assert sums_to_step(figures, SUM_TOLERANCE) and figures.steps == 2
        assert figures.matmul_s > 0 and figures.optimizer_s > 0 and figures.data_loading_s > 0
    assert ranks[0].exposed_communication_s > 1.5 > ranks[1].exposed_communication_s  # the 2 s sleep, waited for
    assert ranks[1].host_idle_s > 1.5 > ranks[0].host_idle_s
    lagging = waiting_straggler(ranks)
    assert lagging is not None and lagging.rank == 1 and lagging.lag_share > STRAGGLER_WAIT_SHARE
    # what the run itself recorded is what reading its traces gives
    assert [r.model_dump(exclude={"unmeasured"}) for r in result.profile.ranks] == \
        [r.model_dump(exclude={"unmeasured"}) for r in ranks]
    assert result.profile.straggler == lagging


def test_the_summary_and_the_report_name_the_rank_the_others_waited_for(tmp_path):
    rows = dict(run_summary_rows(load_result(SLOW_RUN)))
    assert rows["waiting for"].startswith("rank 1: it waited")
    assert "host/idle" in rows["rank 1 time"] and rows["profile"].startswith("steps 5-6, after the timed ones")
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(DATA), "--out", str(tmp_path / "report.md")]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "## Where the time goes" in report
    assert "waiting for rank 1: it waited" in report


@pytest.mark.skipif(importlib.util.find_spec("hta") is None,
                    reason="HolisticTraceAnalysis is not installed (the test extra)")
def test_holistic_trace_analysis_reads_the_traces_back():
    """HTA, Meta's reader of PyTorch traces, parses each rank's trace: the ranks the files name, the
    profiled step, the ops hwbench charged to GEMMs."""
    from hta.trace_analysis import TraceAnalysis

    folder = SLOW_RUN.parent / load_result(SLOW_RUN).profile.trace_dir
    analysis = TraceAnalysis(trace_dir=str(folder))
    assert sorted(analysis.t.get_all_traces()) == [0, 1]
    symbols = analysis.t.symbol_table.sym_table
    names = {symbols[index] for index in analysis.t.get_trace(1)["name"]}
    assert "aten::mm" in names and "Optimizer.step#AdamW.step" in names


def _hta_reads(folder, ranks: list[int]) -> None:
    """HTA parses the traces of ``folder``: one per rank, each with its profiled steps' GEMMs."""
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is not installed (the test extra)")
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(folder))
    assert sorted(analysis.t.get_all_traces()) == ranks
    symbols = analysis.t.symbol_table.sym_table
    for rank in ranks:
        names = {symbols[index] for index in analysis.t.get_trace(rank)["name"]}
        assert any(name.startswith("ProfilerStep#") for name in names) and names & {"aten::mm", "aten::addmm"}


# --- runs ----------------------------------------------------------------------------------------


def test_the_profiler_hook_writes_a_gzip_trace_per_rank_and_reads_it_back(tmp_path):
    """hwbench.harness.profile on a small real training step (what the worker gives it, without a
    run around it): one discarded step, then the profiled ones, the trace gzip'd where the plan says."""
    import torch

    from hwbench.harness.profile import ProfilePlan, profile_steps, with_data_annotation

    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.AdamW(model.parameters())
    trained: list[int] = []

    def train(step: int) -> None:
        batch = with_data_annotation(lambda: torch.randn(8, 32))()
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        trained.append(step)

    plan = ProfilePlan(out_dir=str(tmp_path), folder="run.profile", steps=2, rank=0)
    figures = profile_steps(plan, "cpu", 7, train)
    assert trained == [7, 8, 9]  # the profiler's warm-up step, then the two it records
    assert figures.trace == "run.profile/rank-0.json.gz" and figures.steps == 2
    with gzip.open(tmp_path / figures.trace, "rt") as file:  # gzip'd JSON, as the name says
        names = {event.get("name") for event in json.load(file)["traceEvents"]}
    assert {"ProfilerStep#1", "ProfilerStep#2", "aten::addmm", "hwbench::data"} <= names
    assert sums_to_step(figures) and figures.matmul_s > 0 and figures.optimizer_s > 0 and figures.data_loading_s > 0
    _hta_reads(tmp_path / "run.profile", [0])


def test_a_trace_that_cannot_be_written_is_a_reason_not_a_lost_run(tmp_path):
    """The result's folder is a file: the steps still train, and the breakdown says why it has no figures."""
    from hwbench.harness.profile import ProfilePlan, profile_steps

    blocked = tmp_path / "out"
    blocked.write_text("a file where the folder should be")
    trained: list[int] = []
    figures = profile_steps(ProfilePlan(out_dir=str(blocked), folder="run.profile", steps=1, rank=2), "cpu", 1,
                            trained.append)
    assert trained == [1, 2] and figures.rank == 2 and figures.step_s is None and figures.trace is None
    assert figures.why("breakdown").startswith(f"the trace could not be written to {blocked}/run.profile/rank-2")


def test_a_failed_profiled_step_keeps_the_run_alone_and_is_raised_as_a_rank(tmp_path):
    from hwbench.harness.profile import ProfilePlan, profile_or_reason

    def train(step: int) -> None:
        if step == 2:
            raise RuntimeError("out of memory under the profiler\nmore")

    plan = ProfilePlan(out_dir=str(tmp_path), folder="run.profile", steps=1, rank=0)
    figures = profile_or_reason(plan, "cpu", 1, False, train)
    assert figures.step_s is None
    assert figures.why("breakdown") == "a profiled step failed: RuntimeError: out of memory under the profiler"
    with pytest.raises(RuntimeError, match="out of memory"):
        profile_or_reason(plan, "cpu", 1, True, train)


@pytest.mark.heavy  # a whole run, about 5 s on 2 idle cores (13-17 s on this shared machine); the hook test above
def test_a_profiled_run_keeps_its_profiled_steps_out_of_the_timed_figures(tmp_path):
    """One process: the profiled steps come after the timed ones, a gzip'd trace per rank beside the
    result, a breakdown that sums to the step."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--micro-batch-size", "1",
                     "--global-batch-size", "1", "--steps", "2", "--warmup", "1", "--eval-iters", "0",
                     "--profile", "--profile-steps", "1", "--no-preflight", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json")
    result = load_result(path)
    assert [step.step for step in result.steps] == [1, 2, 3] and result.metrics.timed_steps == 2
    profile = result.profile
    assert profile.steps == [5] and profile.profiler_warmup_steps == 1  # step 4: the profiler's warm-up
    assert profile.trace_dir == f"{result.run_id}.profile"
    assert profile.traces == [f"{result.run_id}.profile/rank-0.json.gz"]
    with gzip.open(tmp_path / profile.traces[0], "rt") as file:
        assert any(event.get("name") == "ProfilerStep#1" for event in json.load(file)["traceEvents"])
    (figures,) = profile.ranks
    assert sums_to_step(figures) and figures.matmul_s > 0 and figures.exposed_communication_s == 0
    assert profile.straggler is None and result.spec.profile is True and result.spec.profile_steps == 1
    assert "profile" in out.getvalue() and "rank 0 time" in out.getvalue()
    _hta_reads(tmp_path / profile.trace_dir, [0])


def test_profile_steps_without_profile_is_refused(capsys):
    assert main(["run", "--model", "tiny", "--profile-steps", "3", "--no-preflight"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--profile-steps 3 sets how many steps --profile records, and --profile is not given; "
                            "add --profile, or leave --profile-steps out")
    assert main(["run", "--model", "tiny", "--profile", "--profile-steps", "0", "--no-preflight"]) == 2
    assert "--profile-steps" in capsys.readouterr().err


@pytest.mark.heavy  # two 2-rank runs, 40-80 s on this shared machine; the stored traces above take the path by default
@pytest.mark.parametrize("fault, named", [("1:1:slow", 1), (None, None)])
def test_a_two_rank_ddp_run_names_the_slow_rank_and_only_it(tmp_path, monkeypatch, fault, named):
    if fault:
        monkeypatch.setenv("HWBENCH_FAULT", fault)
    assert main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--steps", "2", "--warmup", "1",
                 "--eval-iters", "0", "--nproc-per-node", "2", "--dp", "2", "--profile", "--no-preflight",
                 "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json")
    profile = load_result(path).profile
    assert [figures.rank for figures in profile.ranks] == [0, 1]
    assert all(sums_to_step(figures) for figures in profile.ranks)
    assert (profile.straggler.rank if profile.straggler else None) == named
    _hta_reads(tmp_path / profile.trace_dir, [0, 1])


@pytest.mark.heavy  # a 2-rank run, 20-40 s here
def test_a_two_rank_tensor_parallel_run_is_profiled(tmp_path):
    """--tp 2: DTensor's collectives run on the training thread (functional all-reduce, wait_tensor)."""
    assert main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--steps", "2", "--warmup", "1",
                 "--eval-iters", "0", "--nproc-per-node", "2", "--tp", "2", "--profile", "--no-preflight",
                 "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json")
    profile = load_result(path).profile
    assert len(profile.ranks) == 2
    for figures in profile.ranks:
        assert sums_to_step(figures) and figures.communication_s > 0 and figures.matmul_s > 0
    _hta_reads(tmp_path / profile.trace_dir, [0, 1])
