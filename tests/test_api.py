"""The Python API: docs/api.md's example runs as it is written there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def test_import_hwbench_is_light():
    done = subprocess.run([sys.executable, "-c", "import sys, hwbench; print(hwbench.__version__, "
                           "'torch' in sys.modules, 'pandas' in sys.modules)"], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split()[1:] == ["False", "False"], done.stderr


@pytest.mark.slow
def test_the_documented_example_runs(tmp_path):
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ok ") and lines[0].endswith(" tokens/s")
    assert "tiny" in done.stdout and "cpu" in done.stdout  # the DataFrame row
    assert sum(1 for line in lines if line.startswith("tp") and "GiB per rank" in line) == 3
    assert lines[-1].startswith("#")  # the Markdown report's title
    assert len(list((tmp_path / "results" / "api-example").glob("*.json"))) == 1


def test_api_errors_are_the_commands_errors():
    import hwbench
    from hwbench.errors import UsageError

    with pytest.raises(UsageError, match="--model 'gpt5' is not in the catalog"):
        hwbench.run(model="gpt5")
    with pytest.raises(UsageError, match="`speed` is not a `hwbench run` option"):
        hwbench.run(speed=3)


def test_hwbench_report_is_the_package_and_write_report_the_call(tmp_path):
    import hwbench
    import hwbench.report

    assert not callable(hwbench.report) and hasattr(hwbench.report, "write_report")
    folder = Path(__file__).resolve().parent / "data" / "history" / "noise"
    out = tmp_path / "r.md"
    text = hwbench.write_report(folder, tokens=1e9, out=out)  # one folder given as a path, not a list
    assert text.startswith("#") and out.read_text() == text


def _cli_error(argv, capsys) -> str:
    from hwbench.cli import main

    assert main(argv) == 2
    return capsys.readouterr().err.strip().removeprefix("hwbench: error: ")


@pytest.mark.parametrize("call, argv", [
    (dict(devices=8, device_memory="32GiB", headroom=-5.0), ["--devices", "8", "--device-memory", "32GiB",
                                                             "--headroom", "-5"]),
    (dict(devices=0, device_memory="32GiB"), ["--devices", "0", "--device-memory", "32GiB"]),
    (dict(devices=8, device_memory="32XB"), ["--devices", "8", "--device-memory", "32XB"]),
    (dict(devices=8, device_model="nope"), ["--devices", "8", "--device-model", "nope"]),
    (dict(devices=4, device_memory="32GiB", model="nosuch"), ["--devices", "4", "--device-memory", "32GiB", "--model",
                                                              "nosuch"]),
    (dict(devices=30000, device_memory="32GiB"), ["--devices", "30000", "--device-memory", "32GiB"]),
])
def test_plan_refuses_what_the_command_refuses_with_the_same_line(call, argv, capsys):
    import hwbench
    from hwbench.errors import UsageError

    with pytest.raises(UsageError) as error:
        hwbench.plan(**call)
    assert str(error.value) == _cli_error(["plan", *argv], capsys)


@pytest.mark.parametrize("call, fragment", [
    (dict(devices=8, device_memory="32GiB", headroom="0.1"), "--headroom '0.1' is not accepted"),
    (dict(devices=8, device_memory=-1), "--device-memory -1 is not accepted"),
    (dict(devices=8, device_memory="32GiB", headroom=-5), "--headroom -5 is not accepted"),
    (dict(devices="8", device_memory="32GiB"), "--devices '8' is not accepted"),
    (dict(devices=8, device_memory="32GiB", device="tpu"), "--device 'tpu' is not known"),
])
def test_plan_refuses_values_of_the_wrong_type_in_one_line(call, fragment):
    import hwbench
    from hwbench.errors import UsageError

    with pytest.raises(UsageError, match=re.escape(fragment)) as error:
        hwbench.plan(**call)
    assert "\n" not in str(error.value)


def test_the_other_calls_refuse_bad_input_as_their_commands_do(tmp_path, capsys):
    import hwbench
    from hwbench.errors import UsageError

    folder = str(Path(__file__).resolve().parent / "data" / "history" / "noise")
    with pytest.raises(UsageError) as error:
        hwbench.write_report([folder], format="pdf")
    assert str(error.value) == _cli_error(["report", folder, "--format", "pdf"], capsys)
    with pytest.raises(UsageError, match="RESULTS 'no_such_folder': no such file or folder"):
        hwbench.write_report("no_such_folder")  # one path, not the letters n, o, ...
    with pytest.raises(UsageError, match="--out None is not accepted"):
        hwbench.sweep("smoke", out=None)
    with pytest.raises(UsageError) as error:
        hwbench.sweep("smoke", out=tmp_path, repeats=0)
    assert str(error.value) == _cli_error(["sweep", "smoke", "--out", str(tmp_path), "--repeats", "0"], capsys)
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


NOISE = str(Path(__file__).resolve().parent / "data" / "history" / "noise")

# Each call of the API with an argument of the wrong type or value -> the fragment of its one-line
# UsageError. Before: a TypeError or AttributeError from deep inside, or (marked) taken silently.
WRONG_ARGUMENTS = {
    "run(5)": (lambda hw, tmp: hw.run(5), "options 5 is not accepted; give a RunOptions, a mapping"),
    "run(pairs)": (lambda hw, tmp: hw.run([("model", "nosuch")]), "options [('model', 'nosuch')] is not accepted"),
    "run(progress='yes')": (lambda hw, tmp: hw.run(model="nosuch", progress="yes"),  # silently taken
                            "--progress 'yes' is not accepted; give true or false"),
    "run(write=None)": (lambda hw, tmp: hw.run(model="nosuch", write=None), "--write None is not accepted"),
    "sweep(5)": (lambda hw, tmp: hw.sweep(5, out=tmp), "--suite 5 is not accepted; give a suite file or"),
    "sweep(slurm=5)": (lambda hw, tmp: hw.sweep("smoke", out=tmp, slurm=5), "--slurm 5 is not accepted"),
    "sweep(force='no')": (lambda hw, tmp: hw.sweep("smoke", out=tmp, force="no"), "--force 'no' is not accepted"),
    "load_results('')": (lambda hw, tmp: hw.load_results(""), "paths '' is not accepted"),  # read the current folder
    "write_report(prices=5)": (lambda hw, tmp: hw.write_report(NOISE, prices=5), "prices 5 is not accepted"),
    "write_report(out=5)": (lambda hw, tmp: hw.write_report(NOISE, out=5), "--out 5 is not accepted; give a path"),
    "write_report(against=5)": (lambda hw, tmp: hw.write_report(NOISE, against=5), "--against 5 is not accepted"),
    "export(job=5)": (lambda hw, tmp: hw.export("prometheus", NOISE, job=5), "--job 5 is not accepted"),  # taken
    "export(out=5)": (lambda hw, tmp: hw.export("bencher", NOISE, out=5), "--out 5 is not accepted"),
    "archive(out=None)": (lambda hw, tmp: hw.archive(NOISE, out=None), "--out None is not accepted; give a file"),
    "verify_archive(5)": (lambda hw, tmp: hw.verify_archive(5), "--verify 5 is not accepted"),
    "preflight(out=5)": (lambda hw, tmp: hw.preflight(out=5), "--out 5 is not accepted; give a folder"),  # taken
    "accept(suite=5)": (lambda hw, tmp: hw.accept(suite=5, baseline=NOISE, out=tmp), "--suite 5 is not accepted"),
    "accept(devices_per_node='2')": (lambda hw, tmp: hw.accept(suite="smoke", baseline=NOISE, out=tmp,
                                                                devices_per_node="2"),
                                     "--devices-per-node '2' is not accepted; give an integer >= 1"),
    "baseline_save(out=None)": (lambda hw, tmp: hw.baseline_save(NOISE, out=None), "--out None is not accepted"),
}


@pytest.mark.parametrize("call", WRONG_ARGUMENTS)
def test_every_call_refuses_a_wrong_type_with_the_documented_usage_error(tmp_path, call):
    import hwbench
    from hwbench.errors import UsageError

    make, fragment = WRONG_ARGUMENTS[call]
    with pytest.raises(UsageError) as error:
        make(hwbench, tmp_path / "out")
    assert fragment in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert not (tmp_path / "out").exists()


def test_load_results_reads_one_folder_and_drops_copies_with_the_reason(tmp_path):
    import shutil

    import hwbench

    source = Path(__file__).resolve().parent / "data" / "compare" / "tiny-cpu.json"
    shutil.copy(source, tmp_path / "a.json")
    shutil.copy(source, tmp_path / "b.json")  # the same run twice: counted once, as hwbench report counts it
    frame = hwbench.load_results(str(tmp_path))
    assert len(frame) == 1 and frame["status"].tolist() == ["ok"]
    [(path, reason)] = frame.attrs["skipped"]
    assert path.endswith("b.json") and "already read from" in reason
