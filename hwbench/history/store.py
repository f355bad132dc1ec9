"""The history database: every result ever added, one SQLite file, or a PostgreSQL
database for a team's shared store (hwbench.history.postgres; docs/history.md).

Tables: ``runs`` (one row per result: run id, start time, the night it belongs to,
git commit, status, the point it measured, its environment fingerprint, its kind: a run's
or `hwbench collectives`') and ``metrics`` (every numeric figure of a result under its
dotted name, such as ``tokens_per_s`` or ``step_time_s.median``; a collectives result's
busbw per scope, collective, form and size, such as ``busbw_gbs/all/all_reduce/in_place/1024``).
Adding is idempotent by run id, and one call of add_results is one transaction: a failure leaves the database as it was.

The schema version is SQLite's ``user_version`` (a one-row table in PostgreSQL);
MIGRATIONS[v] takes a database from version v - 1 to v, so an older database is brought
up to date when it is opened and a newer one is refused (this hwbench would not know its
tables). A step is plain SQL that both databases take, or a function of the connection
for what SQL alone cannot do.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import functools
import json
import math
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hwbench.errors import UsageError
from hwbench.files import umask
from hwbench.point import EMULATED, SIMULATED, PointKey
from hwbench.result.collectives import POINT_FIELDS as COLLECTIVE_POINT_FIELDS
from hwbench.result.collectives import CollectiveKey, CollectivesResult, busbw_figures
from hwbench.result.environment import performance_fingerprint
from hwbench.result.model import RunResult
from hwbench.temporaries import remove_stale_temporaries, signals_held, writer_temporary

DEFAULT_DB = "results/history.sqlite"
OPTION = "--db"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

# The point key of version 1 databases, before the key had max_positions, fused_qkv and cross_entropy.
V1_POINT_FIELDS = ("model", "backend", "device_model", "precision", "micro_batch_size", "global_batch_size",
                   "seq_length", "recompute", "compile", "tp", "pp", "dp", "nnodes", "engine", "zero_stage", "fsdp",
                   "pp_schedule", "data", "steps")
# The point key of version 2 databases, before the key had stand_in.
V2_POINT_FIELDS = ("model", "backend", "device_model", "precision", "micro_batch_size", "global_batch_size",
                   "seq_length", "max_positions", "recompute", "compile", "tp", "pp", "dp", "nnodes", "engine",
                   "zero_stage", "fsdp", "pp_schedule", "data", "steps", "fused_qkv", "cross_entropy")


def _point_keys_with_positions(connection) -> None:
    """Version 2: every stored point key in version 2's fields (V2_POINT_FIELDS). The runs of a version 1 database
    predate the fused QKV and cross-entropy options (False, "standard"); max_positions is the
    workload's positions in the catalog, which every run without --max-positions had, when the
    sequence fits them, and null (unknown: the old key did not keep it) when it does not."""
    from hwbench.catalog import load_catalog

    positions = {name: workload.model.max_position_embeddings for name, workload in load_catalog().workloads.items()}
    defaults = {field.name: field.default for field in dataclasses.fields(PointKey)}
    rows = connection.execute("SELECT run_id, point_key FROM runs WHERE point_key IS NOT NULL").fetchall()
    for run_id, text in rows:
        old = _json_column(text)
        if not (isinstance(old, list) and len(old) == len(V1_POINT_FIELDS)):
            continue  # damaged: runs_with_metric names it
        values = dict(zip(V1_POINT_FIELDS, old))
        own, seq = positions.get(values["model"]), values["seq_length"]
        values["max_positions"] = own if isinstance(seq, int) and own is not None and seq <= own else None
        key = [values.get(name, defaults[name]) for name in V2_POINT_FIELDS]
        connection.execute("UPDATE runs SET point_key = ? WHERE run_id = ?", (json.dumps(key), run_id))


def _point_keys_with_stand_in(connection) -> None:
    """Version 3: every stored point key ends with stand_in, "simulated" for a run whose stored
    environment says a stand-in ran it, else null: simulated runs leave the real device's series."""
    _extend_point_keys(connection, len(V2_POINT_FIELDS), lambda environment: SIMULATED if isinstance(
        environment, dict) and environment.get("simulated") is True else None)


