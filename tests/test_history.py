"""`hwbench history`: the database, series and segments, change points, the trend page.

The nights are modified copies of a real result (tests/data/compare/tiny-cpu.json, as
tests/test_compare.py uses it): each night 3 repeats with a start time, a commit and a
throughput drawn around a level. The noise model of the simulation test is built from real
repeated runs of this machine (tests/data/history/noise/, docs/history.md).
"""

from __future__ import annotations

import copy
import json
import random
import re
import sqlite3
import statistics
from pathlib import Path

import pytest

from hwbench.cli import main as cli_main
from hwbench.cli import run_command
from hwbench.errors import UsageError
from hwbench.history import changes, simulation, store
from hwbench.judge.compare import REGRESSION_EXIT
from hwbench.paths import result_files
from hwbench.result.model import RunResult
from hwbench.result.store import load_result, write_result
from hwbench.stats import energy_divisive_split, pooled_t_test, student_t_quantile

DATA = Path(__file__).parent / "data"
TEMPLATE = json.loads((DATA / "compare" / "tiny-cpu.json").read_text())
NOISE_RUNS = DATA / "history" / "noise"


def night_date(night: int) -> str:
    return f"2026-{10 + night // 28:02d}-{1 + night % 28:02d}"


def write_nights(folder: Path, levels: list[float], *, cv: float = 0.01, seed: int = 7, torch_from: int | None = None,
                 repeats: int = 3) -> Path:
    """One sweep folder per night: ``repeats`` results around ``levels[night]`` tokens/s."""
    rng = random.Random(seed)
    for night, level in enumerate(levels):
        for repeat in range(repeats):
            data = copy.deepcopy(TEMPLATE)
            data["run_id"] = f"night{night}-{repeat}"
            data["started_at"] = f"{night_date(night)}T02:{17 + repeat:02d}:00.000+00:00"
            data["environment"]["hwbench_git"] = {"commit": f"c{night:03d}" + "0" * 36, "dirty": False}
            if torch_from is not None and night >= torch_from:
                data["environment"]["torch_version"] = "2.14.0+cpu"
            value = level * (1 + rng.gauss(0, cv))
            data["metrics"]["tokens_per_s"] = value
            data["metrics"]["samples_per_s"] = value / data["spec"]["seq_length"]
            tokens_per_step = data["spec"]["global_batch_size"] * data["spec"]["seq_length"]
            data["metrics"]["step_time_s"]["median"] = tokens_per_step / value
            data["sweep"] = {"suite": "nightly", "suite_path": "x", "point": "one-rank", "repeat": repeat,
                             "repeats": repeats, "key": f"k{repeat}"}
            write_result(RunResult.from_dict(data), folder / f"night{night:03d}")
    return folder


