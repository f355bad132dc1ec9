"""Host waits for the device inside the timed window (metrics.host_syncs).

The counting itself is torch's sync debug mode on CUDA, which needs a card; here the
backend's use of it (mode set to warn for the window, restored after, torch's warnings
counted with their call sites, every other warning passed on) runs against a stand-in
for the two torch.cuda calls, and the merge and the warning run for real (the CPU's
null with its reason: tests/test_run_e2e.py, the embedded default run)."""

from __future__ import annotations

import warnings

import pytest
import torch

from hwbench.device.base import HostSyncCount, MemoryStats
from hwbench.device.cuda import SYNC_WARNING, CudaBackend
from hwbench.harness.merge import RankReport, merge_host_syncs

NO_MEMORY = MemoryStats(None, None, None, None, None, source="test")  # a rank's memory statistics without figures


class FakeSyncDebug:
    """torch.cuda's get/set_sync_debug_mode, remembering every mode set."""

    def __init__(self) -> None:
        self.mode = 0
        self.history: list = []

    def get(self) -> int:
        return self.mode

    def set(self, mode) -> None:
        self.history.append(mode)
        self.mode = {"default": 0, "warn": 1, "error": 2}.get(mode, mode)


def _synchronising_op(debug: FakeSyncDebug) -> None:
    """What c10's warn_or_error_on_sync does in warn mode, seen from Python."""
    if debug.mode == 1:
        warnings.warn(SYNC_WARNING, UserWarning, stacklevel=2)  # torch names the Python line that called the op


@pytest.fixture
def cuda_backend(monkeypatch):
    debug = FakeSyncDebug()
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", debug.get)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", debug.set)
    return object.__new__(CudaBackend), debug


def test_cuda_counts_each_wait_with_its_call_sites_and_restores_the_mode(cuda_backend):
    backend, debug = cuda_backend
    with backend.counting_host_syncs() as record:
        for _ in range(3):
            _synchronising_op(debug)
        _synchronising_op(debug)
    assert record.count == 4 and record.reason is None
    assert len(record.where) == 2 and all(site.startswith(__file__ + ":") for site in record.where)
    assert debug.history == ["warn", 0] and debug.mode == 0  # warn inside, the earlier mode after
    _synchronising_op(debug)  # outside the window: not counted, nothing warned
    assert record.count == 4


def test_cuda_window_without_waits_counts_zero_and_other_warnings_pass_on(cuda_backend):
    backend, _ = cuda_backend
    with pytest.warns(DeprecationWarning, match="an unrelated warning"):
        with backend.counting_host_syncs() as record:
            warnings.warn("an unrelated warning", DeprecationWarning, stacklevel=1)
    assert record.count == 0 and record.where == []


def test_cuda_mode_is_restored_when_the_window_raises(cuda_backend):
    backend, debug = cuda_backend
    debug.mode = 2  # a user ran with sync debug mode "error" already
    with pytest.raises(RuntimeError, match="boom"):
        with backend.counting_host_syncs():
            raise RuntimeError("boom")
    assert debug.mode == 2


def _report(rank: int, host_syncs):
    return RankReport(rank=rank, step_times_s=[1.0], memory=NO_MEMORY, host_syncs=host_syncs)


def test_merge_keeps_the_rank_that_waited_most():
    merged = merge_host_syncs([_report(0, HostSyncCount(count=0, where=[], reason=None)),
                               _report(1, HostSyncCount(count=3, where=["engine.py:217"], reason=None)),
                               _report(2, HostSyncCount(count=1, where=["x.py:1"], reason=None))])
    assert merged.dump() == {"count": 3, "where": ["engine.py:217"], "rank": 1, "ranks_counted": 3}
    assert merge_host_syncs([_report(0, HostSyncCount(count=None, where=[], reason="cannot count"))]) is None
    assert merge_host_syncs([_report(0, None)]) is None


@pytest.mark.parametrize("eval_interval,validating", [(0, False), (2, True)])
def test_a_waiting_host_is_a_warning_that_names_the_first_site(eval_interval, validating):
    from hwbench.catalog import load_catalog
    from hwbench.harness.merge import merge_ranks
    from hwbench.result.model import RunResult
    from hwbench.spec import build_run_spec, find_workload

    catalog = load_catalog()
    spec = build_run_spec({"model": "tiny", "device": "cpu", "steps": 4, "warmup": 1, "eval_interval": eval_interval,
                           "telemetry": False}, catalog, check_paths=False)
    steps = spec.warmup + spec.steps
    report = RankReport(rank=0, step_times_s=[0.1] * spec.steps, memory=NO_MEMORY, losses=[3.0] * steps,
                        grad_norms=[1.0] * steps, lrs=[1e-4] * steps, loss_scales=[None] * steps,
                        skipped=[False] * steps, wall_time_s=0.4,
                        host_syncs=HostSyncCount(count=4, where=["native.py:217"], reason=None))
    result = RunResult(run_id="r", status="ok", spec={}, device={})
    merge_ranks(result, spec, find_workload(catalog, "tiny"), [report])
    assert result.metrics.host_syncs.count == 4
    [warning] = [w for w in result.warnings if "waited for the device" in w]
    assert "4 times in the timed window (first at native.py:217)" in warning
    assert ("--eval-interval" in warning) == validating
