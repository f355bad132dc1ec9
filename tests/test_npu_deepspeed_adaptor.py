"""When hwbench loads Ascend's deepspeed_npu adaptor. DeepSpeed
has its own NPU accelerator since 0.9.3; the adaptor patches only DeepSpeed
0.6.0 and 0.9.2, and Ascend's README tells users of a newer DeepSpeed to
uninstall it. So hwbench imports it only under such an old DeepSpeed, records
the decision, and turns an import failure into one line."""

from __future__ import annotations

import sys
import types

import pytest

from hwbench.device import deepspeed_support
from hwbench.device.deepspeed_support import npu_adaptor_decision
from hwbench.errors import SetupError


def real_npu() -> types.SimpleNamespace:
    return types.SimpleNamespace(name="npu", simulated=False, deepspeed_accelerator="npu")


@pytest.fixture
def adaptor_on_path(tmp_path, monkeypatch):
    """An installed deepspeed_npu that notes its import in sys.modules['_adaptor_imported']
    (or raises what ADAPTOR_RAISES names, as the real one does under a DeepSpeed it
    cannot patch)."""
    (tmp_path / "deepspeed_npu").mkdir()
    (tmp_path / "deepspeed_npu" / "__init__.py").write_text(
        "import os, sys, types\n"
        "if os.environ.get('ADAPTOR_RAISES'):\n"
        "    raise ImportError(os.environ['ADAPTOR_RAISES'])\n"
        "sys.modules['_adaptor_imported'] = types.ModuleType('_adaptor_imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deepspeed_npu", raising=False)
    monkeypatch.delitem(sys.modules, "_adaptor_imported", raising=False)
    return tmp_path


def test_installed_adaptor_is_left_alone_under_a_deepspeed_with_its_own_npu_accelerator(adaptor_on_path,
                                                                                        monkeypatch):
    monkeypatch.setattr(deepspeed_support, "_installed_deepspeed_version", lambda: "0.19.8")
    record = deepspeed_support._import_npu_adaptor(real_npu())
    assert "_adaptor_imported" not in sys.modules
    assert record == {
        "patch": "deepspeed_npu", "applied": False, "found": True, "deepspeed_version": "0.19.8",
        "why": ("DeepSpeed 0.19.8 has its own NPU accelerator (since 0.9.3); deepspeed_npu patches only "
                "DeepSpeed 0.6.0 and 0.9.2 and is left unloaded")}


def test_adaptor_is_imported_under_deepspeed_0_9_2(adaptor_on_path, monkeypatch):
    monkeypatch.setattr(deepspeed_support, "_installed_deepspeed_version", lambda: "0.9.2")
    record = deepspeed_support._import_npu_adaptor(real_npu())
    assert "_adaptor_imported" in sys.modules
    assert record["applied"] is True and record["deepspeed_version"] == "0.9.2"


def test_adaptor_that_cannot_import_is_one_line(adaptor_on_path, monkeypatch):
    monkeypatch.setattr(deepspeed_support, "_installed_deepspeed_version", lambda: "0.9.2")
    monkeypatch.setenv("ADAPTOR_RAISES", "cannot import name 'inf' from 'torch._six'\n(more)")
    with pytest.raises(SetupError) as raised:
        deepspeed_support._import_npu_adaptor(real_npu())
    assert str(raised.value) == (
        "--engine deepspeed: deepspeed_npu cannot be imported under DeepSpeed 0.9.2: ImportError: cannot import "
        "name 'inf' from 'torch._six' (or pip install 'deepspeed>=0.14', which needs no adaptor)")


@pytest.mark.parametrize("version, found, load", [
    ("0.19.8", False, False), ("0.14.0", True, False), ("0.9.3", True, False),
    ("0.9.2", True, True), ("0.6.0", True, True), ("0.9.2", False, False), (None, True, False),
])
def test_adaptor_decision(version, found, load):
    decided, why = npu_adaptor_decision(version, found)
    assert decided is load
    assert why