def history(capsys, *argv) -> tuple[int, str, str]:
    code = run_command("history", [str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- statistics ---------------------------------------------------------------


def test_pooled_t_test_matches_r():
    # R: t.test(c(4,5,6), c(1,2,3), var.equal=TRUE): t = -3.6742, df = 4, p = 0.02131, CI -5.267 to -0.733
    test = pooled_t_test([4, 5, 6], [1, 2, 3])
    assert test["difference"] == -3 and test["df"] == 4
    assert test["t"] == pytest.approx(-3.6742, abs=1e-4) and test["p"] == pytest.approx(0.02131, abs=1e-5)
    assert (test["ci95_low"], test["ci95_high"]) == pytest.approx((-5.26696, -0.73304), abs=1e-4)
    assert student_t_quantile(0.05, 10) == pytest.approx(2.228139, abs=1e-5)
    assert student_t_quantile(0.001, 30) == pytest.approx(3.645959, abs=1e-5)


def test_energy_divisive_split_finds_the_step_and_the_end_of_a_dip():
    assert energy_divisive_split([10.0] * 12 + [9.0] * 8, 3)[:2] == (12, 20)
    assert energy_divisive_split([10.0] * 12 + [9.0] * 8 + [10.0] * 10, 3)[:2] in ((12, 20), (20, 30))
    assert energy_divisive_split([5.0] * 20, 3)[2] == 0
    assert energy_divisive_split([5.0] * 5, 3) is None


def test_change_points_find_each_step_and_nothing_in_noise():
    rng = random.Random(3)
    levels = [100.0] * 20 + [94.0] * 15 + [101.0] * 15
    assert changes.change_points([v * (1 + rng.gauss(0, 0.005)) for v in levels]) == [20, 35]
    assert changes.change_points([100 * (1 + rng.gauss(0, 0.01)) for _ in range(60)]) == []
    assert changes.change_points([100.0] * 5 + [50.0] * 2) == []  # two odd nights at the end are not a level yet


# --- the database ---------------------------------------------------------------


def test_add_is_idempotent_and_keeps_commit_date_fingerprint_and_every_metric(tmp_path, capsys):
    results = write_nights(tmp_path / "runs", [1000.0] * 4)
    db = tmp_path / "h" / "history.sqlite"
    code, out, _ = history(capsys, "add", results, "--db", db)
    assert code == 0 and "added 12 run(s), 0 already there" in out
    code, out, _ = history(capsys, "add", results, "--db", db)
    assert code == 0 and "added 0 run(s), 12 already there" in out and "12 run(s) in all" in out
    connection = sqlite3.connect(db)
    assert connection.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
    night, commit, fingerprint = connection.execute(
        "SELECT night, git_commit, fingerprint FROM runs WHERE run_id = 'night2-1'").fetchone()
    assert night == "2026-10-03" and commit.startswith("c002")
    assert json.loads(fingerprint)["torch_version"] == TEMPLATE["environment"]["torch_version"]
    names = {name for (name,) in connection.execute("SELECT name FROM metrics WHERE run_id = 'night2-1'")}
    assert {"tokens_per_s", "samples_per_s", "step_time_s.median", "step_time_s.cv", "memory.peak_reserved_bytes",
            "tflops_per_device", "loss_end"} <= names


def test_add_refuses_a_missing_path_and_writes_nothing(tmp_path):
    db = tmp_path / "history.sqlite"
    with pytest.raises(UsageError, match="RESULTS .*no such file"):
        run_command("history", ["add", str(tmp_path / "missing"), "--db", str(db)])
    assert not db.exists()
    assert cli_main(["history", "add", str(tmp_path / "missing"), "--db", str(db)]) == 2


def test_add_of_nothing_readable_is_refused_and_makes_no_database(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "broken.json").write_text("{")
    db = tmp_path / "history.sqlite"
    with pytest.raises(UsageError, match="no readable hwbench result files \\(1 unreadable: .*broken.json: "):
        run_command("history", ["add", str(tmp_path / "runs"), "--db", str(db)])
    assert not db.exists()


def test_add_names_unreadable_files_and_takes_the_rest(tmp_path, capsys):
    results = write_nights(tmp_path / "runs", [1000.0])
    (results / "broken.json").write_text('{"schema_version": 1, "run_id": ')
    code, out, err = history(capsys, "add", results, "--db", tmp_path / "h.sqlite")
    assert code == 0 and "added 3 run(s)" in out and "1 unreadable" in out and "broken.json" in err


def test_database_of_a_newer_schema_or_not_sqlite_is_refused(tmp_path):
    newer = tmp_path / "newer.sqlite"
    sqlite3.connect(newer).execute(f"PRAGMA user_version = {store.SCHEMA_VERSION + 1}")
    with pytest.raises(UsageError, match="--db .*newer than this hwbench"):
        store.open_history(newer)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_text("not a database" * 100)
    with pytest.raises(UsageError, match="--db .*not a usable SQLite database"):
        store.open_history(garbage)
    with pytest.raises(UsageError, match="--db .*no history database"):
        store.open_history(tmp_path / "absent.sqlite")
    with pytest.raises(UsageError, match="--db 'mysql://ci@db/hwbench': not a database hwbench knows"):
        store.open_history("mysql://ci@db/hwbench", create=True)
    with pytest.raises(UsageError, match="--db .* is not a file"):
        store.open_history(tmp_path, create=True)


def test_an_old_database_is_migrated_when_opened(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite"
    store.open_history(path, create=True).close()
    monkeypatch.setitem(store.MIGRATIONS, store.SCHEMA_VERSION + 1, ("ALTER TABLE runs ADD COLUMN note TEXT",))
    monkeypatch.setattr(store, "SCHEMA_VERSION", store.SCHEMA_VERSION + 1)
    connection = store.open_history(path)
    assert connection.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
    assert "note" in [row[1] for row in connection.execute("PRAGMA table_info(runs)")]


def mark_simulated(folder: Path, from_night: int) -> None:
    """The runs of ``folder`` from night ``from_night`` on as a stand-in writes them (device and environment)."""
    for path in sorted(folder.glob("night*/*.json")):
        data = json.loads(path.read_text())
        if int(data["run_id"].removeprefix("night").split("-")[0]) >= from_night:
            data["device"]["simulated"] = data["environment"]["simulated"] = True
            path.write_text(json.dumps(data))


SIMULATED_SERIES = "tokens/s of tiny on Intel(R) Xeon(R) Processor [simulated] fp32"


def test_simulated_runs_form_their_own_series_and_add_says_so(tmp_path, capsys):
    """Six nights through a stand-in at 1% of the device's throughput were filed into the device's
    series: a 99% fall, an open regression. They are a series of their own, and `add` says so."""
    runs = write_nights(tmp_path / "runs", [1000.0] * 12 + [10.0] * 6)
    mark_simulated(runs, from_night=12)
    db = tmp_path / "h.sqlite"
    code, out, _ = history(capsys, "add", runs, "--db", db)
    assert code == 0 and ("18 of the runs added are simulated (a stand-in ran the device's code path on the host): "
                          "they form their own series, marked [simulated], apart from the device's") in out
    code, out, _ = history(capsys, "changes", "--db", db, "--metric", "tokens_per_s")
    assert code == 0 and " fell " not in out and "0 open regression(s)" in out
    code, out, _ = history(capsys, "show", "--db", db, "--metric", "tokens_per_s")
    rows = {line.split("  ")[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"tokens/s of tiny on Intel(R) Xeon(R) Processor fp32", SIMULATED_SERIES}


def test_a_version_2_database_keeps_its_runs_and_sets_its_simulated_runs_apart(tmp_path, capsys):
    """A database written before the point key had stand_in (version 2: 22 fields) is brought up
    to date when opened: every run kept, the simulated ones (by their stored environment) in their
    own series."""
    runs = write_nights(tmp_path / "runs", [1000.0] * 12 + [10.0] * 6)
    mark_simulated(runs, from_night=12)
    db = tmp_path / "h.sqlite"
    history(capsys, "add", runs, "--db", db)
    with sqlite3.connect(db) as connection:  # as version 2 wrote it
        for run_id, key in connection.execute("SELECT run_id, point_key FROM runs").fetchall():
            connection.execute("UPDATE runs SET point_key = ? WHERE run_id = ?",
                               (json.dumps(json.loads(key)[:len(store.V2_POINT_FIELDS)]), run_id))
        connection.execute("PRAGMA user_version = 2")
    code, out, _ = history(capsys, "show", "--db", db, "--metric", "tokens_per_s")
    assert code == 0 and SIMULATED_SERIES in out
    with sqlite3.connect(db) as connection:
        keys = dict(connection.execute("SELECT run_id, point_key FROM runs").fetchall())
        assert connection.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
    assert len(keys) == 54
    stand_in = len(store.V2_POINT_FIELDS)  # version 3 appended it; version 4 fp8_recipe after it, version 5 ep
    assert all(json.loads(key)[stand_in + 1:] == [None, 1] for key in keys.values())
    assert {run_id for run_id, key in keys.items() if json.loads(key)[stand_in] == "simulated"} == \
        {f"night{night}-{repeat}" for night in range(12, 18) for repeat in range(3)}
    assert all(json.loads(key)[stand_in] is None for run_id, key in keys.items()
               if int(run_id[5:].split("-")[0]) < 12)


# --- changes, show, report --------------------------------------------------------


def test_changes_names_the_regression_its_night_commit_and_ci_and_exits_3(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 25 + [930.0] * 6), "--db", db)
    code, out, _ = history(capsys, "changes", "--db", db, "--metric", "tokens_per_s")
    assert code == REGRESSION_EXIT == 3
    line = next(line for line in out.splitlines() if " fell " in line)
    assert line.startswith("tokens/s of tiny on Intel(R) Xeon(R) Processor fp32 fell ")
    assert 6.0 <= float(re.search(r" fell ([0-9.]+)%", line).group(1)) <= 8.0  # a 7% step
    assert f"at {night_date(25)}, commit c025000" in line and "the night before: c024000" in line
    assert "confirmed by 5 later nights" in line and "95% CI -" in line
    assert "OPEN REGRESSION" in out and "1 open regression(s) beyond 5%" in out
    # accepted from that date on: --since after it, or a threshold above the drop
    assert history(capsys, "changes", "--db", db, "--since", night_date(26), "--metric", "tokens_per_s")[0] == 0
    assert history(capsys, "changes", "--db", db, "--threshold", "10%", "--metric", "tokens_per_s")[0] == 0


def test_a_recovered_regression_is_listed_but_not_open(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 20 + [920.0] * 8 + [1002.0] * 8), "--db", db)
    code, out, _ = history(capsys, "changes", "--db", db, "--metric", "tokens_per_s")
    assert code == 0 and "0 open regression(s)" in out and "2 change point(s)" in out
    assert 7.0 <= float(re.search(r" fell ([0-9.]+)%", out).group(1)) <= 9.0
    assert 7.5 <= float(re.search(r" rose ([0-9.]+)%", out).group(1)) <= 10.0


def test_a_half_fixed_regression_stays_open_while_the_rest_passes_the_threshold(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 20 + [880.0] * 8 + [940.0] * 8), "--db", db)
    code, out, _ = history(capsys, "changes", "--db", db)
    assert code == REGRESSION_EXIT and f"worse than before {night_date(20)}" in out
    step_time = next(line for line in out.splitlines() if line.startswith("median step time") and " rose " in line)
    assert step_time.endswith("(regression)")  # lower is better: a longer step is the regression


def test_an_environment_change_starts_a_segment_and_is_not_a_regression(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 20 + [900.0] * 8, torch_from=20), "--db", db)
    code, out, _ = history(capsys, "changes", "--db", db)
    assert code == 0
    assert (f"tokens/s of tiny on Intel(R) Xeon(R) Processor fp32: new environment from {night_date(20)} "
            f"(torch_version {TEMPLATE['environment']['torch_version']} -> 2.14.0+cpu)") in out
    assert " fell " not in out and "0 change point(s), 3 environment change(s)" in out


