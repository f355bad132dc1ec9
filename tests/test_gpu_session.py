"""benchmarks/gpu_session.sh's mechanics on the CPU (tiny suites): stages that resume, files
copied to the destination as each step ends (within the device tool's 8 files, no folders),
a step stopped at the call's budget still leaving its finished points behind, and the short
table last. The run stage's side-by-side is tests/test_bare_loop.py's."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_session.sh"
QUICK = ("defaults: {model: tiny, data: synthetic, seq-length: 32, micro-batch-size: 1, global-batch-size: 1, "
         "steps: 2, warmup: 1, eval-iters: 0, telemetry: false, timeout: 120}\n")


def session(tmp_path, *stages, budget=None, **env):
    environment = {**os.environ, "HWBENCH_PYTHON": sys.executable, "HWBENCH_SESSION_DIR": str(tmp_path / "session"),
                   "HWBENCH_DEVICE": "cpu", **env}
    environment.pop("OUT", None)
    if budget is not None:
        environment["HWBENCH_CALL_BUDGET"] = str(budget)
    return subprocess.run(["bash", str(SCRIPT), "--dest", str(tmp_path / "back"), *stages], env=environment,
                          capture_output=True, text=True, timeout=400)


def test_an_unknown_stage_is_one_line_and_exit_2(tmp_path):
    done = session(tmp_path, "probe", "measure")
    assert done.returncode == 2
    assert done.stderr.strip() == ("gpu_session.sh: stage 'measure' is not known; accepted: probe, run, sweep, "
                                   "speed, report, all")
    done = session(tmp_path, "sweep", budget="9m")
    assert done.returncode == 2 and "HWBENCH_CALL_BUDGET '9m'" in done.stderr


@pytest.mark.slow
def test_stages_resume_publish_as_they_go_and_stop_at_the_budget(tmp_path):
    (tmp_path / "one.yaml").write_text("name: one\n" + QUICK + "points:\n  - {name: p}\n")
    # a quick point, then one far longer than the budget leaves it
    (tmp_path / "long.yaml").write_text("name: long\n" + QUICK + "points:\n  - {name: quick}\n"
                                        "  - {name: slow, steps: 5000}\n")
    env = {"HWBENCH_SUITE": str(tmp_path / "one.yaml"), "HWBENCH_SPEED_SUITE": str(tmp_path / "long.yaml")}

    done = session(tmp_path, "sweep", "report", **env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    back = tmp_path / "back"
    files = sorted(p.name for p in back.iterdir())
    assert all((back / name).is_file() for name in files) and len(files) <= 8  # the device tool's limit
    assert {"session.log", "results.tar.gz", "summary.md", "report.md", "report.html"} <= set(files)
    with tarfile.open(back / "results.tar.gz") as tar:
        results = [n for n in tar.getnames() if n.startswith("./sweep/one/p/") and n.endswith(".json")]
    assert len(results) == 1
    assert "tiny" in (back / "report.md").read_text()
    last = done.stdout.rstrip().splitlines()
    assert last[-1].startswith("| sweep/one/p: tiny fp32 | ok | 1/1 x 32 |")  # the table comes last

    again = session(tmp_path, "sweep", **env)  # the next call: the finished point is kept, not run again
    assert again.returncode == 0 and "kept from an earlier sweep" in again.stdout
    assert len(list((tmp_path / "session" / "sweep" / "one" / "p").glob("*.json"))) == 1

    # 45 s: the quick point ends well inside it (a tiny point takes seconds), the slow one is
    # stopped at it, and the report then has under the 30 s a step needs to be started
    stopped = session(tmp_path, "speed", "report", budget=45, **env)
    assert stopped.returncode == 1
    log = (back / "session.log").read_text()  # published although the call ran out
    assert "== speed: stopped at the call's budget" in log
    assert "== report-md: not started" in log and "run its stage again in the next call" in log
    with tarfile.open(back / "results.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.startswith("./speed/long/quick/") and n.endswith(".json") for n in names)
