"""The history database: every result ever added, one SQLite file, or a PostgreSQL
database for a team's shared store (hwbench.history.postgres; docs/history.md).

Tables: ``runs`` (one row per result: run id, start time, the night it belongs to,
git commit, status, the point it measured, its environment fingerprint) and
``metrics`` (every numeric figure of a result under its dotted name, such as
``tokens_per_s`` or ``step_time_s.median``). Adding is idempotent by run id, and
one call of add_results is one transaction: a failure leaves the database as it was.

The schema version is SQLite's ``user_version`` (a one-row table in PostgreSQL);
MIGRATIONS[v] takes a database from version v - 1 to v, so an older database is brought
up to date when it is opened and a newer one is refused (this hwbench would not know its
tables). The statements are plain SQL that both databases take.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Iterator

from hwbench.errors import UsageError
from hwbench.report.compare import KEY_FIELDS, performance_fingerprint, point_key
from hwbench.results import RunResult

DEFAULT_DB = "results/history.sqlite"
OPTION = "--db"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

# MIGRATIONS[v]: the statements that take a database from version v - 1 to version v.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE runs (
               run_id TEXT PRIMARY KEY,
               started_at TEXT NOT NULL,
               night TEXT NOT NULL,          -- the UTC date the run started on
               git_commit TEXT,
               git_dirty INTEGER,
               status TEXT NOT NULL,
               point_key TEXT,               -- JSON list of hwbench.report.compare.KEY_FIELDS; NULL without a spec
               fingerprint TEXT NOT NULL,    -- JSON: device model and the performance environment fields
               environment TEXT NOT NULL,    -- JSON: the result's whole environment
               source TEXT NOT NULL,         -- the file it was read from
               added_at TEXT NOT NULL)""",
        """CREATE TABLE metrics (
               run_id TEXT NOT NULL REFERENCES runs(run_id),
               name TEXT NOT NULL,
               value DOUBLE PRECISION NOT NULL,
               PRIMARY KEY (run_id, name))""",
        "CREATE INDEX runs_by_point ON runs(point_key, started_at)",
        "CREATE INDEX metrics_by_name ON metrics(name)",
    ),
}
SCHEMA_VERSION = max(MIGRATIONS)


def open_history(path: str | os.PathLike, create: bool = False):
    """The database at ``path`` (a file, or a postgresql:// URL), migrated to SCHEMA_VERSION.
    ``create``: make the file (and its folder), or the tables, when missing; otherwise a
    missing database is a UsageError naming --db."""
    text = os.fspath(path)
    if text.startswith(POSTGRES_SCHEMES):
        return _open_postgres(text, create)
    if "://" in text:
        raise UsageError(f"{OPTION} {text!r}: not a database hwbench knows; give the path of an SQLite file or a "
                         "postgresql:// URL")
    where = Path(path)
    if where.exists() and not where.is_file():
        raise UsageError(f"{OPTION} {text!r} is not a file; give the path of an SQLite file")
    if not where.exists():
        if not create:
            raise UsageError(f"{OPTION} {text!r}: no history database there; make one with "
                             "`hwbench history add RESULTS --db PATH`")
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"{OPTION} {text!r}: its folder cannot be made ({error.strerror})") from None
    try:
        connection = sqlite3.connect(where)
        migrate(connection, text)
    except sqlite3.DatabaseError as error:
        raise UsageError(f"{OPTION} {text!r}: not a usable SQLite database ({error})") from None
    return connection


def _open_postgres(url: str, create: bool):
    try:
        from hwbench.history.postgres import PostgresConnection, connection_error_types
    except ImportError:
        raise UsageError(f"{OPTION} {printable(url)!r}: a PostgreSQL database needs psycopg (pip install "
                         "'hwbench[postgres]')") from None
    errors = connection_error_types()
    try:
        connection = PostgresConnection(url)
        if not create and connection.schema_version() == 0:
            raise UsageError(f"{OPTION} {printable(url)!r}: no history tables there; make them with "
                             "`hwbench history add RESULTS --db URL`")
        migrate(connection, printable(url))
    except errors as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"{OPTION} {printable(url)!r}: the PostgreSQL database cannot be used: {reason}") from None
    return connection


def printable(database: str | os.PathLike) -> str:
    """--db as it may be printed: a password in a URL replaced by ***."""
    url = os.fspath(database)
    if "://" not in url:
        return url
    scheme, _, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if at and ":" in credentials:
        credentials = credentials.split(":", 1)[0] + ":***"
    return f"{scheme}://{credentials}{at}{host}"


def _schema_version(connection) -> int:
    if isinstance(connection, sqlite3.Connection):
        return connection.execute("PRAGMA user_version").fetchone()[0]
    return connection.schema_version()