def test_show_lists_each_series(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 12 + [900.0] * 4), "--db", db)
    code, out, _ = history(capsys, "show", "--db", db)
    assert code == 0
    rows = {line.split("  ")[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"tokens/s of tiny on Intel(R) Xeon(R) Processor fp32",
                         "median step time of tiny on Intel(R) Xeon(R) Processor fp32",
                         "peak memory of tiny on Intel(R) Xeon(R) Processor fp32"}
    assert "regression -10." in rows["tokens/s of tiny on Intel(R) Xeon(R) Processor fp32"]


def test_report_is_one_offline_page_with_a_chart_per_series(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 12 + [900.0] * 9, torch_from=17), "--db", db)
    page = tmp_path / "trends.html"
    assert history(capsys, "report", "--db", db, "--out", page)[0] == 0
    text = page.read_text()
    assert text.count("<svg") == 3 and "src=" not in text and "http://" not in text.replace("http://www.w3.org", "")
    assert f"{night_date(12)}, commit c012000" in text  # a night's tooltip
    assert "stroke-dasharray" in text and "new torch_version" in text
    # each night of tokens/s is a dot at its median with a whisker over its 3 runs
    chart = text.split("<h2>tokens/s of ")[1].split("</svg>")[0]
    dots = {title: float(cy) for cy, title in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)" r="3.6"[^>]*>'
                                                          r"<title>([^<]*)</title>", chart)}
    whiskers = re.findall(r'<path class="whisker" d="M[\d.]+,([\d.]+)V([\d.]+)[^"]*"[^>]*>'
                          r"<title>([^<]*)</title>", chart)
    assert len(dots) == len(whiskers) == 21
    assert all(float(top) < dots[title] < float(bottom) for top, bottom, title in whiskers)