def _point_keys_with_fp8_recipe(connection) -> None:
    """Version 4: every stored point key ends with fp8_recipe, null: every run stored before it was
    not an FP8 run (--precision fp8 came with the field)."""
    _extend_point_keys(connection, len(V2_POINT_FIELDS) + 1, lambda _environment: None)


def _point_keys_with_expert_parallelism(connection) -> None:
    """Version 5: every stored point key ends with ep, 1 for every run stored before it (expert
    parallelism, --ep, came with the field)."""
    _extend_point_keys(connection, len(V2_POINT_FIELDS) + 2, lambda _environment: 1)  # version 4's: fp8_recipe last


def _extend_point_keys(connection, length: int, new_field: Callable[[Any], Any]) -> None:
    """Every stored point key of ``length`` fields (the version before's) with one more field at its
    end, ``new_field`` of the run's stored environment."""
    rows = connection.execute("SELECT run_id, point_key, environment FROM runs WHERE point_key IS NOT NULL").fetchall()
    for run_id, text, environment in rows:
        old = _json_column(text)
        if not (isinstance(old, list) and len(old) == length):
            continue  # damaged: runs_with_metric names it
        key = [*old, new_field(_json_column(environment))]
        connection.execute("UPDATE runs SET point_key = ? WHERE run_id = ?", (json.dumps(key), run_id))


def _runs_with_kind(connection) -> None:
    """Version 6: ``runs.kind``, 'run' for every row stored before it (collectives results came with
    it). Left as it is where the column is there already (a database whose version was set back)."""
    column = "kind TEXT NOT NULL DEFAULT 'run'"
    if not isinstance(connection, sqlite3.Connection):
        connection.execute(f"ALTER TABLE runs ADD COLUMN IF NOT EXISTS {column}")
    elif "kind" not in [row[1] for row in connection.execute("PRAGMA table_info(runs)")]:
        connection.execute(f"ALTER TABLE runs ADD COLUMN {column}")


# MIGRATIONS[v]: the steps that take a database from version v - 1 to version v.
MIGRATIONS: dict[int, tuple[Any, ...]] = {  # SQL text, or a function of the connection
    1: (
        """CREATE TABLE IF NOT EXISTS runs (
               run_id TEXT PRIMARY KEY,
               started_at TEXT NOT NULL,
               night TEXT NOT NULL,          -- the UTC date the run started on
               git_commit TEXT,
               git_dirty INTEGER,
               status TEXT NOT NULL,
               point_key TEXT,               -- JSON list of hwbench.point.PointKey's fields; NULL without a spec
               fingerprint TEXT NOT NULL,    -- JSON: device model and the performance environment fields
               environment TEXT NOT NULL,    -- JSON: the result's whole environment
               source TEXT NOT NULL,         -- the file it was read from
               added_at TEXT NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS metrics (
               run_id TEXT NOT NULL REFERENCES runs(run_id),
               name TEXT NOT NULL,
               value DOUBLE PRECISION NOT NULL,
               PRIMARY KEY (run_id, name))""",
        "CREATE INDEX IF NOT EXISTS runs_by_point ON runs(point_key, started_at)",
        "CREATE INDEX IF NOT EXISTS metrics_by_name ON metrics(name)",
    ),
    2: (_point_keys_with_positions,),
    3: (_point_keys_with_stand_in,),
    4: (_point_keys_with_fp8_recipe,),
    5: (_point_keys_with_expert_parallelism,),
    # collectives results beside the runs, in the same tables: their point key is CollectiveKey's
    # (hwbench/result/collectives.py), so every reader of runs asks for kind 'run'
    6: (_runs_with_kind,),
}
RUN_KIND, COLLECTIVES_KIND = "run", "collectives"
SCHEMA_VERSION = max(MIGRATIONS)

