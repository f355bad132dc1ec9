"""`hwbench report`: published tables as data, per-device normalisation, cost and
energy per token, the Markdown/HTML/CSV/JSON outputs and bad input. Fast: the
fixture results under tests/data/report/ were made once (make_fixtures.py) with
hand-set figures, so every expected value below is computed by hand."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

from hwbench.cli import run_command
from hwbench.errors import UsageError
from hwbench.report.published import REQUIRED_COLUMNS, load_published


def main(argv):
    return run_command("report", argv)

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "report"
GOOD, BAD = DATA / "good", DATA / "bad"
PUBLISHED = REPO / "results" / "published"
A, B, C = (
    "20261121T100000Z-345m-cuda-aaaaaa",
    "20261121T130000Z-tiny-cpu-bbbbbb",
    "20261121T120000Z-345m-nomp-npu-cccccc",
)
D = "20261121T110000Z-345m-cuda-dddddd"


def run_report(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads(run_report(str(GOOD), "--format", "json", "--price", "h100-sxm=2.5", "--against", str(PUBLISHED)))


def _run(data: dict, run_id: str) -> dict:
    return next(r for r in data["runs"] if r["run_id"] == run_id)


# --- the published tables ------------------------------------------------------------


def test_published_tables_hold_exactly_the_facts_figures():
    table = pd.concat([load_published(PUBLISHED / "table2.csv"), load_published(PUBLISHED / "table3.csv")])
    got = {
        (int(r.table), r.name, r.model): (
            r.params,
            None if pd.isna(r.ppl) else r.ppl,
            r.samples_per_s,
            int(r.seq_length),
            None if pd.isna(r.steps) else int(r.steps),
        )
        for r in table.itertuples()
    }
    assert got == {
        (2, "8p-GPU(V)", "345m"): ("345M", 26.375, 37.8, 1024, 500000),
        (2, "8p-NPU", "345m"): ("345M", 26.485, 59.7, 1024, 500000),
        (2, "8p-GPU(V)", "1.3b"): ("1.3B", None, 15.71, 1024, None),
        (2, "8p-NPU", "1.3b"): ("1.3B", None, 21.47, 1024, None),
        (2, "8p-GPU(V)", "2.7b"): ("2.7B", None, 4.125, 2048, None),
        (2, "8p-NPU", "2.7b"): ("2.7B", None, 5.280, 2048, None),
        (2, "8p-GPU(V)", "3.7b"): ("3.7B", None, 3.120, 2048, None),
        (2, "8p-NPU", "3.7b"): ("3.7B", None, 4.558, 2048, None),
        (3, "8p-GPU(A)", "345m-nomp"): ("345M", 28.67, 235.0, 1024, 100000),
        (3, "8p-NPU", "345m-nomp"): ("345M", 28.71, 227.0, 1024, 100000),
    }
    assert set(table["devices"]) == {8.0}
    layouts = {
        (r.model, int(r.tp), int(r.pp), int(r.micro_batch_size), int(r.global_batch_size)) for r in table.itertuples()
    }
    assert layouts == {
        ("345m", 1, 2, 4, 16),
        ("1.3b", 2, 2, 8, 32),
        ("2.7b", 2, 2, 8, 32),
        ("3.7b", 2, 2, 4, 16),
        ("345m-nomp", 1, 1, 8, 64),
    }  # the ModelZoo GPT-2 scripts' settings
    # activation checkpointing on, off for 345M_without_mp (the same scripts)
    assert {r.model: r.recompute for r in table.itertuples()} == {
        "345m": True,
        "1.3b": True,
        "2.7b": True,
        "3.7b": True,
        "345m-nomp": False,
    }
    assert set(table["precision"]) == {"fp16"}


def test_published_csv_missing_columns_is_one_line_usage_error(tmp_path):
    bad = tmp_path / "table9.csv"
    text = (PUBLISHED / "table2.csv").read_text().splitlines()
    columns = text[0].split(",")
    keep = [i for i, c in enumerate(columns) if c not in ("samples_per_s", "ppl")]
    bad.write_text("\n".join(",".join(line.split(",")[i] for i in keep) for line in text) + "\n")
    with pytest.raises(UsageError) as error:
        load_published(bad)
    message = str(error.value)
    assert "\n" not in message and str(bad) in message and "ppl" in message and "samples_per_s" in message
    with pytest.raises(UsageError, match="missing column"):
        main([str(GOOD), "--against", str(bad)])


def test_published_csv_bad_number(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text(",".join(REQUIRED_COLUMNS) + "\n2,8p-X,345m,345M,8,1,2,1024,,fast,\n")
    with pytest.raises(UsageError, match=r"line 2: column samples_per_s is 'fast'"):
        load_published(bad)


def test_published_csv_bad_recompute(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text(",".join(REQUIRED_COLUMNS) + ",recompute\n2,8p-X,345m,345M,8,1,2,1024,,37.8,,maybe\n")
    with pytest.raises(UsageError, match=r"line 2: column recompute is 'maybe'; accepted: true, false"):
        load_published(bad)


# --- figures computed by hand -----------------------------------------------------------


def test_ratios_and_per_device_normalisation(data):
    rows = {(c["run_id"], c["table"], c["name"]): c for c in data["comparison"]}
    # a: 345m TP1 PP2 on 2 devices, 14.925 samples/s; matches both Table 2 345m rows (TP1 PP2)
    npu = rows[(A, "2", "8p-NPU")]
    assert npu["ratio"] == pytest.approx(14.925 / 59.7) == pytest.approx(0.25)
    assert npu["measured_samples_per_s_per_device"] == pytest.approx(14.925 / 2)
    assert npu["published_samples_per_s_per_device"] == pytest.approx(59.7 / 8)
    assert npu["ratio_per_device"] == pytest.approx(1.0)
    gpu = rows[(A, "2", "8p-GPU(V)")]
    assert gpu["ratio"] == pytest.approx(14.925 / 37.8)
    assert gpu["ratio_per_device"] == pytest.approx((14.925 / 2) / (37.8 / 8))
    # c: 345m-nomp on 1 simulated NPU, 14.1875 samples/s against Table 3
    assert rows[(C, "3", "8p-NPU")]["ratio"] == pytest.approx(0.0625)
    assert rows[(C, "3", "8p-NPU")]["ratio_per_device"] == pytest.approx(0.5)
    assert rows[(C, "3", "8p-GPU(A)")]["ratio_per_device"] == pytest.approx(14.1875 / (235 / 8))
    # a's layout is the published one; only its device count differs
    assert npu["same_layout"] and npu["differences"] == [
        "devices 2 vs 8",
        "recompute off vs on",
        "engine native vs deepspeed",
    ]
    # d: 345m TP1 PP1 on 1 GPU, 8 samples/s: a 1-device run read against the 8-device rows per device,
    # its different layout named
    d = rows[(D, "2", "8p-GPU(V)")]
    assert not d["same_layout"] and d["differences"] == [
        "PP 1 vs 2",
        "devices 1 vs 8",
        "recompute off vs on",
        "engine native vs deepspeed",
    ]
    assert d["ratio"] == pytest.approx(8 / 37.8)
    assert d["ratio_per_device"] == pytest.approx(8 / (37.8 / 8))
    assert rows[(D, "2", "8p-NPU")]["ratio_per_device"] == pytest.approx(8 / (59.7 / 8))
    # b (tiny: no published row) and e (oom) are not compared
    assert {c["run_id"] for c in data["comparison"]} == {A, C, D}
    assert len(data["comparison"]) == 6


def test_differences_name_every_setting_that_differs():
    from hwbench.report.against_published import setting_differences

    pub = pd.Series(
        {
            "tp": 2.0,
            "pp": 2.0,
            "devices": 8.0,
            "seq_length": 1024.0,
            "global_batch_size": 32.0,
            "micro_batch_size": 8.0,
            "precision": "fp16",
            "recompute": True,
        }
    )
    same = pd.Series(
        {
            "tp": 2,
            "pp": 2,
            "world_size": 8,
            "seq_length": 1024,
            "global_batch_size": 32,
            "micro_batch_size": 8,
            "precision": "fp16",
            "recompute": True,
        }
    )
    assert setting_differences(same, pub) == []
    # the engine: the shipped published rows were measured with Megatron-DeepSpeed
    assert setting_differences(pd.Series({**same, "engine": "native"}), pub) == ["engine native vs deepspeed"]
    assert setting_differences(pd.Series({**same, "engine": "deepspeed"}), pub) == []
    assert setting_differences(pd.Series({**same, "engine": "deepspeed"}), pd.Series({**pub, "engine": "native"})) == [
        "engine deepspeed vs native"
    ]
    other = pd.Series(
        {
            "tp": 1,
            "pp": 1,
            "world_size": 1,
            "seq_length": 2048,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "precision": "bf16",
            "recompute": False,
        }
    )
    assert setting_differences(other, pub) == [
        "TP 1 vs 2",
        "PP 1 vs 2",
        "devices 1 vs 8",
        "seq 2048 vs 1024",
        "global batch 8 vs 32",
        "micro batch 2 vs 8",
        "precision bf16 vs fp16",
        "recompute off vs on",
    ]
    # a published row that leaves a setting empty matches any value of it
    assert setting_differences(other, pd.Series({"tp": float("nan"), "pp": None, "devices": 8.0})) == ["devices 1 vs 8"]
    # a setting the run did not record is named, not taken for the same
    assert setting_differences(
        pd.Series({"tp": 2, "pp": 2, "world_size": 8, "seq_length": None}),
        pd.Series({"tp": 2.0, "pp": 2.0, "devices": 8.0, "seq_length": 1024.0}),
    ) == ["seq ? vs 1024"]


def test_cost_energy_and_projection_by_hand(data):
    a = _run(data, A)
    tokens_per_s = 14.925 * 1024
    assert a["cost_per_million_tokens_usd"] == pytest.approx(2.5 / 3600 * 2 / tokens_per_s * 1e6)
    assert a["price_source"] == "--price h100-sxm"
    # 2 devices x 1000 J over 4 timed steps x 16 samples x 1024 tokens
    assert a["energy_j"] == 2000 and a["timed_tokens"] == 4 * 16 * 1024
    assert a["energy_per_token_j"] == pytest.approx(2000 / 65536)
    assert a["power_w_mean"] == 800
    # the default budget: 20 tokens per parameter (Hoffmann et al. 2022) of the 345m fixture's 354,871,296
    budget = 20 * 354_871_296
    assert a["token_budget"] == budget and "20 tokens per parameter" in a["token_budget_basis"]
    # 345m on the H100 was measured at 1 device (d: 8 samples/s) and 2 (a: 14.925): the fitted slope of
    # log2 tokens/s on log2 devices is log2(14.925 / 8), and a is projected from 2 to 8 devices with it
    slope = math.log2(14.925 / 8)
    projected = tokens_per_s * (8 / 2) ** slope
    days = budget / projected / 86400
    assert a["projected_tokens_per_s"] == pytest.approx(projected)
    assert a["projected_days"] == pytest.approx(days)
    assert a["projected_cost_usd"] == pytest.approx(2.5 * 8 * days * 24)
    assert "fitted to 1, 2 devices (93% efficiency per doubling)" in a["projection_basis"]
    assert 2 ** (slope - 1) == pytest.approx(0.9328, abs=1e-4)
    # b: price 0.36 USD/h from the result, 512 tokens/s on 1 CPU; no telemetry on the CPU
    b = _run(data, B)
    assert b["cost_per_million_tokens_usd"] == pytest.approx(0.1953125)
    assert b["energy_per_token_j"] is None and "CPU backend" in b["energy_reason"]
    # c: a simulated NPU: no price, energy or projection, each with the reason
    c = _run(data, C)
    assert c["cost_per_million_tokens_usd"] is None and c["price_source"].startswith("not priced: a simulated device")
    assert c["energy_per_token_j"] is None and c["energy_reason"].startswith("not counted: a simulated device")
    assert c["projected_days"] is None and c["projection_basis"].startswith("not projected: a simulated device")


def test_price_by_device_model_and_projection_options():
    data = json.loads(
        run_report(
            str(GOOD / "a-345m-h100x2.json"),
            "--format",
            "json",
            "--price",
            "NVIDIA H100 80GB HBM3=3",
            "--tokens",
            "1e9",
            "--devices",
            "4",
        )
    )
    a = data["runs"][0]
    assert a["price_usd_per_hour"] == 3
    days = 1e9 / (14.925 * 1024 / 2 * 4) / 86400
    assert a["projected_days"] == pytest.approx(days)
    assert a["projected_cost_usd"] == pytest.approx(3 * 4 * days * 24)


# --- outputs --------------------------------------------------------------------------

SECTIONS = ("Decision", "Runs", "Against the published tables", "Per model", "Procurement", "Convergence",
            "Checkpoints", "Environment", "Skipped input files")


def test_markdown_has_every_section_and_the_tables():
    text = run_report(str(GOOD), "--price", "h100-sxm=2.5")
    for title in SECTIONS:
        assert f"## {title}" in text
    assert "| NAME " in text and "8p-NPU" in text and "59.7" in text and "26.485" in text
    assert f"↳ measured {A}" in text and "0.250" in text and "1.000" in text
    assert "$0.0909" in text and "$0.1953" in text and "0.030518 J" in text
    assert "simulated device" in text and "[CPU]" in text
    assert "linear scaling" in text and "samples/s / its world size" in text
    assert "runs differ in torch_version" in text and "runs differ in precision" in text
    assert "CUDA out of memory" in text
    assert "nan" not in text.lower().replace("nanos", "")


def test_html_is_self_contained_with_plots(tmp_path):
    out = tmp_path / "r.html"
    assert main([str(GOOD), "--format", "html", "--out", str(out), "--price", "h100-sxm=2.5"]) == 0
    text = out.read_text()
    for title in SECTIONS:
        assert f"<h2>{title}</h2>" in text
    # one chart per model and kind, inline SVG: 345m (throughput, scaling over 1 and 2 H100s, memory, loss),
    # 345m-nomp and tiny (throughput, memory, loss each: one device count, no scaling plot); and the
    # decision's chart of each workload
    charts = re.findall(r'<svg class="chart"[^>]*aria-label="([^"]*)"', text)
    assert sorted(charts) == sorted(
        [
            "345m, fp16: best point per device model",
            "345m-nomp, fp16: best point per device model",
            "tiny, fp32: best point per device model",
            "345m: throughput per device charged",
            "345m: scaling with devices charged (oversubscribed runs left out)",
            "345m: peak memory per device",
            "345m: training loss (warm-up steps included)",
            "345m-nomp: throughput per device charged",
            "345m-nomp: peak memory per device",
            "345m-nomp: training loss (warm-up steps included)",
            "tiny: throughput per device charged",
            "tiny: peak memory per device",
            "tiny: training loss (warm-up steps included)",
        ]
    )
    assert "<style>" in text and "<img" not in text
    # offline: no resource is fetched (the SVG namespace is an identifier, not a request)
    assert not re.search(r'(src|href)="https?://', text) and "@import" not in text
    assert text.count("<script>") == 1 and "addEventListener" in text
    assert "<table>" in text


def test_cells_write_text_and_carry_the_number():
    from hwbench.report.cells import fmt, fmt_g, gib_cell, percent, tokens_cell, usd

    cases = [  # (cell, its text in Markdown and HTML, what JSON carries)
        (fmt(1234.567), "1,234.57", 1234.567),
        (fmt(0.012345), "0.0123", 0.012345),
        (fmt(7, 0), "7", 7),
        (fmt(None), "-", None),
        (fmt(float("nan")), "-", None),
        (fmt("n/a"), "n/a", "n/a"),
        (fmt(950, 1, low=940, high=960), "950.0 (940.0-960.0)", {"value": 950, "min": 940, "max": 960}),
        (fmt(800.4, 0, " W"), "800 W", {"value": 800.4, "unit": "W"}),
        (fmt_g(26.375), "26.375", 26.375),
        (usd(1234.5, ",.0f"), "$1,234", {"value": 1234.5, "unit": "USD"}),
        (usd(None, missing="no price"), "no price", {"value": None, "reason": "no price"}),
        (gib_cell(1.5 * 2**30), "1.50 GiB", {"value": 1.5 * 2**30, "unit": "bytes"}),
        (percent(0.4123), "41.2%", {"value": 0.4123, "unit": "fraction"}),
        (tokens_cell(7.09743e9), "7.09743e9", {"value": 7.09743e9, "unit": "tokens"}),
    ]
    for cell, text, data in cases:
        assert (cell.text, str(cell), f"{cell}", cell.data()) == (text, text, text, data)
        assert cell.is_number == (cell.value is not None and not isinstance(cell.value, str))
    assert fmt(0.25, 3) + " J" == "0.25 J" and "TP" + fmt(2, 0) == "TP2"  # joined with text: text


def _cells(page: str, section: str) -> list[tuple[str, str]]:
    """(class attribute, text) of every table cell of a section of the HTML report."""
    part = page.split(f'<section id="{section}">')[1].split("</section>")[0]
    return re.findall(r'<td( class="num")?>([^<]*)</td>', part)


def test_html_aligns_numbers_by_type_and_escapes_text(tmp_path):
    """Number cells (a count, a percentage, bytes, dollars) are right-aligned and text is not, by
    the cell's type; a device model with markup in it is shown as text in tables and charts."""
    data = json.loads((GOOD / "a-345m-h100x2.json").read_text())
    data["device"]["device_model"] = 'H100 <b>"x"</b> & co'
    data["environment"]["device_models"] = [data["device"]["device_model"]]
    (tmp_path / "a.json").write_text(json.dumps(data))
    out = tmp_path / "r.html"
    assert main([str(tmp_path / "a.json"), "--format", "html", "--out", str(out), "--price", "h100-sxm=2.5"]) == 0
    page = out.read_text()
    assert "<b>" not in page and "H100 &lt;b&gt;&#34;x&#34;&lt;/b&gt; &amp; co x2" in page
    assert 'data-series="H100 &lt;b&gt;&#34;x&#34;&lt;/b&gt; &amp; co"' in page  # the throughput chart's series
    number = ' class="num"'
    per_model = {text: css for css, text in _cells(page, "per-model")}
    assert per_model[A] == per_model["TP1 PP2 DP1"] == per_model["4/16"] == per_model["- [1]"] == ""  # text
    assert per_model["1024"] == number  # the sequence length: a whole number
    assert per_model["25.0%"] == number and per_model["20.00 GiB"] == per_model["80.00 GiB"] == number
    procurement = {text: css for css, text in _cells(page, "procurement")}
    assert procurement["$0.0909"] == procurement["$645"] == procurement["0.030518 J"] == number
    assert procurement["7.09743e9"] == procurement["800 W"] == number  # the token budget, the power
    # a figure with its footnote stays a number; the note is said once under the table
    assert procurement["2 [1]"] == procurement["$2.5 [2]"] == number
    notes = page.split('<section id="procurement">')[1].split("</section>")[0].split('<ol class="notes">')[1]
    assert "<li>price: --price h100-sxm.</li>" in notes.split("</ol>")[0]