def _set_schema_version(connection, version: int) -> None:
    if isinstance(connection, sqlite3.Connection):
        connection.execute(f"PRAGMA user_version = {int(version)}")
    else:
        connection.set_schema_version(version)


def migrate(connection, name: str) -> None:
    """Apply every migration above the database's version, each in its own transaction."""
    version = _schema_version(connection)
    if version > SCHEMA_VERSION:
        raise UsageError(f"{OPTION} {name!r}: history schema version {version} is newer than this hwbench reads "
                         f"(up to {SCHEMA_VERSION}); use a newer hwbench")
    for target in range(version + 1, SCHEMA_VERSION + 1):
        with connection:
            for statement in MIGRATIONS[target]:
                connection.execute(statement)
            _set_schema_version(connection, target)


def flat_metrics(metrics: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every numeric figure of a result's metrics as (dotted name, value); lists (validation
    points, per-device telemetry) and the reasons of unmeasured figures are left out."""
    for key, value in metrics.items():
        if key == "unmeasured":
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from flat_metrics(value, f"{name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield name, float(value)


def night_of(started_at: str) -> str:
    """The UTC date a run started on: the repeats of one nightly job share it."""
    try:
        moment = datetime.datetime.fromisoformat(started_at)
    except ValueError:
        return started_at[:10]
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.timezone.utc)
    return moment.date().isoformat()


@dataclasses.dataclass
class AddOutcome:
    added: int = 0
    already_present: int = 0
    without_start: list[str] = dataclasses.field(default_factory=list)  # run ids left out: no start time


def add_results(connection, results: Iterable[tuple[RunResult, Path]]) -> AddOutcome:
    """Add (result, the file it came from) pairs in one transaction; a run id already in the
    database is left as it is."""
    outcome = AddOutcome()
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    known = {row[0] for row in connection.execute("SELECT run_id FROM runs")}
    runs, metrics = [], []
    for result, source in results:
        if result.run_id in known:
            outcome.already_present += 1
            continue
        if not result.started_at:
            outcome.without_start.append(result.run_id)
            continue
        known.add(result.run_id)
        runs.append(_run_row(result, source, now))
        metrics += [(result.run_id, name, value) for name, value in flat_metrics(result.metrics or {})]
    with connection:
        _insert_new(connection, "runs", runs)
        _insert_new(connection, "metrics", metrics)
    outcome.added = len(runs)
    return outcome


def _run_row(result: RunResult, source: Path, now: str) -> tuple:
    environment = result.environment or {}
    git = environment.get("hwbench_git") or {}
    key = point_key(result)
    dirty = git.get("dirty")
    return (result.run_id, result.started_at, night_of(result.started_at), git.get("commit"),
            None if dirty is None else int(bool(dirty)), result.status,
            None if key is None else json.dumps(list(key)),
            json.dumps(performance_fingerprint(result), sort_keys=True),
            json.dumps(environment, sort_keys=True, default=str), os.fspath(source), now)


def _insert_new(connection, table: str, rows: list[tuple]) -> None:
    """Insert rows, leaving out those whose key is there already: another writer of a shared
    database may have added the same run since the known run ids were read."""
    if not rows:
        return
    if isinstance(connection, sqlite3.Connection):
        marks = ", ".join("?" * len(rows[0]))
        connection.executemany(f"INSERT INTO {table} VALUES ({marks}) ON CONFLICT DO NOTHING", rows)
    else:
        connection.insert_new(table, rows)


@dataclasses.dataclass(frozen=True)
class StoredRun:
    """One run as the history reads it back for one metric."""

    run_id: str
    started_at: str
    night: str
    commit: str | None
    status: str
    point: dict[str, Any]  # KEY_FIELDS -> value
    fingerprint: dict[str, str | None]
    value: float | None  # the metric; None when the run has no such figure


def runs_with_metric(connection, metric_name: str) -> list[StoredRun]:
    """Every run that measured a point, with its value of ``metric_name`` (dotted name),
    oldest first."""
    rows = connection.execute(
        """SELECT runs.run_id, started_at, night, git_commit, status, point_key, fingerprint, metrics.value
           FROM runs LEFT JOIN metrics ON metrics.run_id = runs.run_id AND metrics.name = ?
           WHERE point_key IS NOT NULL ORDER BY started_at, runs.run_id""", (metric_name,))
    return [StoredRun(run_id, started, night, commit, status, dict(zip(KEY_FIELDS, json.loads(key))),
                      json.loads(fingerprint), value)
            for run_id, started, night, commit, status, key, fingerprint, value in rows]


def run_count(connection) -> int:
    return connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