# How long an SQLite command waits for another writer (a concurrent `history add`) to finish.
BUSY_TIMEOUT_S = 60.0
HISTORY_TABLES = ("runs", "metrics")


class HistoryConnection(sqlite3.Connection):
    """sqlite3's connection that knows the --db it was opened from, for its error messages, with
    the calls the store makes of hwbench.history.postgres.PostgresConnection too."""

    name = ""

    def schema_version(self) -> int:
        return self.execute("PRAGMA user_version").fetchone()[0]

    def set_schema_version(self, version: int) -> None:
        self.execute(f"PRAGMA user_version = {int(version)}")

    def insert_new(self, table: str, rows: list[tuple]) -> None:
        marks = ", ".join("?" * len(rows[0]))
        self.executemany(f"INSERT INTO {table} VALUES ({marks}) ON CONFLICT DO NOTHING", rows)


def database_error(name: str, error: sqlite3.Error) -> UsageError:
    """One line for an SQLite failure: busy (another writer), damaged, or not usable."""
    reason = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, sqlite3.OperationalError) and ("locked" in reason or "busy" in reason):
        return UsageError(f"{OPTION} {name!r}: the history database is busy (another `hwbench history add` is writing "
                          f"to it) and stayed so for {BUSY_TIMEOUT_S:g} s; try again when it has finished")
    damaged = ("malformed", "not a database", "no such table", "no such column", "corrupt", "disk image")
    if not isinstance(error, sqlite3.OperationalError) or any(word in reason for word in damaged):
        return damaged_database(name, reason)
    return UsageError(f"{OPTION} {name!r}: the history database cannot be used ({reason})")


def _guarded(function):
    """A store operation on an SQLite connection: sqlite3's errors become one UsageError line."""

    @functools.wraps(function)
    def guarded(connection, *args, **kwargs):
        try:
            return function(connection, *args, **kwargs)
        except sqlite3.Error as error:
            if not isinstance(connection, sqlite3.Connection):
                raise
            raise database_error(getattr(connection, "name", "") or "?", error) from None
        except Exception as error:  # a PostgreSQL store's driver error (a dropped connection, a denied INSERT)
            if isinstance(connection, sqlite3.Connection) or not _is_driver_error(error):
                raise
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UsageError(f"{OPTION}: the PostgreSQL database failed: {reason}") from None
    return guarded


def _is_driver_error(error: Exception) -> bool:
    from hwbench.history.postgres import connection_error_types  # only reached with a PostgreSQL store

    return isinstance(error, connection_error_types())


