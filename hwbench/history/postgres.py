"""A PostgreSQL database behind the few calls hwbench.history.store makes of sqlite3, so a
team can keep one shared history (`--db postgresql://...`; docs/history.md).

psycopg is imported only here, and only for such a URL: `pip install 'hwbench[postgres]'`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

# The version of the schema, which SQLite keeps in its user_version: a one-row table here.
VERSION_TABLE = "hwbench_history_schema"


class PostgresConnection:
    """psycopg's connection with sqlite3's manners where the store needs them: ``?``
    placeholders, ``with connection:`` as one transaction (committed, or rolled back on an
    exception); and a bulk insert of new rows."""

    def __init__(self, url: str):
        import psycopg

        self._connection = psycopg.connect(url, connect_timeout=10)

    def execute(self, sql: str, parameters: Sequence[Any] = ()):
        return self._connection.execute(sql.replace("?", "%s"), parameters)

    def insert_new(self, table: str, rows: list[Sequence[Any]]) -> None:
        """INSERT ... ON CONFLICT DO NOTHING of many rows, through COPY into a temporary table
        (row-by-row inserts took 22 s for 10,000 results; docs/history.md)."""
        if not rows:
            return
        staging = f"hwbench_new_{table}"
        self.execute(f"CREATE TEMPORARY TABLE IF NOT EXISTS {staging} (LIKE {table}) ON COMMIT DELETE ROWS")
        with self._connection.cursor() as cursor:
            with cursor.copy(f"COPY {staging} FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        self.execute(f"INSERT INTO {table} SELECT * FROM {staging} ON CONFLICT DO NOTHING")

    def __enter__(self) -> PostgresConnection:
        return self

    def __exit__(self, kind, value, traceback) -> Literal[False]:
        if kind is None:
            self._connection.commit()
        else:
            self._connection.rollback()
        return False

    def close(self) -> None:
        self._connection.close()

    def schema_version(self) -> int:
        if self.execute("SELECT to_regclass(?)", (VERSION_TABLE,)).fetchone()[0] is None:
            return 0
        row = self.execute(f"SELECT max(version) FROM {VERSION_TABLE}").fetchone()
        return row[0] or 0

    def set_schema_version(self, version: int) -> None:
        """Inside the migration's transaction, so the version moves with the tables."""
        self.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER NOT NULL)")
        self.execute(f"DELETE FROM {VERSION_TABLE}")
        self.execute(f"INSERT INTO {VERSION_TABLE} VALUES (?)", (version,))


def connection_error_types() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.Error,)
