"""Bad input: one line naming the option, the value and what is accepted;
exit status 2; nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest

from hwbench.cli import main

BAD_RUNS = [
    (["--model", "gpt5"], ["--model", "'gpt5'", "accepted", "345m"]),
    (["--device", "tpu"], ["--device", "'tpu'", "cuda"]),
    (["--precision", "fp4"], ["--precision", "'fp4'", "fp8"]),
    (["--model", "tiny", "--micro-batch-size", "4", "--global-batch-size", "10"],
     ["--global-batch-size 10", "--micro-batch-size 4", "accepted: 4, 8"]),
    (["--model", "tiny", "--seq-length", "4096"], ["--seq-length 4096", "128 positions", "1 to 128",
                                                    "--max-positions 4096"]),
    (["--model", "tiny", "--seq-length", "128", "--max-positions", "64"],
     ["--max-positions 64", "from --seq-length 128 to 1048576"]),
    (["--max-positions", "long"], ["--max-positions", "'long'"]),
    (["--steps", "0"], ["--steps 0", "from 1 to 1000000"]),
    (["--steps", str(10**20)], ["--steps 100000000000000000000", "from 1 to 1000000"]),
    (["--seed", "99999999999999999999999"], ["--seed 99999999999999999999999", "from 0 to 4294967295"]),
    (["--seed", "-1"], ["--seed -1", "from 0 to 4294967295"]),
    (["--timeout", "inf"], ["--timeout inf", "> 0"]),
    (["--timeout", "nan"], ["--timeout nan", "> 0"]),
    (["--micro-batch-size", "0"], ["--micro-batch-size 0", "from 1 to 10000000"]),
    (["--global-batch-size", "-8"], ["--global-batch-size -8", "from 1 to 10000000"]),
    (["--warmup", "-1"], ["--warmup -1", "from 0 to"]),
    (["--steps", "ten"], ["--steps", "'ten'"]),
    (["--telemetry-interval", "0"], ["--telemetry-interval 0", "0.01 to 60"]),
    # parallel layouts: checked before any process starts
    (["--model", "tiny", "--tp", "2"], ["--tp 2", "world size 1", "--nproc-per-node 1"]),
    (["--model", "tiny", "--nproc-per-node", "4", "--tp", "3"], ["--tp 3", "4 attention heads", "accepted: 1, 2, 4"]),
    (["--model", "tiny", "--nproc-per-node", "4", "--pp", "4"], ["--pp 4", "2 layers", "1 to 2"]),
    (["--model", "tiny", "--nproc-per-node", "4", "--tp", "2", "--dp", "3"], ["--dp 3", "= 6", "world size 4"]),
    (["--model", "tiny", "--nproc-per-node", "2", "--global-batch-size", "4", "--micro-batch-size", "4"],
     ["--global-batch-size 4", "--micro-batch-size 4", "data parallel 2"]),
    (["--model", "tiny", "--zero", "2"], ["--zero 2", "--engine deepspeed"]),
    (["--model", "tiny", "--zero", "5", "--engine", "deepspeed"], ["--zero 5", "0, 1, 2, 3"]),
    (["--model", "tiny", "--fsdp", "--engine", "deepspeed"], ["--fsdp", "--zero 3"]),
    (["--model", "tiny", "--nproc-per-node", "2", "--pp", "2", "--engine", "deepspeed", "--zero", "2"],
     ["--zero 2", "--pp 2", "ZeRO 0 or 1"]),
    (["--model", "tiny", "--nproc-per-node", "2", "--pp", "2", "--pp-schedule", "1f1b", "--micro-batch-size", "8"],
     ["--pp-schedule 1f1b", "--pp 2", "gives 1", "gpipe"]),
    (["--model", "tiny", "--engine", "megatron"], ["--engine", "'megatron'", "native"]),
    # --settings fast and the model options it turns on
    (["--model", "tiny", "--settings", "quick"], ["--settings", "'quick'", "published", "fast"]),
    (["--model", "tiny", "--device-memory", "8GiB"], ["--device-memory 8GiB", "give --settings fast with it"]),
    (["--model", "tiny", "--settings", "fast", "--device-memory", "lots"], ["--device-memory 'lots'", "24GiB"]),
    (["--model", "tiny", "--cross-entropy", "fused"], ["--cross-entropy", "'fused'", "chunked"]),
    (["--model", "tiny", "--nproc-per-node", "2", "--tp", "2", "--cross-entropy", "chunked"],
     ["--cross-entropy chunked with --tp 2", "accepted: --cross-entropy standard, or --tp 1"]),
    (["--model", "tiny", "--engine", "deepspeed", "--cross-entropy", "chunked"],
     ["--cross-entropy chunked", "--engine deepspeed", "--engine native"]),
    (["--model", "tiny", "--nproc-per-node", "4", "--pp", "2", "--fsdp", "--cross-entropy", "chunked"],
     ["--cross-entropy chunked with --fsdp and --pp 2", "--fsdp without --pp"]),
    (["--model", "tiny", "--nproc-per-node", "2", "--tp", "2", "--engine", "deepspeed", "--fused-qkv"],
     ["--fused-qkv with --engine deepspeed --tp 2 --pp 1", "--no-fused-qkv"]),
    # the Llama architecture: no position table to lengthen; tensor parallelism splits whole key/value
    # heads (llama-tiny: 4 query heads, so --tp 4 divides them, over 2 key/value heads)
    (["--model", "llama-tiny", "--max-positions", "4096"],
     ["--max-positions 4096 with --model llama-tiny", "rotary", "leave it out"]),
    (["--model", "llama-tiny", "--seq-length", "200000"], ["--seq-length 200000", "accepted: 1 to 131072"]),
    (["--model", "llama-tiny", "--nproc-per-node", "4", "--tp", "4"],
     ["--tp 4 does not divide the 2 key/value heads (num_query_groups) of --model llama-tiny", "accepted: 1, 2"]),
    (["--model", "llama-tiny", "--nproc-per-node", "4", "--tp", "4", "--engine", "deepspeed"],
     ["--tp 4 does not divide the 2 key/value heads", "accepted: 1, 2"]),
    (["--nnodes", "2", "--node-rank", "2"], ["--node-rank 2", "--nnodes 2", "0 to 1"]),
    (["--nproc-per-node", "0"], ["--nproc-per-node 0", "from 1 to 1024"]),
    (["--threads-per-rank", "0"], ["--threads-per-rank 0", "from 1 to 4096"]),
    (["--master-port", "70000"], ["--master-port 70000", "1 to 65535"]),
    (["--rdzv-endpoint", "nohost"], ["--rdzv-endpoint 'nohost'", "HOST:PORT"]),
    (["--timeout", "0"], ["--timeout 0", "> 0"]),
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


def test_a_value_that_starts_with_a_dash_is_answered_with_how_to_give_it(tmp_path, capsys):
    # argparse reads "--outlier -5%" as an option with no value; the line says how to give one.
    assert main(["accept", "--outlier", "-5%", "--suite", "s.yaml", "--baseline", "b.json",
                 "--out", str(tmp_path / "out")]) == 2
    line = capsys.readouterr().err.strip()
    assert "--outlier" in line and "--outlier=VALUE" in line and "\n" not in line
    assert main(["accept", "--outlier=-5%", "--suite", "s.yaml", "--baseline", "b.json",
                 "--out", str(tmp_path / "out")]) == 2
    assert "--outlier '-5%': must be 0 or more" in capsys.readouterr().err
    assert main(["run", "--steps"]) == 2
    assert "--steps=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


MISTYPED = [
    (["run", "--threads", "2"], "hwbench run: unrecognized arguments: --threads 2 (did you mean --threads-per-rank?)"),
    (["run", "--micro-batch=4"], "--micro-batch=4 (did you mean --micro-batch-size?)"),
    (["run", "--threads", "2", "--micro-batch", "4"],
     "(did you mean --threads-per-rank for --threads, --micro-batch-size for --micro-batch?)"),
    (["run", "--mdoel", "tiny"], "(did you mean --model?)"),
    (["run", "--no-telemtry"], "(did you mean --no-telemetry?)"),
    (["run", "--batch-size", "8"], "(did you mean --micro-batch-size or --global-batch-size?)"),
    (["compare", "a", "b", "--thresold", "3"], "hwbench compare: unrecognized arguments: --thresold 3 "
                                               "(did you mean --threshold?)"),
    # the outer command's own options are suggested, in its name, not only the run options it passes on
    (["slurm", "--device", "cpu", "--partiton", "gpu"], "hwbench slurm: unrecognized arguments: --partiton gpu "
                                                        "(did you mean --partition?)"),
    (["k8s", "--nnodes", "1", "--nproc-per-node", "1", "--image", "i", "--imag", "j"],
     "hwbench k8s: unrecognized arguments: --imag j (did you mean --image?)"),
    # argparse names a missing required option before any unknown one: the mistyped one is answered there too
    (["tune", "--model", "tiny", "--devics", "2"], "hwbench tune: the following arguments are required: --devices "
                                                   "(did you mean --devices or --device?)"),
    (["k8s", "--nnodes", "1", "--model", "tiny", "--nproc-per-nod", "2"],
     "the following arguments are required: --nproc-per-node (did you mean --nproc-per-node?)"),
]


@pytest.mark.parametrize("argv, expected", MISTYPED, ids=[" ".join(a) for a, _ in MISTYPED])
def test_a_mistyped_option_is_answered_with_the_nearest_ones(argv, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert expected in captured.err and captured.err.startswith("hwbench: error: ") and captured.err.count("\n") == 1
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_no_option_is_suggested_where_none_is_near_or_after_a_double_dash(capsys):
    for argv in (["run", "--xyzzy"], ["run", "--steps", "3", "--", "--stpes"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "unrecognized arguments" in err and "did you mean" not in err


def test_a_mistyped_option_of_a_real_process_is_one_line_with_the_suggestion(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hwbench", "run", "--threads", "2", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("hwbench: error: hwbench run: unrecognized arguments: --threads 2 "
                           "(did you mean --threads-per-rank?)\n")
    assert not (tmp_path / "o").exists()


def test_the_abbreviations_argparse_takes_still_work(capsys):
    """The top parser takes a shortened --version; the commands take no abbreviation (a
    shortened option is answered with the ones it begins)."""
    with pytest.raises(SystemExit) as stopped:
        main(["--vers"])
    assert stopped.value.code == 0 and capsys.readouterr().out.startswith("hwbench ")
    assert main(["run", "--nproc", "2"]) == 2
    assert "(did you mean --nproc-per-node?)" in capsys.readouterr().err


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


def test_cuda_without_a_gpu_says_what_is_missing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "out"
    assert main(["run", "--device", "cuda", "--out", str(out)]) == 2
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda" in lines[0], stderr
    assert "CUDA" in lines[0]
    assert not out.exists()


def test_broken_catalog_file_is_named(tmp_path, capsys, monkeypatch):
    devices = tmp_path / "devices"
    devices.mkdir()
    (devices / "mychip.yaml").write_text(
        "name: mychip\nvendor: me\nbackend: cuda\ntitle: Mine\nmatch: ['Mine']\n"
        "peak_flops: {bf16: fast, fp16: {dense: null, unavailable: x}, fp32: {dense: null, unavailable: x}}\n"
    )
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    assert main(["models"]) == 2
    line = capsys.readouterr().err.strip()
    assert "mychip.yaml" in line and "peak_flops.bf16" in line and "'fast'" in line


@pytest.mark.parametrize("text, field", [
    # a mistyped peak would otherwise read as "no peak" and make every MFU null
    ("peak_flops: {bf16: {dense: null, unavailable: x}, fp16: {dense: null, unavailable: x}, "
     "fp32: {dense: null, unavailable: x}, fp61: 2.0e15}\n", "peak_flops.fp61"),
    ("peak_flops: {bf16: {dense: null, unavailable: x}, fp16: {dense: null, unavailable: x}, "
     "fp32: {dense: null, unavailable: x}}\nprice_per_hour: 2.5\n", "price_per_hour"),
])
def test_an_unknown_catalog_field_is_named_with_the_known_ones(tmp_path, capsys, monkeypatch, text, field):
    devices = tmp_path / "devices"
    devices.mkdir()
    (devices / "mychip.yaml").write_text("name: mychip\nvendor: me\nbackend: cuda\ntitle: Mine\nmatch: ['Mine']\n"
                                         + text)
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    assert main(["devices"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "mychip.yaml" in lines[0]
    assert f"field {field}: is not a field here; the fields here are:" in lines[0]
    assert ("bf16" if "." in field else "price_usd_per_hour") in lines[0]  # what would be accepted


def test_tensor_parallelism_of_per_head_query_key_norms_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """A dense model with --qk-layernorm (Qwen3's q_norm, k_norm): PP2 is accepted, TP2 is refused
    before anything runs (each rank would hold only its heads' part of the norms' gradient)."""
    from hwbench.catalog import load_catalog
    from hwbench.commands.run import parse_run_spec

    workloads = tmp_path / "workloads"
    workloads.mkdir()
    text = Path(load_catalog().workloads["llama-tiny"].path).read_text()
    assert "name: llama-tiny\n" in text and "  swiglu: true\n" in text
    (workloads / "qk-tiny.yaml").write_text(text.replace("name: llama-tiny\n", "name: qk-tiny\n").replace(
        "  swiglu: true\n", "  swiglu: true\n  qk_layernorm: true\n"))
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    assert parse_run_spec(["--model", "qk-tiny", "--nproc-per-node", "2", "--pp", "2"]).parallel.pp == 2
    out = tmp_path / "out"
    assert main(["run", "--quiet", "--model", "qk-tiny", "--nproc-per-node", "2", "--tp", "2", "--out",
                 str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--tp 2 with --model qk-tiny" in lines[0] and "qk_layernorm" in lines[0]
    assert "accepted: --tp 1" in lines[0] and not out.exists()


def test_a_closed_pipe_ends_the_output_quietly():
    """`hwbench models | head -1`: no BrokenPipeError traceback, the SIGPIPE exit status."""
    child = subprocess.Popen([sys.executable, "-m", "hwbench", "models"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    child.stdout.close()  # the reader leaves before the first line
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 141 and b"Traceback" not in stderr, stderr


def test_models_lists_every_size_with_counts(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    for name, count in [("345m", "354,871,296"), ("1.3b", "1,313,722,368"), ("3.7b", "3,785,988,096"),
                        ("tiny", "6,852,096"), ("llama3.2-1b", "1,235,814,400"), ("llama3.1-8b", "8,030,261,248")]:
        row = next(line for line in text.splitlines() if line.startswith(name + " "))
        assert count in row, row
    llama = next(line for line in text.splitlines() if line.startswith("llama3.1-70b ")).split()
    assert llama[1] == "Llama" and llama[9] == "8" and llama[10] == "128,256"  # architecture, kv heads, vocabulary
    assert llama[3] == "-" and llama[5] == "-"  # dense: no active count or experts apart
    mixtral = next(line for line in text.splitlines() if line.startswith("mixtral-8x7b ")).split()
    assert mixtral[2:7] == ["46,702,792,704", "12,879,925,248", "46,571,720,704", "8", "top-2"]
    assert next(line for line in text.splitlines() if line.startswith("345m ")).split()[1] == "GPT-2"
    assert "Llama 3's 128,256" in text  # the footer names each vocabulary


def test_devices_lists_the_catalog_and_this_machine(capsys):
    assert main(["devices"]) == 0
    text = capsys.readouterr().out
    assert "h100-sxm" in text and "989" in text and "ascend-910" in text
    assert "--device auto uses" in text


def _spec(*args):
    from hwbench.commands.run import parse_run_spec

    return parse_run_spec(list(args))


def test_the_published_layout_applies_when_the_device_count_allows():
    spec = _spec("--model", "345m", "--nproc-per-node", "8")  # published: TP1 PP2, 8 devices
    assert (spec.parallel.tp, spec.parallel.pp, spec.parallel.dp, spec.parallel.source) == (1, 2, 4, "published")
    # 4 devices: TP1 PP2 still fits; microbatches 16 / (4 x 2) = 2 >= 2 stages, so 1F1B
    spec = _spec("--model", "345m", "--nproc-per-node", "4")
    assert (spec.parallel.pp, spec.parallel.dp, spec.pp_schedule) == (2, 2, "1f1b")
    # 8 devices: 16 / (4 x 4) = 1 microbatch per step, fewer than 2 stages: GPipe, said in the spec
    assert _spec("--model", "345m", "--nproc-per-node", "8").pp_schedule == "gpipe"
    spec = _spec("--model", "1.3b", "--nproc-per-node", "2")  # TP2 PP2 needs a multiple of 4
    assert (spec.parallel.tp, spec.parallel.pp, spec.parallel.dp, spec.parallel.source) == (1, 1, 2, "default")
    spec = _spec("--model", "1.3b", "--nproc-per-node", "4", "--tp", "4")  # the user's word wins
    assert (spec.parallel.tp, spec.parallel.pp, spec.parallel.source) == (4, 1, "user")
    spec = _spec("--model", "345m", "--nproc-per-node", "2", "--engine", "deepspeed")  # ZeRO engine: data parallel
    assert (spec.parallel.pp, spec.parallel.dp) == (1, 2)


def test_under_torchrun_the_world_size_is_torchruns():
    from hwbench.catalog import load_catalog
    from hwbench.spec import build_run_spec

    spec = build_run_spec({"model": "tiny", "tp": 2}, load_catalog(), torchrun_world_size=4)
    assert spec.launch.under_torchrun and spec.launch.world_size == 4 and spec.parallel.dp == 2


def test_a_user_entry_as_specific_as_a_shipped_one_takes_the_device(tmp_path, monkeypatch):
    from hwbench.catalog import load_catalog

    shipped = load_catalog().match_device("cuda", "NVIDIA H200 NVL")
    assert shipped is not None and shipped.name == "h200-nvl"
    pattern = max(shipped.match, key=len)
    devices = tmp_path / "devices"
    devices.mkdir()
    null = "{dense: null, unavailable: not looked up}"
    (devices / "my-h200.yaml").write_text(
        f"name: my-h200\nvendor: me\nbackend: cuda\ntitle: Mine\nmatch: ['{pattern}']\n"
        f"peak_flops: {{bf16: {null}, fp16: {null}, fp32: {null}}}\n")
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    assert load_catalog().match_device("cuda", "NVIDIA H200 NVL").name == "my-h200"


def test_a_workload_may_give_both_warmup_fields_and_needs_one(tmp_path, monkeypatch, capsys):
    from hwbench.catalog import load_catalog

    shipped = Path(load_catalog().workloads["tiny"].path).read_text()
    assert "lr_warmup_iters" in shipped
    workloads = tmp_path / "workloads"
    workloads.mkdir()
    both = shipped.replace("name: tiny", "name: mine").replace(
        "  lr_warmup_iters:", "  lr_warmup_fraction: 0.01\n  lr_warmup_iters:")
    (workloads / "mine.yaml").write_text(both)
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    assert (
        load_catalog().workloads["mine"].training.lr_warmup_iters
        == load_catalog().workloads["tiny"].training.lr_warmup_iters
    )
    neither = "\n".join(line for line in both.splitlines() if "lr_warmup" not in line) + "\n"
    (workloads / "mine.yaml").write_text(neither)
    from hwbench.catalog import _cached

    _cached.cache_clear()  # the catalog is read once per HWBENCH_CATALOG_PATH value
    assert main(["models"]) == 2
    line = capsys.readouterr().err.strip()
    assert "mine.yaml" in line and "lr_warmup_fraction" in line and "lr_warmup_iters" in line


def test_a_broken_pipe_elsewhere_is_not_taken_for_a_closed_stdout(monkeypatch):
    from hwbench import cli
    from hwbench.commands import models

    def broken(args):
        raise BrokenPipeError("a child's pipe")

    monkeypatch.setattr(models, "main", broken)
    with pytest.raises(BrokenPipeError):
        cli.main(["models"])


@pytest.mark.parametrize("text, expected", [
    ("backend: tpu\n", "field backend: must be one of cpu, cuda, rocm, npu, hpu, not 'tpu'"),
    ("tdp_watts: true\n", "field tdp_watts: must be a number, not true/false"),
    ("match_by_power_limit: {names: ['x'], over_watts: 500, up_to_watts: 400}\n",
     "field match_by_power_limit: up_to_watts 400 must be greater than over_watts 500"),
    # an unquoted day that is none: PyYAML raised ValueError, which came out as a traceback
    ("price_date: 2026-13-01\n", "a value YAML cannot read (month must be in 1..12)"),
])
def test_a_bad_catalog_value_is_one_line_naming_the_field_value_and_what_is_accepted(
        tmp_path, capsys, monkeypatch, text, expected):
    devices = tmp_path / "devices"
    devices.mkdir()
    null = "{dense: null, unavailable: x}"
    entry = (f"name: mychip\nvendor: me\nbackend: cuda\ntitle: Mine\nmatch: ['Mine']\n"
             f"peak_flops: {{bf16: {null}, fp16: {null}, fp32: {null}}}\n")
    (devices / "mychip.yaml").write_text(entry.replace("backend: cuda\n", "") + text if "backend" in text
                                         else entry + text)
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    assert main(["devices"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "mychip.yaml" in lines[0] and expected in lines[0], lines
    assert captured.out == ""


@pytest.mark.parametrize("argv, expected", [
    (["k8s", "--image", "img", "--nnodes", "0", "--nproc-per-node", "1"],
     "--nnodes 0 is not accepted; give an integer >= 1"),
    (["k8s", "--image", "img", "--nnodes", "1", "--nproc-per-node", "1", "--api", "jobset"],
     "--api 'jobset' is not accepted; give one of pytorchjob, trainjob"),
    (["calibrate", "--threads", "0"], "--threads 0 is not accepted; give an integer >= 1"),
    (["calibrate", "--min-time", "inf"], "--min-time inf is not accepted; give seconds > 0, at most 3600"),
    (["accept", "--suite", "s", "--baseline", "b", "--out", "o", "--repeats", "x"],
     "--repeats 'x' is not accepted; give an integer >= 1"),
    (["accept", "--suite", "s", "--baseline", "b", "--out", "o", "--probe-time", "0"],
     "--probe-time 0 is not accepted; give seconds > 0"),
])
def test_a_commands_own_argument_is_refused_as_a_run_option_is(argv, expected, capsys, tmp_path, monkeypatch):
    """k8s, calibrate and accept check their own arguments with hwbench.arguments.Option (arguments.argument):
    one line, the value as typed, what is accepted, before anything runs."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == f"hwbench: error: {expected}\n" and captured.out == ""
    assert list(tmp_path.iterdir()) == []