def open_history(path: str | os.PathLike, create: bool = False):
    """The database at ``path`` (a file, or a postgresql:// URL), migrated to SCHEMA_VERSION.
    ``create``: make the file (and its folder), or the tables, when missing; otherwise a
    missing database is a UsageError naming --db, and the file is opened read-only and
    must be an hwbench history (nothing is written into another SQLite file)."""
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
    if not create:
        return _open_sqlite_read(where, text)
    connection = None
    try:
        connection = _connect(where, text)
        _refuse_foreign(connection, text)
        migrate(connection, text)
        # nothing is added to a damaged file (reads stop at the damage they meet anyway)
        problems = [row[0] for row in connection.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            found = " ".join("; ".join(problems).replace("*** in database main ***", "").split())
            raise sqlite3.DatabaseError(f"database disk image is malformed: {found[:200]}")
    except sqlite3.DatabaseError as error:
        if connection is not None:
            connection.close()
        raise _open_error(text, error) from None
    return connection


Stored = RunResult | CollectivesResult  # what the history takes: a run's result or a collectives result


def add_to_history(path: str | os.PathLike, results: Iterable[tuple[Stored, Path]]) -> tuple[AddOutcome, int]:
    """open_history(create=True), add_results and run_count. A new SQLite file is built under a
    temporary name in its folder (``.NAME.HOST-PID-XXXX.tmp``) and linked into place only once
    committed, so an add that fails or is interrupted (Ctrl-C, SIGTERM, SIGHUP) leaves no file
    behind; the temporaries of an add that was killed outright are removed by the next add into
    that folder (``outcome.stale_removed``). When another add made the file meanwhile, the runs go
    into that one."""
    results = list(results)
    text = os.fspath(path)
    where = Path(path)
    if "://" in text:
        return _add_and_count(open_history(path, create=True), results, [])
    removed = remove_stale_temporaries(where.parent, f".{where.name}.") if where.parent.is_dir() else []
    if where.exists():
        return _add_and_count(open_history(path, create=True), results, removed)
    temporary = None
    try:
        with signals_held():  # the temporary is made, and named, before a stop can leave it
            try:
                where.parent.mkdir(parents=True, exist_ok=True)
                temporary = writer_temporary(where.parent, f".{where.name}.")
            except OSError as error:
                raise UsageError(f"{OPTION} {text!r}: cannot be made there ({error.strerror})") from None
        os.chmod(temporary, 0o666 & ~umask())
        connection = open_history(temporary, create=True)
        connection.name = text
        outcome, count = _add_and_count(connection, results, removed)
        try:
            os.link(temporary, where)
            return outcome, count
        except FileExistsError:
            pass  # another add made it first: add into that one
        except OSError as error:
            if error.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP) and not where.exists():
                os.replace(temporary, where)  # a file system without hard links
                return outcome, count
            raise UsageError(f"{OPTION} {text!r}: cannot be made there ({error.strerror})") from None
    finally:
        if temporary is not None:
            with signals_held():  # a second Ctrl-C or SIGTERM cannot stop the clean-up half way
                for companion in ("", "-journal"):
                    Path(temporary + companion).unlink(missing_ok=True)
    return _add_and_count(open_history(path, create=True), results, removed)


def _add_and_count(connection, results: list[tuple[Stored, Path]], removed: list[str]) -> tuple[AddOutcome, int]:
    try:
        outcome = add_results(connection, results)
        outcome.stale_removed = removed
        return outcome, run_count(connection)
    finally:
        connection.close()


