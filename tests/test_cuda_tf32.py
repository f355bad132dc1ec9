"""TF32 is turned off through torch's fp32_precision API where it exists, else the legacy flags.
Checked without a GPU: the function takes the torch.backends namespace."""

import types
import warnings

import pytest
import torch

from hwbench.device.cuda import turn_tf32_off


class LegacyFlagForbidden(types.SimpleNamespace):
    """A backend of a torch with the new API on which touching allow_tf32 is a failure."""

    def __setattr__(self, name, value):
        if name == "allow_tf32":
            raise AssertionError("the legacy allow_tf32 flag was set although fp32_precision exists")
        super().__setattr__(name, value)


def new_api_backends():
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(matmul=LegacyFlagForbidden(fp32_precision="none")),
        cudnn=LegacyFlagForbidden(fp32_precision="none", conv=types.SimpleNamespace(fp32_precision="tf32"),
                                  rnn=types.SimpleNamespace(fp32_precision="tf32")))


def legacy_backends():  # torch < 2.9: only the allow_tf32 flags
    return types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=True)),
                                 cudnn=types.SimpleNamespace(allow_tf32=True))


def test_a_torch_with_fp32_precision_gets_ieee_everywhere_and_no_legacy_flag():
    backends = new_api_backends()
    assert turn_tf32_off(backends) == "fp32_precision"
    assert backends.cuda.matmul.fp32_precision == "ieee"
    assert (backends.cudnn.fp32_precision, backends.cudnn.conv.fp32_precision,
            backends.cudnn.rnn.fp32_precision) == ("ieee", "ieee", "ieee")


def test_an_older_torch_gets_the_legacy_flags():
    backends = legacy_backends()
    assert turn_tf32_off(backends) == "allow_tf32"
    assert backends.cuda.matmul.allow_tf32 is False and backends.cudnn.allow_tf32 is False


@pytest.fixture
def restored_precision():
    b = torch.backends
    saved = (b.cuda.matmul.fp32_precision, b.cudnn.fp32_precision, b.cudnn.conv.fp32_precision,
             b.cudnn.rnn.fp32_precision)
    yield
    b.cuda.matmul.fp32_precision, b.cudnn.fp32_precision = saved[:2]
    b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision = saved[2:]


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9")
def test_the_installed_torch_takes_the_new_api_without_a_warning(restored_precision):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert turn_tf32_off(torch.backends) == "fp32_precision"
    b = torch.backends
    assert (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision) == \
        ("ieee", "ieee", "ieee")
    assert b.cuda.matmul.allow_tf32 is False  # what the legacy reader sees agrees


# --- the caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF), checked without a GPU ---

from hwbench.device.kinds import KINDS, choose_allocator_setting  # noqa: E402

CUDA_ALLOCATOR = KINDS["cuda"].allocator


def test_expandable_segments_are_set_unless_the_user_set_the_allocator():
    environ: dict[str, str] = {}
    text = choose_allocator_setting(CUDA_ALLOCATOR, environ, device_initialised=False)
    assert environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert text.startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set by hwbench")
    # a rank started by hwbench's launcher inherits it: still hwbench's, not the user's
    inherited = dict(environ)
    assert choose_allocator_setting(CUDA_ALLOCATOR, inherited, device_initialised=False) == text
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):  # the user's, under either name
        users = {name: "max_split_size_mb:512"}
        text = choose_allocator_setting(CUDA_ALLOCATOR, users, device_initialised=False)
        assert users == {name: "max_split_size_mb:512"}
        assert text == f"{name}=max_split_size_mb:512 (the user's, left as it is)"
    # too late: CUDA already read its settings; say so rather than claim a setting that is not in effect
    late: dict[str, str] = {}
    assert choose_allocator_setting(CUDA_ALLOCATOR, late, device_initialised=True).startswith("unchanged: the "
                                                                                                "device was")
    assert late == {}


def test_the_cuda_backend_sets_the_allocator_before_its_first_cuda_call(monkeypatch):
    import os

    from hwbench.device.cuda import CudaBackend
    from hwbench.errors import SetupError

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("HWBENCH_SET_PYTORCH_CUDA_ALLOC_CONF", raising=False)
    seen = []
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: seen.append(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
                        or False)
    with pytest.raises(SetupError, match="torch sees no CUDA device"):
        CudaBackend()
    assert seen == ["expandable_segments:True"]


def test_the_tuning_records_whether_the_allocator_runs_with_expandable_segments():
    from hwbench.device.cuda import expandable_segments_in_effect

    def memory(snapshot):
        return types.SimpleNamespace(_snapshot=lambda: snapshot)

    assert expandable_segments_in_effect(memory({"allocator_settings": {"expandable_segments": True}})) is True
    assert expandable_segments_in_effect(memory({"allocator_settings": {"expandable_segments": False}})) is False
    assert expandable_segments_in_effect(memory({"segments": []})) is None  # a torch that does not say