def test_csv_is_the_runs_table():
    frame = pd.read_csv(io.StringIO(run_report(str(GOOD), "--format", "csv")))
    assert len(frame) == 5
    assert {
        "run_id",
        "samples_per_s",
        "tokens_per_s_per_device",
        "cost_per_million_tokens_usd",
        "energy_per_token_j",
        "predicted_peak_bytes",
    } <= set(frame.columns)


def test_predicted_memory_from_the_planner(data):
    a = _run(data, A)
    assert a["predicted_peak_bytes"] > 0 and a["predicted_reason"] is None
    assert a["peak_bytes"] == 20 * 2**30 and a["capacity_bytes"] == 80 * 2**30


# --- bad input -------------------------------------------------------------------------


def test_empty_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as error:
        main([str(tmp_path)])
    assert "\n" not in str(error.value) and str(tmp_path) in str(error.value)


def test_missing_path_and_bad_options(tmp_path):
    for argv, pattern in (
        ([str(tmp_path / "none")], "no such file"),
        ([str(GOOD), "--price", "h100"], "--price 'h100'"),
        ([str(GOOD), "--tokens", "lots"], "--tokens 'lots'"),
        ([str(GOOD), "--projection-devices", "0"], "--projection-devices 0"),
        ([str(GOOD), "--format", "pdf"], "pdf"),
    ):
        with pytest.raises(UsageError, match=pattern):
            main(argv)


