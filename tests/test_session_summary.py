"""benchmarks/session_summary.py: the table a device session prints last marks an HFU figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from session_summary import HEADERS, result_rows  # noqa: E402

RUN = REPO / "tests" / "data" / "report" / "good" / "a-345m-h100x2.json"  # mfu 0.25


def test_a_recompute_run_counted_by_megatron_deepspeed_reads_hfu(tmp_path):
    for name, recompute, formula in (("hw", True, "megatron-deepspeed"), ("plain", False, "megatron-deepspeed"),
                                     ("model", True, "megatron-core-v0.12")):
        (tmp_path / name).mkdir()
        data = json.loads(RUN.read_text())
        data["spec"].update(recompute=recompute, flops_formula=formula)
        data["metrics"]["flops_formula"] = formula
        (tmp_path / name / "result.json").write_text(json.dumps(data))
    mfu = HEADERS.index("MFU")
    got = {row[0].split(":")[0]: row[mfu] for row in result_rows(tmp_path)}
    assert got == {"hw": "25.0% HFU", "plain": "25.0%", "model": "25.0%"}


def _session(tmp_path, **changes):
    """One CUDA bf16 345M result in its own folder, changed as given; its planned peak."""
    from session_summary import session_results

    from hwbench.report.runs import predicted_peak

    data = json.loads(RUN.read_text())
    data["spec"].update(precision="bf16", parallel={"tp": 1, "pp": 1, "dp": 1, "source": "user"})
    data["device"].update(device_count=1, tdp_watts=700)
    data["metrics"].update(host_syncs={"count": 0, "sites": []},
                           by_formula={"megatron-core-v0.12": {"mfu": 0.47}},
                           telemetry={**data["metrics"]["telemetry"], "window_s": 4.0,
                                      "devices": [{"index": 0, "power_w_mean": 500.0, "energy_j": 2000.0}]})
    for key, value in changes.items():
        section, field = key.split("__")
        data[section][field] = value
    folder = tmp_path / "session" / "fast"
    folder.mkdir(parents=True)
    (folder / "20261201T000000Z-345m-cuda-abcdef.json").write_text(json.dumps(data))
    [(_, result)] = session_results(tmp_path / "session")
    planned, why = predicted_peak(result)
    assert planned is not None, why
    return tmp_path / "session", data, planned


def _verdicts(folder, ratios=None):
    from session_summary import goal_checks

    checks = goal_checks(folder, ratios or {})
    return {goal.split(" (")[0].split(",")[0]: (verdict, why) for goal, verdict, why in checks}


def test_the_goals_pass_on_figures_that_meet_them_and_each_fails_on_its_own_miss(tmp_path):
    folder, data, planned = _session(tmp_path / "good")
    path = folder / "fast" / "20261201T000000Z-345m-cuda-abcdef.json"
    data["metrics"]["memory"]["peak_reserved_bytes"] = int(planned * 1.05)
    path.write_text(json.dumps(data))
    good = _verdicts(folder, {"harness_ratio": 1.01, "telemetry_ratio": 1.002})
    assert good["every run ends ok"][0] == "PASS"
    assert good["no host wait in the timed loop"][0] == "PASS"
    assert good["mean power above 0 and at most the TDP"][0] == "PASS"
    assert good["energy within 10% of mean power x window"][0] == "PASS"
    assert good["MFU of 345m at seq 1024"] == ("PASS", "best 47.0%: fast/abcdef")
    assert good["MFU of 1.3b at seq 2048"][0] == "n/a"
    assert good["hwbench's step within 2 % of the bare loop's"][0] == "PASS"
    assert good["telemetry costs under 0.5 %"][0] == "PASS"
    assert good["planner within 10% of the measured peak"][0] == "PASS"

    bad = dict(data)
    bad["metrics"] = {**data["metrics"], "host_syncs": {"count": 25, "sites": []},
                      "by_formula": {"megatron-core-v0.12": {"mfu": 0.31}},
                      "memory": {**data["metrics"]["memory"], "peak_reserved_bytes": int(planned * 1.3)},
                      "telemetry": {**data["metrics"]["telemetry"],
                                    "devices": [{"index": 0, "power_w_mean": 750.0, "energy_j": 1000.0}]}}
    path.write_text(json.dumps(bad))
    failed = _verdicts(folder, {"harness_ratio": 1.05, "telemetry_ratio": 1.01})
    assert failed["no host wait in the timed loop"] == ("FAIL", "fast/abcdef: 25")
    assert failed["mean power above 0 and at most the TDP"] == ("FAIL", "fast/abcdef device 0: 750 W (TDP 700 W)")
    assert failed["energy within 10% of mean power x window"][0] == "FAIL"
    assert failed["MFU of 345m at seq 1024"] == ("FAIL", "best 31.0%: fast/abcdef")
    assert failed["hwbench's step within 2 % of the bare loop's"] == ("FAIL",
                                                                      "harness_ratio 1.050 (median of the repeats)")
    assert failed["telemetry costs under 0.5 %"][0] == "FAIL"
    assert failed["planner within 10% of the measured peak"][0] == "FAIL" and "(-23%)" in failed[
        "planner within 10% of the measured peak"][1]

    bad["status"], bad["error"] = "oom", {"message": "CUDA out of memory"}
    path.write_text(json.dumps(bad))
    assert _verdicts(folder)["every run ends ok"] == ("FAIL", "fast/abcdef: oom (CUDA out of memory)")


def test_a_stand_in_or_cpu_result_is_held_to_no_goal(tmp_path):
    for name, device in (("simulated", {"simulated": True}), ("cpu", {"backend": "cpu"})):
        folder, _, _ = _session(tmp_path / name, **{f"device__{k}": v for k, v in device.items()})
        verdicts = _verdicts(folder)
        assert verdicts["every run ends ok"] == ("n/a", "no result of a real accelerator"), name
        assert {verdict for verdict, _ in verdicts.values()} == {"n/a"}, name


def test_the_side_by_side_ratios_are_judged_only_when_its_runs_were_on_a_real_accelerator(tmp_path, capsys):
    from session_summary import main

    for name, simulated, verdict in (("card", False, "PASS"), ("stand-in", True, "n/a")):
        folder, data, _ = _session(tmp_path / name)
        data["device"]["simulated"] = simulated
        sides = folder / "side-by-side"
        (sides / "r1" / "hwbench").mkdir(parents=True)
        (sides / "r1" / "hwbench" / "20261201T000000Z-345m-cuda-fedcba.json").write_text(json.dumps(data))
        (sides / "side_by_side.json").write_text(json.dumps(
            {"options": {"device": "cuda"}, "harness_ratio": 1.01, "telemetry_ratio": 1.001}))
        assert main([str(folder)]) == 0
        lines = capsys.readouterr().out.splitlines()
        (harness,) = [line for line in lines if line.startswith("| hwbench's step within 2 %")]
        assert harness.split(" | ")[1] == verdict, (name, harness)
