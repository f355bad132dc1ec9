"""The shipped device catalog against the names real devices report."""

import re

import pytest

from hwbench.catalog import load_catalog

# torch.cuda.get_device_name / torch.npu.get_device_name as real machines report them, and the
# entry each must resolve to (None: no shipped entry, so MFU is null rather than another card's).
REAL_NAMES = {
    ("cuda", "NVIDIA H100 80GB HBM3"): "h100-sxm",
    ("cuda", "NVIDIA H100 PCIe"): "h100-pcie",
    ("cuda", "NVIDIA H100 NVL"): "h100-nvl",
    ("cuda", "NVIDIA H200"): "h200",
    ("cuda", "NVIDIA H200 NVL"): "h200-nvl",
    ("cuda", "NVIDIA GH200 480GB"): None,
    ("cuda", "NVIDIA GH200 144G HBM3e"): None,
    ("cuda", "NVIDIA H20"): None,
    ("cuda", "NVIDIA H800"): None,
    ("cuda", "NVIDIA A100-SXM4-80GB"): "a100-sxm",
    ("cuda", "NVIDIA A100-SXM4-40GB"): "a100-sxm",
    ("cuda", "NVIDIA A100 80GB PCIe"): None,
    ("cuda", "NVIDIA A100-PCIE-40GB"): None,
    ("cuda", "Tesla V100-SXM2-32GB"): "v100-sxm2",
    ("cuda", "Tesla V100-SXM2-16GB"): "v100-sxm2",
    ("cuda", "Tesla V100-PCIE-32GB"): "v100-pcie",
    ("cuda", "Tesla V100-PCIE-16GB"): "v100-pcie",
    ("cuda", "Tesla V100S-PCIE-32GB"): None,
    ("npu", "Ascend910A"): "ascend-910",
    ("npu", "Ascend910ProB"): "ascend-910",
    ("npu", "Ascend910B3"): "ascend-910b",
    ("npu", "Ascend910B4"): "ascend-910b",
}


def matching_entries(catalog, backend, name):
    """Every entry with a pattern that matches, not only the one match_device picks."""
    return sorted(entry.name for entry in catalog.devices.values()
                  if entry.backend == backend and any(re.search(p, name, re.IGNORECASE) for p in entry.match))


@pytest.mark.parametrize(("backend", "name"), sorted(REAL_NAMES))
def test_a_real_device_name_matches_exactly_its_own_entry(backend, name):
    catalog = load_catalog()
    expected = REAL_NAMES[(backend, name)]
    assert matching_entries(catalog, backend, name) == ([expected] if expected else [])
    found = catalog.match_device(backend, name)
    assert (found.name if found else None) == expected


def test_the_grace_hopper_superchip_is_not_taken_for_an_h200():
    found = load_catalog().match_device("cuda", "NVIDIA GH200 480GB")
    assert found is None or found.name != "h200"


def test_every_shipped_cuda_entry_is_reached_by_a_real_name():
    # A pattern that no listed name reaches is either dead or a name this test should list.
    catalog = load_catalog()
    reached = {entry for entry in REAL_NAMES.values() if entry}
    assert reached == set(catalog.devices)


def test_the_h200_nvl_has_its_own_dense_peaks_and_power():
    entry = load_catalog().devices["h200-nvl"]
    assert entry.peak("bf16") == (835.5e12, None) and entry.peak("fp16") == (835.5e12, None)
    assert entry.tdp_watts == 600 and entry.peak_flops_source
