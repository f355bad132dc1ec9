"""`hwbench tune`: candidates, pruning, and a measured ranking on the CPU."""

import json

import pytest

from hwbench.cli import main
from hwbench.harness.tune import candidates
from hwbench.options import RunOptions


def test_candidates_cover_every_split_and_try_each_layout_early():
    base = RunOptions(model="1.3b", device="cpu", data="synthetic", global_batch_size=8)
    runnable, pruned = candidates(base, 4, None, ["native", "deepspeed"])
    assert pruned == []  # every layout of 1.3b fits 4 devices; no capacity given, nothing predicted too big
    found = [candidate for candidate, _layout in runnable]
    layouts = {(c.tp, c.pp, c.dp) for c in found}
    assert layouts == {(1, 1, 4), (1, 2, 2), (2, 1, 2), (1, 4, 1), (2, 2, 1), (4, 1, 1)}
    assert all(c.variant in ("plain", "fsdp") for c in found if c.tp * c.pp > 1 and c.dp > 1)
    assert {c.variant for c in found if (c.tp, c.pp) == (1, 1)} == {"plain", "fsdp", "zero1", "zero2", "zero3"}
    first_six = found[:6]  # every layout at its largest micro batch, no recompute, before anything else
    assert {(c.tp, c.pp, c.dp) for c in first_six} == layouts
    assert all(not c.recompute and c.micro_batch == c.per_rank_batch for c in first_six)


@pytest.mark.slow
def test_tune_on_cpu_ranks_measured_layouts(tmp_path, capsys):
    code = main(["tune", "--model", "tiny", "--devices", "2", "--device", "cpu", "--steps", "2", "--warmup", "1",
                 "--seq-length", "32", "--max-trials", "3", "--patience", "3", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    ranking = json.loads((tmp_path / "tiny-2" / "ranking.json").read_text())
    measured = [t for t in ranking["trials"] if t["samples_per_s"]]
    assert len(measured) == 3 and len(ranking["ranking"]) == 3
    speeds = {t["name"]: t["samples_per_s"] for t in measured}
    assert [speeds[name] for name in ranking["ranking"]] == sorted(speeds.values(), reverse=True)
    assert len({(t["tp"], t["pp"], t["dp"]) for t in measured}) == 3  # three different layouts were tried
    assert all(t["status"] == "not-measured" for t in ranking["trials"] if not t["run_id"])
    out = capsys.readouterr().out
    assert ranking["ranking"][0] in out and "not ranked" in out

    # the same command again: every trial is kept from the first tune, none measured again
    files = sorted(p.name for p in (tmp_path / "tiny-2").rglob("*.json"))
    assert main(["tune", "--model", "tiny", "--devices", "2", "--device", "cpu", "--steps", "2", "--warmup", "1",
                 "--seq-length", "32", "--max-trials", "3", "--patience", "3", "--out", str(tmp_path)]) == 0
    assert "kept from an earlier sweep" in capsys.readouterr().err
    again = json.loads((tmp_path / "tiny-2" / "ranking.json").read_text())
    assert again["ranking"] == ranking["ranking"] and sorted(p.name for p in (tmp_path / "tiny-2").rglob("*.json")) == files
    assert [t["run_id"] for t in again["trials"]] == [t["run_id"] for t in ranking["trials"]]


def test_tune_refuses_bad_input_in_one_line(capsys):
    assert main(["tune", "--model", "tiny", "--devices", "0"]) == 2
    assert "--devices 0" in capsys.readouterr().err
    assert main(["tune", "--model", "tiny", "--devices", "2", "--engines", "megatron"]) == 2
    assert "--engines 'megatron'" in capsys.readouterr().err
