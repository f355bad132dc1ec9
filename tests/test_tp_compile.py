"""Tensor parallelism with compiled blocks on the Llama architecture: with rotary positions the
vocab-parallel embedding's output (an AsyncCollectiveTensor, the all-reduce not yet waited on)
went straight into the first compiled block, whose backward then failed in DTensor's
redistribute ('Tensor' object has no attribute '_local_tensor'). Two real torchrun ranks (gloo)
of tests/tp_compile_ranks.py, compiled against eager from the same weights."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


def _ranks(tmp_path, backend: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           str(REPO_ROOT / "tests" / "tp_compile_ranks.py"), str(tmp_path), backend],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _assert_compiled_matches_eager(ranks: list[dict], tolerance: float) -> None:
    for rank, report in enumerate(ranks):
        assert "error" not in report, f"rank {rank}: {report['error']}"
        assert report["first_block_input"] == "Tensor", f"rank {rank}: {report['first_block_input']}"
        eager, compiled = report["loss"]
        assert abs(compiled - eager) <= tolerance * abs(eager), f"rank {rank}: loss {compiled} vs eager {eager}"
        assert report["max_gradient_difference"] <= tolerance, f"rank {rank}: {report['max_gradient_difference']}"


def test_a_compiled_tensor_parallel_llama_block_trains_as_the_eager_one(tmp_path):
    """aot_eager: AOTAutograd's forward and backward graphs, where the failure was, without
    inductor's code generation (seconds of C++ compilation on the CPU); the same ops as eager."""
    _assert_compiled_matches_eager(_ranks(tmp_path, "aot_eager"), tolerance=1e-6)


@pytest.mark.heavy
def test_an_inductor_compiled_tensor_parallel_llama_block_trains_as_the_eager_one(tmp_path):
    """inductor, what --compile uses: its fused kernels reorder fp32 sums, so within 1e-4."""
    _assert_compiled_matches_eager(_ranks(tmp_path, "inductor"), tolerance=1e-4)
