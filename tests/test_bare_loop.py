"""benchmarks/bare_loop.py and benchmarks/side_by_side.py on the CPU with the tiny model:
the mechanics only (what is compared with what, and the ratios' arithmetic); the figures
that matter come from a GPU session (docs/performance.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from hwbench.catalog import load_catalog
from hwbench.workload import count_parameters, model_flops_per_iteration

TINY = load_catalog().workloads["tiny"].model


def _script(name):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bare_loop():
    return _script("bare_loop")


def _side_by_side():
    return _script("side_by_side")


@pytest.mark.parametrize("argv,expected", [
    (["--model", "tiny", "--seq-length", "256"], ["--seq-length 256", "--max-positions 256"]),
    (["--model", "gpt9"], ["--model 'gpt9'", "accepted"]),
    (["--model", "tiny", "--micro-batch-size", "3", "--global-batch-size", "4"], ["--global-batch-size 4"]),
    (["--model", "tiny", "--steps", "0"], ["--steps 0"]),
    (["--precision", "fp8"], ["--precision", "'fp8'", "bf16"]),
])
def test_the_bare_loop_refuses_bad_input_as_hwbench_run_does(argv, expected, capsys, tmp_path):
    assert _bare_loop().main([*argv, "--device", "cpu", "--json", str(tmp_path / "bare.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and all(text in err for text in expected), err
    assert not (tmp_path / "bare.json").exists()


# heavy: two real runs of a point (hwbench run and the bare loop) and their division; the default
# run keeps the bare loop's input checks and how its figures and repeats combine (below)
@pytest.mark.slow
@pytest.mark.heavy
def test_side_by_side_runs_both_sides_on_the_same_point_and_divides_their_medians(tmp_path):
    out = tmp_path / "sbs"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "side_by_side.py"), "--device", "cpu",
                           "--model", "tiny", "--steps", "2", "--warmup", "1", "--micro-batch-size", "1",
                           "--global-batch-size", "2", "--seq-length", "32", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads((out / "side_by_side.json").read_text())
    assert document["options"]["repeats"] == 1 and len(document["repeats"]) == 1
    sides = document["repeats"][0]["sides"]
    assert set(sides) == {"bare loop", "hwbench --no-telemetry", "hwbench"}
    median = {name: side["step_time_median_s"] for name, side in sides.items()}
    assert all(value > 0 for value in median.values())
    assert document["harness_ratio"] == pytest.approx(median["hwbench"] / median["bare loop"])
    assert document["harness_ratio_no_telemetry"] == pytest.approx(
        median["hwbench --no-telemetry"] / median["bare loop"]
    )
    assert document["telemetry_ratio"] == pytest.approx(median["hwbench"] / median["hwbench --no-telemetry"])
    assert document["harness_ratio_range"] == [document["harness_ratio"]] * 2

    bare = json.loads((out / "r1" / "bare.json").read_text())
    assert (
        bare["micro_batch_size"],
        bare["global_batch_size"],
        bare["gradient_accumulation_steps"],
        bare["seq_length"],
        bare["precision"],
    ) == (1, 2, 2, 32, "fp32")
    assert bare["optimizer"] == "AdamW fused"  # as hwbench's CPU backend asks for (device/kinds.py)
    assert len(bare["step_time_s"]["all"]) == 2 and bare["step_time_s"]["median"] == median["bare loop"]
    assert bare["flops_per_iteration"] == model_flops_per_iteration(TINY, 2, 32)
    assert bare["tflops_per_device"] == pytest.approx(bare["flops_per_iteration"] / median["bare loop"] / 1e12)
    assert bare["tokens_per_s"] == pytest.approx(2 * 32 / median["bare loop"])
    # the same model and point as hwbench's runs
    for folder, telemetry in (("hwbench", True), ("hwbench-no-telemetry", False)):
        (path,) = (out / "r1" / folder).glob("*.json")
        result = json.loads(path.read_text())
        assert result["status"] == "ok" and result["spec"]["telemetry"] is telemetry
        assert (
            result["spec"]["micro_batch_size"],
            result["spec"]["global_batch_size"],
            result["spec"]["seq_length"],
            result["spec"]["precision"],
            result["spec"]["steps"],
        ) == (1, 2, 32, "fp32", 2)
        assert result["workload"]["parameters"] == bare["parameters"] == count_parameters(TINY).total
        assert result["metrics"]["flops_per_iteration"] == bare["flops_per_iteration"]
    assert done.stdout.rstrip().splitlines()[-1].startswith("telemetry_ratio = ")  # the ratios come last


def _side(median):
    return {"status": "ok", "step_time_median_s": median}


def test_repeats_combine_into_the_median_and_range_of_each_repeats_ratio():
    def sides(bare, quiet, full):
        return {"bare loop": _side(bare), "hwbench --no-telemetry": _side(quiet), "hwbench": _side(full)}

    module = _side_by_side()
    document = module.combine([sides(1.0, 1.1, 1.2), sides(2.0, 2.0, 2.1), sides(1.0, 1.3, 1.5)])
    assert [r["harness_ratio"] for r in document["repeats"]] == pytest.approx([1.2, 1.05, 1.5])
    assert document["harness_ratio"] == pytest.approx(1.2)  # the median of the repeats' ratios
    assert document["harness_ratio_range"] == pytest.approx([1.05, 1.5])
    assert document["telemetry_ratio"] == pytest.approx(1.2 / 1.1)
    failed = sides(1.0, 1.1, 1.2)
    failed["hwbench"] = {"error": "status oom"}
    document = module.combine([sides(1.0, 1.1, 1.2), failed])
    assert document["harness_ratio"] is None and document["harness_ratio_range"] is None  # not from half the repeats
    assert document["harness_ratio_no_telemetry"] == pytest.approx(1.1)


def test_both_sides_figures_come_from_their_median_step(tmp_path):
    """A result's own tokens/s is over its mean step; the side-by-side columns are from the
    median of both sides, as the bare loop's are."""
    module = _side_by_side()
    result = json.loads((REPO_ROOT / "tests" / "data" / "compare" / "tiny-cpu.json").read_text())
    steps = [1.0, 1.0, 4.0]  # mean 2 s, median 1 s
    result["metrics"]["step_time_s"].update(n=3, mean=2.0, median=1.0, min=1.0, max=4.0)
    result["metrics"]["tokens_per_s"] = 8 * 128 * 3 / sum(steps)  # what hwbench writes: over the mean step
    folder = tmp_path / "hwbench"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(result))
    side = module.hwbench_side(folder, {"exit": 0})
    assert side["step_time_median_s"] == 1.0
    assert side["tokens_per_s"] == pytest.approx(8 * 128 / 1.0) != pytest.approx(result["metrics"]["tokens_per_s"])
    assert side["tflops_per_device"] == pytest.approx(result["metrics"]["flops_per_iteration"] / 1.0 / 1e12)
    bare = {
        "global_batch_size": 8,
        "seq_length": 128,
        "flops_per_iteration": 4e10,
        "peak_memory_bytes": 1,
        "step_time_s": {"median": 0.5, "mean": 0.9},
    }
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    side = module.bare_side(tmp_path / "bare.json", {"exit": 0})
    assert (side["tokens_per_s"], side["tflops_per_device"]) == (pytest.approx(8 * 128 / 0.5), pytest.approx(0.08))
    assert module.combine([])["statistic"] == "median step time"
    assert "median step time" in module.table({"bare loop": side}, {})


