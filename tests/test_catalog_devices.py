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
    ("cuda", "NVIDIA H200 NVL"): "h200-nvl",
    ("cuda", "NVIDIA B200"): "b200",
    ("cuda", "NVIDIA GB200"): "gb200",
    ("rocm", "AMD Instinct MI300X"): "mi300x",
    ("rocm", "AMD Instinct MI325X"): "mi325x",
    ("rocm", "AMD Instinct MI355X"): "mi355x",
    ("rocm", "AMD Instinct MI250X"): "mi250x",
    ("rocm", "AMD Instinct MI250X/MI250"): "mi250x",
    ("rocm", "AMD Instinct MI210"): None,
    ("hpu", "GAUDI2"): "gaudi2",
    ("hpu", "GAUDI3"): "gaudi3",
    ("npu", "Ascend910_9392"): "ascend-a3",
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


def test_every_shipped_entry_is_reached_by_a_real_name():
    # A pattern that no listed name reaches is either dead or a name this test should list.
    catalog = load_catalog()
    reached = {entry for entry in REAL_NAMES.values() if entry} | {entry for _, _, entry in SHARED_NAMES if entry}
    assert reached == set(catalog.devices)


# Names several models report, told apart by the power limit NVML gives (H200 page: the NVL
# up to 600 W, the SXM up to 700 W), and what each resolves to.
SHARED_NAMES = [
    ("NVIDIA H200", 700.0, "h200"),
    ("NVIDIA H200", 600.0, "h200-nvl"),
    ("NVIDIA H200 PCIe", 600.0, "h200-nvl"),  # a driver that calls the NVL "H200 PCIe"
    ("NVIDIA H200 PCIe", 450.0, "h200-nvl"),
    ("NVIDIA H200", None, None),  # no power limit: no peak rather than the SXM's
    ("NVIDIA H200", 1000.0, None),
]


@pytest.mark.parametrize(("name", "watts", "expected"), SHARED_NAMES)
def test_an_ambiguous_h200_name_is_resolved_by_its_power_limit(name, watts, expected):
    found = load_catalog().identify("cuda", name, watts)
    assert (found.entry.name if found.entry else None) == expected
    assert name in found.why and ("power limit" in found.why)
    if watts is None:
        assert "did not report" in found.why


def test_every_shipped_peak_is_sourced_dated_and_dense():
    """The peak table: each figure dense, with the figure as listed, whether it was listed with
    sparsity (then halved), its source and the day it was read; or null with the reason."""
    for entry in load_catalog().devices.values():
        assert set(entry.peak_flops) == {"fp32", "bf16", "fp16", "fp8"}, entry.name  # each shipped entry has fp8
        for precision, figure in entry.peak_flops.items():
            where = f"{entry.name} {precision}"
            if figure.dense is None:
                assert figure.unavailable and len(figure.unavailable) > 20, where
                continue
            assert figure.source and figure.read and figure.sparsity in (True, False), where
            assert figure.dense == pytest.approx(figure.listed / 2 if figure.sparsity else figure.listed, rel=1e-3)


def test_the_h200_figures_are_the_h200_pages_dense_halves():
    devices = load_catalog().devices
    sxm, nvl = devices["h200"], devices["h200-nvl"]
    assert sxm.peak("bf16") == (989.5e12, None) and sxm.peak_flops["bf16"].listed == 1979e12
    assert nvl.peak("bf16") == (835.5e12, None) and nvl.peak_flops["bf16"].listed == 1671e12
    assert sxm.peak_flops["bf16"].sparsity and nvl.peak_flops["fp16"].sparsity
    assert (sxm.tdp_watts, nvl.tdp_watts) == (700, 600)


def test_the_h200_nvl_has_its_own_dense_peaks_and_power():
    entry = load_catalog().devices["h200-nvl"]
    assert entry.peak("bf16") == (835.5e12, None) and entry.peak("fp16") == (835.5e12, None)
    assert entry.tdp_watts == 600 and "H200 NVL column" in entry.peak_flops["bf16"].source
