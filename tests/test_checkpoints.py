"""Checkpoints: saved in Megatron-LM's folder names, resumed exactly, measured.

Exact resumption: the reference runs of conftest (PARITY_BASE: 1 warm-up step and 2 timed
steps, so steps 1-3) against a run of steps 1-2 that saves and a run that loads it and
trains step 3. In the same layout step 3 and the validation after it are equal bit for
bit; in another layout within the parity tolerance. Multi-rank cases are real torchrun
processes on gloo.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import LLAMA_UNTIED, parity_run, reference_run

from hwbench.checkpoint import LATEST_FILE, MANIFEST_FILE
from hwbench.harness.checkpointing import ResumePlan
from hwbench.judge.parity import LAYOUT_TOLERANCE
from hwbench.paths import result_files
from hwbench.result.model import Restart

pytestmark = pytest.mark.slow

FIRST_TWO = ["--steps", "1"]  # with PARITY_BASE's --warmup 1: steps 1 and 2
THIRD = ["--warmup", "0", "--steps", "1"]  # resumed after step 2: step 3


def _steps(result: dict) -> list[tuple[int, float, float, float]]:
    return [(s["step"], s["loss"], s["grad_norm"], s["lr"]) for s in result["steps"]]


def save_then_resume(tmp_path: Path, *layout: str, saving: tuple[str, ...] = ()) -> tuple[dict, dict, Path]:
    """Steps 1-2 saved in ``layout`` (with the options ``saving``), then step 3 resumed from it
    in the same layout: both results and the save folder."""
    save = tmp_path / "checkpoints"
    code, first = parity_run(tmp_path / "first", *layout, *FIRST_TWO, "--save", str(save), *saving)
    assert code == 0 and first["status"] == "ok", first.get("error")
    code, resumed = parity_run(tmp_path / "resumed", *layout, *THIRD, "--load", str(save))
    assert code == 0 and resumed["status"] == "ok", resumed.get("error")
    return first, resumed, save


def assert_exact(first: dict, resumed: dict, reference: dict) -> None:
    """Steps 1-2 and 3 are the reference's, bit for bit, and so is the final validation."""
    assert _steps(first) + _steps(resumed) == _steps(reference)
    assert resumed["metrics"]["valid_loss"] == reference["metrics"]["valid_loss"]


@pytest.fixture(scope="module")
def one_process_save(tmp_path_factory) -> tuple[dict, dict, Path]:
    """save_then_resume on one process, once for the module: its save folder is tiny_checkpoint, and its
    resumed run the same-settings resumption test_resuming_with_other_data_settings_... compares with."""
    return save_then_resume(tmp_path_factory.mktemp("one-process"))


def test_one_process_resumes_bit_for_bit_in_megatron_folders(one_process_save, single_process_run):
    first, resumed, save = one_process_save
    assert_exact(first, resumed, single_process_run)
    assert (save / LATEST_FILE).read_text().strip() == "2"
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000002", LATEST_FILE]  # nothing partial left
    manifest = json.loads((save / "iter_0000002" / MANIFEST_FILE).read_text())
    assert manifest["iteration"] == 2 and manifest["model"] == "tiny"
    assert manifest["data"]["consumed_train_samples"] == 2 * first["spec"]["global_batch_size"]
    # storage, measured: the one save after the last step, and the load of it
    saves, loads = first["checkpoint"]["saves"], resumed["checkpoint"]["loads"]
    assert [s["iteration"] for s in saves] == [2] and not saves[0]["timed"]
    on_disk = sum(p.stat().st_size for p in (save / "iter_0000002").iterdir() if p.name != MANIFEST_FILE)
    assert saves[0]["bytes"] == on_disk
    assert saves[0]["gb_per_s"] == pytest.approx(on_disk / saves[0]["wall_time_s"] / 1e9)
    assert saves[0]["stall_s"] >= saves[0]["wall_time_s"] > 0  # synchronous: training waits for all of it
    assert loads[0]["iteration"] == 2 and loads[0]["path"] == str(save / "iter_0000002")
    assert 0 < loads[0]["bytes"] <= on_disk and loads[0]["gb_per_s"] > 0
    from test_docs import undocumented

    assert not undocumented(first) and not undocumented(resumed)


