"""`hwbench tune`: candidates, pruning, and a measured ranking on the CPU."""

import json

import pytest

from hwbench.cli import main
from hwbench.options import RunOptions
from hwbench.suites.tune import Candidate, Trial, candidates, ranking, write_ranking


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


def test_llama_candidates_take_every_layout_its_key_value_heads_allow():
    """llama-tiny (4 query heads over 2 key/value heads, 2 layers) on 4 devices: tensor and pipeline
    parallelism are candidates as for GPT-2; TP4 is pruned with `hwbench run`'s reason (it would
    split a key/value head), PP4 with the layers'."""
    base = RunOptions(model="llama-tiny", device="cpu", data="synthetic")
    runnable, pruned = candidates(base, 4, None, ["native", "deepspeed"])
    assert {(c.tp, c.pp, c.dp) for c, _layout in runnable} == {(1, 1, 4), (1, 2, 2), (2, 1, 2), (2, 2, 1)}
    assert {c.variant for c, _layout in runnable if (c.tp, c.pp) == (1, 1)} == {"plain", "fsdp", "zero1", "zero2",
                                                                               "zero3"}
    reasons = {(t.candidate.tp, t.candidate.pp): t.note for t in pruned}
    assert set(reasons) == {(4, 1), (1, 4)} and all(t.status == "invalid" for t in pruned)
    assert "--tp 4 does not divide the 2 key/value heads (num_query_groups)" in reasons[(4, 1)]
    assert "--pp 4 exceeds the 2 layers" in reasons[(1, 4)]


@pytest.mark.slow
@pytest.mark.heavy  # the default run enumerates Llama's candidates (above) and tunes tiny (below)
def test_tune_runs_llamas_layouts_and_ranks_them(tmp_path):
    """`hwbench tune --model llama-tiny --devices 2`: DDP, TP2 and PP2 each measured and ranked."""
    assert main(["tune", "--model", "llama-tiny", "--devices", "2", "--device", "cpu", "--steps", "2", "--warmup",
                 "1", "--seq-length", "32", "--max-trials", "3", "--patience", "3", "--quiet", "--out",
                 str(tmp_path)]) == 0
    ranking = json.loads((tmp_path / "llama-tiny-2" / "ranking.json").read_text())
    measured = [t for t in ranking["trials"] if t["samples_per_s"]]
    assert {(t["tp"], t["pp"], t["dp"]) for t in measured} == {(1, 1, 2), (2, 1, 1), (1, 2, 1)}
    assert all(t["status"] == "ok" for t in measured) and len(ranking["ranking"]) == 3


