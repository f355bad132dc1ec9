"""The package's import graph: no cycles, and no import that runs upward.

Layers, from the top (docs/architecture.md):

    commands   hwbench.cli, hwbench.commands.*, hwbench.__main__  (parse argv, print)
    api        hwbench.api                                       (the Python API over the library)
    library    everything else: spec, options, point, planner, harness, engine, workload, result, report, ...
    device     hwbench.device.*                                  (the only code that names a vendor)
    base       hwbench (its constants), hwbench.errors, hwbench.units

A module may import its own layer and the layers below it. Every import counts, the
ones inside functions too: a cycle hidden in a function is still a cycle. Imports of
the root package `hwbench` itself are left out (it holds the version constants and
the lazy API names, imported by everything), and so are its own lazy imports of
hwbench.api (`hwbench.run` is the API's entry point, resolved on first use).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hwbench"
ORDER = ("base", "device", "library", "api", "commands")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer(module: str) -> str:
    if module in ("hwbench", "hwbench.errors", "hwbench.units"):
        return "base"
    if module == "hwbench.device" or module.startswith("hwbench.device."):
        return "device"
    if module in ("hwbench.cli", "hwbench.__main__") or module.startswith("hwbench.commands"):
        return "commands"
    if module == "hwbench.api":
        return "api"
    return "library"


def imports() -> dict[str, set[str]]:
    """module -> the hwbench modules it imports (anywhere in its file)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from hwbench.judge import compare` imports the module hwbench.judge.compare
                found = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names]
            else:
                continue
            targets |= {t for t in found if t.startswith("hwbench.") and t in modules and t != name}
        graph[name] = targets
    return graph


def test_no_import_cycles():
    graph = imports()
    cycles = []
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in state:
                visit(target, trail + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_module_imports_a_higher_layer():
    upward = [f"{module} ({layer(module)}) imports {target} ({layer(target)})"
              for module, targets in sorted(imports().items()) for target in sorted(targets)
              if module != "hwbench" and ORDER.index(layer(target)) > ORDER.index(layer(module))]
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_the_check_sees_imports_inside_functions(tmp_path):
    """The walker is not blind to a function-level import (the kind that hid cli -> harness -> cli)."""
    graph = imports()
    assert "hwbench.harness.run" in graph["hwbench.commands.run"]  # imported inside main()