def test_truncated_and_unknown_schema_are_listed_as_skipped(tmp_path):
    text = run_report(str(BAD))
    skipped = text.split("## Skipped input files")[1]
    assert "truncated.json" in skipped and "not a complete JSON document" in skipped
    assert "future.json" in skipped and "schema_version 99 is newer than this hwbench reads (4)" in skipped
    assert B in text  # the good file is reported
    both = run_report(str(GOOD), str(BAD))  # the same run twice: reported once, the copy listed as skipped
    assert both.split("## Skipped input files")[1].count("already read from") == 1
    only_bad = tmp_path / "only-bad"
    only_bad.mkdir()
    shutil.copy(BAD / "truncated.json", only_bad)
    with pytest.raises(UsageError, match="no readable result file"):
        main([str(only_bad)])


def test_per_model_table_shows_mfu_against_the_measured_ceiling_or_why_not(tmp_path):
    shutil.copytree(GOOD, tmp_path / "runs")
    path = tmp_path / "runs" / "a-345m-h100x2.json"  # run A
    result = json.loads(path.read_text())
    achieved = result["metrics"]["tflops_per_device"] * 1e12
    result["device"]["measured_ceiling"] = {
        "flops": achieved * 2,
        "precision": result["spec"]["precision"],
        "size": 8192,
        "measured_at": "2026-11-23T08:00:00+00:00",
        "driver": "550.54.15",
        "store": "/x/calibration.json",
    }
    result["metrics"]["mfu_measured_ceiling"] = 0.5
    path.write_text(json.dumps(result))
    text = run_report(str(tmp_path / "runs"))
    assert "MFU (measured ceiling)" in text
    per_model = text[text.index("## Per model") :]
    row = next(line for line in per_model.splitlines() if line.startswith(f"| {A}"))
    assert "50.0%" in row
    # the other runs were written before hwbench calibrate: a numbered note says so
    assert "MFU against a measured ceiling not measured: the result predates hwbench calibrate." in text


