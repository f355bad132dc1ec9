"""Shared pytest fixtures for hwbench's tests."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FAKES = REPO_ROOT / "tests" / "fakes"


_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                     "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def no_launch_environment_leaks():
    """A test that leaves torchrun's or Slurm's variables in os.environ makes every later
    `hwbench run` in the session a rank of a job that does not exist (it waits two minutes
    for a rendezvous, then fails): name the test that leaked them, and undo the leak."""
    def launch_environment() -> dict[str, str]:
        return {key: value for key, value in os.environ.items()
                if key in _LAUNCH_VARIABLES or key.startswith("SLURM_")}

    before = launch_environment()
    yield
    leaked = launch_environment()
    if leaked != before:
        for key in leaked.keys() - before.keys():
            del os.environ[key]
        os.environ.update(before)
        pytest.fail(
            f"the test left launch variables changed in os.environ: {sorted(set(leaked.items()) ^ set(before.items()))}"
        )


# --- Stand-in Ascend NPU (tests/fakes: torch_npu module and npu-smi) ---------


@pytest.fixture
def repo_root() -> Path:
    """The hwbench checkout (the folder holding pyproject.toml)."""
    return REPO_ROOT


@pytest.fixture
def standin_npu_env() -> dict[str, str]:
    """Environment for a subprocess that should see the stand-in NPU: a copy of
    os.environ with tests/fakes first on PYTHONPATH (``import torch_npu`` finds
    the stand-in) and tests/fakes/bin first on PATH (the stand-in ``npu-smi``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKES), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join(filter(None, [str(FAKES / "bin"), env.get("PATH")]))
    return env


def stand_in_gave(section: dict, figure: str) -> Any:
    """What the stand-in answered for ``figure``: a simulated run records the figure as null with
    that value in its reason (hwbench/harness/stand_in.py), which this reads back."""
    assert section[figure] is None, (figure, section[figure])
    reason = section["unmeasured"][figure]
    found = re.fullmatch(r"the device is simulated: the stand-in gave (.+), a test value, not a reading of a device",
                         reason)
    assert found, reason
    return ast.literal_eval(found.group(1))


def without_preflight(stderr: str) -> str:
    """``stderr`` of a `hwbench run`/`sweep` without the preflight lines it prints first: those
    depend on the machine's state (a busy CI runner gets a load-average warning) and are
    tested in tests/test_preflight.py, not by tests of what a run says when it stops."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("hwbench: preflight"))


def sigint_as_usual() -> None:
    """preexec_fn for a child that a test interrupts with SIGINT: a test run
    started in the background (CI wrappers, `cmd &`) ignores SIGINT, and a child
    inherits that; Python then never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def process_gone(pid: int) -> bool:
    """No live process has ``pid``: it is gone, or a zombie its parent has yet to reap."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def kill_tree(pid: int) -> None:
    """End a child a failed test left running, with every process under it."""
    from hwbench.harness.launcher import kill_tree as kill

    kill([pid])


# --- Reference runs shared by the parity tests --------------------------------
#
# tests/test_parallel.py and tests/test_deepspeed_pipeline.py compare every layout
# with the same two reference runs of the same small job: one process, and the
# native engine's TP2 on 2 ranks (which pads the vocabulary as every TP2 layout
# does). Each is run once per test session, not once per module.

PARITY_BASE = [
    "--quiet",
    "--model",
    "tiny",
    "--data",
    "synthetic",
    "--seq-length",
    "32",
    "--steps",
    "2",
    "--warmup",
    "1",
    "--eval-iters",
    "1",
    "--no-telemetry",
]


def parity_run(out: Path, *options: str) -> tuple[int, dict]:
    """`hwbench run PARITY_BASE OPTIONS --out OUT` in this process: its exit status and
    its one result."""
    import json

    from hwbench.cli import main

    code = main(["run", *PARITY_BASE, *options, "--out", str(out)])
    files = list(out.glob("*.json"))
    assert len(files) == 1, f"expected one result in {out}, found {files}"
    return code, json.loads(files[0].read_text())


@pytest.fixture(scope="session")
def single_process_run(tmp_path_factory) -> dict:
    """PARITY_BASE on one process."""
    code, result = parity_run(tmp_path_factory.mktemp("single") / "run")
    assert code == 0 and result["status"] == "ok", result.get("error")
    return result


@pytest.fixture(scope="session")
def native_tp2_run(tmp_path_factory) -> dict:
    """PARITY_BASE on 2 ranks, native engine, --tp 2."""
    code, result = parity_run(tmp_path_factory.mktemp("native-tp2") / "run", "--nproc-per-node", "2", "--tp", "2")
    assert code == 0 and result["status"] == "ok", result.get("error")
    return result


# The Llama architecture in the same job: `llama-tiny` (the catalog's, tied output layer as Llama
# 3.2), and LLAMA_UNTIED, the same with an output layer of its own (as Llama 3.1 8B and 70B), a
# workload of a test catalog folder (HWBENCH_CATALOG_PATH, set while a test that names it runs).
# Their vocabulary (128256) needs no padding at TP2, so every Llama layout follows its one process
# to reduction order.
LLAMA = "llama-tiny"
LLAMA_UNTIED = "llama-tiny-untied"
REFERENCE_RUNS = {"tiny": "single_process_run", LLAMA: "llama_single_process_run",
                  LLAMA_UNTIED: "llama_untied_single_process_run"}


@pytest.fixture(scope="session")
def llama_untied_catalog(tmp_path_factory) -> Path:
    """A catalog folder holding LLAMA_UNTIED: llama-tiny's file with its output layer untied."""
    from hwbench.catalog import load_catalog

    folder = tmp_path_factory.mktemp("llama-untied-catalog")
    (folder / "workloads").mkdir()
    text = Path(load_catalog().workloads[LLAMA].path).read_text()
    tied, untied = "untie_embeddings_and_output_weights: false", "untie_embeddings_and_output_weights: true"
    assert f"name: {LLAMA}\n" in text and tied in text
    (folder / "workloads" / f"{LLAMA_UNTIED}.yaml").write_text(
        text.replace(f"name: {LLAMA}\n", f"name: {LLAMA_UNTIED}\n").replace(tied, untied))
    return folder


