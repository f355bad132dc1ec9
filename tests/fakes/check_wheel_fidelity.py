#!/usr/bin/env python3
"""Is the stand-in torch_npu faithful to a real torch-npu wheel, for what hwbench calls?

Reads the Python sources of an unpacked wheel (its compiled parts need CANN and are
never loaded) and, for every torch.npu / torch_npu name hwbench's device layer
calls, says whether the wheel defines it and whether the call hwbench makes fits
the wheel's signature. It also checks the memory_stats key names hwbench reads,
the unit of Event.elapsed_time, the backend entry point and the device-conflict
check (docs/npu.md). Not part of the default test run (it needs the
download). Usage:

    pip download --no-deps torch-npu==2.13.0 -d /tmp/torch_npu_wheel
    cd /tmp/torch_npu_wheel && unzip -q -o torch_npu-2.13.0-*.whl -d unpacked
    python tests/fakes/check_wheel_fidelity.py /tmp/torch_npu_wheel/unpacked

Exit status: 0 when every line is ok, 1 when one is not, 2 on bad input.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEVICE_LAYER = REPO / "hwbench" / "device"

# How hwbench calls each name: (positional arguments, keyword arguments). The
# names themselves are also found by scanning hwbench/device (calls_in_hwbench),
# so a new call without an entry here is reported, not silently skipped.
CALLS = {
    "device_count": (0, ()),
    "set_device": (1, ()),
    "synchronize": (0, ()),
    "Event": (0, ("enable_timing",)),
    "Event.record": (0, ()),
    "Event.elapsed_time": (1, ()),
    "reset_peak_memory_stats": (0, ()),
    "memory_stats": (0, ()),
    "get_device_name": (1, ()),
    "get_device_properties": (1, ()),
    "is_bf16_supported": (0, ()),
}
MEMORY_STATS_KEYS = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "num_alloc_retries", "num_ooms")


def calls_in_hwbench() -> set[str]:
    """torch.npu names called in hwbench's device layer: ``self.api.X`` (the
    accelerator backends' torch.<device> module) and ``torch.npu.X``."""
    names: set[str] = set()
    for path in DEVICE_LAYER.glob("*.py"):
        text = path.read_text()
        names.update(re.findall(r"\bself\.api\.(\w+)", text))
        names.update(re.findall(r"\btorch\.npu\.(\w+)", text))
    return names


