"""The result model and its upgrade chain: every file an earlier hwbench wrote still loads.

The inputs are real version 1 files: tests/data/results-v1/ (a run with validation, 2 ranks,
a failed 2-rank run, a sweep's ok, invalid and skipped records, made with the hwbench before
version 2; its README says how), tests/data/compare/tiny-cpu.json and tests/data/report/; a
real version 2 file, tests/data/results-v2/ (made with the hwbench before version 3), and a real
version 3 file, tests/data/results-v3/ (made with the hwbench before version 4).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hwbench import RESULT_SCHEMA_VERSION
from hwbench.cli import main
from hwbench.result.model import RunResult
from hwbench.result.store import ResultFormatError, load_result, load_results, write_result
from hwbench.result.upgrade import PREDATES_CALIBRATION, upgrade
from hwbench.spec import OptimizerSpec

DATA = Path(__file__).parent / "data"
V1_FILES = sorted([*(DATA / "results-v1").glob("*.json"), DATA / "compare" / "tiny-cpu.json",
                   *(DATA / "report" / "good").glob("*.json"), DATA / "report" / "bad" / "b-tiny-cpu.json"])
V2_FILE = DATA / "results-v2" / "tiny-cpu-eval.json"
V3_FILE = DATA / "results-v3" / "tiny-cpu-eval.json"


def test_the_inputs_are_version_1_files():
    assert len(V1_FILES) == 13
    assert {json.loads(path.read_text())["schema_version"] for path in V1_FILES} == {1}
    assert json.loads(V2_FILE.read_text())["schema_version"] == 2
    assert json.loads(V3_FILE.read_text())["schema_version"] == 3
    assert RESULT_SCHEMA_VERSION == 4


@pytest.mark.parametrize("path", V1_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_version_1_file_loads_through_the_chain(path, tmp_path):
    original = json.loads(path.read_text())
    result = load_result(path)
    assert result.schema_version == 4 and result.run_id == original["run_id"] and result.status == original["status"]
    spec = original["spec"]
    if "model" in spec:  # a resolved spec: the formula renamed, the positions recorded
        assert result.spec.flops_formula == "megatron-core-v0.7" and spec["flops_formula"] == "megatron-lm"
        positions = spec.get("max_positions") or original["workload"].get("max_position_embeddings")
        assert result.spec.max_positions == positions is not None
        assert result.point_key is not None and result.point_key.max_positions == positions
    else:  # a sweep's record of a point whose options were refused
        assert result.spec.run_args == spec["run_args"] and result.point_key is None
    # written back at version 4, it reads as the same result
    written = json.loads(write_result(result, tmp_path).read_text())
    assert written["schema_version"] == 4 and list(written)[0] == "schema_version"
    assert load_result(tmp_path / f"{result.run_id}.json") == result


def test_the_chain_changes_only_what_versions_2_to_4_rename_and_add(tmp_path):
    path = DATA / "results-v1" / "tiny-cpu-eval.json"
    original = json.loads(path.read_text())
    written = load_result(path).to_dict()
    assert (written.pop("schema_version"), original.pop("schema_version")) == (4, 1)
    for section in ("spec", "metrics"):
        assert (written[section].pop("flops_formula"), original[section].pop("flops_formula")) == \
            ("megatron-core-v0.7", "megatron-lm")
    _renamed_adamw_constants(written["spec"]["optimizer"], original["spec"]["optimizer"])
    assert "checkpoint" not in original and written.pop("checkpoint") is None  # a newer section: written null
    _not_profiled(written, original)
    assert written == original  # every other value, nested extras included, as the file had it


def _not_profiled(written: dict, original: dict) -> None:
    """Version 4's additions, popped: a run before --profile was not profiled, and has no profile section."""
    assert "profile" not in original and written.pop("profile") is None
    assert "profile" not in original["spec"] and written["spec"].pop("profile") is False
    assert written["spec"].pop("profile_steps") is None


def _renamed_adamw_constants(written: dict, original: dict) -> None:
    """Version 3's renames, popped from both: betas [b1, b2] -> adam_beta1, adam_beta2; eps -> adam_eps."""
    assert [written.pop("adam_beta1"), written.pop("adam_beta2")] == original.pop("betas") == [0.9, 0.999]
    assert written.pop("adam_eps") == original.pop("eps") == 1e-8


def test_a_version_2_file_loads_with_adamws_constants_under_their_option_names(tmp_path):
    original = json.loads(V2_FILE.read_text())
    result = load_result(V2_FILE)
    assert result.schema_version == 4 and result.run_id == original["run_id"]
    optimizer = result.spec.run_spec().optimizer  # the typed spec reads the constants the run trained with
    assert (optimizer.adam_beta1, optimizer.adam_beta2, optimizer.adam_eps) == (0.9, 0.999, 1e-8)
    # written before the warm-up options: the fields' defaults are what the run had
    assert (optimizer.lr_warmup_init, optimizer.lr_warmup_fraction) == (0.0, None) == (
        OptimizerSpec.lr_warmup_init, OptimizerSpec.lr_warmup_fraction)
    written = result.to_dict()
    assert (written.pop("schema_version"), original.pop("schema_version")) == (4, 2)
    _renamed_adamw_constants(written["spec"]["optimizer"], original["spec"]["optimizer"])
    _not_profiled(written, original)
    assert written == original  # nothing else changes
    assert load_result(write_result(result, tmp_path)) == result