def test_also_formula_shows_another_formulas_mfu_beside_each_runs_own(tmp_path):
    shutil.copytree(GOOD, tmp_path / "runs")
    path = tmp_path / "runs" / "a-345m-h100x2.json"  # run A: a result with every formula's figures
    result = json.loads(path.read_text())
    result["metrics"]["by_formula"] = {
        "megatron-core-v0.12": {"flops_per_iteration": 1.0, "tflops_per_device": 1.0, "mfu": 0.25},
        "megatron-core-v0.7": {"flops_per_iteration": 1.1, "tflops_per_device": 1.1, "mfu": 0.275},
    }
    path.write_text(json.dumps(result))
    text = run_report(str(tmp_path / "runs"), "--also-formula", "megatron-lm")  # the old name is taken
    per_model = text[text.index("## Per model") :]
    assert "MFU (megatron-core-v0.7)" in per_model
    row = next(line for line in per_model.splitlines() if line.startswith(f"| {A}"))
    assert "27.5%" in row
    # D was written with megatron-lm (= megatron-core-v0.7) and before by_formula: its own MFU is that one
    row_d = next(line for line in per_model.splitlines() if line.startswith(f"| {D}"))
    cells = [cell.strip() for cell in row_d.split("|")]
    header = [
        cell.strip() for cell in next(line for line in per_model.splitlines() if line.startswith("| run ")).split("|")
    ]
    assert cells[header.index("MFU (megatron-core-v0.7)")] == cells[header.index("MFU")] != "-"
    plain = run_report(str(tmp_path / "runs"))
    assert "MFU (megatron" not in plain  # only when asked for
    with pytest.raises(UsageError, match="--also-formula 'flops' is not known; accepted: megatron-core-v0.12"):
        main([str(GOOD), "--also-formula", "flops"])