@pytest.mark.slow
def test_tune_on_cpu_ranks_measured_layouts(tmp_path, capsys):
    code = main(["tune", "--model", "tiny", "--devices", "2", "--device", "cpu", "--steps", "2", "--warmup", "1",
                 "--seq-length", "32", "--max-trials", "2", "--patience", "3", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    ranking = json.loads((tmp_path / "tiny-2" / "ranking.json").read_text())
    measured = [t for t in ranking["trials"] if t["samples_per_s"]]
    assert len(measured) == 2 and len(ranking["ranking"]) == 2
    speeds = {t["name"]: t["samples_per_s"] for t in measured}
    assert [speeds[r["name"]] for r in ranking["ranking"]] == sorted(speeds.values(), reverse=True)
    assert all(r["runs"] == 1 and r["samples_per_s_min"] == r["samples_per_s_max"] == r["samples_per_s"]
               for r in ranking["ranking"])
    assert len({(t["tp"], t["pp"], t["dp"]) for t in measured}) == 2  # two different layouts were tried
    assert all(t["status"] == "not-measured" for t in ranking["trials"] if not t["run_ids"])
    out = capsys.readouterr().out
    assert ranking["ranking"][0]["name"] in out and "not ranked" in out

    # the same command again: every trial is kept from the first tune, none measured again
    files = sorted(p.name for p in (tmp_path / "tiny-2").rglob("*.json"))
    assert main(["tune", "--model", "tiny", "--devices", "2", "--device", "cpu", "--steps", "2", "--warmup", "1",
                 "--seq-length", "32", "--max-trials", "2", "--patience", "3", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "kept from an earlier sweep" in err and "2 trial(s) x 1 repeat(s): " in err
    again = json.loads((tmp_path / "tiny-2" / "ranking.json").read_text())
    assert (
        again["ranking"] == ranking["ranking"]
        and sorted(p.name for p in (tmp_path / "tiny-2").rglob("*.json")) == files
    )
    assert [t["run_ids"] for t in again["trials"]] == [t["run_ids"] for t in ranking["trials"]]


def _trial(variant: str, samples: list[float]) -> Trial:
    return Trial(Candidate(1, 1, 2, variant, 4, False, 4), "ok", samples)


def test_layouts_one_run_cannot_tell_apart_share_a_rank_and_say_so(tmp_path):
    """One short trial each: 6.40 vs 6.23 samples/s (2.7%) is not a ranking; 6.40 vs 5.0 (28%) is,
    by the threshold alone, and the ranking says that too."""
    trials = [_trial("plain", [6.40]), _trial("fsdp", [6.23]), _trial("zero1", [5.0])]
    ranked = ranking(trials)
    assert [(r.rank, r.trial.candidate.variant) for r in ranked] == [(1, "plain"), (1, "fsdp"), (3, "zero1")]
    assert ranked[1].shares_with == "tp1-pp1-dp2-plain-mb4"
    assert ranked[1].confidence.startswith(
        "within 5% of tp1-pp1-dp2-plain-mb4 with one run a side: not distinguishable"
    )
    assert ranked[2].confidence == "tp1-pp1-dp2-plain-mb4 is 28.0% faster (threshold only: one run on a side)"
    write_ranking(trials, tmp_path / "ranking.json")
    saved = json.loads((tmp_path / "ranking.json").read_text())["ranking"]
    assert [(r["rank"], r["name"], r["shares_rank_with"]) for r in saved] == [
        (1, "tp1-pp1-dp2-plain-mb4", None),
        (1, "tp1-pp1-dp2-fsdp-mb4", "tp1-pp1-dp2-plain-mb4"),
        (3, "tp1-pp1-dp2-zero1-mb4", None),
    ]


def test_repeats_rank_by_median_and_keep_their_spread(tmp_path):
    """Three runs each: a separated 6.7% lead is a rank of its own; a 17% lower median whose runs
    spread 3-7 samples/s is inconclusive and shares the rank; ranking.json has each median, range and n."""
    trials = [_trial("plain", [6.40, 6.50, 6.30]), _trial("fsdp", [6.00, 6.10, 5.90]), _trial("zero1", [5.0, 7.0, 3.0])]
    ranked = ranking(trials)
    assert [(r.rank, r.trial.candidate.variant) for r in ranked] == [(1, "plain"), (2, "fsdp"), (2, "zero1")]
    assert ranked[1].confidence == "tp1-pp1-dp2-plain-mb4 is 6.7% faster (p=0.1 (exact U=0), separated)"
    assert ranked[2].confidence.startswith(
        "not distinguishable from tp1-pp1-dp2-fsdp-mb4: inconclusive: not significant with 3 and 3 runs"
    )
    write_ranking(trials, tmp_path / "ranking.json")
    saved = json.loads((tmp_path / "ranking.json").read_text())
    first = saved["ranking"][0]
    assert (first["samples_per_s"], first["samples_per_s_min"], first["samples_per_s_max"], first["runs"]) == (
        6.40,
        6.30,
        6.50,
        3,
    )
    assert saved["ranking"][2]["of_best"] == pytest.approx(5.0 / 6.40)
    assert saved["trials"][2]["samples_per_s_each"] == [5.0, 7.0, 3.0]


def test_tune_refuses_bad_input_in_one_line(capsys):
    assert main(["tune", "--model", "tiny", "--devices", "0"]) == 2
    assert "--devices 0" in capsys.readouterr().err
    assert main(["tune", "--model", "tiny", "--devices", "2", "--engines", "megatron"]) == 2
    assert "--engines 'megatron'" in capsys.readouterr().err
    # a minute enumerating the splits of 30000, then refused as --nproc-per-node
    assert main(["tune", "--model", "tiny", "--devices", "30000", "--out", "/nonexistent/tune"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--devices 30000 is not accepted; give an integer from 1 to 1024" in err[0], err


def test_tune_says_a_slow_precision_before_its_first_trial_even_quiet(tmp_path, capsys, monkeypatch):
    """fp16 on a CPU without fp16 units: the warning is on stderr before any trial starts, also with
    --quiet (the trials themselves are replaced: no training here)."""
    import hwbench.suites.tune
    from hwbench.device import cpu

    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"fpu", "avx", "avx2", "fma", "f16c"})
    said_before: list[str] = []

    def no_trials(*_args, **_kwargs):
        said_before.append(capsys.readouterr().err)
        raise SystemExit(0)

    monkeypatch.setattr(hwbench.suites.tune, "run_points", no_trials)
    with pytest.raises(SystemExit):
        main(
            [
                "tune",
                "--model",
                "tiny",
                "--devices",
                "2",
                "--device",
                "cpu",
                "--precision",
                "fp16",
                "--quiet",
                "--out",
                str(tmp_path),
            ]
        )
    [err] = said_before
    [line] = err.splitlines()
    assert line.startswith("hwbench: warning: --precision fp16: this CPU (") and line.endswith(
        "; --precision fp32 runs at speed here"
    )
