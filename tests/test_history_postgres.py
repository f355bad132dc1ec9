"""`hwbench history --db postgresql://...` against a real PostgreSQL server, started here from
the distribution's package (initdb and pg_ctl of /usr/lib/postgresql/*/bin, a throw-away
cluster on a Unix socket in a temporary folder; run as the `postgres` user when the tests run
as root, since the server refuses root). Skipped, with the reason, without those binaries or
without psycopg (pip install 'hwbench[postgres]'). About 3 s.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile

import pytest
from test_history import history, night_date, write_nights

from hwbench.errors import UsageError
from hwbench.history import store
from hwbench.judge.compare import REGRESSION_EXIT


def _server_binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="module")
def postgres_url():
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hwbench[postgres]')")
    binaries = _server_binaries()
    if binaries is None:
        pytest.skip("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (apt-get install postgresql)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` user to run the server as")
    folder = tempfile.mkdtemp(prefix="hwbench-pg-")
    os.chmod(folder, 0o755)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    data = os.path.join(folder, "cluster")
    subprocess.run(_as_server_user([f"{binaries}/initdb", "-D", data, "-A", "trust", "-U", "hwbench", "-E", "UTF8",
                                    "--no-sync"]), check=True, capture_output=True, timeout=120)
    subprocess.run(_as_server_user([f"{binaries}/pg_ctl", "-D", data, "-l", os.path.join(folder, "log"), "-w", "-o",
                                    f"-k {folder} -c listen_addresses= -p 5433 -c fsync=off", "start"]),
                   check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql://hwbench@/postgres?host={folder}&port=5433"
    finally:
        subprocess.run(_as_server_user([f"{binaries}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def empty_postgres(postgres_url):
    """The server's database without hwbench's tables."""
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as connection:
        for table in ("metrics", "runs", "hwbench_history_schema"):
            connection.execute(f"DROP TABLE IF EXISTS {table}")
    return postgres_url


def test_add_and_changes_work_alike_on_postgresql(tmp_path, capsys, empty_postgres):
    with pytest.raises(UsageError, match="no history tables there"):
        store.open_history(empty_postgres)
    results = write_nights(tmp_path / "runs", [1000.0] * 25 + [930.0] * 6)
    code, out, _ = history(capsys, "add", results, "--db", empty_postgres)
    assert code == 0 and "added 93 run(s), 0 already there" in out
    code, out, _ = history(capsys, "add", results, "--db", empty_postgres)
    assert code == 0 and "added 0 run(s), 93 already there" in out
    code, out, _ = history(capsys, "changes", "--db", empty_postgres, "--metric", "tokens_per_s")
    assert code == REGRESSION_EXIT and f"at {night_date(25)}, commit c025000" in out
    # the same verdict, figures included, as from an SQLite file
    history(capsys, "add", results, "--db", tmp_path / "h.sqlite")
    assert history(capsys, "changes", "--db", tmp_path / "h.sqlite", "--metric", "tokens_per_s")[1] == out


def test_schema_version_is_kept_in_postgresql(empty_postgres, monkeypatch):
    connection = store.open_history(empty_postgres, create=True)
    assert connection.schema_version() == store.SCHEMA_VERSION
    connection.close()
    monkeypatch.setitem(store.MIGRATIONS, store.SCHEMA_VERSION + 1, ("ALTER TABLE runs ADD COLUMN note TEXT",))
    monkeypatch.setattr(store, "SCHEMA_VERSION", store.SCHEMA_VERSION + 1)
    connection = store.open_history(empty_postgres)
    assert connection.schema_version() == store.SCHEMA_VERSION
    connection.close()
    monkeypatch.setattr(store, "SCHEMA_VERSION", store.SCHEMA_VERSION - 1)
    with pytest.raises(UsageError, match="newer than this hwbench reads"):
        store.open_history(empty_postgres)


def test_an_unreachable_server_is_one_line_without_the_password(tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hwbench[postgres]')")
    url = f"postgresql://ci:secret@/hwbench?host={tmp_path}&port=1"
    with pytest.raises(UsageError, match="cannot be used") as raised:
        store.open_history(url, create=True)
    assert "secret" not in str(raised.value) and "ci:***@" in str(raised.value)
    assert store.printable(url) == f"postgresql://ci:***@/hwbench?host={tmp_path}&port=1"


def test_collectives_busbw_series_work_alike_on_postgresql(tmp_path, capsys, empty_postgres):
    """Collectives results in a PostgreSQL history (runs.kind, the busbw figures' names matched by LIKE):
    the same open regression, figures included, as from an SQLite file."""
    from test_history import write_collectives_nights

    results = write_collectives_nights(tmp_path / "coll", [10.0] * 12 + [8.0] * 6)
    code, out, _ = history(capsys, "add", results, "--db", empty_postgres)
    assert code == 0 and "added 54 run(s)" in out
    code, out, _ = history(capsys, "changes", "--db", empty_postgres, "--metric", "busbw")
    assert code == REGRESSION_EXIT and "OPEN REGRESSION: bus bandwidth of all_reduce in place 1048576 B" in out
    history(capsys, "add", results, "--db", tmp_path / "h.sqlite")
    assert history(capsys, "changes", "--db", tmp_path / "h.sqlite", "--metric", "busbw")[1] == out
