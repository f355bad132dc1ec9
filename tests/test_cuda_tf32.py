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
