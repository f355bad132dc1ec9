"""The metric registry (hwbench/metrics.py): every registered figure a result has reaches every
consumer (the Prometheus/OpenMetrics gauges, both github-action-benchmark files, Bencher's
measures, the report's runs table), and each is written for people one way, by its unit, in
compare, accept and the history alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwbench.cli import main
from hwbench.metrics import METRICS
from hwbench.report.runs import run_row
from hwbench.result.store import load_result
from hwbench.workload.flops import DEFAULT_FLOPS_FORMULA

TEMPLATE = Path(__file__).parent / "data" / "compare" / "tiny-cpu.json"


@pytest.fixture
def every_figure(tmp_path) -> Path:
    """A folder with one real CPU result given the figures it lacks (MFU, no catalog peak on this
    CPU; a mixture of experts' imbalance and expert parallelism's all-to-all share, a dense model's
    run) and its figures under the default FLOPs formula, which the exports read: a result that
    has every registered figure."""
    data = json.loads(TEMPLATE.read_text())
    metrics = data["metrics"]
    metrics["unmeasured"].pop("mfu")
    metrics.update(mfu=0.25, flops_formula=DEFAULT_FLOPS_FORMULA, by_formula={
        DEFAULT_FLOPS_FORMULA: {"flops_per_iteration": 1.0, "tflops_per_device": metrics["tflops_per_device"],
                                "mfu": 0.25}},
                   routing={"imbalance_median": 1.18, "imbalance_max": 1.3, "dropped_tokens": 0},
                   expert_parallel={"ep": 2, "all_to_all_share": 0.21})
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(data))
    return folder


def figures(folder: Path) -> dict[str, float]:
    result = load_result(next(folder.glob("*.json")))
    found = {name: metric.read(result, DEFAULT_FLOPS_FORMULA) for name, metric in METRICS.items()}
    assert None not in found.values(), found  # the fixture has every figure, or the test would prove nothing
    return found  # type: ignore[return-value]


def export(capsys, *argv) -> str:
    assert main(["export", *map(str, argv)]) == 0
    return capsys.readouterr().out


def test_every_figure_is_a_prometheus_gauge(every_figure, capsys):
    from prometheus_client.parser import text_string_to_metric_families

    samples = {sample.name: sample.value for family in text_string_to_metric_families(export(capsys, "prometheus",
                                                                                             every_figure))
               for sample in family.samples}
    for name, value in figures(every_figure).items():
        gauge = METRICS[name].gauge
        assert samples.get(gauge.name) == pytest.approx(value * gauge.factor), name


def test_every_figure_is_in_the_ci_exports_of_its_direction(every_figure, capsys):
    found = figures(every_figure)
    entries = {higher: {entry["name"].rsplit(": ", 1)[1]: entry for entry in json.loads(export(capsys, fmt,
                                                                                              every_figure))}
               for higher, fmt in ((True, "customBiggerIsBetter"), (False, "customSmallerIsBetter"))}
    (bencher,) = json.loads(export(capsys, "bencher", every_figure)).values()
    for name, value in found.items():
        metric = METRICS[name]
        entry = entries[metric.higher_is_better][metric.label]
        assert (entry["unit"], entry["value"]) == (metric.unit.name, pytest.approx(value)), name
        assert metric.label not in entries[not metric.higher_is_better], name
        assert bencher[metric.bencher_name]["value"] == pytest.approx(value), name
    assert sum(map(len, entries.values())) == len(bencher) == len(METRICS)  # no figure of its own besides


def test_every_figure_has_its_column_in_the_reports_runs_table(every_figure):
    result = load_result(next(every_figure.glob("*.json")))
    row = run_row(result, "run.json", {}, None)
    for name, metric in METRICS.items():
        assert row[metric.column] == metric.read(result), name  # the run's own figure, under its own formula


@pytest.mark.parametrize("name, value, text", [
    ("tokens_per_s", 1633.4, "1,633 tokens/s"),
    ("tokens_per_s", 12.345, "12.3 tokens/s"),
    ("tokens_per_s", 1.7e308, "1.7e+308 tokens/s"),  # no real rate: three digits, not 300
    ("samples_per_s", 4.378, "4.38 samples/s"),
    ("tflops_per_device", 0.0232, "0.0232 TFLOP/s"),
    ("mfu", 0.4123, "41.2%"),
    ("step_time_median", 0.46271, "462.7 ms"),
    ("step_time_median", 1.9523, "1.952 s"),
    ("step_time_median", 12345.6, "12,346 s"),
    ("peak_memory", 1.3 * 2 ** 30, "1.3 GiB"),
    ("all_to_all_share", 0.2104, "21.0%"),
    ("moe_imbalance", 1.1834, "1.18x"),
])
def test_a_figure_reads_the_same_in_compare_and_the_history(name, value, text):
    """compare wrote a median step time as "0.4627 s" and the history as "462.7 ms", and the
    history's throughputs without their unit: both write the registry's text now."""
    assert METRICS[name].text(value) == text


@pytest.mark.parametrize("values, unit", [([0.46, 0.52], " ms"), ([0.9, 1.2], " s")])
def test_a_step_time_axis_is_in_the_unit_its_largest_figure_is_written_in(values, unit):
    """The trend page's ticks and tooltips agree: ms where every step is under a second, else s."""
    metric = METRICS["step_time_median"]
    assert metric.unit.axis(values)[1] == unit and metric.text(max(values)).endswith(unit)


def test_every_figure_is_in_the_registry_table_of_the_docs():
    """docs/results.md lists each entry with its gauge and Bencher measure: adding a metric touches it."""
    doc = (Path(__file__).parents[1] / "docs" / "results.md").read_text()
    table = doc.split("## The compared figures: the metric registry")[1].split("\n## ")[0]
    rows = {line.split(" | ")[0].strip("| `"): line for line in table.splitlines() if line.startswith("| `")}
    assert set(rows) == set(METRICS)
    for name, metric in METRICS.items():
        assert all(f"`{text}`" in rows[name] for text in (f"metrics.{metric.stored_name}", metric.gauge.name,
                                                          metric.bencher_name, metric.column)), name