def test_also_formula_says_why_a_formula_could_not_count_a_run(tmp_path):
    """A formula with no term for a model (megatron-deepspeed for a mixture of experts) leaves its
    figures null with its own reason in metrics.by_formula: the report's note gives that reason,
    not the run's own MFU's."""
    shutil.copytree(GOOD, tmp_path / "runs")
    path = tmp_path / "runs" / "a-345m-h100x2.json"
    result = json.loads(path.read_text())
    why = "the megatron-deepspeed FLOPs formula ... has no mixture-of-experts term"
    result["metrics"]["by_formula"] = {"megatron-deepspeed": {
        "flops_per_iteration": None, "tflops_per_device": None, "mfu": None,
        "unmeasured": dict.fromkeys(("flops_per_iteration", "tflops_per_device", "mfu"), why)}}
    path.write_text(json.dumps(result))
    text = run_report(str(tmp_path / "runs"), "--also-formula", "megatron-deepspeed")
    assert re.fullmatch(r"- \[\d+\]", _per_model_cells(text, A)["MFU (megatron-deepspeed)"])
    assert f"MFU not measured: {why}" in text


def _per_model_cells(text: str, run_id: str) -> dict[str, str]:
    """The cells of ``run_id``'s row in the first per-model table, by column header (Markdown)."""
    lines = text[text.index("## Per model") :].splitlines()
    header = [cell.strip() for cell in next(line for line in lines if line.startswith("| run ")).split("|")]
    row = [cell.strip() for cell in next(line for line in lines if line.startswith(f"| {run_id}")).split("|")]
    return dict(zip(header, row))


