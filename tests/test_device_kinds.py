"""One registry of device kinds (hwbench/device/kinds.py): every kind in it has what the rest of
hwbench reads from it (its Backend class, a preflight reader, calibration defaults, a place in
--device auto's order, a Kubernetes resource, a catalog entry), and no other module of hwbench
keeps its own table of kinds: adding a kind touches the registry, its backend and telemetry
modules, a catalog YAML and its stand-in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hwbench.device.kinds import AUTO_ORDER, DEVICE_CHOICES, DEVICE_KINDS, FALLBACK_KIND, KINDS, import_named

PACKAGE = Path(__file__).resolve().parent.parent / "hwbench"
REGISTRY = PACKAGE / "device" / "kinds.py"


@pytest.mark.parametrize("name", DEVICE_KINDS)
def test_each_kind_names_a_backend_class_that_imports_and_agrees_with_its_entry(name):
    kind = KINDS[name]
    backend = import_named(kind.backend_class)
    assert (backend.name, backend.dist_backend, backend.deepspeed_accelerator) == (
        name, kind.dist_backend, kind.deepspeed_accelerator)


@pytest.mark.parametrize("name", DEVICE_KINDS)
def test_each_kind_has_a_preflight_reader_and_calibration_defaults(name):
    from hwbench.catalog import PRECISIONS
    from hwbench.device.preflight import READERS

    kind = KINDS[name]
    assert kind.preflight is not None and callable(import_named(kind.preflight.reader))
    assert READERS[name][0] == kind.preflight.source
    defaults = kind.calibration
    assert defaults.sizes and all(size > 0 for size in defaults.sizes)
    assert "fp32" in defaults.precisions and set(defaults.precisions) <= set(PRECISIONS)
    low, high = defaults.plausible_flops
    assert 0 < low < high
    assert defaults.copy_bytes > 0 and defaults.probe_gemm_size > 0 and defaults.probe_copy_bytes > 0


def test_auto_tries_every_accelerator_once_then_the_cpu():
    from hwbench.device import _accelerator_classes
    from hwbench.options import RUN_OPTIONS

    assert sorted(AUTO_ORDER) == sorted(DEVICE_KINDS) and FALLBACK_KIND == "cpu"
    assert list(_accelerator_classes()) == list(AUTO_ORDER[:-1])
    assert DEVICE_CHOICES == ("auto", *DEVICE_KINDS)
    # --device's help says the order the registry gives
    assert RUN_OPTIONS["device"].help == f"auto picks npu, then {', '.join(AUTO_ORDER[1:-1])}, then cpu"


def test_every_accelerator_has_a_pod_resource_and_a_catalog_entry():
    from hwbench.catalog import BACKENDS, load_catalog
    from hwbench.k8s import DEVICE_RESOURCES, POD_DEVICES

    assert BACKENDS == DEVICE_KINDS and set(POD_DEVICES) == set(DEVICE_KINDS)
    in_catalog = {entry.backend for entry in load_catalog().devices.values()}
    for name in DEVICE_KINDS:
        if name != FALLBACK_KIND:
            assert DEVICE_RESOURCES[name] and name in in_catalog, name


def kind_tables(root: Path) -> list[str]:
    """Each literal tuple, list, set or dict (its keys) in ``root``'s modules, the registry
    apart, that names two device kinds or more: a table of kinds kept beside the registry."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == REGISTRY.name and path.parent.name == "device":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                items = node.elts
            elif isinstance(node, ast.Dict):
                items = [key for key in node.keys if key is not None]
            else:
                continue
            names = [item.value for item in items if isinstance(item, ast.Constant) and item.value in KINDS]
            if len(names) >= 2:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {names}")
    return found


def test_no_module_but_the_registry_keeps_a_table_of_device_kinds():
    assert kind_tables(PACKAGE) == []


def test_the_table_finder_finds_a_table_of_kinds(tmp_path):
    """The check above can fail: a module with its own tables of kinds (as catalog.py, k8s.py and
    calibration/__init__.py had) is named, line by line."""
    (tmp_path / "vendor.py").write_text('BACKENDS = ("cpu", "cuda")\nSIZES = {"npu": 1, "hpu": 2}\n'
                                        'ONE = ("cpu", "auto")\n')
    assert kind_tables(tmp_path) == ["vendor.py:1: ['cpu', 'cuda']", "vendor.py:2: ['npu', 'hpu']"]
