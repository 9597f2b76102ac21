"""The embedded log store: a SQLite file with an FTS5 index, beside the platform's database.

Days are a column, not tables: retention deletes a tenant's whole days by that column. One
connection per thread; WAL, so searches read while the shipper writes. close() may come from
another thread than one using its connection (the platform's log flusher writes in its own):
it waits for the statements running, since sqlite3 crashes the process on a connection closed
under one.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, date
from pathlib import Path

from aistation.logstore.base import Cursor, Expired, LogLine, LogQuery, StoreDown
from aistation.logstore.sql import SqlLogStore, day_usage, epoch

SCHEMA = """
CREATE TABLE IF NOT EXISTS log_line (
    id INTEGER PRIMARY KEY, ts REAL NOT NULL, day TEXT NOT NULL, tenant_id INTEGER,
    job_id INTEGER, attempt INTEGER, replica INTEGER, line_no INTEGER,
    stream TEXT NOT NULL, level TEXT NOT NULL, source TEXT NOT NULL,
    request_id TEXT NOT NULL, context TEXT NOT NULL, message TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS log_line_tenant_ts ON log_line (tenant_id, ts);
CREATE INDEX IF NOT EXISTS log_line_job ON log_line (job_id, attempt, replica, line_no);
CREATE INDEX IF NOT EXISTS log_line_day ON log_line (day, tenant_id);
CREATE INDEX IF NOT EXISTS log_line_request ON log_line (request_id) WHERE request_id != '';
CREATE VIRTUAL TABLE IF NOT EXISTS log_fts USING fts5(
    message, content='log_line', content_rowid='id', tokenize='unicode61 remove_diacritics 0');
CREATE TRIGGER IF NOT EXISTS log_line_indexed AFTER INSERT ON log_line BEGIN
    INSERT INTO log_fts (rowid, message) VALUES (new.id, new.message); END;
CREATE TRIGGER IF NOT EXISTS log_line_unindexed AFTER DELETE ON log_line BEGIN
    INSERT INTO log_fts (log_fts, rowid, message) VALUES ('delete', old.id, old.message); END;
CREATE TABLE IF NOT EXISTS log_cursor (key TEXT PRIMARY KEY, offset INTEGER NOT NULL,
    line_no INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log_usage (tenant_key INTEGER NOT NULL, day TEXT NOT NULL,
    lines INTEGER NOT NULL, bytes INTEGER NOT NULL, PRIMARY KEY (tenant_key, day));
CREATE TABLE IF NOT EXISTS log_dropped (source TEXT PRIMARY KEY, count INTEGER NOT NULL);
"""
def match_expression(query: LogQuery) -> str:
    # Words are letters and digits only (query.parse), so quoting them is all FTS5 needs.
    return " ".join('"' + " ".join(phrase) + '"' for phrase in query.phrases)


class SqliteLogStore(SqlLogStore):
    as_epoch = True
    bucket_sql = "CAST((ts - %s) / %s AS INTEGER)"

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._using = threading.RLock()  # held by each operation, and by close()

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection for one operation; close() waits for it to end."""
        with self._using:
            yield self._db()

    def close(self) -> None:
        with self._using:
            super().close()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path, timeout=15, isolation_level=None,
                                     check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(SCHEMA)
            except sqlite3.Error as exc:
                raise StoreDown(f"log store {self.path}: {exc}") from None
            self._remember(db)
        return db

    def _run(self, sql: str, params: Sequence = (), hints: Sequence[str] = ()) -> list[tuple]:
        try:
            with self._connection() as db:
                return db.execute(sql.replace("%s", "?"), list(params)).fetchall()
        except sqlite3.OperationalError as exc:
            raise StoreDown(f"log store {self.path}: {exc}") from None

    def append(self, lines: Sequence[LogLine], cursors: dict[str, Cursor] | None = None) -> None:
        rows = [(epoch(line.ts), line.ts.astimezone(UTC).date().isoformat(), line.tenant_id,
                 line.job_id, line.attempt, line.replica, line.line_no, line.stream, line.level,
                 line.source, line.request_id, line.context, line.message) for line in lines]
        with self._connection() as db:
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.executemany(
                        "INSERT INTO log_line (ts, day, tenant_id, job_id, attempt, replica, "
                        "line_no, stream, level, source, request_id, context, message) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
                    db.executemany(
                        "INSERT INTO log_usage (tenant_key, day, lines, bytes) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT (tenant_key, day) DO UPDATE SET "
                        "lines = lines + excluded.lines, bytes = bytes + excluded.bytes",
                        [(tenant or 0, day.isoformat(), count, size)
                         for (tenant, day), (count, size) in day_usage(lines).items()])
                    db.executemany(
                        "INSERT INTO log_cursor (key, offset, line_no) VALUES (?, ?, ?) "
                        "ON CONFLICT (key) DO UPDATE SET offset = excluded.offset, "
                        "line_no = excluded.line_no",
                        [(key, cursor.offset, cursor.line_no)
                         for key, cursor in (cursors or {}).items()])
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                raise StoreDown(f"log store {self.path}: {exc}") from None

    def _match(self, query: LogQuery) -> tuple[str, list]:
        return ("id IN (SELECT rowid FROM log_fts WHERE log_fts MATCH %s)",
                [match_expression(query)])

    def expire(self, cutoffs: dict[int | None, date], default_cutoff: date) -> Expired:
        expired = Expired()
        for row in self.usage():
            tenant, day = row.tenant_id, row.day
            if day >= cutoffs.get(tenant, default_cutoff):
                continue
            with self._connection() as db:
                try:
                    db.execute("BEGIN IMMEDIATE")
                    cursor = db.execute("DELETE FROM log_line WHERE day = ? AND tenant_id IS ?",
                                        [day.isoformat(), tenant])
                    db.execute("DELETE FROM log_usage WHERE tenant_key = ? AND day = ?",
                               [tenant or 0, day.isoformat()])
                    db.execute("COMMIT")
                except sqlite3.OperationalError as exc:
                    db.execute("ROLLBACK")
                    raise StoreDown(f"log store {self.path}: {exc}") from None
            expired.days.append((tenant, day))
            expired.lines += cursor.rowcount
        return expired

    def maintain(self) -> None:
        self._run("PRAGMA optimize")  # statistics for the indexes the searches lean on

    def clear(self) -> None:
        for table in ("log_line", "log_cursor", "log_usage", "log_dropped"):
            self._run(f"DELETE FROM {table}")