def test_the_trend_page_and_the_report_share_one_stylesheet_and_script(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 4), "--db", db)
    assert history(capsys, "report", "--db", db, "--out", tmp_path / "trends.html")[0] == 0
    assert run_command("report", [str(tmp_path / "runs"), "--format", "html", "--out", str(tmp_path / "r.html")]) == 0
    trends, report = (tmp_path / "trends.html").read_text(), (tmp_path / "r.html").read_text()

    def inline(page: str, tag: str) -> str:
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.DOTALL)
        assert len(found) == 1
        return found[0]

    assert inline(trends, "style") == inline(report, "style") and "svg.chart" in inline(report, "style")
    assert inline(trends, "script") == inline(report, "script") and "g.legend" in inline(report, "script")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["changes", "--since", "yesterday"], "--since 'yesterday': not a date"),
        (["changes", "--threshold", "abc"], "--threshold 'abc'"),
        (["show", "--metric", "speed"], "invalid choice: 'speed'"),
        (["report", "--out", "{db}"], "--out .* is one of the input files"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 3), "--db", db)
    argv = [a.replace("{db}", str(db)) for a in argv] + ["--db", str(db)]
    with pytest.raises(UsageError, match=message):
        run_command("history", argv)
    assert cli_main(["history", *argv]) == 2
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 9


# --- the simulation (docs/history.md has the full one) ----------------------------


def real_noise_runs() -> list[float]:
    files = result_files([NOISE_RUNS])
    if not files:
        pytest.skip(f"no real repeated runs in {NOISE_RUNS}")
    return [load_result(path).metrics.tokens_per_s for path in files]


def test_noise_model_is_built_from_real_runs():
    values = real_noise_runs()
    assert len(values) >= 10
    model = simulation.NoiseModel.from_runs(values, resample=True)
    assert model.cv == pytest.approx(statistics.stdev(values) / statistics.fmean(values))
    assert statistics.median(model.deviations) == pytest.approx(0.0, abs=1e-12)


def test_simulated_goals_hold_at_two_percent_run_to_run_noise():
    """Seeded and small (the documented figures: benchmarks/history_simulation.py, 1000 series):
    a 5% step found within 3 nights in >= 95% of series, within one night of the truth, and
    noise-only series raising no false regression on any night."""
    noise = simulation.NoiseModel(0.02)
    steps = simulation.simulate_steps(noise, series=60, seed=101)
    assert steps.rate("detected") >= 0.95 and steps.rate("located") >= 0.95
    quiet = simulation.simulate_noise_only(noise, series=60, seed=102)
    assert quiet.false_change == 0 and quiet.false_gate == 0


def test_at_this_machines_noise_a_five_percent_step_cannot_be_found():
    """The real runs of this shared machine are far noisier than 2%: the simulation says so
    (what docs/history.md reports), rather than pretending."""
    noise = simulation.NoiseModel.from_runs(real_noise_runs(), resample=True)
    assert noise.cv > 0.10
    assert simulation.simulate_steps(noise, series=30, seed=103).rate("detected") < 0.5


def test_history_needs_no_torch(tmp_path, capsys):
    """`history changes` reads a database and does statistics: it must not wait for torch."""
    import subprocess
    import sys

    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 6), "--db", db)
    code = (
        f"import sys\nfrom hwbench.cli import main\nmain(['history', 'changes', '--db', {str(db)!r}])\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO TORCH', file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "NO TORCH", done.stderr[-2000:]


# --- damaged, busy, foreign and concurrent databases; bad start times; FIFOs ---------


def _one_line_exit_2(capsys, argv, *expected):
    code = cli_main(["history", *map(str, argv)])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    return err


def _small_history(tmp_path, capsys) -> Path:
    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1000.0] * 30), "--db", db)
    return db


READ_COMMANDS = (["show"], ["changes"], ["report", "--out", "trends.html"])


def test_a_damaged_database_file_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = _small_history(tmp_path, capsys)
    with open(db, "r+b") as stream:  # dd if=/dev/urandom bs=1 count=24 seek=4096 conv=notrunc
        stream.seek(4096)
        stream.write(random.Random(5).randbytes(24))
    for command in READ_COMMANDS:
        _one_line_exit_2(capsys, [*command, "--db", db], "--db", "the history database is damaged")
    _one_line_exit_2(capsys, ["add", NOISE_RUNS, "--db", db], "--db", "damaged")
    assert not (tmp_path / "trends.html").exists()


@pytest.mark.parametrize(
    "damage, words",
    [
        ("UPDATE runs SET fingerprint = 'not json'", "fingerprint is not a JSON mapping"),
        ("UPDATE runs SET point_key = '{bad'", "point_key is not a JSON list"),
        ("UPDATE runs SET point_key = '[1,2]'", "point_key is not a JSON list"),
        ("UPDATE metrics SET value = 'abc' WHERE name = 'tokens_per_s'", "tokens_per_s is not a finite number"),
        ("DROP TABLE metrics", "no metrics table"),
        # every column a reader parses: the start time orders the nights, the night groups them, the point
        # key's fields label the series and compare layouts (each of these used to be a traceback)
        (
            "UPDATE runs SET started_at = 'garbage' WHERE run_id LIKE 'night3-%'",
            "started_at 'garbage' is not an ISO 8601",
        ),
        (
            "UPDATE runs SET started_at = '2026-10-04T99:00' WHERE run_id LIKE 'night3-%'",
            "is not an ISO 8601 date-time",
        ),
        (
            "UPDATE runs SET started_at = '0001-01-01T00:00:00+05:00' WHERE run_id = 'night3-0'",
            "is out of the range of dates in UTC",
        ),
        ("UPDATE runs SET night = 'garbage' WHERE run_id = 'night3-1'", "night 'garbage' is not a date (YYYY-MM-DD)"),
        (
            "UPDATE runs SET point_key = json_set(point_key, '$[10]', 'a') WHERE run_id = 'night3-1'",
            "point_key's tp is not int",
        ),
        (
            "UPDATE runs SET point_key = json_set(point_key, '$[0]', json('null')) WHERE run_id = 'night3-1'",
            "point_key's model is not str",
        ),
        (
            "UPDATE runs SET point_key = json_set(point_key, '$[4]', json('true')) WHERE run_id = 'night3-1'",
            "point_key's micro_batch_size is not int or None",
        ),
    ],
)
def test_damaged_rows_are_refused_with_their_run_id(tmp_path, capsys, monkeypatch, damage, words):
    monkeypatch.chdir(tmp_path)
    db = _small_history(tmp_path, capsys)
    with sqlite3.connect(db) as connection:
        connection.execute(damage)
    for command in READ_COMMANDS:
        err = _one_line_exit_2(capsys, [*command, "--db", db, "--metric", "tokens_per_s"], "--db", words)
        assert "DROP" in damage or "run 'night" in err


