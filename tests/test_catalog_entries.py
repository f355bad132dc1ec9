"""Catalog entries are the models that read their files: what an entry holds beside the file's
fields (its path, the resolved warm-up) is not a field a file may give, and what it holds is
immutable."""

import dataclasses

import pydantic
import pytest

from hwbench.catalog import CatalogError, _cached, load_catalog
from hwbench.workload.config import GPTConfig

NULL = "{dense: null, unavailable: x, listed: 1.0e12, source: a note}"
DEVICE = (f"name: mine\nvendor: me\nbackend: cuda\ntitle: Mine\nmatch: ['Mine']\n"
          f"peak_flops: {{bf16: {NULL}, fp16: {NULL}, fp32: {NULL}}}\n")


def _catalog(tmp_path, monkeypatch, kind: str, text: str):
    folder = tmp_path / kind
    folder.mkdir(exist_ok=True)
    (folder / "mine.yaml").write_text(text)
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    _cached.cache_clear()
    return load_catalog()


def _mine() -> str:
    """The shipped tiny workload's file, named mine."""
    return open(load_catalog().workloads["tiny"].path).read().replace("name: tiny", "name: mine")


@pytest.mark.parametrize("kind", ["devices", "workloads"])
def test_a_file_cannot_give_the_path_an_entry_keeps(tmp_path, monkeypatch, kind):
    text = DEVICE if kind == "devices" else _mine()
    with pytest.raises(CatalogError, match=r"mine.yaml: field path: is not a field here; the fields here are: .*name"):
        _catalog(tmp_path, monkeypatch, kind, text + "path: /elsewhere.yaml\n")


def test_a_mistyped_model_field_is_named_with_gptconfigs_fields(tmp_path, monkeypatch):
    text = _mine().replace("  num_layers:", "  num_heads: 4\n  num_layers:")
    with pytest.raises(CatalogError) as refused:
        _catalog(tmp_path, monkeypatch, "workloads", text)
    fields = ", ".join(sorted(field.name for field in dataclasses.fields(GPTConfig)))
    assert f"field model.num_heads: is not a field here; the fields here are: {fields}" in str(refused.value)


def test_an_entry_holds_its_path_its_peaks_by_precision_and_no_notes_beside_a_null_figure(tmp_path, monkeypatch):
    entry = _catalog(tmp_path, monkeypatch, "devices", DEVICE).devices["mine"]
    assert entry.path == str(tmp_path / "devices" / "mine.yaml")
    assert list(entry.peak_flops) == ["fp32", "bf16", "fp16"] and entry.match == ("Mine",)
    figure = entry.peak_flops["bf16"]
    assert (figure.dense, figure.listed, figure.source, figure.unavailable) == (None, None, None, "x")
    assert entry.peak("bf16") == (None, f"the catalog entry 'mine' ({entry.path}) has no bf16 peak: x")


def test_a_workload_holds_the_warmup_its_fraction_gives_and_is_immutable(tmp_path, monkeypatch):
    text = (_mine()
            .replace("  lr_warmup_iters: 2", "  lr_warmup_fraction: 0.013").replace("published: null", ""))
    workload = _catalog(tmp_path, monkeypatch, "workloads", text).workloads["mine"]
    assert workload.training.lr_warmup_iters == round(0.013 * workload.training.lr_decay_iters) == 3
    assert isinstance(workload.model, GPTConfig) and workload.published is None
    assert hash(workload) == hash(load_catalog().workloads["mine"])  # as a frozen dataclass was
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        workload.training.seq_length = 1
    assert load_catalog().workloads["345m"].published.tables == ("table2",)


@pytest.mark.parametrize("peaks, more, expected", [
    ("{bf16: {dense: null}, fp16: {dense: null, unavailable: x}, fp32: {dense: null, unavailable: x}}",
     "price_usd_per_hour: -1\n", "field price_usd_per_hour: must be >= 0, not -1"),
    ("{bf16: {dense: null}, fp16: 3, fp32: {dense: null, unavailable: x}}", "",
     "field peak_flops.fp16: must be a mapping with dense"),
])
def test_of_several_problems_one_inside_a_figure_is_named_last(tmp_path, monkeypatch, peaks, more, expected):
    text = DEVICE.replace(DEVICE.splitlines()[-1], f"peak_flops: {peaks}") + more
    with pytest.raises(CatalogError, match=expected):
        _catalog(tmp_path, monkeypatch, "devices", text)