def _connect(where: Path, name: str, read_only: bool = False) -> HistoryConnection:
    if read_only:
        connection = sqlite3.connect(where.absolute().as_uri() + "?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                                     factory=HistoryConnection)
    else:
        connection = sqlite3.connect(where, timeout=BUSY_TIMEOUT_S, factory=HistoryConnection)
    connection.name = name
    return connection


def _open_error(name: str, error: sqlite3.DatabaseError) -> UsageError:
    if "file is not a database" in str(error):
        return UsageError(f"{OPTION} {name!r}: not a usable SQLite database ({error}); give the file "
                          "`hwbench history add` made")
    return database_error(name, error)


def _tables(connection) -> set[str]:
    return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _refuse_foreign(connection, name: str) -> None:
    """An SQLite database that holds tables but is no hwbench history is not written into."""
    tables = _tables(connection)
    if connection.schema_version() == 0 and tables and not set(HISTORY_TABLES) <= tables:
        raise UsageError(f"{OPTION} {name!r}: an SQLite database that is not an hwbench history (tables: "
                         f"{', '.join(sorted(tables))[:200]}); give a history file or a new path")


def _open_sqlite_read(where: Path, name: str):
    """Read-only (changes, show, report): nothing is written unless the file is an older
    hwbench history, which is migrated, or an add into it was killed half way, which SQLite
    rolls back to the last committed state first (a read-only connection cannot)."""
    journal = Path(f"{where}-journal")
    if journal.exists() and journal.stat().st_size > 0:
        _roll_back_interrupted_add(where, name)
    connection = None
    try:
        connection = _connect(where, name, read_only=True)
        version = connection.schema_version()
        if version > SCHEMA_VERSION:
            migrate(connection, name)  # refuses it
        missing = [table for table in HISTORY_TABLES if table not in _tables(connection)]
        if version == 0 or missing:
            raise UsageError(f"{OPTION} {name!r}: not an hwbench history database (" +
                             (f"no {' and '.join(missing)} table" if missing else "no history schema version") +
                             "); give the file `hwbench history add` made")
        if version < SCHEMA_VERSION:
            connection.close()
            connection = _connect(where, name)
            migrate(connection, name)
    except (sqlite3.DatabaseError, UsageError) as error:
        if connection is not None:
            connection.close()
        if isinstance(error, UsageError):
            raise
        raise _open_error(name, error) from None
    return connection


def _roll_back_interrupted_add(where: Path, name: str) -> None:
    """An add killed inside its transaction leaves SQLite's journal beside the file (a "hot"
    journal): the next connection that may write rolls the file back with it, as SQLite does
    on any open; a read-only one refuses the file ("attempt to write a readonly database")."""
    try:
        connection = _connect(where, name)
        try:
            connection.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        raise UsageError(f"{OPTION} {name!r}: an add into it was stopped half way and SQLite cannot roll it back "
                         f"here ({error}); run `hwbench history add` where the file can be written") from None


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


def migrate(connection, name: str) -> None:
    """Apply every migration above the database's version, each in its own transaction.
    SQLite: the version is read again under the write lock (BEGIN IMMEDIATE), so concurrent
    first adds do not both create the tables."""
    version = connection.schema_version()
    if version > SCHEMA_VERSION:
        raise UsageError(f"{OPTION} {name!r}: history schema version {version} is newer than this hwbench reads "
                         f"(up to {SCHEMA_VERSION}); use a newer hwbench")
    for target in range(version + 1, SCHEMA_VERSION + 1):
        with connection:
            if isinstance(connection, HistoryConnection):
                connection.execute("BEGIN IMMEDIATE")
                if connection.schema_version() >= target:  # another writer got there first
                    continue
            for step in MIGRATIONS[target]:
                if callable(step):
                    step(connection)
                else:
                    connection.execute(step)
            connection.set_schema_version(target)


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


MAX_METRIC_NAME = 200  # characters of a dotted metric name: hwbench's own are under 80


def metrics_problem(metrics: dict[str, Any], prefix: str = "metrics.") -> str | None:
    """Why a result's metrics cannot be stored as figures (a field the result model keeps as
    it is, one hwbench does not write): a number a float cannot hold (400 digits) or not
    finite, a name too long or with a control character; None when every one can."""
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        shown = repr(name) if len(name) <= 80 else repr(name[:77] + "...")
        if not name.isprintable() or len(name) > MAX_METRIC_NAME:
            return (f"field {shown}: a metric's name must be printable and at most {MAX_METRIC_NAME} characters "
                    f"({len(name)})")
        if isinstance(value, dict) and key != "unmeasured":
            problem = metrics_problem(value, f"{name}.")
            if problem:
                return problem
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                finite = math.isfinite(float(value))
            except OverflowError:  # an integer beyond a float
                return f"field {shown}: an integer of {len(str(abs(value)))} digits; a figure must be a finite number"
            if not finite:
                return f"field {shown}: {value!r}; a figure must be a finite number"
    return None


def night_of(started_at: str) -> str:
    """The UTC date a run started on: the repeats of one nightly job share it."""
    try:
        return utc_instant(started_at).date().isoformat()
    except ValueError:
        return started_at[:10]


def utc_instant(started_at: str) -> datetime.datetime:
    """A start time as a UTC instant (a time without an offset is taken as UTC). Sorting the text
    would put 10-02T01:00+05:00 after 10-01T21:00Z, though it is the earlier."""
    moment = datetime.datetime.fromisoformat(started_at)
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)).astimezone(datetime.timezone.utc)


def start_problem(started_at: Any) -> str | None:
    """Why a result's started_at cannot place it on a night: not an ISO 8601 date-time, or
    later than a day from now (a clock or a hand edit gone wrong); None when it can."""
    if not isinstance(started_at, str) or not started_at:
        return "is missing; a result needs its start time"
    try:
        if "T" not in started_at and " " not in started_at.strip():
            raise ValueError
        moment = datetime.datetime.fromisoformat(started_at)
    except ValueError:
        return f"{started_at[:60]!r} is not an ISO 8601 date-time (such as 2026-11-23T02:17:00+00:00)"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    if moment > datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1):
        return f"{started_at[:60]!r} is in the future"
    return None


