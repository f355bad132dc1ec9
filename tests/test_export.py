"""`hwbench export`: each format made from real results and read back by its consumer's own
parser where the consumer installs here (MLPerf's mlp_parser and system description checker,
prometheus_client's parsers, a Pushgateway stand-in that records the request, TensorBoard's
EventAccumulator, pandas/pyarrow); github-action-benchmark's and Bencher's JSON against their
published shapes (the action's zod schema, as pydantic; Bencher's JSON schema). A stand-in's run
(the CUDA stand-in, tests/fakes/cuda) and a run that failed on an injected fault are real runs too."""

from __future__ import annotations

import base64
import copy
import http.server
import json
import socket
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import parity_run

import hwbench
from hwbench.cli import main
from hwbench.metrics import METRICS


@pytest.fixture(scope="module")
def results(tmp_path_factory, single_process_run) -> Path:
    """Two real runs of one point (two seeds: repeats) in one folder."""
    folder = tmp_path_factory.mktemp("export") / "results"
    folder.mkdir()
    (folder / f"{single_process_run['run_id']}.json").write_text(json.dumps(single_process_run))
    code, second = parity_run(tmp_path_factory.mktemp("export-repeat"), "--seed", "7", "--eval-interval", "1")
    assert code == 0 and second["status"] == "ok"
    (folder / f"{second['run_id']}.json").write_text(json.dumps(second))
    return folder


@pytest.fixture(scope="module")
def simulated_result(cuda_standin_result) -> Path:
    """A real run through the CUDA stand-in (conftest's cuda_standin_result): it reports the real device's name
    (an H100), marked simulated."""
    result = json.loads(cuda_standin_result.read_text())
    assert result["device"]["simulated"] is True and result["device"]["device_model"] == "NVIDIA H100 80GB HBM3"
    return cuda_standin_result


@pytest.fixture(scope="module")
def failed_result(tmp_path_factory) -> Path:
    """A real run that failed: rank 0 raised at step 2 (the fault hook, docs/reliability.md)."""
    out = tmp_path_factory.mktemp("failed") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HWBENCH_FAULT", "0:2:raise")
        code, result = parity_run(out)
    assert code == 1 and result["status"] == "failed"
    # the one process's own record of its failure (the default run's fault sweep leaves this point out)
    error = result["error"]
    assert error["rank"] == 0 and "InjectedFault" in error["traceback"]
    assert error["message"] == "injected fault: rank 0 raised at step 2"
    from test_docs import undocumented

    assert not undocumented(result)
    (path,) = out.glob("*.json")
    return path


