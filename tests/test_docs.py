"""The documentation stays true to the code: every field a result file holds is
described in docs/results.md, every module is a row of docs/architecture.md's table."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Keys under these paths are data (variable names, per-field reasons), not schema.
OPEN_MAPS = ("environment.env", "metrics.unmeasured", "metrics.memory.unmeasured", "ranks[].memory.unmeasured",
             "metrics.telemetry.devices[].unmeasured", "metrics.data.split_documents",
             "metrics.time_to_target.unmeasured", "metrics.steady_state.unmeasured", "metrics.goodput.shares",
             "profile.ranks[].shares",  # keyed by category, each named in its row
             "metrics.by_formula",  # keyed by formula name; its fields documented as metrics.by_formula.<name>.x
             # documented as "fields as <the top-level object>"
             "nodes[].environment", "ranks[].telemetry", "engine.config", "error.plan")


def undocumented(result: dict) -> list[str]:
    """Key paths of a result that docs/results.md does not name."""
    doc = (ROOT / "docs" / "results.md").read_text()
    return sorted({p for p in key_paths(result) if f"`{p}`" not in doc})


def key_paths(value, prefix=""):
    if isinstance(value, dict):
        for key, child in value.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            if path not in OPEN_MAPS:
                yield from key_paths(child, path)
    elif isinstance(value, list):
        for child in value:
            yield from key_paths(child, prefix + "[]")


# Each kind of run is one that other tests of the session read too (conftest's fixture of that name), so it
# is made once: tiny on the built-in corpus with telemetry on (SEEDED_TINY_RUN), fp16 (the loss scale's
# fields), moe-tiny (routing, the experts' figures) and fp8 emulated on the CPU (engine.fp8, device.fp8_*).
# The synthetic data's fields are checked on the fault sweep's results (tests/test_sweep.py).
@pytest.mark.parametrize("fixture", ["seeded_tiny_runs", "fp16_tiny_run", "moe_tiny_run", "fp8_tiny_run"],
                         ids=["tiny", "tiny-fp16", "moe-tiny", "fp8"])
def test_every_result_field_is_documented(request, fixture):
    shared = request.getfixturevalue(fixture)
    path = shared[0] if isinstance(shared, list) else shared
    result = json.loads(path.read_text())
    doc = (ROOT / "docs" / "results.md").read_text()
    missing = sorted({p for p in key_paths(result) if f"`{p}`" not in doc})
    assert not missing, f"docs/results.md does not describe: {missing}"


def test_every_profile_field_is_documented():
    """--profile's section, of a stored profiled run (tests/data/profile): a run costs more than this check."""
    result = json.loads((ROOT / "tests" / "data" / "profile" / "dp2-slow-rank1.json").read_text())
    assert result["profile"]["ranks"] and result["profile"]["straggler"]
    missing = undocumented(result)
    assert not missing, f"docs/results.md does not describe: {missing}"


def test_every_section_a_message_names_exists():
    """A message or comment that sends the reader to "README, 'X'" or "docs/Y.md, 'X'" names a
    heading (or a bold paragraph lead) that the file has."""
    import re

    root = Path(__file__).resolve().parent.parent
    pattern = re.compile(r"(README|docs/[\w-]+\.md), '([^']+)'")
    found = []
    for source in sorted((root / "hwbench").rglob("*.py")):
        for name, section in pattern.findall(source.read_text()):
            text = (root / (name + ".md" if name == "README" else name)).read_text()
            leads = re.findall(r"^#+ (.+)$", text, re.MULTILINE) + re.findall(r"\*\*([^*]+?)\.?\*\*", text)
            found.append(section)
            assert any(lead.startswith(section) for lead in leads), f"{source.name}: {name} has no section {section!r}"
    assert "Which torch you get" in found


def test_the_repository_cites_only_public_sources():
    """The project's own notes outside the repository are no source for its users: a
    document, comment or test names the public source itself (a README, a script, a paper)."""
    import subprocess

    private = ["FAC" + "TS", "DESIGN" + ".md", "shared/" + "reference", "shared/" + "seeds"]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for name in tracked.splitlines():
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".csv", ".html", ""}:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{name}: {word}" for word in private if word in text]
    assert not found, found


def architecture_table() -> dict[str, str]:
    """docs/architecture.md's "Modules" table: each path its first column names, with the row it is on.
    A bare name (`tune.py`) is beside the path before it in the same cell."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    named = {}
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`]+)`", row.split(" | ", 1)[0]):
            path = name if name.startswith("hwbench/") else f"{folder}/{name}"
            folder = path.rstrip("/").rsplit("/", 1)[0] if not name.endswith("/") else path.rstrip("/")
            named[path.rstrip("/")] = row
    return named


def test_the_architecture_table_names_every_module_and_only_real_paths():
    """Each module that holds code (an `__init__.py` that is only a docstring holds none) is a row of the
    "Modules" table, and each path the table names exists."""
    import ast

    named = architecture_table()
    modules = []
    for path in sorted((ROOT / "hwbench").rglob("*.py")):
        body = ast.parse(path.read_text()).body
        if any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body):
            modules.append(str(path.relative_to(ROOT)))
    assert len(modules) > 100 and "hwbench/spec.py" in modules
    missing = [module for module in modules if module not in named]
    assert not missing, f"docs/architecture.md's Modules table has no row for: {missing}"
    absent = [path for path in named if not (ROOT / path).exists()]
    assert not absent, f"docs/architecture.md's Modules table names paths that do not exist: {absent}"