@pytest.fixture
def llama_untied(monkeypatch, llama_untied_catalog) -> str:
    """LLAMA_UNTIED in the catalog for this test (and the ranks it starts)."""
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(llama_untied_catalog))
    return LLAMA_UNTIED


@pytest.fixture(scope="session")
def llama_single_process_run(tmp_path_factory) -> dict:
    """PARITY_BASE with --model llama-tiny on one process."""
    code, result = parity_run(tmp_path_factory.mktemp("llama-single") / "run", "--model", LLAMA)
    assert code == 0 and result["status"] == "ok", result.get("error")
    return result


@pytest.fixture(scope="session")
def llama_untied_single_process_run(tmp_path_factory, llama_untied_catalog) -> dict:
    """PARITY_BASE with --model LLAMA_UNTIED on one process."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HWBENCH_CATALOG_PATH", str(llama_untied_catalog))
        code, result = parity_run(tmp_path_factory.mktemp("llama-untied-single") / "run", "--model", LLAMA_UNTIED)
    assert code == 0 and result["status"] == "ok", result.get("error")
    return result


def reference_run(request: pytest.FixtureRequest, model: str) -> dict:
    """The single-process run of ``model`` (one of REFERENCE_RUNS); for LLAMA_UNTIED, its catalog
    folder is set for the rest of the test too."""
    if model == LLAMA_UNTIED:
        request.getfixturevalue("llama_untied")
    return request.getfixturevalue(REFERENCE_RUNS[model])


# --- One sweep of three repeats, shared ---------------------------------------
#
# tests/test_sweep.py reads the statistics of a point's repeats and tests/test_workflows.py lays
# out nights from real repeats of one point: one sweep, once per session, serves both.

THREE_REPEATS_SUITE = {"name": "gate",
                       "defaults": {"model": "tiny", "data": "synthetic", "seq-length": 32, "steps": 2, "warmup": 1,
                                    "eval-iters": 0, "telemetry": False, "timeout": 300},
                       "points": [{"name": "one-rank", "seed": 7}]}


@pytest.fixture(scope="session")
def three_repeats(tmp_path_factory) -> dict[str, Path]:
    """`hwbench sweep SUITE --device cpu --repeats 3` of THREE_REPEATS_SUITE: the suite file and the
    point's folder (its three results and aggregate.json)."""
    import yaml

    from hwbench.cli import main

    root = tmp_path_factory.mktemp("three-repeats")
    suite = root / "gate.yaml"
    suite.write_text(yaml.safe_dump(THREE_REPEATS_SUITE, sort_keys=False))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["sweep", str(suite), "--device", "cpu", "--repeats", "3", "--quiet", "--no-preflight", "--out",
                     str(root / "out")])
    assert code == 0
    (root / "summary.txt").write_text(printed.getvalue())
    return {"suite": suite, "point": root / "out" / "gate" / "one-rank", "summary": root / "summary.txt"}


# --- One run through the CUDA stand-in, shared ----------------------------------

STANDIN_RUN = ["run", "--model", "tiny", "--seq-length", "32", "--steps", "2", "--warmup", "1", "--eval-iters", "0",
               "--telemetry-interval", "0.1"]