def _report_line(folder: Path, capsys, run_id: str, section: str = "Checkpoints", *options: str) -> str:
    """The line of run ``run_id`` in ``section`` of `hwbench report FOLDER OPTIONS`."""
    from hwbench.cli import run_command

    capsys.readouterr()
    assert run_command("report", [str(folder), *options]) == 0
    text = capsys.readouterr().out
    text = text[text.index(f"## {section}"):]
    text = text[:text.index("\n## ")]
    return next(line for line in text.splitlines() if line.lstrip("|-* ").startswith(run_id))


def test_save_interval_saves_in_the_timed_window_and_prices_the_stall(tmp_path, capsys):
    save = tmp_path / "run" / "every"  # under --out: its manifests are no results to a reader of --out
    capsys.readouterr()
    code, result = parity_run(tmp_path / "run", "--steps", "3", "--save", str(save), "--save-interval", "2")
    summary = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("checkpoints"))
    assert code == 0, result.get("error")
    checkpoint = result["checkpoint"]
    assert [(s["iteration"], s["timed"]) for s in checkpoint["saves"]] == [(2, True), (4, False)]
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000002", "iter_0000004", LATEST_FILE]
    assert [p.name for p in result_files(tmp_path / "run")] == [f"{result['run_id']}.json"]
    # the save between timed steps is no step: 3 step times, and the stall priced per hour
    assert result["metrics"]["timed_steps"] == 3 == result["metrics"]["step_time_s"]["n"]
    median, stall = result["metrics"]["step_time_s"]["median"], checkpoint["save_stall_s"]
    assert checkpoint["stall_s_per_hour"] == pytest.approx(3600 * stall / (2 * median + stall))
    # the goodput charges the saves' time to the saves, apart from the training steps
    goodput = result["metrics"]["goodput"]
    assert goodput["checkpoint_save_s"] >= sum(s["stall_s"] for s in checkpoint["saves"]) * 0.9
    assert goodput["timed_steps_s"] < result["metrics"]["timed_wall_time_s"]
    assert sum(goodput["shares"].values()) == pytest.approx(1.0, abs=1e-9)
    # the run summary and the report carry them
    assert "2 saved" in summary and f"{checkpoint['stall_s_per_hour']:,.1f} s per hour at --save-interval 2" in summary
    per_hour = f"{checkpoint['stall_s_per_hour']:,.1f}"
    row = _report_line(tmp_path / "run", capsys, result["run_id"])
    assert "2 steps" in row and per_hour in row and "TP1 PP1 DP1" in row
    # the decision section prices the policy, in dollars where the device is priced
    price = f"{result['device']['device_model']}=3.6"
    policy = _report_line(tmp_path / "run", capsys, result["run_id"], "Decision", "--price", price)
    assert f"a save every 2 steps stalls {per_hour} s of every hour of training" in policy
    assert f"${checkpoint['stall_s_per_hour'] / 3600 * 3.6:,.2f} per hour on 1 devices" in policy


TP2 = ["--nproc-per-node", "2", "--tp", "2"]


