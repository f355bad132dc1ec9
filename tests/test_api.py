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


def test_hwbench_report_can_be_called_again(tmp_path):
    """Importing hwbench.report's modules binds the package over the API function's name: the
    package must answer the call too."""
    import hwbench

    folder = Path(__file__).resolve().parent / "data" / "history" / "noise"
    first = hwbench.report([str(folder)], tokens=1e9)
    import hwbench.report.build  # noqa: F401  (what the first call did already)

    assert hwbench.report([str(folder)], tokens=1e9) == first