@dataclasses.dataclass
class AddOutcome:
    added: int = 0
    already_present: int = 0
    without_start: list[str] = dataclasses.field(default_factory=list)  # run ids left out: no usable start time
    # temporaries of an add that was killed outright, removed before this one (their names)
    stale_removed: list[str] = dataclasses.field(default_factory=list)
    # runs already there whose new file holds other figures: kept as they were, each said why
    conflicting: list[str] = dataclasses.field(default_factory=list)
    simulated: int = 0  # of the runs added, those a stand-in ran: their own series, apart from the device's
    collectives: int = 0  # of the results added, `hwbench collectives`' (their busbw series)
    emulated: int = 0  # of the runs added, FP8 computed without FP8 units: their own series too


def figures_of(result: Stored) -> list[tuple[str, float]]:
    """What the history stores of a result: a run's every numeric figure by its dotted name, a
    collectives result's busbw by CollectiveKey.figure_name."""
    if isinstance(result, CollectivesResult):
        return [(key.figure_name(), value) for key, value in busbw_figures(result)]
    return list(flat_metrics(result.metrics.dump()))


def _conflict(connection, result: Stored, source: Path) -> str | None:
    """Why ``result`` (from ``source``) is not the run of the same id in the database, or None when
    its figures are those stored: the first figure that differs, or is only on one side."""
    stored = dict(connection.execute("SELECT name, value FROM metrics WHERE run_id = ?", (result.run_id,)))
    new = dict(figures_of(result))
    differing = sorted(name for name in stored.keys() | new.keys() if stored.get(name) != new.get(name))
    if not differing:
        return None
    name = "tokens_per_s" if "tokens_per_s" in differing else differing[0]
    where = connection.execute("SELECT source FROM runs WHERE run_id = ?", (result.run_id,)).fetchone()
    figures = ", ".join(f"{'none' if value is None else f'{value:.6g}'} {side}"
                        for side, value in (("there", stored.get(name)), ("here", new.get(name))))
    return (f"{source}: run {result.run_id} is in the database already (added from {where[0] if where else '?'}) "
            f"with other figures ({name}: {figures}{f'; {len(differing) - 1} more' if len(differing) > 1 else ''})")


@_guarded
def add_results(connection, results: Iterable[tuple[Stored, Path]]) -> AddOutcome:
    """Add (result, the file it came from) pairs in one transaction; a run id already in the
    database is left as it is. The runs already there are read inside the write transaction
    (SQLite: BEGIN IMMEDIATE), so concurrent adds count them right."""
    outcome = AddOutcome()
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results = list(results)
    with connection:
        if isinstance(connection, sqlite3.Connection):
            connection.execute("BEGIN IMMEDIATE")
        known = {row[0] for row in connection.execute("SELECT run_id FROM runs")}
        runs, metrics = [], []
        for result, source in results:
            if result.run_id in known:
                outcome.already_present += 1
                conflict = _conflict(connection, result, source)
                if conflict:
                    outcome.conflicting.append(conflict)
                continue
            if start_problem(result.started_at):
                outcome.without_start.append(result.run_id)
                continue
            known.add(result.run_id)
            if isinstance(result, RunResult):
                outcome.simulated += result.simulated
                outcome.emulated += result.stand_in == EMULATED
                runs.append(_run_row(result, source, now))
            else:
                outcome.collectives += 1
                runs.append(_collectives_row(result, source, now))
            metrics += [(result.run_id, name, value) for name, value in figures_of(result)]
        _insert_new(connection, "runs", runs)
        _insert_new(connection, "metrics", metrics)
    outcome.added = len(runs)
    return outcome


def _run_row(result: RunResult, source: Path, now: str) -> tuple:
    git, key = result.environment.hwbench_git, result.point_key
    dirty = git.dirty if git else None
    return (result.run_id, result.started_at, night_of(result.started_at), git.commit if git else None,
            None if dirty is None else int(dirty), result.status,
            None if key is None else json.dumps(list(key.values())),
            json.dumps(performance_fingerprint(result), sort_keys=True),
            json.dumps(result.environment.dump(), sort_keys=True, default=str), os.fspath(source), now, RUN_KIND)