@pytest.mark.heavy  # the one-process resumption and the killed-rank restart (TP2) stay in the default run
def test_tp2_resumes_bit_for_bit_and_its_checkpoint_loads_on_one_process(tmp_path, native_tp2_run,
                                                                          single_process_run):
    """Each rank writes its own shards; the vocabulary TP2 pads to 50432 rows loads into one
    process's 50304 (within the tolerance the padding itself costs, tests/test_parallel.py)."""
    first, resumed, save = save_then_resume(tmp_path, *TP2)
    assert_exact(first, resumed, native_tp2_run)
    shards = sorted(p.name for p in (save / "iter_0000002").glob("__*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    assert [r["rank"] for r in first["checkpoint"]["saves"][0]["ranks"]] == [0, 1]
    code, single = parity_run(tmp_path / "tp1", *THIRD, "--load", str(save))
    assert code == 0 and single["status"] == "ok", single.get("error")
    (step, loss, _norm, lr), = _steps(single)
    (_step, want, _want_norm, want_lr), = _steps(single_process_run)[2:]
    assert step == 3 and lr == want_lr and abs(loss - want) / want < LAYOUT_TOLERANCE
    assert any("generator states not restored" in w for w in single["warnings"])


def test_async_save_resumes_bit_for_bit(tmp_path, single_process_run):
    """torch.distributed.checkpoint's async_save: the write runs in the background, training
    waits only for the copy to host memory; the checkpoint is the same."""
    first, resumed, save = save_then_resume(tmp_path, saving=("--async-save", "--save-interval", "1"))
    assert_exact(first, resumed, single_process_run)
    saves = first["checkpoint"]["saves"]
    assert [s["iteration"] for s in saves] == [1, 2] and first["checkpoint"]["async_save"]
    assert all(s["wall_time_s"] > 0 and s["bytes"] > 0 for s in saves)
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000001", "iter_0000002", LATEST_FILE]


def test_llama_resumes_bit_for_bit_on_one_process(tmp_path, llama_untied, llama_untied_single_process_run):
    """The Llama architecture with an untied output layer (its own weight and AdamW moments in the
    checkpoint, beside the word embedding's): steps 1-2 saved, step 3 resumed, the single-process
    run's bit for bit."""
    first, resumed, save = save_then_resume(tmp_path, "--model", llama_untied)
    assert_exact(first, resumed, llama_untied_single_process_run)
    manifest = json.loads((save / "iter_0000002" / MANIFEST_FILE).read_text())
    assert manifest["model"] == llama_untied and manifest["iteration"] == 2


# heavy (python -m pytest -m heavy): the default run keeps TP2 above and Llama on one process; each of
# these is three torchrun jobs (uninterrupted, saved, resumed) and a load into one process. The Llama
# one: TP2's shards of q/k/v split by key/value heads, SwiGLU, and the untied output layer.
LAYOUTS = [pytest.param("tiny", ["--nproc-per-node", "2", "--pp", "2"], id="pp2", marks=pytest.mark.heavy),
           pytest.param("tiny", ["--nproc-per-node", "2", "--fsdp"], id="fsdp2", marks=pytest.mark.heavy),
           pytest.param(LLAMA_UNTIED, ["--nproc-per-node", "2", "--tp", "2"], id="llama-untied-tp2",
                        marks=pytest.mark.heavy)]


@pytest.mark.parametrize("model,layout", LAYOUTS)
def test_layout_resumes_bit_for_bit_and_loads_on_one_process(tmp_path, request, model, layout):
    reference = reference_run(request, model)
    layout = ["--model", model, *layout]
    code, uninterrupted = parity_run(tmp_path / "uninterrupted", *layout)
    assert code == 0, uninterrupted.get("error")
    first, resumed, save = save_then_resume(tmp_path, *layout)
    assert_exact(first, resumed, uninterrupted)
    code, single = parity_run(tmp_path / "one", "--model", model, *THIRD, "--load", str(save))
    assert code == 0 and single["status"] == "ok", single.get("error")
    (step, loss, norm, lr), = _steps(single)
    (_step, want, want_norm, want_lr), = _steps(reference)[2:]
    assert step == 3 and lr == want_lr
    assert abs(loss - want) / want < LAYOUT_TOLERANCE and abs(norm - want_norm) / want_norm < LAYOUT_TOLERANCE


def test_a_killed_rank_restarts_from_the_last_checkpoint_and_ends_ok(tmp_path, monkeypatch, capsys,
                                                                     native_tp2_run):
    """torchrun --max-restarts 1: rank 1 SIGKILLs itself at the start of step 3; torchrun starts
    both ranks again, they resume from step 2's checkpoint and train step 3 as an uninterrupted
    run does, bit for bit. The restart is recorded with what it cost, and left out of the step times."""
    monkeypatch.setenv("HWBENCH_FAULT", "1:3:signal")
    save = tmp_path / "checkpoints"
    code, result = parity_run(tmp_path / "run", *TP2, "--save", str(save), "--save-interval", "1",
                              "--max-restarts", "1")
    assert code == 0 and result["status"] == "ok", result.get("error")
    assert "--max-restarts=1" in result["launch"]["command"]
    (restart,) = result["checkpoint"]["restarts"]
    assert restart["attempt"] == 1 and restart["resumed_from_iteration"] == 2
    assert restart["reached_iteration"] == 2 and restart["steps_lost"] == 0  # killed before step 3 finished
    assert restart["time_lost_s"] > 0
    # the goodput counts the restart's lost time once: less what the new attempt's own clock holds
    goodput = result["metrics"]["goodput"]
    assert 0 < goodput["restarts_s"] < restart["time_lost_s"]
    assert sum(goodput["shares"].values()) == pytest.approx(1.0, abs=1e-9)
    assert any(w.startswith("restart 1: a rank failed; resumed from step 2") for w in result["warnings"])
    # the last attempt's steps only: step 3, the uninterrupted run's
    assert _steps(result) == _steps(native_tp2_run)[2:]
    assert result["metrics"]["valid_loss"] == native_tp2_run["metrics"]["valid_loss"]
    assert result["metrics"]["timed_steps"] == 1
    assert (save / LATEST_FILE).read_text().strip() == "3"
    assert [load["iteration"] for load in result["checkpoint"]["loads"]] == [2]
    # each rank's bytes hold its own shard of the model, however soon rank 0 renamed the folder
    (last,) = [s for s in result["checkpoint"]["saves"] if s["iteration"] == 3]
    shards = {rank: (save / "iter_0000003" / f"__{rank}_0.distcp").stat().st_size for rank in (0, 1)}
    assert all(part["bytes"] > shards[part["rank"]] for part in last["ranks"]), (last["ranks"], shards)
    from test_docs import undocumented

    assert not undocumented(result)
    line = _report_line(tmp_path / "run", capsys, result["run_id"]).rstrip(" |")
    assert line.endswith(f"1 (0 steps, {restart['time_lost_s']:,.1f} s)")


def test_a_restart_s_time_lost_comes_in_a_new_plan_once_training_starts():
    """The plan is frozen: training_from makes a new one whose restart holds the time from the
    checkpoint resumed from to the start of training; the plan it came from keeps none."""
    restart = Restart(attempt=1, resumed_from_iteration=2, reached_iteration=3, steps_lost=1)
    plan = ResumePlan("checkpoints/iter_0000002", 2, 4, restart, (), restart_since=100.0)
    started = plan.training_from(112.5)
    assert started.restart is not None and started.restart.dump() == {
        "attempt": 1, "resumed_from_iteration": 2, "reached_iteration": 3, "steps_lost": 1, "time_lost_s": 12.5}
    assert plan.restart is restart and restart.time_lost_s is None
    assert (started.load, started.start_iteration, started.end_iteration) == (plan.load, 2, 4)
    behind = plan.training_from(90.0).restart  # a clock behind the checkpoint's time: never below zero
    assert behind is not None and behind.time_lost_s == 0.0
    first = ResumePlan(None, 0, 3)  # no restart: nothing to add
    assert first.training_from(5.0) is first

DEEPSPEED_LAYOUTS = [
    pytest.param(
        ["--zero", "1"],
        {
            "mp_rank_00_model_states.pt",
            "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "zero_pp_rank_1_mp_rank_00_optim_states.pt",
        },
        id="zero1",
    ),
    pytest.param(
        ["--pp", "2"],
        {
            "mp_rank_00_model_states.pt",
            "mp_rank_01_model_states.pt",
            "layer_00-model_00-model_states.pt",
            "layer_03-model_00-model_states.pt",
        },
        id="pp2",
    ),
]


@pytest.mark.heavy
@pytest.mark.parametrize(("options", "deepspeed_files"), DEEPSPEED_LAYOUTS)
def test_deepspeed_resumes_bit_for_bit_through_its_own_checkpoint(tmp_path, capsys, options, deepspeed_files):
    """DeepSpeed's save_checkpoint/load_checkpoint on 2 ranks (ZeRO 1: each rank its optimizer
    shard; the pipeline engine: a file per layer) in an iter_NNNNNNN folder; another layout or
    engine is refused before anything runs."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install 'hwbench[deepspeed]')")
    layout = ["--nproc-per-node", "2", "--engine", "deepspeed", *options]
    code, uninterrupted = parity_run(tmp_path / "uninterrupted", *layout)
    assert code == 0, uninterrupted.get("error")
    first, resumed, save = save_then_resume(tmp_path, *layout)
    assert_exact(first, resumed, uninterrupted)
    files = {p.name for p in (save / "iter_0000002").iterdir()}
    assert deepspeed_files | {"rng_rank_00001.pt", MANIFEST_FILE} <= files
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000002", LATEST_FILE]  # no DeepSpeed 'latest'
    (save_op,) = first["checkpoint"]["saves"]
    assert save_op["bytes"] == sum(
        p.stat().st_size for p in (save / "iter_0000002").iterdir() if p.name != MANIFEST_FILE
    )
    assert resumed["checkpoint"]["loads"][0]["bytes"] > 0
    from hwbench.cli import main

    capsys.readouterr()
    for other, says in (
        (["--engine", "deepspeed", "--zero", "1"], "DeepSpeed loads it only in that layout"),
        (["--nproc-per-node", "2"], "load it with --engine deepspeed"),
    ):
        code = main(
            [
                "run",
                "--model",
                "tiny",
                "--data",
                "synthetic",
                "--seq-length",
                "32",
                *other,
                "--load",
                str(save),
                "--out",
                str(tmp_path / "refused"),
            ]
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and says in err[0], err
        assert not (tmp_path / "refused").exists()


# --- bad input and faults ------------------------------------------------------------------


def _refused(tmp_path: Path, capsys, *options: str) -> str:
    """`hwbench run ... OPTIONS` refused before anything runs: exit 2, one line, no result."""
    from hwbench.cli import main

    capsys.readouterr()
    out = tmp_path / "refused"
    code = main(
        ["run", "--quiet", "--model", "tiny", "--data", "synthetic", "--seq-length", "32", *options, "--out", str(out)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert not out.exists()
    return err[0]


@pytest.fixture(scope="module")
def tiny_checkpoint(one_process_save) -> Path:
    """A one-process save of steps 1-2 (the whole --save folder; tests copy it before changing it)."""
    return one_process_save[2]


def test_a_folder_that_is_no_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    line = _refused(tmp_path, capsys, "--load", str(tmp_path / "empty"))
    assert f"--load {tmp_path / 'empty'} is not a checkpoint" in line and LATEST_FILE in line
    line = _refused(tmp_path, capsys, "--load", str(tmp_path / "absent"))
    assert "no such folder" in line
    (tmp_path / "a-file").write_text("x")  # it said "no such folder" of a file that is there
    line = _refused(tmp_path, capsys, "--load", str(tmp_path / "a-file"))
    assert f"--load {tmp_path / 'a-file'}: a file, not a folder" in line


def test_another_models_checkpoint_is_refused_naming_the_difference(tmp_path, capsys, tiny_checkpoint):
    line = _refused(tmp_path, capsys, "--load", str(tiny_checkpoint), "--model", "small")
    assert "holds --model tiny" in line and "not this run's --model small" in line and "hidden_size" in line


def test_resuming_with_other_data_settings_runs_and_says_so_in_the_result(tmp_path, tiny_checkpoint,
                                                                          one_process_save):
    # As Megatron-LM, a checkpoint resumes at another sequence length or seed (a longer context,
    # say), but the position is counted in samples: the run is not the saved one's continuation.
    code, resumed = parity_run(tmp_path / "other", *THIRD, "--load", str(tiny_checkpoint), "--seq-length", "64",
                               "--seed", "7")
    assert code == 0 and resumed["status"] == "ok", resumed.get("error")
    said = [w for w in resumed["warnings"] if w.startswith("resumed with other data")]
    assert len(said) == 1, resumed["warnings"]
    assert "--seq-length 32 then, 64 now" in said[0] and "--seed 1234 then, 7 now" in said[0]
    assert "--data" not in said[0] and "--global-batch-size" not in said[0]
    _, same, _ = one_process_save  # the same checkpoint resumed with the same settings
    assert not [w for w in same["warnings"] if w.startswith("resumed with other data")]


def test_a_truncated_checkpoint_is_refused_naming_the_file(tmp_path, capsys, tiny_checkpoint):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    shard = copy / "iter_0000002" / "__0_0.distcp"
    with shard.open("r+b") as handle:
        handle.truncate(shard.stat().st_size // 2)  # a copy cut short
    line = _refused(tmp_path, capsys, "--load", str(copy))
    assert "is truncated: __0_0.distcp holds" in line and "the manifest says" in line
    shard.unlink()
    assert "is truncated: __0_0.distcp is missing" in _refused(tmp_path, capsys, "--load", str(copy))


def _set(key: str, value, within: str | None = None):
    def change(manifest: dict) -> None:
        (manifest[within] if within else manifest)[key] = value
    return change


# A manifest damaged (a field of the wrong type or range, a hostile file name) -> what the line names.
DAMAGED_MANIFESTS = {
    "iteration text": (_set("iteration", "two"), "iteration: must be an integer, not text"),
    "iteration null": (_set("iteration", None), "iteration: must be an integer, not null"),
    "iteration negative": (_set("iteration", -5), "iteration: must be >= 0, not -5"),
    "iteration fraction": (_set("iteration", 2.5), "iteration: must be an integer, not a number"),
    "iteration 400 digits": (_set("iteration", 10**400), "iteration: must be <= 9223372036854775807"),
    "iteration not the folder's": (_set("iteration", 7), "says iteration 7, the folder's name 2"),
    "version true": (_set("version", True), "manifest version 'True'; this hwbench reads version 1"),
    "files a list": (_set("files", [".metadata"]), "files: must be a mapping, not a list"),
    "files empty": (_set("files", {}), "files: must hold at least 1, not 0"),
    "file size text": (_set(".metadata", "big", "files"), "must be an integer, not text"),
    "file above the folder": (_set("../latest_checkpointed_iteration.txt", 2, "files"), "is not inside"),
    "file by absolute path": (_set("/etc/hostname", 1, "files"), "'/etc/hostname', which is not inside"),
    "model_config null": (_set("model_config", None), "model_config: must be a mapping, not null"),
    "layout text": (_set("layout", "tp1"), "layout: must be a mapping, not text"),
    "layout tp zero": (_set("tp", 0, "layout"), "layout.tp: must be >= 1, not 0"),
    "data position missing": (lambda m: m["data"].pop("consumed_train_samples"),
                              "data.consumed_train_samples: is missing"),
    "data position negative": (_set("consumed_valid_samples", -8, "data"), "must be >= 0, not -8"),
    "engine unknown": (_set("engine", "megatron"), "engine: must be one of 'native' or 'deepspeed'"),
    "model a number": (_set("model", 5), "model: must be text, not an integer"),
    "fused_qkv text": (_set("fused_qkv", "no"), "fused_qkv: must be true/false, not text"),
}


@pytest.mark.parametrize("damage", DAMAGED_MANIFESTS)
def test_a_damaged_manifest_is_refused_in_one_line_naming_the_field(tmp_path, capsys, tiny_checkpoint, damage):
    """Each of these was a traceback (int('two'), 'list' has no .items), a run that failed
    half way through its load (the data position), or a load that went on (a manifest
    naming /etc/hostname, a manifest of iteration 7 in iter_0000002)."""
    import shutil

    change, says = DAMAGED_MANIFESTS[damage]
    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    path = copy / "iter_0000002" / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    line = _refused(tmp_path, capsys, "--load", str(copy))
    assert f"--load {copy} (iter_0000002)" in line and says in line, line


def test_a_manifest_listing_a_file_through_a_link_out_of_the_folder_is_refused(tmp_path, capsys, tiny_checkpoint):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    (copy / "iter_0000002" / "outside").symlink_to("/etc")
    path = copy / "iter_0000002" / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["files"]["outside/hostname"] = Path("/etc/hostname").stat().st_size  # whole, as the manifest says
    path.write_text(json.dumps(manifest))
    line = _refused(tmp_path, capsys, "--load", str(copy))
    assert "lists the file 'outside/hostname', which is not inside the checkpoint's folder" in line, line


@pytest.mark.parametrize(
    ("content", "shown"),
    [(b"", "''"), (b"abc", "'abc'"), (b"-1", "'-1'"), (b"9" * 400, "'" + "9" * 40 + "'"), (b"../x", "'../x'"),
     ("\u00b2".encode(), "'\u00b2'"), ("\u0662".encode(), "'\u0662'"), (b"\xff\xfe", "'\ufffd\ufffd'")],
    ids=["empty", "text", "negative", "400 digits", "a path", "superscript two", "arabic-indic two", "not utf-8"],
)
def test_a_latest_file_that_holds_no_iteration_is_refused_in_one_line(tmp_path, capsys, tiny_checkpoint, content,
                                                                       shown):
    """400 digits made a folder name too long for the file system (OSError); '\u00b2' passed
    str.isdigit and failed int(); an Arabic-Indic two loaded iter_0000002."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    (copy / LATEST_FILE).write_bytes(content)
    line = _refused(tmp_path, capsys, "--load", str(copy))
    assert f"{LATEST_FILE} holds {shown}, not an iteration number (digits 0-9, at most 18)" in line, line


# The save of steps 1-2 is tiny_checkpoint's (the run below with --warmup 1 --steps 1, as conftest's
# PARITY_BASE and FIRST_TWO give it), copied onto the small file system rather than trained again.
FILL_DISK = """set -e
mount -t tmpfs -o size={size} tmpfs {disk}
touch {out}/mounted
cp -R {checkpoint} {disk}/save
{hwbench} --warmup 0 --steps 1 --load {disk}/save --save {disk}/save --out {out}/second || echo "exit $?" > {out}/code
cp -a {disk}/save {out}/after
"""


def test_a_disk_that_fills_during_a_save_keeps_the_previous_checkpoint(tmp_path, tiny_checkpoint):
    """A tmpfs (in a mount namespace of its own) with room for one checkpoint: the second save
    fails with ENOSPC; the run ends with status storage naming it, step 2's checkpoint stays
    the latest, whole, and no partial folder is left."""
    import shlex
    import subprocess
    import sys

    from hwbench.checkpoint import find_checkpoint

    size = sum(p.stat().st_size for p in (tiny_checkpoint / "iter_0000002").iterdir())
    hwbench = " ".join(
        shlex.quote(a)
        for a in [
            sys.executable,
            "-m",
            "hwbench",
            "run",
            "--quiet",
            "--model",
            "tiny",
            "--data",
            "synthetic",
            "--seq-length",
            "32",
            "--eval-iters",
            "1",
            "--no-telemetry",
        ]
    )
    disk = tmp_path / "disk"
    disk.mkdir()
    assert sorted(p.name for p in tiny_checkpoint.iterdir()) == ["iter_0000002", LATEST_FILE]
    script = FILL_DISK.format(size=int(size * 1.5), disk=disk, hwbench=hwbench, out=tmp_path,
                              checkpoint=shlex.quote(str(tiny_checkpoint)))
    unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--map-root-user", "--mount"]
    try:
        done = subprocess.run([*unshare, "sh", "-c", script], check=False, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here to mount a small file system")
    if "mount" in done.stderr and not (tmp_path / "mounted").exists():
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "code").read_text().strip() == "exit 1"
    (result_file,) = (tmp_path / "second").glob("*.json")
    result = json.loads(result_file.read_text())
    assert result["status"] == "storage"
    assert "the checkpoint of step 3 could not be written" in result["error"]["message"]
    assert "No space left on device" in result["error"]["message"]
    assert "iter_0000002 is still the latest, whole" in result["error"]["message"]
    after = tmp_path / "after"
    assert sorted(p.name for p in after.iterdir()) == ["iter_0000002", LATEST_FILE]  # nothing partial
    assert find_checkpoint(after).iteration == 2  # every file there with its size


def test_a_suite_point_measures_checkpoint_throughput(tmp_path):
    """The shipped suite's form (a save every few steps into a given folder) on the CPU: the
    sweep's result carries the storage figures; the shipped suite itself saves at an interval."""
    from hwbench.cli import main
    from hwbench.suites.suite import find_suite, load_suite

    shipped = load_suite(find_suite("checkpoints"))
    assert all(p.option("save") and p.option("save_interval") for p in shipped.points)
    assert any(p.option("async_save") for p in shipped.points)
    suite = tmp_path / "ckpt.yaml"
    suite.write_text(f"""name: ckpt
defaults: {{model: tiny, data: synthetic, seq-length: 32, steps: 2, warmup: 1, eval-iters: 0, telemetry: false}}
points:
  - {{name: local, save: {tmp_path / "disk"}, save-interval: 1}}
""")
    assert main(["sweep", str(suite), "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (path,) = (tmp_path / "runs" / "ckpt" / "local").glob("*.json")
    checkpoint = json.loads(path.read_text())["checkpoint"]
    assert [s["iteration"] for s in checkpoint["saves"]] == [1, 2, 3]
    assert checkpoint["save_gb_per_s"] > 0 and checkpoint["stall_s_per_hour"] > 0 and checkpoint["save_bytes"] > 0


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--save-interval", "2"], "--save-interval needs --save DIR"),
        (["--async-save"], "--async-save needs --save DIR"),
        (["--save", "x", "--async-save", "--engine", "deepspeed"], "DeepSpeed saves through its own save_checkpoint"),
        (["--max-restarts", "1"], "--max-restarts 1 restarts torchrun's ranks, and this run has one process"),
        (["--save-interval", "0", "--save", "x"], "--save-interval"),
    ],
)
def test_checkpoint_options_that_cannot_work_are_refused_in_one_line(tmp_path, capsys, options, says):
    assert says in _refused(tmp_path, capsys, *options)


def test_a_save_killed_half_way_is_never_loaded_and_the_next_run_clears_it(tmp_path, tiny_checkpoint):
    import shutil

    from hwbench.checkpoint import find_checkpoint

    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    half = copy / ".iter_0000005.partial"  # what a run killed mid-save leaves
    half.mkdir()
    (half / "__0_0.distcp").write_bytes(b"\0" * 100)
    assert find_checkpoint(copy).iteration == 2  # latest names the whole one
    code, result = parity_run(tmp_path / "run", *THIRD, "--load", str(copy), "--save", str(copy))
    assert code == 0 and [s["iteration"] for s in result["checkpoint"]["saves"]] == [3], result.get("error")
    assert sorted(p.name for p in copy.iterdir()) == ["iter_0000002", "iter_0000003", LATEST_FILE]


@pytest.mark.parametrize("latest", ["7\n", "seven\n", None])
def test_a_failed_save_names_the_latest_checkpoint_and_survives_a_damaged_latest_file(tmp_path, latest):
    """The reason a save failed reads the latest file as --load does: a damaged one is named, not a
    ValueError raised from inside the failure's own message."""
    from hwbench.checkpoint import failed_save

    if latest is not None:
        (tmp_path / LATEST_FILE).write_text(latest)
    said = failed_save(OSError(28, "No space left on device"), tmp_path, 9)
    assert said.startswith(f"the checkpoint of step 9 could not be written to --save {tmp_path}: ")
    assert said.endswith({"7\n": "iter_0000007 is still the latest, whole",
                          "seven\n": "not an iteration number (digits 0-9, at most 18))",
                          None: "no earlier checkpoint in it"}[latest])


def test_a_ranks_files_are_found_after_rank_0_renamed_the_save(tmp_path):
    """Rank 0 commits a save (renames its partial folder) as soon as its own write is done; another
    rank that looks for its files after that finds them in the renamed folder, not none (its bytes
    were counted as its generator states' alone)."""
    import torch

    from hwbench.checkpoint.native import TorchState

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    partial, final = tmp_path / "iter_0000001.partial", tmp_path / "iter_0000001"
    partial.mkdir()
    write = TorchState(model, optimizer, None).save(partial, rank=0, asynchronous=False)  # async: the same listing
    written = sorted(path.name for path in write.wait(partial))
    partial.rename(final)  # what rank 0's commit does
    found = write.wait(partial, final)
    assert written and sorted(path.name for path in found) == written and all(path.parent == final for path in found)
    assert sum(path.stat().st_size for path in found) > 64 * 64 * 4 * 3  # the weights and AdamW's two moments