def test_a_formula_that_counts_recompute_reads_hfu_for_a_run_that_recomputes(tmp_path):
    """megatron-deepspeed (Megatron-DeepSpeed's throughput_calculator) counts the recompute's extra
    forward (x4/3): for run A, which recomputes, its figure is hardware FLOPs utilisation and stands
    under HFU with a note saying why; for run D, which does not, it is MFU. The runs' own
    (model FLOPs) figure stays MFU for both."""
    shutil.copytree(GOOD, tmp_path / "runs")
    for name, recompute, mfu in (("a-345m-h100x2.json", True, 0.4), ("d-345m-h100x1.json", False, 0.3)):
        path = tmp_path / "runs" / name
        result = json.loads(path.read_text())
        result["spec"]["recompute"] = recompute
        result["metrics"]["by_formula"] = {
            "megatron-deepspeed": {"flops_per_iteration": 1.0, "tflops_per_device": 1.0, "mfu": mfu},
        }
        path.write_text(json.dumps(result))
    text = run_report(str(tmp_path / "runs"), "--also-formula", "megatron-deepspeed")
    a, d = _per_model_cells(text, A), _per_model_cells(text, D)
    assert re.fullmatch(r"40\.0% \[\d+\]", a["HFU (megatron-deepspeed)"]) and a["MFU (megatron-deepspeed)"] == "-"
    assert d["MFU (megatron-deepspeed)"] == "30.0%" and d["HFU (megatron-deepspeed)"] == "-"
    assert a["MFU"] == d["MFU"] == "25.0%" and "HFU" not in a  # megatron-lm, the runs' own: model FLOPs
    assert "HFU, not MFU: the megatron-deepspeed formula counts activation recomputation's extra forward" in text
    data = json.loads(run_report(str(tmp_path / "runs"), "--format", "json"))
    assert {r["run_id"]: r["mfu_kind"] for r in data["runs"] if r["run_id"] in (A, D)} == {A: "MFU", D: "MFU"}
    # no run recomputes: one column, MFU
    path = tmp_path / "runs" / "a-345m-h100x2.json"
    result = json.loads(path.read_text())
    result["spec"]["recompute"] = False
    path.write_text(json.dumps(result))
    text = run_report(str(tmp_path / "runs"), "--also-formula", "megatron-deepspeed")
    assert "HFU" not in text and _per_model_cells(text, A)["MFU (megatron-deepspeed)"] == "40.0%"


