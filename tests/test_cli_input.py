"""Bad input: one line naming the option, the value and what is accepted;
exit status 2; nothing written."""

import os
import subprocess
import sys

import pytest

from hwbench.cli import main

BAD_RUNS = [
    (["--model", "gpt5"], ["--model", "'gpt5'", "accepted", "345m"]),
    (["--device", "tpu"], ["--device", "'tpu'", "cuda"]),
    (["--precision", "fp8"], ["--precision", "'fp8'", "bf16"]),
    (["--model", "tiny", "--micro-batch-size", "4", "--global-batch-size", "10"],
     ["--global-batch-size 10", "--micro-batch-size 4", "accepted: 4, 8"]),
    (["--model", "tiny", "--seq-length", "4096"], ["--seq-length 4096", "128 positions", "1 to 128"]),
    (["--steps", "0"], ["--steps 0", ">= 1"]),
    (["--micro-batch-size", "0"], ["--micro-batch-size 0", ">= 1"]),
    (["--global-batch-size", "-8"], ["--global-batch-size -8", ">= 1"]),
    (["--warmup", "-1"], ["--warmup -1", ">= 0"]),
    (["--steps", "ten"], ["--steps", "'ten'"]),
    (["--telemetry-interval", "0"], ["--telemetry-interval 0", "0.01 to 60"]),
]


@pytest.mark.parametrize("args,expected", BAD_RUNS, ids=[" ".join(a) for a, _ in BAD_RUNS])
def test_bad_run_option_is_one_line_exit_2_and_writes_nothing(args, expected, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--quiet", "--out", str(out), *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    for fragment in expected:
        assert fragment in lines[0]
    assert captured.out == ""
    assert not out.exists()


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "results.json"
    target.write_text("keep me")
    assert main(["run", "--quiet", "--model", "tiny", "--out", str(target)]) == 2
    line = capsys.readouterr().err.strip()
    assert "--out" in line and "is a file" in line and "directory" in line
    assert target.read_text() == "keep me"


def test_out_under_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "plain"
    target.write_text("")
    assert main(["run", "--quiet", "--model", "tiny", "--out", str(target / "runs")]) == 2
    assert "lies under the file" in capsys.readouterr().err


def test_cuda_without_a_gpu_says_what_is_missing(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "hwbench", "run", "--device", "cuda", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda" in lines[0], done.stderr
    assert "CUDA" in lines[0]
    assert not out.exists()


def test_broken_catalog_file_is_named(tmp_path, capsys, monkeypatch):
    devices = tmp_path / "devices"
    devices.mkdir()
    (devices / "mychip.yaml").write_text(
        "name: mychip\nvendor: me\nbackend: cuda\ntitle: Mine\nmatch: ['Mine']\n"
        "peak_flops: {bf16: fast}\n"
    )
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    assert main(["models"]) == 2
    line = capsys.readouterr().err.strip()
    assert "mychip.yaml" in line and "peak_flops.bf16" in line and "'fast'" in line


def test_models_lists_every_size_with_counts(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    for name, count in [("345m", "354.9M"), ("1.3b", "1,313.7M"), ("3.7b", "3,786.0M"), ("tiny", "6.9M")]:
        row = next(line for line in text.splitlines() if line.startswith(name + " "))
        assert count in row, row


def test_devices_lists_the_catalog_and_this_machine(capsys):
    assert main(["devices"]) == 0
    text = capsys.readouterr().out
    assert "h100-sxm" in text and "989" in text and "ascend-910" in text
    assert "--device auto uses" in text