@pytest.mark.parametrize("content", [b"", "foreign"])
def test_read_commands_never_write_into_a_file_that_is_not_a_history(tmp_path, capsys, monkeypatch, content):
    import hashlib

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "other.db"
    if content == "foreign":
        with sqlite3.connect(db) as connection:
            connection.execute("CREATE TABLE x (a)")
    else:
        db.write_bytes(content)
    before = hashlib.md5(db.read_bytes()).hexdigest()
    for command in READ_COMMANDS:
        _one_line_exit_2(capsys, [*command, "--db", db], "--db", "not an hwbench history")
    assert hashlib.md5(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
    if content == "foreign":  # nor does add take it over
        _one_line_exit_2(capsys, ["add", NOISE_RUNS, "--db", db], "not an hwbench history")
        assert hashlib.md5(db.read_bytes()).hexdigest() == before


def _concurrent_writer(db, folder, barrier, answers):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    barrier.wait()  # the writers start `hwbench history add` at the same moment
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["history", "add", str(folder), "--db", str(db)])
    found = re.search(r"added (\d+) run\(s\), (\d+) already there", out.getvalue())
    answers.put(tuple(map(int, found.groups())) if code == 0 and found else f"exit {code}: {err.getvalue()}")


# A race shows in some trials only: the default run tries once, `-m heavy` twice more.
@pytest.mark.parametrize("trial", [0, *(pytest.param(trial, marks=pytest.mark.heavy) for trial in (1, 2))])
def test_concurrent_adds_create_the_database_once_and_count_every_run_once(tmp_path, trial):
    """Real processes, as four nightly jobs sharing one database: the first adds race to
    create it, the later ones to add the same runs; every run is counted added exactly once."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    db = tmp_path / "new" / "sub" / "h.sqlite"
    more = write_nights(tmp_path / "runs", [1000.0] * 20)
    for folder in (NOISE_RUNS, more):  # a database that does not exist yet, then one that does
        barrier, answers = context.Barrier(4), context.Queue()
        writers = [context.Process(target=_concurrent_writer, args=(db, folder, barrier, answers)) for _ in range(4)]
        for writer in writers:
            writer.start()
        counts = [answers.get(timeout=300) for _ in writers]
        for writer in writers:
            writer.join(timeout=60)
        files = len(result_files([folder]))
        assert all(isinstance(count, tuple) and sum(count) == files for count in counts), counts
        assert sum(added for added, _ in counts) == files, counts
    total = len(result_files([NOISE_RUNS])) + 60
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == total
    assert sorted(p.name for p in db.parent.iterdir()) == ["h.sqlite"]


def test_a_busy_database_is_named_busy_not_unusable(tmp_path, capsys, monkeypatch):
    db = _small_history(tmp_path, capsys)
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        _one_line_exit_2(capsys, ["add", NOISE_RUNS, "--db", db], "--db", "busy", "another `hwbench history add`")
    finally:
        holder.execute("ROLLBACK")
    assert store.BUSY_TIMEOUT_S == 0.2 and history(capsys, "add", NOISE_RUNS, "--db", db)[0] == 0


@pytest.mark.parametrize(
    "step, failure",
    [
        ("run_count", KeyboardInterrupt),  # SIGINT after the runs went in
        ("_insert_new", sqlite3.OperationalError("disk I/O error")),
    ],
)
def test_an_add_into_a_new_file_that_fails_late_leaves_no_file(tmp_path, capsys, monkeypatch, step, failure):
    def late(*args):
        raise failure

    monkeypatch.setattr(store, step, late)
    db = tmp_path / "h.sqlite"
    code = cli_main(["history", "add", str(NOISE_RUNS), "--db", str(db)])
    _, err = capsys.readouterr()
    assert code == (130 if failure is KeyboardInterrupt else 2) and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("started_at", ["not a date", "9999-01-01T00:00:00+00:00", "2026-11-23", ""])
def test_a_result_without_a_usable_start_time_is_left_out_with_its_reason(tmp_path, capsys, started_at):
    results = write_nights(tmp_path / "runs", [1000.0])
    bad = json.loads((results / "night000" / "night0-0.json").read_text())
    bad["run_id"], bad["started_at"] = "bad-start", started_at
    (results / "bad-start.json").write_text(json.dumps(bad))
    db = tmp_path / "h.sqlite"
    code, out, err = history(capsys, "add", results, "--db", db)
    assert code == 0 and "added 3 run(s)" in out and "1 unreadable" in out
    assert "bad-start.json: field 'started_at'" in err
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs WHERE run_id = 'bad-start'").fetchone()[0] == 0


# A figure the result model keeps as it is (a metric hwbench does not write), made hostile ->
# what the line names. 400 digits was an OverflowError traceback; NaN "the history database is
# damaged"; infinity and the names were stored.
HOSTILE_METRICS = {
    "400 digits": ('"custom": ' + "9" * 400, "field 'metrics.custom': an integer of 400 digits"),
    "NaN": ('"custom": NaN', "field 'metrics.custom': nan; a figure must be a finite number"),
    "infinity": ('"custom": -Infinity', "field 'metrics.custom': -inf; a figure must be a finite number"),
    "nested infinity": ('"custom": {"inner": Infinity}', "field 'metrics.custom.inner': inf"),
    "a name of 100,000 characters": (f'"{"x" * 100_000}": 1.0', "must be printable and at most 200 characters"),
    "a line break in a name": ('"a\\nb": 1.0', "field 'metrics.a\\nb': a metric's name must be printable"),
}


@pytest.mark.parametrize("hostile", HOSTILE_METRICS)
def test_a_hostile_extra_metric_is_one_line_and_exit_2_alone_and_left_out_among_others(tmp_path, capsys, hostile):
    metric, says = HOSTILE_METRICS[hostile]
    results = write_nights(tmp_path / "runs", [1000.0])
    text = (results / "night000" / "night0-0.json").read_text().replace('"run_id": "night0-0"', '"run_id": "bad"')
    assert '"metrics": {' in text
    bad = tmp_path / "bad.json"
    bad.write_text(text.replace('"metrics": {', '"metrics": {' + metric + ", ", 1))
    db = tmp_path / "h.sqlite"
    assert cli_main(["history", "add", str(bad), "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no readable hwbench result files (1 unreadable: {bad}: " in err[0] and says in err[0]
    assert not db.exists()
    bad.rename(results / "bad.json")  # among good results: left out with the reason, the rest added
    code, out, err = history(capsys, "add", results, "--db", db)
    assert code == 0 and "added 3 run(s)" in out and "1 unreadable" in out
    assert f"left out {results / 'bad.json'}: " in err and says in err
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs WHERE run_id = 'bad'").fetchone()[0] == 0


def test_a_fifo_among_the_results_is_left_out_not_waited_on(tmp_path):
    import os
    import subprocess
    import sys

    from hwbench.result.store import load_results

    results = write_nights(tmp_path / "runs", [1000.0])
    os.mkfifo(results / "z.json")
    code = (
        f"from hwbench.cli import main\nraise SystemExit(main(['history', 'add', {str(results)!r}, '--db', "
        f"{str(tmp_path / 'h.sqlite')!r}]))"
    )
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 0 and "added 3 run(s)" in done.stdout and "1 unreadable" in done.stdout, done
    assert "z.json: not a regular file (a FIFO)" in done.stderr
    with pytest.warns(UserWarning, match="z.json: not a regular file"):
        loaded, skipped = load_results([results])
    assert len(loaded) == 3 and [path.name for path, _ in skipped] == ["z.json"]


def test_nights_are_ordered_by_the_instant_not_the_text():
    """10-02T01:00+05:00 is 10-01T20:00Z: before 10-01T21:00Z, though its text sorts after."""
    from hwbench.history.series import nights_of
    from hwbench.history.store import StoredRun, night_of

    def run(run_id, started_at, value):
        return StoredRun(run_id, started_at, night_of(started_at), "c" + run_id, "ok", {}, {}, value)

    nights = nights_of([run("1", "2026-10-01T21:00:00+00:00", 2.0), run("2", "2026-10-02T01:00:00+05:00", 1.0)])
    assert [night.values for night in nights] == [[1.0], [2.0]]


# --- an add stopped or killed half way, runs added twice, figures at the float limit ----------------


def _copies(folder: Path, count: int) -> Path:
    """``count`` results, one a night: enough that adding them takes a moment to catch."""
    folder.mkdir()
    for number in range(count):
        data = copy.deepcopy(TEMPLATE)
        data["run_id"], data["started_at"] = f"copy{number:05d}", f"{night_date(number % 28)}T02:00:00+00:00"
        (folder / f"copy{number:05d}.json").write_text(json.dumps(data))
    return folder


def _stopped_inside_a_new_database(results: Path, db: Path):
    """`hwbench history add` into a new database, stopped (SIGSTOP) while its temporary exists;
    (the process, the temporary's names), or None when the add finished before it was caught."""
    import os
    import signal
    import subprocess
    import sys

    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    add = subprocess.Popen(
        [sys.executable, "-m", "hwbench", "history", "add", str(results), "--db", str(db)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while add.poll() is None and not list(db.parent.glob(f".{db.name}.*.tmp")):
        __import__("time").sleep(0.001)
    if add.poll() is None:
        os.kill(add.pid, signal.SIGSTOP)
        temporaries = sorted(path.name for path in db.parent.glob(f".{db.name}.*"))
        if not db.exists() and temporaries:
            return add, temporaries
        os.kill(add.pid, signal.SIGCONT)
    add.communicate()
    return None


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGKILL"])
def test_an_add_into_a_new_database_stopped_by_a_signal_leaves_nothing_behind(tmp_path, sig):
    """SIGTERM and SIGHUP end the add as Ctrl-C does (exit 130, one line, no file). SIGKILL leaves
    the temporary named by the writer's process; the next add into that folder removes it (and
    SQLite's journal of it), says so, and leaves a living writer's and another host's alone."""
    import os
    import signal
    import socket
    import subprocess

    results = _copies(tmp_path / "runs", 600)
    for attempt in range(5):  # caught while the temporary exists (the add may finish first)
        db = tmp_path / f"try{attempt}" / "h.sqlite"
        db.parent.mkdir()
        caught = _stopped_inside_a_new_database(results, db)
        if caught:
            break
    else:
        pytest.fail("the add never held its temporary long enough to be stopped")
    add, temporaries = caught
    assert f".h.sqlite.{socket.gethostname()}-{add.pid}-" in temporaries[0]
    os.kill(add.pid, getattr(signal, sig))
    os.kill(add.pid, signal.SIGCONT)
    _, err = add.communicate(timeout=120)
    if sig != "SIGKILL":
        assert add.returncode == 130 and err == f"hwbench: interrupted by {sig}; nothing unfinished was written\n"
        assert list(db.parent.iterdir()) == []
        return
    assert add.returncode == -signal.SIGKILL and sorted(p.name for p in db.parent.iterdir()) == temporaries
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    journal = db.parent / f".h.sqlite.{host}-{dead.pid}-k1ll3d00.tmp-journal"  # killed inside a transaction
    living = db.parent / f".h.sqlite.{host}-{os.getpid()}-l1v1ng00.tmp"  # a writer at work: not touched
    elsewhere = db.parent / f".h.sqlite.another-host-{dead.pid}-0th3rh0s.tmp"  # its pids mean nothing here
    for path in (journal, living, elsewhere):
        path.write_bytes(b"partial")
    code = cli_main(["history", "add", str(NOISE_RUNS), "--db", str(db)])
    assert code == 0
    left = sorted(p.name for p in db.parent.iterdir())
    assert left == sorted(["h.sqlite", living.name, elsewhere.name])


def test_the_next_add_says_which_temporaries_of_a_killed_add_it_removed(tmp_path, capsys):
    import socket
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    db = tmp_path / "h.sqlite"
    stale = tmp_path / f".h.sqlite.{socket.gethostname()}-{dead.pid}-abcd1234.tmp"
    stale.write_bytes(b"partial")
    code, out, err = history(capsys, "add", NOISE_RUNS, "--db", db)
    assert code == 0 and "added 20 run(s)" in out
    assert (
        f"removed {stale.name} from {tmp_path}: the temporaries of an earlier `hwbench history add` that was "
        "killed" in err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.sqlite"]


def test_a_run_added_again_with_other_figures_is_named_and_the_first_kept(tmp_path, capsys):
    results = write_nights(tmp_path / "runs", [1000.0])
    db = tmp_path / "h.sqlite"
    assert history(capsys, "add", results, "--db", db)[0] == 0
    first = results / "night000" / "night0-1.json"
    changed = json.loads(first.read_text())
    changed["metrics"]["tokens_per_s"] = 12.5
    other = tmp_path / "again" / "night0-1.json"
    other.parent.mkdir()
    other.write_text(json.dumps(changed))
    code, out, err = history(capsys, "add", other, results / "night000" / "night0-0.json", "--db", db)
    assert code == 0 and "added 0 run(s), 2 already there (1 with other figures, left out)" in out
    assert f"left out {other}: run night0-1 is in the database already (added from {first})" in err
    assert "tokens_per_s: " in err and "12.5 here" in err and "the database keeps the run it has" in err
    stored = (
        sqlite3.connect(db)
        .execute("SELECT value FROM metrics WHERE run_id = 'night0-1' AND name = 'tokens_per_s'")
        .fetchone()[0]
    )
    assert stored == json.loads(first.read_text())["metrics"]["tokens_per_s"]
    # the same two files in one call: the second is named as a different result under the same run id
    code, out, err = history(capsys, "add", results, other.parent, "--db", tmp_path / "new.sqlite")
    assert code == 0 and "added 3 run(s)" in out
    assert f"{other}: run night0-1 was already read from {first}, with other figures" in err


def test_figures_at_the_float_limit_give_a_verdict_without_a_warning(tmp_path, capsys):
    """Figures near 1.7e308 (a damaged or hand-made result: finite, so the model takes them) used
    to overflow the statistics (numpy warnings, then a traceback in the trend page's axis)."""
    import warnings

    db = tmp_path / "h.sqlite"
    history(capsys, "add", write_nights(tmp_path / "runs", [1.0e308] * 10 + [1.7e308] * 10), "--db", db)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy overflow warning fails the test
        code, out, err = history(capsys, "changes", "--db", db, "--metric", "tokens_per_s")
        assert code == 0 and err == ""
        rise = re.search(r"rose (\d+\.\d)% .* at 2026-10-11, .*: 1e\+308 tokens/s -> 1\.7e\+308 tokens/s "
                         r"\(improvement\)", out)
        assert rise and 65 < float(rise.group(1)) < 75, out  # 1.7e308 / 1e308 - 1, with 1% noise
        code, _, _ = history(capsys, "report", "--db", db, "--metric", "tokens_per_s", "--out", tmp_path / "t.html")
    page = (tmp_path / "t.html").read_text()
    assert code == 0 and ">inf<" not in page and ">nan<" not in page and "1.7e+308" in page


def test_a_database_whose_add_was_killed_inside_its_transaction_is_read_as_committed(tmp_path, capsys):
    """SIGKILL inside an add's transaction leaves SQLite's journal beside the file. A read-only
    connection cannot roll it back ("attempt to write a readonly database": `changes`, `show` and
    `report` all failed, exit 2, until the next add); they roll it back first and read the runs
    committed before."""
    import os
    import subprocess
    import sys

    db = tmp_path / "h.sqlite"
    assert history(capsys, "add", NOISE_RUNS, "--db", db)[0] == 0
    results = _copies(tmp_path / "runs", 600)
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    journal = Path(f"{db}-journal")

    def hot() -> bool:  # the journal's header is written (SQLite's magic): the file must be rolled back
        try:
            return journal.read_bytes()[:8] == bytes.fromhex("d9d505f920a163d7")
        except OSError:
            return False

    for _attempt in range(5):  # killed while its journal is hot (the add may finish first)
        add = subprocess.Popen(
            [sys.executable, "-m", "hwbench", "history", "add", str(results), "--db", str(db)],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        while add.poll() is None and not hot():
            __import__("time").sleep(0.0005)
        add.kill()
        add.communicate()
        if hot():
            break
    else:
        pytest.fail("the add was never caught with its journal written")
    code, out, err = history(capsys, "show", "--db", db, "--metric", "tokens_per_s")
    assert code == 0 and err == "" and not hot()
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 20  # the committed add only


# --- collectives results -------------------------------------------------------------


def write_collectives_nights(folder: Path, levels: list[float], *, seed: int = 3) -> Path:
    """Three `hwbench collectives` results a night around ``levels[night]`` GB/s of all-reduce busbw (two
    ranks, 1 MiB in place), with a start time and a commit."""
    from hwbench.result.collectives import CollectivesResult, Row, Settings, write_collectives

    rng = random.Random(seed)
    size = 2 ** 20
    settings = Settings(collectives=["all_reduce"], min_bytes=size, max_bytes=size, warmup=1, iterations=2,
                        check=True, timeout_s=60)
    environment = json.loads((DATA / "compare" / "tiny-cpu.json").read_text())["environment"]
    for night, level in enumerate(levels):
        environment["hwbench_git"] = {"commit": f"c{night:03d}" + "0" * 36, "dirty": False}
        for repeat in range(3):
            busbw = level * (1 + rng.gauss(0, 0.01))
            time_us = size / busbw / 1e3  # busbw = algbw for two ranks' all-reduce: 2(n-1)/n = 1
            row = Row(collective="all_reduce", in_place=True, size_bytes=size, elements=size // 4, time_us=time_us,
                      time_us_min=time_us, time_us_max=time_us, algbw_gbs=busbw, busbw_gbs=busbw, bus_factor=1.0,
                      wrong=0)
            result = CollectivesResult.model_validate({
                "run_id": f"coll{night}-{repeat}", "status": "ok", "device": "cpu", "device_model": "test cpu",
                "dist_backend": "gloo", "world_size": 2, "settings": settings.model_dump(), "rows": [row.model_dump()],
                "ranks": [{"rank": 0, "host": "h"}, {"rank": 1, "host": "h"}], "check_passed": True,
                "started_at": f"{night_date(night)}T03:{10 + repeat:02d}:00+00:00", "environment": environment})
            write_collectives(result, folder / f"night{night:03d}")
    return folder


def test_a_falling_busbw_is_an_open_regression_of_its_collective_series(tmp_path, capsys):
    """Collectives results go into the same database as runs (kind collectives), a series per
    collective, form, size and scope keyed by device, backend, ranks, hosts and dtype; a 20% fall of
    all-reduce busbw is an open regression, as a run's fall in tokens/s is."""
    db = tmp_path / "h.sqlite"
    write_collectives_nights(tmp_path / "coll", [10.0] * 12 + [8.0] * 6)
    write_nights(tmp_path / "runs", [1000.0] * 6)
    code, out, _ = history(capsys, "add", tmp_path / "coll", tmp_path / "runs", "--db", db)
    assert code == 0 and "added 72 run(s)" in out and "54 of the results added are `hwbench collectives`" in out
    with sqlite3.connect(db) as connection:
        kinds = dict(connection.execute("SELECT kind, COUNT(*) FROM runs GROUP BY kind").fetchall())
        names = {row[0] for row in connection.execute(
            "SELECT DISTINCT name FROM metrics JOIN runs USING (run_id) WHERE kind = 'collectives'")}
    assert kinds == {"run": 18, "collectives": 54} and names == {"busbw_gbs/all/all_reduce/in_place/1048576"}
    code, out, _ = history(capsys, "changes", "--db", db)
    assert code == REGRESSION_EXIT
    line = next(line for line in out.splitlines() if " fell " in line)
    label = "bus bandwidth of all_reduce in place 1048576 B, 2 ranks on 1 host (cpu test cpu, gloo, float32)"
    assert line.startswith(f"{label} fell ")
    assert f"at {night_date(12)}, commit c012000" in line
    assert re.search(r"GB/s -> [78]\.\d{3} GB/s \(regression\)$", line)
    assert "OPEN REGRESSION: bus bandwidth of all_reduce in place" in out
    # the runs' series are there and quiet; --metric tokens_per_s leaves the collectives out
    assert history(capsys, "changes", "--db", db, "--metric", "tokens_per_s")[0] == 0
    code, out, _ = history(capsys, "show", "--db", db, "--metric", "busbw")
    assert code == 0 and label in out
    row = r"float32\) +18 +1 +" + night_date(17) + r" +c017000 +[78]\.\d{3} GB/s +1 +regression -2"
    assert re.search(row, out), out
    code, _, _ = history(capsys, "report", "--db", db, "--out", tmp_path / "trends.html", "--metric", "busbw")
    page = (tmp_path / "trends.html").read_text()
    assert code == 0 and label in page
    assert "open regression -20." in page and " GB/s" in page
