"""Property: whatever a result file holds, no reader of it ends in a traceback.

Hypothesis mutates a real result file (tests/data/compare/tiny-cpu.json, from
`hwbench run`): truncated at any byte, a field dropped or retyped (null, text, a
negative, huge or non-finite number, a list, a mapping, deep nesting), or the
whole file re-encoded. Each mutant is fed to the loader, `hwbench report`,
`hwbench compare`, `hwbench parity` and `hwbench system`. Each must either use the
file or name it with a reason (ResultFormatError, a one-line error, a line in the
output); none may raise.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[test]')")

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hwbench.cli import main
from hwbench.result.store import ResultFormatError, load_result

TEMPLATE_PATH = Path(__file__).parent / "data" / "compare" / "tiny-cpu.json"
TEMPLATE = json.loads(TEMPLATE_PATH.read_text())
SETTINGS = settings(max_examples=int(os.environ.get("HWBENCH_PROPERTY_EXAMPLES", 100)), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):
            found += _paths(item, prefix + (index,))
    return found


PATHS = _paths(TEMPLATE)
SHALLOW = [path for path in PATHS if len(path) <= 2]  # the fields readers touch first: drawn half the time
REPLACEMENTS = [None, "", "text", -1, -1.5, 0, 10**30, 1e308, float("nan"), float("inf"), True, [], {}, [1, "x"],
                {"a": {"b": None}}, "1" * 5000]


def _set(data: dict, path: tuple, value: Any, drop: bool = False) -> dict:
    copied = copy.deepcopy(data)
    target = copied
    for part in path[:-1]:
        target = target[part]
    if drop:
        if isinstance(target, dict):
            target.pop(path[-1], None)
        else:
            target.pop(path[-1])
    else:
        target[path[-1]] = value
    return copied


def _dump(data: Any) -> bytes:
    return json.dumps(data, indent=1).encode()  # NaN and Infinity as JSON's non-standard literals: a bad writer


@st.composite
def mutants(draw) -> bytes:
    kind = draw(st.sampled_from(["truncate", "drop", "retype", "nest", "encode"]))
    whole = _dump(TEMPLATE)
    if kind == "truncate":
        return whole[: draw(st.integers(0, len(whole) - 1))]
    path = draw(st.sampled_from(SHALLOW if draw(st.booleans()) else PATHS))
    if kind == "drop":
        return _dump(_set(TEMPLATE, path, None, drop=True))
    if kind == "retype":
        return _dump(_set(TEMPLATE, path, draw(st.sampled_from(REPLACEMENTS))))
    if kind == "nest":
        depth = draw(st.sampled_from([50, 5000]))  # written as text: json.dumps itself cannot nest that deep
        return _dump(_set(TEMPLATE, path, "__NEST__")).replace(b'"__NEST__"', b"[" * depth + b"1" + b"]" * depth)
    text = json.dumps({**TEMPLATE, "run_id": "caf\u00e9-\u00fc"})
    return text.encode(draw(st.sampled_from(["utf-16", "latin-1", "utf-32"])))


def _write(folder: Path, content: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    path = folder / "mutant.json"
    path.write_bytes(content)
    return path


def _readable(path: Path) -> str | None:
    """None when the loader takes the file, else its reason."""
    try:
        load_result(path)
    except ResultFormatError as error:
        assert str(path) in str(error)
        return str(error)
    return None


@SETTINGS
@given(content=mutants())
def test_the_loader_takes_a_file_or_names_it(tmp_path_factory, content):
    path = _write(tmp_path_factory.mktemp("load"), content)
    _readable(path)  # anything but ResultFormatError propagates and fails


# The files the reliability attack broke readers with, always tried first.
KNOWN = [
    _dump({**TEMPLATE, "spec": None}),
    b"[" * 100_000 + b"]" * 100_000,
    _dump(TEMPLATE)[:1000],
    b"",
    b"[1, 2]",
    _dump({**TEMPLATE, "schema_version": 2}),
    _dump({**TEMPLATE, "metrics": None}),
    _dump({**TEMPLATE, "steps": {"1": 2}}),
    _dump({**TEMPLATE, "metrics": {**TEMPLATE["metrics"], "tokens_per_s": -1.0}}),
]


def _with_known(test):
    for content in KNOWN:
        test = example(content=content)(test)
    return test


@pytest.mark.parametrize("command", ["report", "compare", "parity", "system"])
@SETTINGS
@_with_known
@given(content=mutants())
def test_every_reader_uses_the_file_or_names_it(tmp_path_factory, capsys, command, content):
    root = tmp_path_factory.mktemp(command)
    good = root / "good"
    good.mkdir()
    (good / "good.json").write_text(TEMPLATE_PATH.read_text())
    path = _write(root / "mutant", content)
    reason = _readable(path)
    argv = {
        "report": ["report", str(good), str(root / "mutant"), "--format", "json"],
        "compare": ["compare", str(good), str(root / "mutant")],
        "parity": ["parity", str(good / "good.json"), str(path)],
        "system": ["system", str(path)],
    }[command]
    code = main(argv)  # must return, not raise
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert code in {"report": (0, 2), "compare": (0, 2, 3, 4, 5), "parity": (0, 1, 2), "system": (0, 2)}[command]
    if reason is not None:  # a file the loader refused is named, with why
        assert str(path) in err or str(path) in out, (command, err[-500:])
