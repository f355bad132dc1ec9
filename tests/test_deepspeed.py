"""The DeepSpeed engine's config, the device-layer patches before DeepSpeed is
imported, and one in-process training step against the native engine.
(The multi-process ZeRO parity runs are elsewhere.)"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch

from hwbench.commands.run import parse_run_spec
from hwbench.device import deepspeed_support
from hwbench.device.deepspeed_support import ACCELERATOR_ENV, prepare_deepspeed
from hwbench.engine.deepspeed import deepspeed_config
from hwbench.errors import SetupError

# Tests that import deepspeed; the rest run without it.
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")


def _spec(*extra: str):
    return parse_run_spec(["--model", "tiny", "--engine", "deepspeed", "--steps", "2", "--warmup", "0",
                           "--data", "synthetic", *extra])


def _backend(name: str = "cpu", simulated: bool = False):
    return types.SimpleNamespace(name=name, deepspeed_accelerator=name, simulated=simulated)


@pytest.fixture
def fresh_patches(monkeypatch):
    """prepare_deepspeed as on a first call, with DS_ACCELERATOR unset; both restored after."""
    monkeypatch.setattr(deepspeed_support, "_records", None)
    monkeypatch.setenv(ACCELERATOR_ENV, "placeholder")  # so the undo removes what the call sets
    monkeypatch.delenv(ACCELERATOR_ENV)


# --- deepspeed_config ---------------------------------------------------------


def test_config_fp32_batches_consistent_and_quiet():
    spec = _spec("--global-batch-size", "16", "--micro-batch-size", "2", "--zero", "2")
    config = deepspeed_config(spec, dp_size=2)
    assert config["train_batch_size"] == 16
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert config["gradient_accumulation_steps"] == 4
    assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                          * config["gradient_accumulation_steps"] * 2)
    assert config["zero_optimization"] == {"stage": 2}
    assert config["gradient_clipping"] == spec.optimizer.clip_grad
    assert config["zero_allow_untested_optimizer"] is True
    assert config["wall_clock_breakdown"] is False
    assert config["steps_per_print"] > 10 ** 6
    assert "fp16" not in config and "bf16" not in config


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_config_zero_stage(stage):
    assert deepspeed_config(_spec("--zero", str(stage)), dp_size=1)["zero_optimization"]["stage"] == stage


def test_config_fp16_dynamic():
    spec = _spec("--precision", "fp16")
    fp16 = deepspeed_config(spec, dp_size=1)["fp16"]
    assert fp16["enabled"] is True
    assert fp16["loss_scale"] == 0  # 0 is DeepSpeed's "dynamic"
    assert fp16["initial_scale_power"] == spec.initial_scale_power == 12
    assert (fp16["loss_scale_window"], fp16["hysteresis"], fp16["min_loss_scale"]) == (1000, 2, 1)


def test_config_fp16_fixed_scale():
    spec = dataclasses_replace(_spec("--precision", "fp16"), loss_scale=1024.0)
    assert deepspeed_config(spec, dp_size=1)["fp16"]["loss_scale"] == 1024.0


def test_config_bf16():
    config = deepspeed_config(_spec("--precision", "bf16"), dp_size=1)
    assert config["bf16"] == {"enabled": True}
    assert "fp16" not in config


def dataclasses_replace(spec, **changes):
    import dataclasses

    return dataclasses.replace(spec, **changes)


# --- prepare_deepspeed --------------------------------------------------------


@needs_deepspeed
def test_torch_six_shim_when_torch_lacks_it(monkeypatch, fresh_patches):
    monkeypatch.setitem(sys.modules, "torch._six", None)  # as on PyTorch 2: the import fails
    monkeypatch.setattr(torch, "_six", None, raising=False)
    records = prepare_deepspeed(_backend())
    shim = next(r for r in records if r["patch"] == "torch._six shim")
    assert shim["applied"] is True and "PyTorch 2" in shim["why"]
    from torch._six import container_abcs, inf, int_classes, string_classes

    assert inf == math.inf
    assert string_classes == (str, bytes) and int_classes is int
    assert container_abcs.Mapping is __import__("collections.abc").abc.Mapping


@needs_deepspeed
def test_accelerator_set_for_cpu_and_idempotent(fresh_patches):
    records = prepare_deepspeed(_backend("cpu"))
    assert os.environ[ACCELERATOR_ENV] == "cpu"
    assert records[0] == {"patch": ACCELERATOR_ENV, "applied": True, "value": "cpu",
                          "why": "the cpu backend's DeepSpeed accelerator"}
    assert next(r for r in records if r["patch"] == "import deepspeed")["version"]
    assert prepare_deepspeed(_backend("cuda")) is records  # a second call patches nothing


@needs_deepspeed
def test_deepspeed_builds_no_inference_shm_op(monkeypatch, fresh_patches):
    """DeepSpeed's CPU comm would compile its shared-memory op with gcc (a minute on a cold
    cache) for inference all-reduce, which training never calls: left out, and said so."""
    comm = importlib.import_module("deepspeed.comm.torch")  # `import ... as` gives the torch it imports
    monkeypatch.setattr(comm, "build_shm_op", comm.build_shm_op)  # restored after the test
    records = prepare_deepspeed(_backend("cpu"))
    skipped = next(r for r in records if r["patch"] == "deepspeed.comm.torch.build_shm_op")
    assert skipped["applied"] is True and "inference all-reduce only" in skipped["why"]
    assert comm.build_shm_op() is None


@needs_deepspeed
def test_accelerator_kept_when_user_set_it(monkeypatch, fresh_patches):
    monkeypatch.setenv(ACCELERATOR_ENV, "npu")
    records = prepare_deepspeed(_backend("cpu"))
    assert os.environ[ACCELERATOR_ENV] == "npu"
    assert records[0]["applied"] is False and records[0]["value"] == "npu"


@needs_deepspeed
def test_simulated_npu_runs_deepspeed_on_cpu(monkeypatch, fresh_patches):
    records = prepare_deepspeed(_backend("npu", simulated=True))
    assert os.environ[ACCELERATOR_ENV] == "cpu"
    assert "simulated" in records[0]["why"]
    adaptor = next(r for r in records if r["patch"] == "deepspeed_npu")
    assert adaptor["applied"] is False


@needs_deepspeed
def test_simulated_npu_through_the_standin(standin_npu_env):
    """The real NPU backend over the stand-in torch_npu, in a fresh process:
    DeepSpeed must pick its CPU accelerator, not its NPU one."""
    env = {k: v for k, v in standin_npu_env.items() if k != ACCELERATOR_ENV}
    code = ("import json; from hwbench.device import select_backend; "
            "from hwbench.device.deepspeed_support import prepare_deepspeed; "
            "records = prepare_deepspeed(select_backend('npu')); "
            "from deepspeed.accelerator import get_accelerator; "
            "print(json.dumps({'records': records, 'accelerator': get_accelerator()._name}))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["accelerator"] == "cpu"
    assert report["records"][0]["value"] == "cpu" and "simulated" in report["records"][0]["why"]


def test_setup_error_without_deepspeed(monkeypatch, fresh_patches):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` now fails as if absent
    with pytest.raises(SetupError) as raised:
        prepare_deepspeed(_backend())
    message = str(raised.value)
    assert "\n" not in message
    assert message == ("--engine deepspeed: deepspeed is not installed (pip install 'hwbench[deepspeed]', "
                       "on Ascend too: DeepSpeed >= 0.9.3 has its own NPU accelerator)")
    assert deepspeed_support._records is None  # a later call tries again


# --- one process, ZeRO 2, against the native engine ---------------------------


@needs_deepspeed
def test_zero2_single_process_matches_native(monkeypatch, fresh_patches):
    """Two optimizer steps with gradient accumulation 2; DeepSpeed makes its own
    one-rank process group and close() destroys it. DeepSpeed's model is built as
    build_engine builds it, with --fused-qkv: the fused projection starts from and
    trains like the native engine's separate q, k and v."""
    import torch.distributed as dist
    ds_comm = importlib.import_module("deepspeed.comm.torch")  # `import a.b.torch as x` finds torch itself

    from hwbench.device import select_backend
    from hwbench.engine import build_engine
    from hwbench.engine.distributed import single_process
    from hwbench.engine.native import NativeEngine
    from hwbench.spec import ParallelDims
    from hwbench.workload.data import SyntheticTokens

    # DeepSpeed's CPU comm builds a shared-memory op with gcc (about a minute on a
    # cold cache); it serves inference all-reduce only, so leave it out here.
    monkeypatch.setattr(ds_comm, "build_shm_op", lambda: None)
    assert not dist.is_initialized()
    # AdamW's constants and the warm-up from the run options: both engines train with them
    spec = _spec("--zero", "2", "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "32",
                 "--adam-beta2", "0.95", "--adam-eps", "1e-5", "--lr-warmup-iters", "1")
    backend = select_backend("cpu")
    from hwbench.catalog import load_catalog

    config = load_catalog().workloads["tiny"].model

    def losses(engine) -> list[float]:
        data = SyntheticTokens(config.vocab_size, spec.seq_length, spec.micro_batch_size, spec.global_batch_size,
                               spec.seed)
        try:
            return [engine.train_step(data.train_batch).loss.item() for _ in range(2)]
        finally:
            if hasattr(engine, "close"):
                engine.close()

    native = losses(NativeEngine(config, spec, backend))  # builds the same seed-determined model itself
    engine = build_engine(config, dataclasses_replace(spec, fused_qkv=True), backend, single_process(ParallelDims()))
    assert hasattr(engine.engine.module.blocks["0"].attn, "qkv_proj")
    # ZeRO's optimizer wraps hwbench's AdamW, which DeepSpeed's config leaves to hwbench (no "optimizer" section)
    assert "optimizer" not in engine.config
    adamw = engine.optimizer.optimizer
    assert {(group["betas"], group["eps"]) for group in adamw.param_groups} == {((0.9, 0.95), 1e-5)}
    ds = losses(engine)
    assert not dist.is_initialized()
    assert ds == pytest.approx(native, rel=1e-4)
    described = engine.describe()
    assert described["name"] == "deepspeed" and described["zero_stage"] == 2
    assert described["accelerator"] == "cpu" and described["config"]["gradient_accumulation_steps"] == 2