def standin_path(folder: str) -> str:
    """The stand-in first on PYTHONPATH, the caller's after it (as standin_npu_env), so the
    subprocess imports the hwbench under test."""
    return os.pathsep.join(filter(None, [str(FAKES / folder), str(FAKES / "common"), os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session")
def cuda_standin_result(tmp_path_factory) -> Path:
    """The result file of `hwbench STANDIN_RUN --device cuda` through tests/fakes/cuda, run once per
    session: tests/test_vendor_standins.py checks it whole, tests/test_export.py exports it."""
    out = tmp_path_factory.mktemp("cuda-standin") / "out"
    done = subprocess.run([sys.executable, "-m", "hwbench", *STANDIN_RUN, "--device", "cuda", "--out", str(out)],
                          env={**os.environ, "PYTHONPATH": standin_path("cuda"), "HWBENCH_STANDIN_CUDA": "1"},
                          cwd=out.parent, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("*.json")
    return path


# --- One run to a target quality, shared ---------------------------------------
#
# tests/test_target.py checks its time-to-target figures and what it printed, uses it as the reference
# of a run that reaches the target in fewer samples, and tests/test_export.py exports it as MLPerf's
# log: the same run (tiny, floor*1000 reached at the validation of step 20), once per session.

TARGET_TINY = ["--quiet", "--model", "tiny", "--seq-length", "32", "--eval-iters", "2", "--no-telemetry"]
TARGET_RUN = ["run", *TARGET_TINY, "--steps", "30", "--warmup", "0", "--target-ppl", "floor*1000"]


@pytest.fixture(scope="session")
def target_run(tmp_path_factory) -> dict[str, Any]:
    """`hwbench TARGET_RUN` in this process, once: its result file ("path") and what it printed
    ("out")."""
    import contextlib
    import io

    from hwbench.cli import main

    out = tmp_path_factory.mktemp("target") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([*TARGET_RUN, "--out", str(out)])
    assert code == 0, printed.getvalue()[-3000:]
    (path,) = out.glob("*.json")
    return {"path": path, "out": printed.getvalue()}


# --- One mixture-of-experts run, shared ----------------------------------------
#
# tests/test_moe_layer.py checks its routing figures step by step and tests/test_docs.py that every
# field of its result is documented: the same run of moe-tiny (2 micro-batches a step), once per session.

MOE_TINY_RUN = ["run", "--quiet", "--model", "moe-tiny", "--device", "cpu", "--steps", "2", "--warmup", "1",
                "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--eval-iters", "1"]


@pytest.fixture(scope="session")
def moe_tiny_run(tmp_path_factory) -> Path:
    """The result file of `hwbench MOE_TINY_RUN` in this process, run once (read it; copy it to change it)."""
    return _shared_run(tmp_path_factory, "moe-tiny", MOE_TINY_RUN)


# --- Two identical seeded runs, shared ------------------------------------------
#
# tests/test_parity.py compares them (and copies of them, changed) and tests/test_docs.py checks that every
# field of a plain run's result is documented: the same two runs of the tiny model on the built-in corpus.

SEEDED_TINY_RUN = ["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--steps", "6", "--warmup", "1",
                   "--eval-iters", "1"]


@pytest.fixture(scope="session")
def seeded_tiny_runs(tmp_path_factory) -> list[Path]:
    """The result files of `hwbench SEEDED_TINY_RUN` run twice in this process, the same seed each time
    (read them; copy one to change it)."""
    from hwbench.cli import main

    paths = []
    for name in ("a", "b"):
        out = tmp_path_factory.mktemp(f"seeded-{name}") / "run"
        assert main([*SEEDED_TINY_RUN, "--out", str(out)]) == 0
        (path,) = out.glob("*.json")
        paths.append(path)
    return paths


# --- Runs of the other precisions, shared ----------------------------------------
#
# tests/test_docs.py checks that every field of an fp16 and an fp8 result is documented; tests/test_run_e2e.py
# reads the fp16 run's loss scales and tests/test_fp8.py the emulated fp8 run's marks: the same runs, once.

# a small batch: fp16 on a CPU without fp16 units is emulated, about 10x slower than fp32
FP16_TINY_RUN = ["run", "--quiet", "--model", "tiny", "--precision", "fp16", "--steps", "3", "--warmup", "1",
                 "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "2", "--eval-iters", "0"]
# GPT's tiny: the cheapest model to convert (tests/test_fp8.py runs llama-tiny's in its heavy parity test)
FP8_TINY_RUN = ["run", "--quiet", "--no-preflight", "--no-telemetry", "--model", "tiny", "--seq-length", "32",
                "--steps", "2", "--warmup", "0", "--eval-iters", "0", "--precision", "fp8"]


def _shared_run(tmp_path_factory, name: str, argv: list[str]) -> Path:
    from hwbench.cli import main

    out = tmp_path_factory.mktemp(name) / "run"
    assert main([*argv, "--out", str(out)]) == 0
    (path,) = out.glob("*.json")
    return path


@pytest.fixture(scope="session")
def fp16_tiny_run(tmp_path_factory) -> Path:
    """The result file of `hwbench FP16_TINY_RUN` in this process, run once (read it; copy it to change it)."""
    return _shared_run(tmp_path_factory, "fp16-tiny", FP16_TINY_RUN)


@pytest.fixture(scope="session")
def fp8_tiny_run(tmp_path_factory) -> Path:
    """The result file of `hwbench FP8_TINY_RUN` (FP8 emulated on the CPU) in this process, run once."""
    return _shared_run(tmp_path_factory, "fp8-tiny", FP8_TINY_RUN)