def _collectives_row(result: CollectivesResult, source: Path, now: str) -> tuple:
    """A collectives result as a row of ``runs``: its point key CollectiveKey's first fields, its
    fingerprint the device model and the performance fields of its environment, as a run's."""
    from hwbench.result.environment import PERFORMANCE_ENVIRONMENT_FIELDS, PREFLIGHT_FIELDS

    environment = result.environment
    git = environment.hwbench_git if environment else None
    fingerprint: dict[str, str | None] = {"device_model": result.device_model or ""}
    if environment is not None:
        fingerprint.update({field: environment.value_text(field) for field in PERFORMANCE_ENVIRONMENT_FIELDS
                            if field not in PREFLIGHT_FIELDS})
    assert result.started_at is not None, "add_results leaves out a result without its start"
    return (result.run_id, result.started_at, night_of(result.started_at), git.commit if git else None,
            None if git is None or git.dirty is None else int(git.dirty), result.status,
            json.dumps(list(result.point_key)), json.dumps(fingerprint, sort_keys=True),
            json.dumps(environment.dump() if environment else {}, sort_keys=True, default=str), os.fspath(source), now,
            COLLECTIVES_KIND)


def _insert_new(connection, table: str, rows: list[tuple]) -> None:
    """Insert rows, leaving out those whose key is there already: another writer of a shared
    database may have added the same run since the known run ids were read."""
    if rows:
        connection.insert_new(table, rows)


@dataclasses.dataclass(frozen=True)
class StoredRun:
    """One run as the history reads it back for one metric."""

    run_id: str
    started_at: str
    night: str
    commit: str | None
    status: str
    point: PointKey | CollectiveKey
    fingerprint: dict[str, str | None]
    value: float | None  # the metric; None when the run has no such figure


@_guarded
def runs_with_metric(connection, metric_name: str) -> list[StoredRun]:
    """Every run that measured a point, with its value of ``metric_name`` (dotted name),
    oldest first. A row of the wrong shape (edited or damaged) is refused with its run id."""
    rows = connection.execute(
        """SELECT runs.run_id, started_at, night, git_commit, status, point_key, fingerprint, metrics.value
           FROM runs LEFT JOIN metrics ON metrics.run_id = runs.run_id AND metrics.name = ?
           WHERE point_key IS NOT NULL AND kind = ? ORDER BY started_at, runs.run_id""", (metric_name, RUN_KIND))
    found = []
    for run_id, started, night, commit, status, key, fingerprint, value in rows:
        point, prints = _json_column(key), _json_column(fingerprint)
        problem = _row_problem(run_id, started, night, commit, status, point, prints, value, metric_name)
        if problem:
            raise _damaged(connection, run_id, problem)
        found.append(StoredRun(run_id, started, night, commit, status, PointKey(*point), prints,
                               None if value is None else float(value)))
    return found


@_guarded
def collectives_with_busbw(connection) -> list[StoredRun]:
    """Every busbw figure of the collectives results, one StoredRun each (its point the figure's
    CollectiveKey), oldest first. A failed result has no figures, so no night. A row of the wrong
    shape is refused with its run id."""
    rows = connection.execute(
        """SELECT runs.run_id, started_at, night, git_commit, status, point_key, fingerprint, metrics.name,
                  metrics.value
           FROM runs JOIN metrics ON metrics.run_id = runs.run_id
           WHERE kind = ? AND metrics.name LIKE ? ORDER BY started_at, runs.run_id, metrics.name""",
        (COLLECTIVES_KIND, "busbw_gbs/%"))
    found = []
    for run_id, started, night, commit, status, key, fingerprint, name, value in rows:
        point, prints = _json_column(key), _json_column(fingerprint)
        problem = _common_problem(run_id, started, night, commit, status, prints, value, "busbw")
        stored_key = None if problem else _collective_key(point, name)
        if problem or stored_key is None:
            problem = problem or f"point_key or figure name {str(name)[:80]!r} is not a collectives result's"
            raise _damaged(connection, run_id, problem)
        found.append(StoredRun(run_id, started, night, commit, status, stored_key, prints, float(value)))
    return found