def test_a_runs_own_formula_that_counts_recompute_reads_hfu(tmp_path):
    """A run measured with --flops-formula megatron-deepspeed and recompute: its own figures (against
    the data sheet and the measured ceiling) are HFU, in the per-model table and the CSV's mfu_kind."""
    shutil.copytree(GOOD, tmp_path / "runs")
    path = tmp_path / "runs" / "a-345m-h100x2.json"
    result = json.loads(path.read_text())
    result["spec"].update(recompute=True, flops_formula="megatron-deepspeed")
    result["metrics"]["flops_formula"] = "megatron-deepspeed"
    path.write_text(json.dumps(result))
    text = run_report(str(tmp_path / "runs"))
    a, d = _per_model_cells(text, A), _per_model_cells(text, D)
    assert a["MFU"] == "-" and re.fullmatch(r"25\.0% \[\d+\]", a["HFU"])
    assert d["MFU"] == "25.0%" and d["HFU"] == "-"
    assert a["MFU (measured ceiling)"] == "-" and a["HFU (measured ceiling)"] != "-"
    runs = pd.read_csv(io.StringIO(run_report(str(tmp_path / "runs"), "--format", "csv")))
    assert dict(zip(runs["run_id"], runs["mfu_kind"])) == {A: "HFU", B: "MFU", C: "MFU", D: "MFU",
                                                           "20261121T140000Z-1.3b-cuda-eeeeee": "MFU"}
