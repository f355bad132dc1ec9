"""The published Llama 3 tables (results/published/llama3-*.csv) as data, and a llama3.1-8b run
placed under them in the report, Markdown, HTML and JSON. The fixture run
(tests/data/report/llama/, made by make_fixtures.py) has hand-set figures: 8 H100s, FSDP, bf16,
seq 8192, micro 2, global 16, 5,000 tokens/s per device, so every ratio below is computed by hand."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

from hwbench.cli import run_command
from hwbench.errors import UsageError
from hwbench.report.against_published import published_layout, setting_differences
from hwbench.report.published import load_published

REPO = Path(__file__).resolve().parent.parent
PUBLISHED = REPO / "results" / "published"
LLAMA_RUNS = REPO / "tests" / "data" / "report" / "llama"
F = "20261129T100000Z-llama3.1-8b-cuda-ffffff"
LLAMA_FILES = ("llama3-torchtitan.csv", "llama3-megatron-bridge.csv", "llama3-dgxc.csv")


def report(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert run_command("report", list(argv)) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def llama() -> pd.DataFrame:
    return pd.concat([load_published(PUBLISHED / name) for name in LLAMA_FILES], ignore_index=True)


def _row(table: pd.DataFrame, table_name: str, name: str) -> pd.Series:
    rows = table[(table["table"] == table_name) & (table["name"] == name)]
    assert len(rows) == 1, (table_name, name)
    return rows.iloc[0]


# --- the tables as the sources publish them -------------------------------------------


def test_the_figures_are_the_sources_own(llama):
    """Each figure as its source prints it, in the unit it prints it in (read 2026-11-29)."""
    per_gpu = {  # tokens/s per GPU as published: torchtitan's TPS/GPU, Megatron-Bridge's Tokens / sec / GPU
        ("torchtitan H100 2024-12 Table 1", "FSDP"): 5762,
        ("torchtitan H100 2024-12 Table 1", "FSDP + torch.compile"): 6667,
        ("torchtitan H100 2024-12 Table 1", "FSDP + torch.compile + Float8"): 8532,
        ("torchtitan H100 2024-12 Table 3", "FSDP"): 5605,
        ("torchtitan H100 2024-12 Table 3", "FSDP + torch.compile"): 6514,
        ("torchtitan H100 2024-12 Table 3", "FSDP + torch.compile + Float8"): 8380,
        ("torchtitan H100 2024-12 Table 4", "2D"): 829,
        ("torchtitan H100 2024-12 Table 4", "2D + AsyncTP"): 876,
        ("torchtitan H200 2025-06 (Trainy)", "NUM_NODES 4"): 10938,
        ("torchtitan H200 2025-06 (Trainy)", "NUM_NODES 8"): 10753,
        ("torchtitan B200 MXFP8", "None (bfloat16)"): 8307.5,
        ("torchtitan B200 MXFP8", "mxfp8_cublas"): 9969.0,
        ("torchtitan B200 MXFP8", "mxfp8_cublas_rceil"): 9642.0,
        ("torchtitan B200 MXFP8", "float8 tensorwise"): 10417.0,
        ("Megatron-Bridge 25.11", "DGX-GB300 FP8-CS"): 37556,
        ("Megatron-Bridge 25.11", "DGX-GB300 FP8-MX"): 36108,
        ("Megatron-Bridge 25.11", "DGX-GB200 FP8-CS"): 31508,
        ("Megatron-Bridge 25.11", "DGX-GB200 FP8-MX"): 29789,
        ("Megatron-Bridge 25.11", "DGX-B200 FP8-CS"): 30624,
        ("Megatron-Bridge 25.11", "DGX-B200 FP8-MX"): 29521,
        ("Megatron-Bridge 25.11", "DGX-H100 FP8-CS"): 14451,
        ("Megatron-Bridge 26.04.01", "DGX-GB300 FP8"): 5248,
        ("Megatron-Bridge 26.04.01", "DGX-GB300 MXFP8"): 4864,
        ("Megatron-Bridge 26.04.01", "DGX-GB300 NVFP4"): 7296,
        ("Megatron-Bridge 26.04.01", "DGX-GB200 FP8"): 4224,
        ("Megatron-Bridge 26.04.01", "DGX-GB200 MXFP8"): 3712,
        ("Megatron-Bridge 26.04.01", "DGX-GB200 NVFP4"): 4864,
        ("Megatron-Bridge 26.04.01", "DGX-H100 FP8"): 1664,
    }
    global_tokens = {  # DGX Cloud Benchmarking v25.02 prints the tokens/s of all the GPUs
        ("DGX Cloud Benchmarking v25.02", "8x H100 BF16"): 82028,
        ("DGX Cloud Benchmarking v25.02", "8x H100 FP8"): 111054,
        ("DGX Cloud Benchmarking v25.02", "64x H100 BF16"): 71756,
        ("DGX Cloud Benchmarking v25.02", "64x H100 FP8"): 100275,
    }
    tflops = {  # Megatron-Bridge's Model TFLOP / sec / GPU
        **{("Megatron-Bridge 25.11", name): figure for name, figure in (
            ("DGX-GB300 FP8-CS", 1933), ("DGX-GB300 FP8-MX", 1858), ("DGX-GB200 FP8-CS", 1622),
            ("DGX-GB200 FP8-MX", 1533), ("DGX-B200 FP8-CS", 1576), ("DGX-B200 FP8-MX", 1519),
            ("DGX-H100 FP8-CS", 744))},
        **{("Megatron-Bridge 26.04.01", name): figure for name, figure in (
            ("DGX-GB300 FP8", 2348), ("DGX-GB300 MXFP8", 2186), ("DGX-GB300 NVFP4", 3253), ("DGX-GB200 FP8", 1892),
            ("DGX-GB200 MXFP8", 1664), ("DGX-GB200 NVFP4", 2202), ("DGX-H100 FP8", 731))},
    }
    got = {(r.table, r.name): r for r in llama.itertuples()}
    assert set(got) == set(per_gpu) | set(global_tokens)
    for key, figure in per_gpu.items():
        assert got[key].tokens_per_s_per_device == figure and pd.isna(got[key].tokens_per_s), key
    for key, figure in global_tokens.items():
        assert got[key].tokens_per_s == figure and pd.isna(got[key].tokens_per_s_per_device), key
    assert {key: r.tflops_per_device for key, r in got.items() if not pd.isna(r.tflops_per_device)} == tflops
    assert llama["samples_per_s"].isna().all()  # none of these sources publishes samples/s


def test_the_layouts_batches_and_precisions_are_the_sources_own(llama):
    # torchtitan Table 1: 8 H100 (96 GB, 500 W), 1D FSDP, local batch 2, global 16
    fsdp = _row(llama, "torchtitan H100 2024-12 Table 1", "FSDP")
    assert (fsdp["devices"], fsdp["tp"], fsdp["pp"], fsdp["fsdp"], fsdp["seq_length"]) == (8, 1, 1, True, 8192)
    assert (fsdp["micro_batch_size"], fsdp["global_batch_size"], fsdp["power_limit_w"]) == (2, 16, 500)
    assert (fsdp["precision"], fsdp["compile"]) == ("bf16", False)
    float8 = _row(llama, "torchtitan H100 2024-12 Table 1", "FSDP + torch.compile + Float8")
    assert (float8["precision"], float8["compile"]) == ("fp8", True)
    table3 = _row(llama, "torchtitan H100 2024-12 Table 3", "FSDP")
    assert (table3["devices"], table3["micro_batch_size"], table3["global_batch_size"]) == (128, 2, 256)
    # torchtitan Table 4: Llama 3.1 70B on 256 GPUs, FSDP 32 x TP 8, local batch 16, global 512, full AC
    two_d = _row(llama, "torchtitan H100 2024-12 Table 4", "2D")
    assert (two_d["model"], two_d["devices"], two_d["tp"], two_d["global_batch_size"], two_d["recompute"]) == (
        "llama3.1-70b", 256, 8, 512, True)
    # Megatron-Bridge 25.11: Blackwell rows DDP (FSDP 0) at micro batch 2, the H100 row FSDP at micro batch 1
    b200 = _row(llama, "Megatron-Bridge 25.11", "DGX-B200 FP8-CS")
    assert (b200["fsdp"], b200["micro_batch_size"], b200["global_batch_size"], b200["precision"]) == (
        False, 2, 128, "fp8")
    assert "current scaling" in b200["recipe"]
    h100 = _row(llama, "Megatron-Bridge 25.11", "DGX-H100 FP8-CS")
    assert (h100["fsdp"], h100["micro_batch_size"], h100["devices"]) == (True, 1, 8)
    # Megatron-Bridge 26.04.01 70B on H100: TP4 PP8, 64 GPUs
    h100_70b = _row(llama, "Megatron-Bridge 26.04.01", "DGX-H100 FP8")
    assert (h100_70b["model"], h100_70b["tp"], h100_70b["pp"], h100_70b["devices"]) == ("llama3.1-70b", 4, 8, 64)
    # DGX Cloud v25.02: 8B at TP1 PP1 CP2, 70B at TP4 PP4 CP2, both at global batch 128
    dgxc = _row(llama, "DGX Cloud Benchmarking v25.02", "64x H100 FP8")
    assert (dgxc["tp"], dgxc["pp"], dgxc["cp"], dgxc["global_batch_size"]) == (4, 4, 2, 128)
    assert set(llama["seq_length"]) == {8192}
    assert set(llama["model"]) == {"llama3.1-8b", "llama3.1-70b"}  # the catalog's workloads


def test_every_row_names_its_source_address_day_engine_and_software(llama):
    for row in llama.itertuples():
        assert row.source and row.url.startswith("https://github.com/") and row.date_read == "2026-11-29", row.name
        assert row.engine and row.software and row.source_model and row.device_class, row.name
    # each address is pinned to the commit that was read
    assert all(re.search(r"/blob/[0-9a-f]{40}/", url) for url in llama["url"])


def test_a_row_without_a_published_throughput_is_one_line(tmp_path):
    text = (PUBLISHED / "llama3-dgxc.csv").read_text().splitlines()
    header = text[0].split(",")
    row = re.sub(r",82028,", ",,", text[1])  # the 8B BF16 row without its tokens/s
    assert row != text[1]
    bad = tmp_path / "t.csv"
    bad.write_text("\n".join([text[0], row]) + "\n")
    with pytest.raises(UsageError) as error:
        load_published(bad)
    assert "line 2: no published throughput; fill one of samples_per_s, tokens_per_s, tokens_per_s_per_device" in str(
        error.value) and "\n" not in str(error.value)
    bad.write_text(text[0] + "\n" + text[1].replace("2026-11-29", "29.11.2026") + "\n")
    with pytest.raises(UsageError, match=r"line 2: column date_read is '29.11.2026'; accepted: a day as YYYY-MM-DD"):
        load_published(bad)
    assert "tokens_per_s" in header


def test_the_default_folder_holds_the_gpt_and_llama_tables():
    table = load_published()
    assert {Path(f).name for f in table["file"]} == {"table2.csv", "table3.csv", *LLAMA_FILES}


# --- the settings that differ, said in words ---------------------------------------------


def test_layout_and_precision_differences_are_said_in_words():
    run = pd.Series({"tp": 1, "pp": 1, "world_size": 8, "seq_length": 8192, "global_batch_size": 16,
                     "micro_batch_size": 2, "precision": "bf16", "recompute": False, "compile": False, "fsdp": True,
                     "engine": "native"})
    pub = pd.Series({"tp": 1.0, "pp": 2.0, "cp": 2.0, "fsdp": False, "devices": 8.0, "seq_length": 8192.0,
                     "global_batch_size": 128.0, "micro_batch_size": 1.0, "precision": "fp8",
                     "recipe": "FP8-CS: per-tensor current scaling", "recompute": None, "compile": True,
                     "engine": "Megatron-Bridge"})
    assert setting_differences(run, pub) == [
        "PP 1 vs 2", "CP 1 vs 2", "FSDP on vs off", "global batch 16 vs 128", "micro batch 2 vs 1",
        "precision bf16 vs fp8 (FP8-CS: per-tensor current scaling)", "compile off vs on",
        "engine native vs Megatron-Bridge"]
    assert published_layout(pub) == "DDP TP1 PP2 CP2"
    assert published_layout(pd.Series({"tp": 2.0, "pp": 2.0})) == "TP2 PP2"  # the GPT tables, as before


# --- a llama3.1-8b run beside the published rows ------------------------------------------


@pytest.fixture(scope="module")
def comparison() -> dict:
    data = json.loads(report(str(LLAMA_RUNS), "--format", "json", "--against", str(PUBLISHED)))
    return {(c["table"], c["name"]): c for c in data["comparison"]}


def test_the_run_is_compared_per_device_with_every_published_row_of_its_model(comparison, llama):
    assert set(comparison) == {(r.table, r.name) for r in llama.itertuples() if r.model == "llama3.1-8b"}
    titan = comparison[("torchtitan H100 2024-12 Table 1", "FSDP")]
    assert titan["basis"] == "tokens/s" and titan["measured_tokens_per_s_per_device"] == 5000
    assert titan["ratio_per_device"] == pytest.approx(5000 / 5762)
    assert titan["differences"] == ["engine native vs torchtitan"]  # torchtitan's own Table 1 settings otherwise
    megatron = comparison[("Megatron-Bridge 25.11", "DGX-H100 FP8-CS")]
    assert megatron["ratio_per_device"] == pytest.approx(5000 / 14451)
    assert megatron["published_tflops_per_device"] == 744 and megatron["measured_tflops_per_device"] == 250
    # DGX Cloud publishes the 8 GPUs' tokens/s: per device it is divided by them
    dgxc = comparison[("DGX Cloud Benchmarking v25.02", "8x H100 BF16")]
    assert dgxc["published_tokens_per_s_per_device"] == pytest.approx(82028 / 8)
    assert dgxc["published_tokens_per_s_per_device_is_derived"] is True
    assert dgxc["ratio_per_device"] == pytest.approx(5000 / (82028 / 8))
    assert dgxc["differences"] == ["CP 1 vs 2", "global batch 16 vs 128", "micro batch 2 vs 1",
                                   "engine native vs NeMo"]
    assert comparison[("torchtitan H200 2025-06 (Trainy)", "NUM_NODES 8")]["differences"][0] == "devices 8 vs 64"


def _table_after(text: str, heading: str) -> list[str]:
    """The Markdown table rows under a heading."""
    block = text.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
    return [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| NAME")]


def test_markdown_places_the_run_under_each_published_llama_row():
    text = report(str(LLAMA_RUNS), "--against", str(PUBLISHED))
    rows = _table_after(text, "torchtitan H100 2024-12 Table 1")
    assert [row.split("|")[1].strip() for row in rows] == [
        "FSDP", f"↳ measured {F}", "FSDP + torch.compile", f"↳ measured {F}", "FSDP + torch.compile + Float8",
        f"↳ measured {F}"]
    assert "5,762" in rows[0] and "at 500 W" in rows[0] and "FSDP TP1 PP1 CP1 on 8" in rows[0]
    assert "5,000" in rows[1] and "0.868" in rows[1] and "FSDP TP1 PP1 DP8 on 8" in rows[1]
    assert "precision bf16 vs fp8 (Float8: torchao float8 of nn.Linear, dynamic scaling)" in rows[5]
    megatron = _table_after(text, "Megatron-Bridge 25.11")
    h100 = next(i for i, row in enumerate(megatron) if row.startswith("| DGX-H100 FP8-CS"))
    assert "14,451" in megatron[h100] and "744" in megatron[h100] and "0.346" in megatron[h100 + 1]
    assert "differs: global batch 16 vs 128, micro batch 2 vs 1, precision bf16 vs fp8 (FP8-CS: per-tensor " \
           "current scaling), engine native vs Megatron-Bridge" in megatron[h100 + 1]
    # the tables' sources, addresses and the day they were read stand above them
    assert "Source: torchtitan benchmarks/llama3_h100_202412_torchtitan.md, at https://github.com/pytorch/" in text
    assert "read 2026-11-29" in text
    # the derived per-GPU figure of DGX Cloud says what it was derived from
    assert "published 82,028 tokens/s on 8 GPUs, divided by them." in text
    # the 70B tables stand without a measured row: the run is an 8B one
    assert not any("measured" in row for row in _table_after(text, "Megatron-Bridge 26.04.01"))


def test_html_places_the_run_under_each_published_llama_row(tmp_path):
    out = tmp_path / "r.html"
    assert run_command("report", [str(LLAMA_RUNS), "--against", str(PUBLISHED), "--format", "html",
                                  "--out", str(out)]) == 0
    page = out.read_text()
    section = page.split("<h3>torchtitan H100 2024-12 Table 1</h3>", 1)[1].split("<h3>", 1)[0]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", section, re.S)]
    cells = [row for row in cells if row]
    assert [row[0] for row in cells][:2] == ["FSDP", f"↳ measured {F}"]  # the measured row right under it
    assert cells[0][7] == "5,762" and cells[1][7] == "5,000" and cells[1][9] == "0.868"
    assert "differs: engine native vs torchtitan" in cells[1][10]
    assert "<h3>Megatron-Bridge 25.11</h3>" in page and "14,451" in page


def test_the_published_tables_alone_put_each_precision_apart():
    """Without runs each (model, precision) of the published rows is a workload of the decision,
    holding the rows of that precision only."""
    text = report()
    fp8 = text.split("### llama3.1-8b, fp8\n", 1)[1].split("\n### ", 1)[0]
    bf16 = text.split("### llama3.1-8b, bf16\n", 1)[1].split("\n### ", 1)[0]
    assert "DGX-H100 FP8-CS (dgx-h100, fp8" in fp8 and "FSDP + torch.compile + Float8 (gpu-h100-96gb, fp8" in fp8
    assert ", bf16, " not in fp8 and ", mxfp8, " not in fp8
    assert "FSDP (gpu-h100-96gb, bf16" in bf16 and "8x H100 BF16 (gpu-h100, bf16" in bf16
    assert "FP8-CS" not in bf16 and ", fp8, " not in bf16 and ", mxfp8, " not in bf16