def damaged_database(name: str, reason: str) -> UsageError:
    return UsageError(f"{OPTION} {name!r}: the history database is damaged ({reason}); restore it from a copy or "
                      "add the results again into a new file")


def _damaged(connection, run_id: Any, problem: str) -> UsageError:
    """The refusal of a database whose row of ``run_id`` is damaged (``problem``)."""
    return damaged_database(getattr(connection, "name", "") or "?", f"run {str(run_id)[:80]!r}: {problem}")


_COLLECTIVE_POINT_TYPES = ((str,), (str, type(None)), (str,), (int,), (int,), (str,))  # POINT_FIELDS'


def _collective_key(point: Any, name: Any) -> CollectiveKey | None:
    if not (isinstance(point, list) and len(point) == len(COLLECTIVE_POINT_FIELDS) and isinstance(name, str)):
        return None
    if any(isinstance(item, bool) or not isinstance(item, kinds)
           for item, kinds in zip(point, _COLLECTIVE_POINT_TYPES, strict=True)):
        return None
    return CollectiveKey.from_figure(point, name)


def _row_problem(run_id: Any, started: Any, night: Any, commit: Any, status: Any, point: Any, prints: Any,
                 value: Any, metric_name: str) -> str | None:
    """What is wrong with a row as the readers would use it, or None: every column they parse is
    checked here, so a damaged row is named rather than met as a traceback further on."""
    problem = _common_problem(run_id, started, night, commit, status, prints, value, metric_name)
    if problem:
        return problem
    if not (isinstance(point, list) and len(point) == len(POINT_TYPES)):
        return f"point_key is not a JSON list of {len(POINT_TYPES)} values"
    wrong = next((name for (name, kinds), item in zip(POINT_TYPES.items(), point) if not _is_one_of(item, kinds)),
                 None)
    if wrong:
        return f"point_key's {wrong} is not {' or '.join(POINT_TYPES[wrong])}"
    return None


def _common_problem(run_id: Any, started: Any, night: Any, commit: Any, status: Any, prints: Any, value: Any,
                    metric_name: str) -> str | None:
    """What is wrong with the columns every stored row has alike (a run's or a collectives result's)."""
    if not all(isinstance(text, str) for text in (run_id, started, night, status)):
        return "run id, started_at, night or status is not text"
    try:
        utc_instant(started)
    except ValueError:
        return f"started_at {started[:60]!r} is not an ISO 8601 date-time"
    except OverflowError:
        return f"started_at {started[:60]!r} is out of the range of dates in UTC"
    try:
        if len(night) != 10:
            raise ValueError
        datetime.date.fromisoformat(night)
    except ValueError:
        return f"night {night[:60]!r} is not a date (YYYY-MM-DD)"
    if commit is not None and not isinstance(commit, str):
        return "git_commit is not text"
    if not (isinstance(prints, dict) and all(item is None or isinstance(item, str) for item in prints.values())):
        return "fingerprint is not a JSON mapping of text"
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value)):
        return f"its {metric_name} is not a finite number ({str(value)[:40]!r})"
    return None


# PointKey's fields and the JSON types each may hold, from its annotations ("int | None")
POINT_TYPES = {field.name: tuple(part.strip() for part in str(field.type).split("|"))
               for field in dataclasses.fields(PointKey)}
_JSON_TYPES = {"str": (str,), "int": (int,), "bool": (bool,), "None": (type(None),)}


def _is_one_of(item: Any, kinds: tuple[str, ...]) -> bool:
    if isinstance(item, bool) and "bool" not in kinds:
        return False  # JSON true is no count
    return any(isinstance(item, _JSON_TYPES[kind]) for kind in kinds)


def _json_column(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


@_guarded
def run_count(connection) -> int:
    return connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