def test_a_version_3_file_loads_as_not_profiled(tmp_path):
    """Version 4 adds --profile: a version 3 run was not profiled, and nothing else changes."""
    original = json.loads(V3_FILE.read_text())
    result = load_result(V3_FILE)
    assert result.schema_version == 4 and result.profile is None and result.spec.profile is False
    assert result.spec.run_spec().profile is False and result.spec.run_spec().profile_steps is None
    written = result.to_dict()
    assert (written.pop("schema_version"), original.pop("schema_version")) == (4, 3)
    _not_profiled(written, original)
    assert written == original
    assert load_result(write_result(result, tmp_path)) == result


def test_telemetry_memory_is_renamed_to_its_unit_everywhere():
    data = json.loads((DATA / "results-v1" / "tiny-cpu-dp2.json").read_text())
    device = {"index": 0, "name": "gpu:0", "memory_used_mb_mean": 1000.5, "memory_used_mb_max": 1200.0,
              "unmeasured": {"memory_used_mb": "not reported by this device", "power_w": "not reported"}}
    data["metrics"]["telemetry"] = {"source": "nvml", "available": True, "devices": [copy.deepcopy(device)]}
    data["ranks"][1]["telemetry"] = {"source": "nvml", "available": True, "devices": [copy.deepcopy(device)]}
    result = RunResult.from_dict(data)
    for telemetry in (result.metrics.telemetry, result.ranks[1].telemetry):
        (read,) = telemetry.devices
        assert (read.memory_used_mib_mean, read.memory_used_mib_max) == (1000.5, 1200.0)
        assert read.unmeasured == {"memory_used_mib": "not reported by this device", "power_w": "not reported"}
        assert "memory_used_mb_mean" not in read.dump() and "memory_used_mb_max" not in read.dump()
    assert "memory_used_mb" not in json.dumps(result.to_dict())
    assert data["metrics"]["telemetry"]["devices"][0] == device  # the caller's mapping is not changed


def test_a_result_from_before_calibration_says_so():
    """tiny-cpu.json predates `hwbench calibrate`: no mfu_measured_ceiling, and the report's
    reason comes from the upgrade, not from a reader's guess."""
    assert "mfu_measured_ceiling" not in json.loads((DATA / "compare" / "tiny-cpu.json").read_text())["metrics"]
    result = load_result(DATA / "compare" / "tiny-cpu.json")
    assert result.metrics.mfu_measured_ceiling is None
    assert result.metrics.why("mfu_measured_ceiling") == PREDATES_CALIBRATION
    fresh = load_result(DATA / "results-v1" / "tiny-cpu-eval.json")  # recorded its own reason
    assert "no calibration for" in fresh.metrics.why("mfu_measured_ceiling")


def test_derived_facts_of_files_that_did_not_record_them():
    old = load_result(DATA / "compare" / "tiny-cpu.json")  # no devices_used, no oversubscribed
    assert (old.backend, old.device_model, old.world_size) == ("cpu", "Intel(R) Xeon(R) Processor", 1)
    assert old.devices_charged == 1 and "one CPU socket per node" in old.devices_charged_basis
    assert old.oversubscribed is False  # 1 rank x 2 threads on 2 usable cores
    recorded = load_result(DATA / "results-v1" / "tiny-cpu-dp2.json")
    assert recorded.devices_charged == recorded.environment.devices_used == 1
    assert recorded.devices_charged_basis == recorded.environment.devices_used_basis
    skipped = load_result(DATA / "results-v1" / "sweep-skipped.json")  # never ran: what was asked for
    assert skipped.backend == skipped.spec.device and skipped.device_model is None
    gpu = load_result(DATA / "report" / "good" / "e-1.3b-oom.json")
    assert gpu.devices_charged == gpu.world_size == 8 and gpu.oversubscribed is None


@pytest.mark.parametrize("version, line", [
    (7, "schema_version 7 is newer than this hwbench reads (4); upgrade hwbench"),
    (0, "schema_version 0 was never written by hwbench (it reads 1 to 4)"),
    ("2", "schema_version must be an integer, not '2'"),
    (True, "schema_version must be an integer, not 'True'"),
])
def test_a_version_the_chain_cannot_bring_is_one_line(tmp_path, capsys, version, line):
    data = json.loads((DATA / "compare" / "tiny-cpu.json").read_text())
    path = tmp_path / "runs" / "other.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**data, "schema_version": version}))
    with pytest.raises(ResultFormatError) as error:
        load_result(path)
    assert str(error.value) == f"{path}: {line}"
    assert main(["report", str(path.parent), str(DATA / "compare")]) == 0
    assert f"left out {path}: {line}" in capsys.readouterr().err


def test_a_current_file_passes_the_chain_unchanged():
    data = load_result(DATA / "results-v1" / "tiny-cpu-eval.json").to_dict()
    assert upgrade(data) == data and upgrade(data) is not data


def test_load_results_takes_one_path_as_one_path(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a.json").write_text((DATA / "results-v1" / "tiny-cpu-eval.json").read_text())
    results, skipped = load_results(str(folder))
    assert [r.run_id for r in results] == [json.loads((folder / "a.json").read_text())["run_id"]] and not skipped
    assert [r.run_id for r in load_results(folder)[0]] == [r.run_id for r in results]
