"""pytest starts and collects without the optional plugins (a GPU image has other pytest
plugins than the test extra installs): no plugin's option in pyproject's addopts, and the
files that need hypothesis or pytest-benchmark skip with the reason instead of failing."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO_ROOT

# pytest as a machine without hypothesis and pytest-benchmark runs it: no installed plugin
# loaded (PYTEST_DISABLE_PLUGIN_AUTOLOAD), and `import hypothesis` failing as if absent. The finder
# answers with a spec of no file whose loader refuses, so that importlib.util.find_spec still
# answers (as it does, with None, for a module that is absent: torch._dynamo's trace rules ask it
# for every optional module when torch.compiler.disable first runs) while the import fails.
WITHOUT_PLUGINS = """
import importlib.abc, importlib.machinery, sys
class Gone(importlib.abc.Loader):
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)
    def exec_module(self, module):
        pass
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hypothesis":
            return importlib.machinery.ModuleSpec(name, Gone())
sys.meta_path.insert(0, Absent())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def pytest_without_plugins(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-c", WITHOUT_PLUGINS, *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, env=env)


def test_the_test_files_collect_without_hypothesis_or_pytest_benchmark():
    done = pytest_without_plugins("--collect-only", "-q", "tests/test_result_files_property.py",
                                  "tests/test_planner.py")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]  # 2 or 4 on a collection or usage error
    assert "tests collected" in done.stdout
    done = pytest_without_plugins("-q", "-rs", "tests/test_result_files_property.py")
    # 5: nothing left to run in the file, every test of it skipped
    assert done.returncode == 5 and "hypothesis is not installed" in done.stdout, done.stdout[-2000:]


def test_benchmarks_skip_without_pytest_benchmark():
    done = pytest_without_plugins("-q", "-rs", "benchmarks/test_train_step.py", "-k", "tiny")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "pytest-benchmark is not installed" in done.stdout