def test_resume_keeps_a_finished_repeat_of_this_host_and_reruns_one_of_another(tmp_path, monkeypatch, capsys):
    """A device call that ran out after repeat 1 leaves r1/sides.json; with --resume the next
    call keeps it (no process started) and writes side_by_side.json; a repeat written on another
    host, with other options or with a failed side is run again."""
    import platform

    module = _side_by_side()
    argv = ["--device", "cpu", "--model", "tiny", "--steps", "2", "--warmup", "1", "--out", str(tmp_path)]
    shared = module.shared_argv(module.parse_args(argv))
    sides = {"bare loop": _side(1.0), "hwbench --no-telemetry": _side(1.02), "hwbench": _side(1.03)}
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "sides.json").write_text(json.dumps(
        {"options": {"device": "cpu", "shared": shared, "host": platform.node()}, "sides": sides}))
    ran = []
    monkeypatch.setattr(module, "run_repeat", lambda args, shared, out: ran.append(out.name) or sides)

    assert module.main([*argv, "--resume"]) == 0
    assert ran == []  # kept: nothing ran
    assert "== repeat 1: kept" in capsys.readouterr().out
    document = json.loads((tmp_path / "side_by_side.json").read_text())
    assert document["repeats_done"] == 1 and document["harness_ratio"] == pytest.approx(1.03)

    assert module.main(argv) == 0 and ran == ["r1"]  # without --resume every repeat runs
    for changed in ({"host": "another-machine"}, {"shared": [*shared, "--compile"]}):
        ran.clear()
        options = {"device": "cpu", "shared": shared, "host": platform.node(), **changed}
        (tmp_path / "r1" / "sides.json").write_text(json.dumps({"options": options, "sides": sides}))
        assert module.main([*argv, "--resume"]) == 0 and ran == ["r1"], changed
    failed = {**sides, "hwbench": {"error": "status oom"}}
    (tmp_path / "r1" / "sides.json").write_text(json.dumps(
        {"options": {"device": "cpu", "shared": shared, "host": platform.node()}, "sides": failed}))
    ran.clear()
    assert module.main([*argv, "--resume"]) == 0 and ran == ["r1"]
