"""benchmarks/cuda_context_probe.py: what it concludes from NVML's listings (the listings
themselves come from the card; here NVML and torch.cuda answer as the three cases would)."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import cuda_context_probe  # noqa: E402


def fake_modules(monkeypatch, context_on_query: bool, listed_pid: int):
    """torch.cuda and NVML as a card would answer: the context appears at the query or at the allocation."""
    state = {"context": False}

    def query(*_):
        state["context"] = state["context"] or context_on_query

    def allocate(*_, **__):
        state["context"] = True

    cuda = types.SimpleNamespace(is_available=lambda: True, get_device_name=query, get_device_properties=query,
                                 is_bf16_supported=query, set_device=lambda index: None,
                                 synchronize=lambda: None)
    torch = types.SimpleNamespace(cuda=cuda, zeros=allocate)
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetHandleByIndex=lambda index: "gpu0",
        nvmlDeviceGetComputeRunningProcesses=lambda handle: (
            [types.SimpleNamespace(pid=4242)] + ([types.SimpleNamespace(pid=listed_pid)] if state["context"] else [])))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


@pytest.mark.parametrize("context_on_query,container", [(False, False), (True, False), (False, True)])
def test_the_probe_tells_a_context_made_by_the_query_and_a_pid_of_another_namespace(
        tmp_path, monkeypatch, capsys, context_on_query, container):
    fake_modules(monkeypatch, context_on_query, 918273 if container else os.getpid())
    out = tmp_path / "cuda_context.json"
    assert cuda_context_probe.main(["--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["listed"]["before torch"] == [4242]  # another process, there all along: not counted
    assert found["context_after_query"] is context_on_query
    assert found["listed_under_own_pid"] is not container
    assert found["listed_under_another_pid"] == ([918273] if container else [])
    line = capsys.readouterr().out.strip()
    assert line == found["verdict"]
    assert ("CREATE a context" in line) is context_on_query and ("another pid [918273]" in line) is container


def test_no_gpu_is_said_in_the_file_and_a_missing_folder_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(
        is_available=lambda: False)))
    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace())
    out = tmp_path / "cuda_context.json"
    assert cuda_context_probe.main(["--out", str(out)]) == 1
    assert json.loads(out.read_text())["error"] == "torch.cuda.is_available() is False"
    assert cuda_context_probe.main(["--out", str(tmp_path / "no" / "such.json")]) == 2
    assert "its folder does not exist" in capsys.readouterr().err