# Run in a process of its own: DeepSpeed keeps its groups in module globals, so a second engine in
# a process whose first one was closed fails to build (each run is a process of its own too).
SAVE_WITH_FSYNC_RECORDED = r"""
import importlib, json, os, sys, time
from pathlib import Path

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # inference all-reduce only
from hwbench.catalog import load_catalog
from hwbench.commands.run import parse_run_spec
from hwbench.device import select_backend
from hwbench.engine import build_engine
from hwbench.engine.distributed import single_process
from hwbench.spec import ParallelDims

spec = parse_run_spec(["--model", "tiny", "--engine", "deepspeed", "--steps", "2", "--warmup", "0",
                       "--data", "synthetic", "--seq-length", "32"])
engine = build_engine(load_catalog().workloads["tiny"].model, spec, select_backend("cpu"),
                      single_process(ParallelDims()))
synced = {}  # path -> when its fsync returned
real_fsync = os.fsync

def fsync(fd):
    real_fsync(fd)
    synced[os.readlink(f"/proc/self/fd/{fd}")] = time.perf_counter()

folder = Path(sys.argv[1])
folder.mkdir()
os.fsync = fsync
try:
    write = engine.checkpoint_state().save(folder, 0, asynchronous=False)
finally:
    os.fsync = real_fsync
    engine.close()
print(json.dumps({"files": [str(p.resolve()) for p in write.wait(folder)], "folder": str(folder.resolve()),
                  "synced": synced, "finished_at": write.finished_at}))
"""


@needs_deepspeed
def test_a_deepspeed_save_is_finished_only_once_its_files_are_on_the_disk(tmp_path):
    """DeepSpeed's torch.save leaves the files in the page cache: the save's time (and so its GB/s)
    ends only after each file it wrote, and the folder's entries, were flushed to the disk. A
    one-process DeepSpeed engine saves with os.fsync recorded."""
    done = subprocess.run([sys.executable, "-c", SAVE_WITH_FSYNC_RECORDED, str(tmp_path / "iter_0000001")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads(done.stdout.strip().splitlines()[-1])
    assert saved["files"] and any(path.endswith("/mp_rank_00_model_states.pt") for path in saved["files"])
    assert set(saved["files"]) | {saved["folder"]} <= set(saved["synced"])
    assert saved["finished_at"] >= max(saved["synced"].values())