def runs_of(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def one_result(results: Path) -> Path:
    """The run with validations between its steps (--eval-interval 1)."""
    return next(path for path in sorted(results.glob("*.json")) if json.loads(path.read_text())["spec"]["seed"] == 7)


def export(capsys, *argv) -> tuple[int, str, str]:
    code = main(["export", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# --- MLPerf ---------------------------------------------------------------------------------


def test_mllog_is_read_by_mlperfs_own_parser(results, tmp_path, capsys):
    mlp_parser = pytest.importorskip("mlperf_logging.compliance_checker.mlp_parser",
                                     reason="mlperf-logging is not installed (the test extra has it)")
    from mlperf_logging.mllog import constants

    source = one_result(results)
    result = json.loads(source.read_text())
    out = tmp_path / "result_0.txt"
    code, _, err = export(capsys, "mllog", source, "--out", out, "--submitter", "ACME", "--division", "open",
                          "--status", "onprem")
    assert code == 0, err
    lines, errors = mlp_parser.parse_file(str(out), ruleset="6.0.0")
    assert not errors
    by_key = {}
    for line in lines:
        by_key.setdefault(line.key, []).append(line)
    known = {value for name, value in vars(constants).items() if name.isupper() and isinstance(value, str)}
    assert set(by_key) <= known, f"keys MLPerf does not define: {set(by_key) - known}"
    for key in ("run_start", "run_stop", "block_start", "block_stop", "eval_accuracy", "global_batch_size",
                "submission_benchmark", "submission_org", "submission_division", "submission_status", "seed"):
        assert key in by_key, key
    assert by_key["submission_org"][0].value["value"] == "ACME"
    assert by_key["global_batch_size"][0].value["value"] == result["spec"]["global_batch_size"]
    # the run_start..run_stop span MLPerf scores is the timed window hwbench measured
    span_ms = by_key["run_stop"][0].timestamp - by_key["run_start"][0].timestamp
    assert span_ms == round(1000 * result["metrics"]["timed_wall_time_s"])
    # no target: not a time to train, so not MLPerf's "success"; no initialisation recorded, none stamped
    assert by_key["run_stop"][0].value["metadata"]["status"] == "aborted"
    assert by_key["run_stop"][0].value["metadata"]["hwbench_status"] == "ok"
    assert "init_start" not in by_key and "init_stop" not in by_key
    # a block of timed steps up to each validation, each eval_accuracy the validation loss at its step
    validations = result["metrics"]["validation"]
    timed = [step["step"] for step in result["steps"] if step["phase"] == "timed"]
    assert len(by_key["eval_accuracy"]) == len(validations) >= 3
    assert [line.value["metadata"]["step_num"] for line in by_key["block_stop"]] == timed
    for line, validation in zip(by_key["eval_accuracy"], validations):
        assert line.value["value"] == validation["loss"]
        assert line.value["metadata"]["step_num"] == validation["step"]
    times = [line.timestamp for line in lines]
    assert times == sorted(times)


def test_mllog_of_a_run_that_reached_its_target_has_its_initialisation_and_success(tmp_path, capsys, target_run):
    mlp_parser = pytest.importorskip("mlperf_logging.compliance_checker.mlp_parser",
                                     reason="mlperf-logging is not installed (the test extra has it)")
    # conftest's target run (tests/test_target.py's): floor*1000 is reached at the validation of step 20
    source = target_run["path"]
    target = json.loads(source.read_text())["metrics"]["time_to_target"]
    assert target["reached"] and target["init_s"] > 0
    code, _, err = export(capsys, "mllog", source, "--out", tmp_path / "result_0.txt")
    assert code == 0, err
    lines, errors = mlp_parser.parse_file(str(tmp_path / "result_0.txt"), ruleset="6.0.0")
    assert not errors
    at = {line.key: line for line in lines}
    # the initialisation the run measured, not two stamps at one instant
    assert at["init_stop"].timestamp - at["init_start"].timestamp == round(1000 * target["init_s"])
    assert at["run_start"].timestamp == at["init_stop"].timestamp
    # MLPerf's "success": the target quality reached, run_start to run_stop the time to it
    assert at["run_stop"].value["metadata"]["status"] == "success"
    assert at["run_stop"].timestamp - at["run_start"].timestamp == round(1000 * target["time_s"])
    times = [line.timestamp for line in lines]
    assert times == sorted(times)


@pytest.mark.parametrize("where", ["metrics.timed_wall_time_s", "steps[step 2].time_s",
                                   "metrics.time_to_target.init_s"])
def test_a_span_longer_than_any_run_is_one_line_not_an_overflow(results, tmp_path, capsys, where):
    damaged = json.loads(one_result(results).read_text())
    if where == "metrics.timed_wall_time_s":
        damaged["metrics"]["timed_wall_time_s"] = 1e307  # finite, so the model takes it
    elif where.startswith("steps"):
        next(step for step in damaged["steps"] if step["step"] == 2)["time_s"] = 1e307
    else:
        damaged["metrics"]["time_to_target"] = {"init_s": 1e307}
    (tmp_path / "damaged.json").write_text(json.dumps(damaged))
    code, out, err = export(capsys, "mllog", tmp_path / "damaged.json", "--out", tmp_path / "result_0.txt")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{where} 1e+307 s is longer than any run" in err and not (tmp_path / "result_0.txt").exists()


def test_mlperf_system_description_passes_mlperfs_checker(results, tmp_path, capsys):
    checker = pytest.importorskip("mlperf_logging.system_desc_checker.system_desc_checker",
                                  reason="mlperf-logging is not installed (the test extra has it)")
    source = one_result(results)
    out = tmp_path / "system.json"
    code, _, err = export(capsys, "mlperf-system", source, "--out", out, "--submitter", "ACME", "--division",
                          "open", "--status", "onprem")
    assert code == 0, err
    valid, name, _, _ = checker.check_system_desc(str(out), "training", "5.0.0")
    assert valid and name == json.loads(out.read_text())["system_name"]
    description = json.loads(out.read_text())
    assert description["status"] == "Available on-premise" and description["submitter"] == "ACME"
    # hwbench system's fields, as MLPerf's text; what the result does not record is empty and named
    system_code = main(["system", str(source)])
    system = json.loads(capsys.readouterr().out)
    assert system_code == 0
    for key, value in system.items():
        assert description[key] == ("" if value is None else str(value).lower() if isinstance(value, bool)
                                    else str(value))
    assert "host_processor_frequency" in description["sw_notes"] and description["host_processor_frequency"] == ""


# --- CI benchmark actions -------------------------------------------------------------------


def action_entries(text: str) -> list:
    """github-action-benchmark's own check of a custom file (src/extract.ts: a zod array of
    {name, value, range?, unit, extra?}), as pydantic, strict about the types hwbench writes."""
    from pydantic import BaseModel, ConfigDict, StrictFloat, StrictStr, TypeAdapter

    class BenchmarkResult(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: StrictStr
        value: StrictFloat
        range: StrictStr | None = None
        unit: StrictStr
        extra: StrictStr | None = None

    return TypeAdapter(list[BenchmarkResult]).validate_json(text)


def test_github_action_benchmark_files_split_by_direction(results, capsys):
    runs = runs_of(results)
    code, bigger, _ = export(capsys, "customBiggerIsBetter", results)
    assert code == 0
    code, smaller, _ = export(capsys, "customSmallerIsBetter", results)
    assert code == 0
    bigger_entries, smaller_entries = action_entries(bigger), action_entries(smaller)
    names = {entry.name for entry in bigger_entries}
    assert {entry.name for entry in smaller_entries}.isdisjoint(names)
    tokens = next(entry for entry in bigger_entries if entry.unit == "tokens/s")
    values = [run["metrics"]["tokens_per_s"] for run in runs]
    assert tokens.value == pytest.approx(statistics.median(values))
    assert tokens.range == f"{min(values):.6g} to {max(values):.6g} over 2 runs"
    assert all(run["run_id"] in tokens.extra for run in runs)
    step = next(entry for entry in smaller_entries if entry.unit == "s")
    assert step.value == pytest.approx(statistics.median(run["metrics"]["step_time_s"]["median"] for run in runs))
    # every lower-is-better figure the runs have (dense runs: no expert imbalance nor all-to-all share)
    from hwbench.result.model import RunResult

    read = [RunResult.from_dict(run) for run in runs]
    expected = {metric.label for metric in METRICS.values()
                if not metric.higher_is_better and any(metric.read(result) is not None for result in read)}
    assert {"median step time", "peak memory"} <= expected
    assert {entry.name.rsplit(": ", 1)[1] for entry in smaller_entries} == expected


# Bencher Metric Format's JSON schema (bencher.dev/docs/reference/bencher-metric-format)
BMF_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema", "type": "object",
    "patternProperties": {".+": {"type": "object", "patternProperties": {".+": {
        "type": "object", "properties": {"value": {"type": "number"}, "lower_value": {"type": "number"},
                                         "upper_value": {"type": "number"}},
        "required": ["value"]}}}}}


def test_bencher_metric_format_bounds_are_the_repeats(results, capsys):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (the test extra has it)")
    code, text, _ = export(capsys, "bencher", results)
    assert code == 0
    document = json.loads(text)
    jsonschema.validate(document, BMF_SCHEMA)
    (benchmark,) = document.values()
    values = [run["metrics"]["tokens_per_s"] for run in runs_of(results)]
    assert benchmark["tokens-per-s"] == {"value": pytest.approx(statistics.median(values)),
                                         "lower_value": min(values), "upper_value": max(values)}


# --- Prometheus -----------------------------------------------------------------------------


def samples(families, name: str) -> list:
    return [sample for family in families for sample in family.samples if sample.name == name]


def test_prometheus_textfile_read_by_prometheus_clients_parser(results, tmp_path, capsys):
    from prometheus_client.parser import text_string_to_metric_families

    out = tmp_path / "hwbench.prom"
    code, _, err = export(capsys, "prometheus", results, "--out", out)
    assert code == 0, err
    families = list(text_string_to_metric_families(out.read_text()))
    assert all(family.type == "gauge" and family.name.startswith("hwbench_") for family in families)
    (tokens,) = samples(families, "hwbench_throughput_tokens_per_second")
    runs = runs_of(results)
    assert tokens.value == pytest.approx(statistics.median(run["metrics"]["tokens_per_s"] for run in runs))
    assert tokens.labels["model"] == "tiny" and tokens.labels["backend"] == "cpu"
    assert tokens.labels["seq_length"] == "32" and tokens.timestamp is None  # textfile collector: no timestamps
    (flops,) = samples(families, "hwbench_model_flops_per_device_per_second")
    assert flops.value == pytest.approx(1e12 * statistics.median(r["metrics"]["tflops_per_device"] for r in runs))
    assert samples(families, "hwbench_point_runs")[0].value == 2


def test_openmetrics_read_by_the_openmetrics_parser(results, capsys):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    code, text, _ = export(capsys, "openmetrics", results)
    assert code == 0 and text.endswith("# EOF\n")
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert families["hwbench_step_time_median_seconds"].unit == "seconds"
    assert families["hwbench_throughput_tokens_per_second"].samples[0].labels["precision"] == "fp32"


class Pushgateway(http.server.BaseHTTPRequestHandler):
    """Records each request as the Pushgateway would receive it, and answers 200."""

    received: list = []  # noqa: RUF012 (one list the test reads)

    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Pushgateway.received.append((self.command, self.path, self.headers["Content-Type"], body.decode()))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_push_to_a_pushgateway(results, capsys):
    from prometheus_client.parser import text_string_to_metric_families

    server = http.server.HTTPServer(("127.0.0.1", 0), Pushgateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Pushgateway.received = []
    try:
        code, out, err = export(capsys, "prometheus", results, "--push", f"http://127.0.0.1:{server.server_port}",
                                "--job", "nightly")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, err
    (request,) = Pushgateway.received
    method, path, _content_type, body = request
    assert (method, path) == ("PUT", "/metrics/job/nightly")
    families = list(text_string_to_metric_families(body))
    assert samples(families, "hwbench_throughput_tokens_per_second")
    assert "pushed" in err and out == text_of_export(results, capsys)


def text_of_export(results, capsys) -> str:
    assert main(["export", "prometheus", str(results)]) == 0
    return capsys.readouterr().out


def test_an_unreachable_pushgateway_is_one_line_and_exit_1_with_the_file_kept(results, tmp_path, capsys):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "hwbench.prom"
    code, _, err = export(capsys, "prometheus", results, "--out", out, "--push", f"http://127.0.0.1:{port}")
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and f"--push http://127.0.0.1:{port}" in err
    assert "hwbench_throughput_tokens_per_second" in out.read_text()  # nothing lost


# --- TensorBoard, Parquet, CSV --------------------------------------------------------------


def test_tensorboard_scalars_read_by_tensorboards_event_reader(results, tmp_path, capsys):
    pytest.importorskip("tensorboard",
                        reason="the tensorboard extra is not installed (pip install -e '.[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    code, _, err = export(capsys, "tensorboard", results, "--out", tmp_path / "logs")
    assert code == 0, err
    for run in runs_of(results):
        events = EventAccumulator(str(tmp_path / "logs" / run["run_id"]))
        events.Reload()
        loss = events.Scalars("loss")
        assert [event.step for event in loss] == [step["step"] for step in run["steps"]]
        assert [event.value for event in loss] == pytest.approx([step["loss"] for step in run["steps"]])
        timed = [step for step in run["steps"] if step["phase"] == "timed"]
        assert [e.value for e in events.Scalars("step_time_s")] == pytest.approx([s["time_s"] for s in timed])
        tokens = run["spec"]["global_batch_size"] * run["spec"]["seq_length"]
        assert [e.value for e in events.Scalars("throughput/tokens_per_s")] == pytest.approx(
            [tokens / s["time_s"] for s in timed])
        assert "power/window_mean_w" not in events.Tags()["scalars"]  # --no-telemetry: no power, none invented
    # a second export of the same runs replaces their folders: no step is shown twice
    assert main(["export", "tensorboard", str(results), "--out", str(tmp_path / "logs")]) == 0
    assert all(len(list((tmp_path / "logs" / run["run_id"]).glob("events.out.tfevents.*"))) == 1
               for run in runs_of(results))


def test_parquet_and_csv_hold_the_load_results_table(results, tmp_path, capsys):
    pytest.importorskip("pyarrow", reason="the parquet extra is not installed (pip install -e '.[parquet]')")
    import pandas as pd

    table = hwbench.load_results(results)
    code, _, err = export(capsys, "parquet", results, "--out", tmp_path / "runs.parquet")
    assert code == 0, err
    parquet = pd.read_parquet(tmp_path / "runs.parquet")
    assert list(parquet.columns) == list(table.columns)
    assert sorted(parquet["metrics.tokens_per_s"]) == sorted(table["metrics.tokens_per_s"])
    assert json.loads(parquet["steps"][0]) == table["steps"][0]  # lists as JSON text
    code, _, _ = export(capsys, "csv", results, "--out", tmp_path / "runs.csv")
    csv = pd.read_csv(tmp_path / "runs.csv")
    assert code == 0 and sorted(csv["run_id"]) == sorted(table["run_id"])


def test_the_api_exports_as_the_command(results):
    outcome = hwbench.export("bencher", results)
    assert json.loads(outcome.text) and outcome.written == [] and outcome.skipped == []


# --- bad input ------------------------------------------------------------------------------


def test_an_unreadable_file_is_named_and_left_out(results, tmp_path, capsys):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for path in results.glob("*.json"):
        (folder / path.name).write_text(path.read_text())
    (folder / "truncated.json").write_text('{"schema_version": 2, "run_id"')
    failed = copy.deepcopy(runs_of(results)[0])
    failed.update(run_id="failed-run", status="failed")
    (folder / "failed.json").write_text(json.dumps(failed))
    code, text, err = export(capsys, "bencher", folder)
    assert code == 5 and json.loads(text)  # the failed run fails the gate (test_a_failed_run_...)
    assert "truncated.json" in err and "not a complete JSON document" in err
    assert "run failed-run (" in err and "status failed" in err


@pytest.mark.parametrize("argv, message", [
    (["yaml", "{results}"], "FORMAT 'yaml' is not known; accepted: mllog"),
    (["mllog", "{results}"], "mllog writes one run"),
    (["parquet", "{results}"], "parquet needs --out FILE"),
    (["bencher", "{results}", "--push", "http://127.0.0.1:9091"], "--push is for the prometheus"),
    (["prometheus", "{results}", "--push", "pushgateway:9091"], "--push 'pushgateway:9091' is not accepted"),
    # an unclosed IPv6 bracket or a port out of range passed the check, then raised ValueError in the push
    (["prometheus", "{results}", "--push", "http://[::1"], "--push 'http://[::1' is not accepted"),
    (["prometheus", "{results}", "--push", "http://127.0.0.1:99999"], "--push 'http://127.0.0.1:99999' is not"),
    (["mllog", "{one}", "--status", "sold"], "--status 'sold' is not accepted"),
    (["bencher", "{results}", "--out", "{tmp}/failed.json/x.json"], "lies under the file"),
    (["bencher", "{tmp}/missing"], "RESULTS '{tmp}/missing': no such file or folder"),
    (["bencher", "{failed}"], "RESULTS hold no run with status ok"),
    (["bencher", "{results}", "--out", "{one}"], "is one of the input files"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(results, tmp_path, capsys, argv, message):
    failed = copy.deepcopy(runs_of(results)[0])
    failed.update(status="failed")
    (tmp_path / "failed.json").write_text(json.dumps(failed))
    names = {"results": results, "one": one_result(results), "tmp": tmp_path, "failed": tmp_path / "failed.json"}
    before = {path: path.stat().st_mtime_ns for path in [*results.iterdir(), *tmp_path.iterdir()]}
    code, out, err = export(capsys, *(arg.format(**names) for arg in argv))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message.format(**names) in err
    assert {path: path.stat().st_mtime_ns for path in [*results.iterdir(), *tmp_path.iterdir()]} == before


@pytest.mark.parametrize("host", ["a" * 64 + ".example.com", "pushgateway..example.com"],
                         ids=["label-over-63-characters", "empty-label"])
def test_a_push_host_the_resolver_cannot_encode_is_one_line_exit_2_in_a_real_process(tmp_path, host):
    """Such a host passed the URL check, then the push raised UnicodeError (a traceback, exit 1)."""
    result = Path(__file__).parent / "data" / "report" / "good" / "b-tiny-cpu.json"
    out = tmp_path / "metrics.prom"
    done = subprocess.run([sys.executable, "-m", "hwbench", "export", "prometheus", str(result), "--out", str(out),
                           "--push", f"http://{host}:9091"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"--push 'http://{host}:9091' is not accepted" in done.stderr and not out.exists()


# --- a simulated run stays apart, marked in each consumer's own terms -----------------------


def real_and_simulated(simulated_result: Path, folder: Path) -> tuple[dict, dict]:
    """The stand-in's run, and the same file as a real H100 would write it (not simulated, other
    figures): both report the device as "NVIDIA H100 80GB HBM3", so only the flag sets them apart."""
    folder.mkdir()
    simulated = json.loads(simulated_result.read_text())
    real = copy.deepcopy(simulated)
    real["device"]["simulated"] = real["environment"]["simulated"] = False
    real["run_id"] = simulated["run_id"].replace("-cuda-", "-cuda-real-")
    real["metrics"]["tokens_per_s"] = simulated["metrics"]["tokens_per_s"] * 100
    for run in (simulated, real):
        (folder / f"{run['run_id']}.json").write_text(json.dumps(run))
    return real, simulated


def test_ci_exports_keep_a_simulated_run_out_of_the_real_devices_series(simulated_result, tmp_path, capsys):
    real, simulated = real_and_simulated(simulated_result, tmp_path / "runs")
    code, text, err = export(capsys, "customBiggerIsBetter", tmp_path / "runs")
    assert code == 0, err
    tokens = {entry.name: entry for entry in action_entries(text) if entry.unit == "tokens/s"}
    assert len(tokens) == 2  # two series, not one median of both
    (marked,) = [entry for name, entry in tokens.items() if name.count("[simulated]") == 1]
    (unmarked,) = [entry for name, entry in tokens.items() if "simulated" not in name]
    assert marked.value == simulated["metrics"]["tokens_per_s"] and simulated["run_id"] in marked.extra
    assert "simulated: a stand-in ran" in marked.extra and "simulated" not in unmarked.extra
    assert unmarked.value == real["metrics"]["tokens_per_s"]
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (the test extra has it)")
    code, text, _ = export(capsys, "bencher", tmp_path / "runs")
    document = json.loads(text)
    jsonschema.validate(document, BMF_SCHEMA)
    by_mark = {name.count("[simulated]"): measures for name, measures in document.items()}
    assert sorted(by_mark) == [0, 1]  # one mark, on the stand-in's benchmark only
    assert by_mark[1]["tokens-per-s"]["value"] == simulated["metrics"]["tokens_per_s"]
    assert by_mark[0]["tokens-per-s"]["value"] == real["metrics"]["tokens_per_s"]


@pytest.mark.parametrize("fmt", ["prometheus", "openmetrics"])
def test_prometheus_labels_a_simulated_point(simulated_result, tmp_path, capsys, fmt):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
    from prometheus_client.parser import text_string_to_metric_families

    real, simulated = real_and_simulated(simulated_result, tmp_path / "runs")
    code, text, err = export(capsys, fmt, tmp_path / "runs")
    assert code == 0, err
    parse = openmetrics_families if fmt == "openmetrics" else text_string_to_metric_families
    families = list(parse(text))
    tokens = {sample.labels.get("stand_in", ""): sample
              for sample in samples(families, "hwbench_throughput_tokens_per_second")}
    assert tokens["simulated"].value == pytest.approx(simulated["metrics"]["tokens_per_s"])
    assert tokens[""].value == pytest.approx(real["metrics"]["tokens_per_s"])
    assert tokens["simulated"].labels["device_model"] == tokens[""].labels["device_model"] == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("fmt", ["mllog", "mlperf-system"])
def test_mlperf_refuses_a_simulated_run(simulated_result, tmp_path, capsys, fmt):
    code, out, err = export(capsys, fmt, simulated_result, "--out", tmp_path / "mlperf.txt")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "simulated NVIDIA H100 80GB HBM3" in err and "not a result in MLPerf's terms" in err
    assert not list(tmp_path.iterdir())


def test_tensorboard_names_a_simulated_runs_folder(simulated_result, tmp_path, capsys):
    pytest.importorskip("tensorboard",
                        reason="the tensorboard extra is not installed (pip install -e '.[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_id = json.loads(simulated_result.read_text())["run_id"]
    code, _, err = export(capsys, "tensorboard", simulated_result, "--out", tmp_path / "logs")
    assert code == 0, err
    assert [path.name for path in (tmp_path / "logs").iterdir()] == [f"{run_id}-simulated"]
    events = EventAccumulator(str(tmp_path / "logs" / f"{run_id}-simulated"))
    events.Reload()
    assert events.Scalars("loss")


# --- a run that failed fails the export's gate ---------------------------------------------


@pytest.mark.parametrize("fmt", ["customBiggerIsBetter", "bencher", "prometheus"])
def test_a_failed_run_is_named_and_fails_the_export_unless_allowed(results, failed_result, tmp_path, capsys, fmt):
    folder = tmp_path / "night"
    folder.mkdir()
    for path in [*results.glob("*.json"), failed_result]:
        (folder / path.name).write_text(path.read_text())
    failed = json.loads(failed_result.read_text())
    out = tmp_path / "figures.txt"
    code, _, err = export(capsys, fmt, folder, "--out", out)
    assert code == 5  # compare's status for a point whose repeats failed
    (line,) = [line for line in err.splitlines() if failed["run_id"] in line]
    assert line.startswith("hwbench export: error: left out run") and "status failed" in line
    assert "injected fault" in line and failed_result.name in line
    assert "--allow-failed" in err and out.read_text()  # the ok runs' figures are written all the same
    code, _, err = export(capsys, fmt, folder, "--out", out, "--allow-failed")
    assert code == 0 and f"note: left out run {failed['run_id']}" in err


@pytest.mark.parametrize("fmt", ["customBiggerIsBetter", "bencher", "prometheus"])
def test_a_point_the_planner_skipped_is_no_failed_run(results, tmp_path, capsys, fmt):
    """A sweep's point that would not fit was never run (status skipped): compare does not count it
    as a failed repeat, and the CI exports must not fail the night on it (they exited 5)."""
    folder = tmp_path / "night"
    folder.mkdir()
    for path in [*results.glob("*.json"), Path(__file__).parent / "data" / "results-v1" / "sweep-skipped.json"]:
        (folder / path.name).write_text(path.read_text())
    code, text, err = export(capsys, fmt, folder)
    assert code == 0 and text and "left out run" not in err, err


def test_the_help_and_the_api_page_name_the_exit_status_a_failed_run_gives(capsys):
    """The command's description and docs/api.md said 'exits 4' while a failed run gives 5."""
    from hwbench.commands.export import DESCRIPTION

    data = Path(__file__).parent / "data"
    code, _, _ = export(capsys, "bencher", data / "report" / "good" / "b-tiny-cpu.json",
                        data / "results-v1" / "tiny-dp2-failed.json")
    api = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    assert code != 0 and f"exits {code} unless --allow-failed" in DESCRIPTION
    assert f"where the command exits {code}, a caller checks this list" in api


def test_a_failed_run_is_named_when_the_push_fails_too(results, failed_result, tmp_path, capsys):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, _, err = export(capsys, "prometheus", *results.glob("*.json"), failed_result, "--push",
                          f"http://127.0.0.1:{port}")
    assert code == 1 and f"left out run {json.loads(failed_result.read_text())['run_id']}" in err
    assert err.strip().splitlines()[-1].startswith(f"hwbench: error: --push http://127.0.0.1:{port}: the Pushgateway")


# --- identifiers from a result never reach outside the output folder ------------------------


@pytest.mark.parametrize("run_id", ["..", ".", "", "../escape", "a\nb"])
def test_a_hostile_run_id_is_refused_when_read_and_nothing_is_removed(results, tmp_path, capsys, run_id):
    pytest.importorskip("tensorboard",
                        reason="the tensorboard extra is not installed (pip install -e '.[tensorboard]')")
    hostile = copy.deepcopy(runs_of(results)[0])
    hostile["run_id"] = run_id
    (tmp_path / "hostile.json").write_text(json.dumps(hostile))
    parent = tmp_path / "parent"
    (parent / "logs").mkdir(parents=True)
    (parent / "keep.txt").write_text("the user's")
    (parent / "logs" / "keep.txt").write_text("the user's")
    code, out, err = export(capsys, "tensorboard", tmp_path / "hostile.json", "--out", parent / "logs")
    assert code == 2 and out == ""
    assert "run_id: must be a file name" in err and "nothing to export" in err
    assert (parent / "keep.txt").read_text() == (parent / "logs" / "keep.txt").read_text() == "the user's"
    assert sorted(path.name for path in parent.rglob("*")) == ["keep.txt", "keep.txt", "logs"]


@pytest.mark.parametrize("existing", ["folder", "symlink", "other run's export", "its export with a user's file"])
def test_tensorboard_replaces_only_a_folder_it_made_for_that_run(results, tmp_path, capsys, existing):
    pytest.importorskip("tensorboard",
                        reason="the tensorboard extra is not installed (pip install -e '.[tensorboard]')")
    run_id = runs_of(results)[0]["run_id"]
    logs, mine = tmp_path / "logs", tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    logs.mkdir()
    if existing == "symlink":
        (logs / run_id).symlink_to(mine, target_is_directory=True)
    else:
        (logs / run_id).mkdir()
        (logs / run_id / "notes.txt").write_text("the user's")
        if existing == "other run's export":
            (logs / run_id / ".hwbench-tensorboard").write_text("20261121T130000Z-tiny-cpu-bbbbbb\n")
        if existing == "its export with a user's file":  # the marker is right, but notes.txt is the user's
            (logs / run_id / ".hwbench-tensorboard").write_text(f"{run_id}\n")
    before = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*"))
    code, _, err = export(capsys, "tensorboard", results, "--out", logs)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{logs / run_id} exists and is not a folder this export made for run {run_id}" in err
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == before  # nothing written
    assert (mine / "notes.txt").read_text() == "the user's"


def test_every_result_in_the_repository_has_a_run_id_that_passes():
    """The run-id rule refuses no result hwbench wrote (tests/data holds files of every schema and age)."""
    import warnings

    from hwbench.result.store import load_results

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tests/data/report/bad is damaged on purpose
        found, skipped = load_results(Path(__file__).parent / "data")
    assert found and not [reason for _path, reason in skipped if "run_id" in reason]


# --- a Pushgateway that answers garbage, a URL with credentials ----------------------------


class Garbage(http.server.BaseHTTPRequestHandler):
    """Answers any request with a Python traceback and no HTTP status line."""

    def do_PUT(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.wfile.write(b"Traceback (most recent call last):\n  File \"app.py\", line 1\nKeyError: 'job'\n")

    def log_message(self, *args):
        pass


class WithAuth(Pushgateway):
    """A Pushgateway behind basic auth: 401 unless user:s3cret."""

    seen: list = []  # noqa: RUF012 (the Authorization headers it got)

    def do_PUT(self):
        WithAuth.seen.append(self.headers["Authorization"])
        if self.headers["Authorization"] != "Basic " + base64.b64encode(b"user:s3cret").decode():
            self.send_response(401)
            self.end_headers()
            return
        super().do_PUT()


def serving(handler):
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    server.timeout = 5
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_pushgateway_answering_garbage_is_one_line_and_exit_1(results, capsys):
    server = serving(Garbage)
    try:
        code, _, err = export(capsys, "prometheus", results, "--push", f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "the Pushgateway did not take the metrics (its answer is not HTTP" in err and "Traceback" not in err


def test_credentials_in_the_push_url_go_as_basic_auth_and_are_never_shown(results, capsys):
    server = serving(WithAuth)
    WithAuth.seen, Pushgateway.received = [], []
    port = server.server_port
    try:
        code, out, err = export(capsys, "prometheus", results, "--push", f"http://user:s3cret@127.0.0.1:{port}")
        assert code == 0, err
        assert Pushgateway.received and WithAuth.seen[-1] == "Basic " + base64.b64encode(b"user:s3cret").decode()
        assert f"metrics pushed to http://***@127.0.0.1:{port}" in err and "s3cret" not in out + err
        code, out, err = export(capsys, "prometheus", results, "--push", f"http://user:wrong@127.0.0.1:{port}")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 1 and len(err.strip().splitlines()) == 1 and "HTTP 401" in err and "wrong" not in out + err
    code, out, err = export(capsys, "prometheus", results, "--push", "http://user:s3cret@[::1")
    assert code == 2 and "--push 'http://***@[::1' is not accepted" in err and "s3cret" not in out + err


# --- collectives results ---------------------------------------------------------------


def collectives_result(folder: Path, run_id: str, busbw: float, status: str = "ok", hosts: int = 1) -> Path:
    """A `hwbench collectives` result of four ranks with one all-reduce row (1 MiB in place) of the
    given busbw, and with ``hosts`` 2 its intra-node and inter-node tables (busbw x 2 and / 2)."""
    from hwbench.result.collectives import CollectivesResult, Row, ScopeRows, Settings, write_collectives

    size = 2 ** 20

    def row(figure: float, ranks: int) -> Row:
        factor = 2 * (ranks - 1) / ranks
        time_us = size / (figure / factor) / 1e3
        return Row(collective="all_reduce", in_place=True, size_bytes=size, elements=size // 4, time_us=time_us,
                   time_us_min=time_us, time_us_max=time_us, algbw_gbs=figure / factor, busbw_gbs=figure,
                   bus_factor=factor, wrong=0)

    settings = Settings(collectives=["all_reduce"], min_bytes=size, max_bytes=size, warmup=1, iterations=2,
                        check=True, timeout_s=60)
    ranks = [{"rank": r, "host": f"node{r * hosts // 4}"} for r in range(4)]
    scopes = [ScopeRows(scope="intra_node", groups=[[0, 1], [2, 3]], rows=[row(2 * busbw, 2)]),
              ScopeRows(scope="inter_node", groups=[[0, 2]], rows=[row(busbw / 2, 2)])] if hosts > 1 else []
    result = CollectivesResult.model_validate({
        "run_id": run_id, "status": status, "device": "cpu", "device_model": "test cpu", "dist_backend": "gloo",
        "world_size": 4, "settings": settings.model_dump(), "ranks": ranks, "check_passed": status == "ok",
        "rows": [row(busbw, 4).model_dump()] if status == "ok" else [],
        "scopes": [scope.model_dump() for scope in scopes] if status == "ok" else [],
        "error": None if status == "ok" else {"type": "RankFailed", "message": "rank 1 failed"}})
    return write_collectives(result, folder)


def test_prometheus_carries_busbw_per_collective_size_and_scope(tmp_path, capsys):
    """Collectives results alone are exported: busbw per collective, form, size and scope, the median
    of the results that share it (10 and 12 GB/s: 11), in bytes/s, read back by prometheus_client."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
    from prometheus_client.parser import text_string_to_metric_families

    for run_id, busbw in (("c1", 10.0), ("c2", 12.0)):
        collectives_result(tmp_path / "coll", run_id, busbw, hosts=2)
    code, text, err = export(capsys, "prometheus", tmp_path / "coll")
    assert code == 0, err
    found = {(s.labels["scope"], s.labels["collective"], s.labels["in_place"], s.labels["size_bytes"]): s
             for s in samples(list(text_string_to_metric_families(text)),
                              "hwbench_collective_bus_bandwidth_bytes_per_second")}
    assert {scope: sample.value for (scope, *_), sample in found.items()} == pytest.approx(
        {"all": 11e9, "intra_node": 22e9, "inter_node": 5.5e9})
    assert set(found) == {(scope, "all_reduce", "true", "1048576") for scope in ("all", "intra_node", "inter_node")}
    labels = found["all", "all_reduce", "true", "1048576"].labels
    assert (labels["device_model"], labels["dist_backend"], labels["world_size"], labels["hosts"]) == (
        "test cpu", "gloo", "4", "2")
    code, text, _ = export(capsys, "openmetrics", tmp_path / "coll")
    family = {f.name: f for f in openmetrics_families(text)}["hwbench_collective_bus_bandwidth_bytes_per_second"]
    assert code == 0 and family.unit == "bytes_per_second" and len(family.samples) == 3


def test_ci_exports_carry_busbw_and_a_failed_collectives_result_fails_the_gate(results, tmp_path, capsys):
    """Beside the runs' figures: busbw in github-action-benchmark's bigger-is-better file and in
    Bencher's, with the repeats' range; a failed collectives result is named and exits 5, as a failed run."""
    folder = tmp_path / "night"
    folder.mkdir()
    for path in results.glob("*.json"):
        (folder / path.name).write_text(path.read_text())
    for run_id, busbw in (("c1", 10.0), ("c2", 12.0)):
        collectives_result(folder, run_id, busbw)
    code, text, err = export(capsys, "customBiggerIsBetter", folder)
    assert code == 0, err
    entries = {entry["name"]: entry for entry in json.loads(text)}
    busbw = entries["all_reduce in place 1048576 B, 4 ranks on 1 host (cpu test cpu, gloo, float32): bus bandwidth"]
    assert (busbw["unit"], busbw["value"], busbw["range"]) == ("GB/s", 11.0, "10 to 12 over 2 runs")
    assert any(name.endswith(": tokens/s") for name in entries)  # the runs' figures are there too
    code, text, _ = export(capsys, "customSmallerIsBetter", folder)
    assert code == 0 and not any("bus bandwidth" in entry["name"] for entry in json.loads(text))
    code, text, _ = export(capsys, "bencher", folder)
    assert json.loads(text)["all_reduce in place 1048576 B, 4 ranks on 1 host (cpu test cpu, gloo, float32)"] == {
        "busbw": {"value": 11.0, "lower_value": 10.0, "upper_value": 12.0}}
    collectives_result(folder, "c3", 0.0, status="failed")
    code, _, err = export(capsys, "bencher", folder)
    assert code == 5 and "error: left out collectives result c3 (" in err and "status failed (rank 1 failed)" in err