class Package:
    """Top-level definitions of the modules of torch_npu/npu, resolved through
    ``from .x import a`` and ``from .x import *`` as Python would."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def module_path(self, dotted: str) -> Path | None:
        base = self.root / Path(*dotted.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.exists():
                return candidate
        return None

    def find(self, module: str, name: str, seen: set | None = None) -> tuple[str, ast.AST] | None:
        """(module, definition) of ``name`` as seen from ``module``, or None."""
        seen = seen if seen is not None else set()
        if (module, name) in seen:
            return None
        seen.add((module, name))
        path = self.module_path(module)
        if path is None:
            return None
        tree = ast.parse(path.read_text())
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return module, node
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level:
                parts = package.split(".")
                target = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                for alias in node.names:
                    if alias.name == "*" or (alias.asname or alias.name) == name:
                        found = self.find(target, alias.name if alias.name != "*" else name, seen)
                        if found:
                            return found
        return None


def fits(function: ast.FunctionDef, positional: int, keywords: tuple[str, ...], method: bool) -> str | None:
    """Why hwbench's call does not fit ``function``'s signature, or None."""
    args = function.args
    params = [a.arg for a in args.posonlyargs + args.args][1 if method else 0:]
    required = len(params) - len(args.defaults)
    if positional > len(params) and args.vararg is None:
        return f"takes at most {len(params)} positional, hwbench passes {positional}"
    missing = [p for p in params[positional:required] if p not in keywords]
    if missing:
        return f"needs {', '.join(missing)}"
    names = set(params) | {a.arg for a in args.kwonlyargs}
    unknown = [k for k in keywords if k not in names and args.kwarg is None]
    if unknown:
        return f"has no parameter {', '.join(unknown)}"
    return None


def signature(function: ast.FunctionDef) -> str:
    return f"{function.name}({ast.unparse(function.args)})"


def check_name(package: Package, name: str) -> tuple[bool, str]:
    positional, keywords = CALLS[name]
    owner, _, method = name.partition(".")
    found = package.find("torch_npu.npu", owner)
    if found is None:
        return False, "not defined in torch_npu/npu (Python sources)"
    module, node = found
    if method:
        definitions = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == method]
        if not definitions:
            return False, f"{owner} ({module}) has no method {method}"
        node = definitions[0]
    elif isinstance(node, ast.ClassDef):
        constructors = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in ("__new__", "__init__")]
        if not constructors:
            return True, f"class in {module}, constructor in a compiled base (not checkable)"
        node = constructors[0]
    problem = fits(node, positional, keywords, method=bool(method) or node.name in ("__new__", "__init__"))
    where = f"{module}: {signature(node)}"
    return (problem is None), (where if problem is None else f"{where}: {problem}")


def check_extras(root: Path) -> list[tuple[str, bool, str]]:
    """The facts beside the signatures that hwbench and the stand-in rely on."""
    npu = root / "torch_npu"
    memory = (npu / "npu" / "memory.py").read_text()
    streams = (npu / "npu" / "streams.py").read_text()
    init = (npu / "__init__.py").read_text()
    entry_points = next(root.glob("torch_npu-*.dist-info/entry_points.txt"), None)
    entry_text = entry_points.read_text() if entry_points else ""
    elapsed = re.search(r"def elapsed_time\(self, end_event\):\s*(?:r?\"\"\"(.*?)\"\"\")?", streams, re.S)
    version = re.search(r"__version__ = '([^']+)'", (npu / "version.py").read_text())
    results = [(f"memory_stats key {key!r}", key in memory, "named in torch_npu/npu/memory.py"
                if key in memory else "not named in torch_npu/npu/memory.py") for key in MEMORY_STATS_KEYS]
    results += [
        ("get_device_properties(...).total_memory", "total_memory" in (npu / "npu" / "__init__.py").read_text(),
         "read by torch_npu.npu.mem_get_info, so the property exists"),
        ("Event.elapsed_time in milliseconds", bool(elapsed and elapsed.group(1) and "millisecond" in elapsed.group(1)),
         (elapsed.group(1) or "").strip().splitlines()[0] if elapsed and elapsed.group(1) else "no docstring"),
        ("entry point torch.backends: torch_npu = torch_npu:_autoload",
         bool(re.search(r"\[torch\.backends\]\s*torch_npu = torch_npu:_autoload", entry_text)),
         "so plain `import torch` imports torch_npu (the stand-in has the same entry point)"),
        ("_check_device_conflict raises RuntimeError", "def _check_device_conflict" in init
         and "raise RuntimeError(" in init, "import torch_npu under a CUDA torch: a RuntimeError, not an ImportError"),
        ("__version__", bool(version), version.group(1) if version else "no torch_npu/version.py"),
    ]
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "torch_npu" / "npu" / "__init__.py").exists():
        print("usage: check_wheel_fidelity.py UNPACKED_WHEEL_DIR (the folder holding torch_npu/)", file=sys.stderr)
        return 2
    root = Path(argv[0])
    package = Package(root)
    called = calls_in_hwbench() | {n.partition(".")[0] for n in CALLS}
    lines: list[tuple[str, bool, str]] = []
    for name in sorted(called | set(CALLS)):
        if name not in CALLS:
            lines.append((f"torch.npu.{name}", False, "called by hwbench but not in CALLS: add how it is called"))
            continue
        ok, detail = check_name(package, name)
        lines.append((f"torch.npu.{name}", ok, detail))
    lines += check_extras(root)
    width = max(len(name) for name, _, _ in lines)
    for name, ok, detail in lines:
        print(f"{'ok ' if ok else 'BAD'}  {name:<{width}}  {detail}")
    bad = sum(1 for _, ok, _ in lines if not ok)
    print(f"\n{len(lines) - bad} ok, {bad} not, against {root}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
