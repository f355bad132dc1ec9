"""The npu-smi layouts of Atlas A3 (two dies per NPU id),
310P Duo (one NPU id for two chips) and 310B (Bus-Id NA), from the published
outputs recorded in tests/fakes/npu-smi (README.md there says where each came
from). The table is keyed by device id, the id ASCEND_RT_VISIBLE_DEVICES and
torch_npu number devices by."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import stand_in_gave

from hwbench.device.npu import NpuBackend
from hwbench.device.npu_smi import NpuSmiSampler, parse_npu_smi_info, parse_npu_smi_rows

FAKES = Path(__file__).resolve().parent / "fakes"
RECORDINGS = FAKES / "npu-smi"
TRAIN_S = 120


def recording(name: str) -> str:
    return (RECORDINGS / name).read_text()


def figures(row: dict) -> tuple:
    return (row["npu"], row["chip"], row["device_id"], row["power_w"], row["temperature_c"],
            row.get("hbm_used_mb"), row["memory_used_mb"])


# --- Atlas A3 -------------------------------------------------------------------


def test_a3_every_die_is_its_own_device():
    table = parse_npu_smi_info(recording("info-a3.txt"))
    assert sorted(table) == [0, 1, 2, 3]  # Phy-IDs; the process table adds nothing
    # (npu, chip, device id, power, temperature, HBM used, memory used)
    assert figures(table[0]) == (0, 0, 0, 162.8, 37.0, 3133.0, 0.0)
    assert figures(table[1]) == (0, 1, 1, None, 37.0, 2876.0, 0.0)  # die 1 prints power "-"
    assert figures(table[2]) == (1, 0, 2, 167.1, 38.0, 3116.0, 0.0)
    assert figures(table[3]) == (1, 1, 3, None, 38.0, 10568.0, 0.0)  # squeezed "10568/ 65536"
    assert [table[d]["bus_id"] for d in range(4)] == ["0000:9C:00.0", "0000:9E:00.0", "0000:37:00.0",
                                                      "0000:39:00.0"]
    assert {table[d]["name"] for d in range(4)} == {"Ascend910"}
    assert {table[d]["hbm_total_mb"] for d in range(4)} == {65536.0}


def test_a3_rows_keep_both_dies_of_one_npu_id():
    rows = parse_npu_smi_rows(recording("info-a3.txt"))
    assert [(row["npu"], row["chip"]) for row in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def eight_card_a3() -> str:
    """An 8-card A3 table (Phy-ID 0-15), made from the recorded first card's two
    row pairs with the NPU id and Phy-IDs renumbered (an 8-card output was not
    published in full) and each die's HBM figure made unique: 1000 + Phy-ID."""
    lines = recording("info-a3.txt").splitlines()
    start = next(i for i, line in enumerate(lines) if "Ascend910" in line)
    pair = lines[start:start + 5]  # die 0 rows, the die separator, die 1 rows
    out = lines[:start]
    for card in range(8):
        for line in pair:
            line = re.sub(r"^\| 0     Ascend910", f"| {card}     Ascend910", line)
            line = re.sub(r"^\| (\d)     (\d)  ", lambda m: f"| {m[1]}     {2 * card + int(m[1]):<2} ", line)
            line = re.sub(r"\d+ / 65536", lambda m: f"{1000 + 2 * card + int(line[2])} / 65536", line)
            out.append(line)
        out.append(lines[start + 5])
    return "\n".join(out) + "\n"


def test_eight_card_a3_ranks_above_seven_read_their_own_die(monkeypatch, tmp_path):
    table = parse_npu_smi_info(eight_card_a3())
    assert sorted(table) == list(range(16))
    assert {d: table[d]["hbm_used_mb"] for d in range(16)} == {d: 1000.0 + d for d in range(16)}
    assert [table[d]["npu"] for d in (8, 9, 15)] == [4, 4, 7]
    # Rank 9 of 16 on the node, all devices visible: npu-smi's die Phy-ID 9.
    backend = NpuBackend.__new__(NpuBackend)  # no torch_npu needed for the mapping
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    backend.local_index = 9
    assert backend.smi_device_id() == 9
    assert table[backend.smi_device_id()]["hbm_used_mb"] == 1009.0


def test_a3_sampler_reads_the_visible_die(monkeypatch):
    """ASCEND_RT_VISIBLE_DEVICES=1,2: rank 0 is die 1 of NPU 0 (no power of its
    own), rank 1 is die 0 of NPU 1."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKES / "bin"), os.environ.get("PATH", "")]))
    monkeypatch.setenv("HWBENCH_STANDIN_NPU_SMI", "info-a3.txt")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1,2")
    backend = NpuBackend.__new__(NpuBackend)
    ids = []
    for rank in (0, 1):
        backend.local_index = rank
        ids.append(backend.smi_device_id())
    first, second = NpuSmiSampler(ids).read()
    assert (first["power_w"], first["temperature_c"], first["memory_used_mib"]) == (None, 37.0, 2876.0)
    assert (second["power_w"], second["temperature_c"], second["memory_used_mib"]) == (167.1, 38.0, 3116.0)


# heavy (python -m pytest -m heavy): the default run reads die Phy-ID 2 through ASCEND_RT_VISIBLE_DEVICES in
# process (test_a3_sampler_reads_the_visible_die above) and takes the stand-in's npu-smi readings through a
# whole run into its result (tests/test_npu_standin.py's end-to-end run)
@pytest.mark.heavy
def test_run_on_a_simulated_a3_die_reports_that_die(standin_npu_env, tmp_path):
    """End to end: the stand-in NPU with ASCEND_RT_VISIBLE_DEVICES=2 on an A3
    npu-smi: the telemetry is die Phy-ID 2 (NPU 1, chip 0)."""
    env = {**standin_npu_env, "ASCEND_RT_VISIBLE_DEVICES": "2", "HWBENCH_STANDIN_NPU_SMI": "info-a3.txt"}
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "hwbench", "run", "--device", "npu", "--model", "tiny", "--seq-length",
                           "32", "--steps", "2", "--warmup", "1", "--eval-iters", "0", "--quiet", "--out", str(out)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TRAIN_S)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(out.glob("*.json")).read_text())
    telemetry = result["metrics"]["telemetry"]
    assert telemetry["available"] is False and telemetry["errors"] == []  # simulated: the readings kept in no figure
    die = telemetry["devices"][0]
    assert stand_in_gave(die, "power_w_mean") == pytest.approx(167.1)
    assert stand_in_gave(die, "temperature_c_mean") == pytest.approx(38.0)
    assert stand_in_gave(die, "memory_used_mib_mean") == pytest.approx(3116.0)


# --- 310P Duo and 310B --------------------------------------------------------


def test_310p_duo_chips_are_found_by_device_id():
    table = parse_npu_smi_info(recording("info-310p-duo.txt"))
    assert sorted(table) == [0, 1]  # device ids, not the card's NPU id 2
    first, second = table[0], table[1]
    assert (first["npu"], first["chip"], first["name"]) == (2, 0, "310P3")
    assert (second["npu"], second["chip"], second["name"]) == (2, 1, "310P3")
    assert (first["power_w"], first["temperature_c"]) == (None, 45.0)  # power "NA"
    assert (second["power_w"], second["temperature_c"]) == (None, 43.0)
    assert (first["memory_used_mb"], first["memory_total_mb"]) == (1529.0, 44280.0)
    assert (second["memory_used_mb"], second["memory_total_mb"]) == (1412.0, 43693.0)
    assert first["bus_id"] == second["bus_id"] == "0000:01:00.0"  # one card, two chips
    assert "hbm_used_mb" not in first


def test_310p_duo_sampler_reads_chip_1(monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKES / "bin"), os.environ.get("PATH", "")]))
    monkeypatch.setenv("HWBENCH_STANDIN_NPU_SMI", "info-310p-duo.txt")
    (reading,) = NpuSmiSampler([1]).read()
    assert (reading["temperature_c"], reading["memory_used_mib"], reading["utilization_percent"]) == (43.0, 1412.0,
                                                                                                       0.0)


def test_310b_second_row_with_bus_id_na_is_not_a_device():
    rows = parse_npu_smi_rows(recording("info-310b.txt"))
    assert len(rows) == 1
    table = parse_npu_smi_info(recording("info-310b.txt"))
    assert list(table) == [0]
    chip = table[0]
    assert (chip["name"], chip["health"]) == ("310B4", "Alarm")
    assert (chip["power_w"], chip["temperature_c"]) == (0.0, 65.0)
    assert chip["bus_id"] is None  # npu-smi prints NA
    assert chip["utilization_percent"] == 0.0
    assert (chip["memory_used_mb"], chip["memory_total_mb"]) == (3628.0, 15609.0)
    assert "hbm_used_mb" not in chip


@pytest.mark.parametrize("card", [4, 5, 8, 32, 64])
def test_310p_card_numbers_are_not_device_ids(card):
    """A 310P in card slot N prints NPU N with device id 0: rank 0 reads it."""
    text = recording("info-310p.txt").replace("| 0       310P3", f"| {card:<7} 310P3")
    table = parse_npu_smi_info(text)
    assert list(table) == [0]
    assert (table[0]["npu"], table[0]["power_w"], table[0]["memory_used_mb"]) == (card, 15.8, 1074.0)
