"""What both SQL backends share: the filters every read applies, and the reads themselves.

A backend gives its connection (`_run`), how it matches words (`_match`), how it counts a
line's time bucket, and its own writes (append, expire, clear).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from aistation.logstore.base import (
    MAX_LIMIT,
    Bucket,
    Cursor,
    DayUsage,
    LogLine,
    LogQuery,
    LogStore,
    Scope,
    StoredLine,
)

COLUMNS = ("id, ts, tenant_id, job_id, attempt, replica, line_no, stream, level, source, "
           "request_id, context, message")


def day_usage(lines: Sequence[LogLine]) -> dict[tuple[int | None, date], tuple[int, int]]:
    """Lines and bytes per (tenant, UTC day): what the tenant's storage quota counts."""
    usage: dict[tuple[int | None, date], tuple[int, int]] = {}
    for line in lines:
        key = (line.tenant_id, line.ts.astimezone(UTC).date())
        count, size = usage.get(key, (0, 0))
        usage[key] = (count + 1, size + len(line.message.encode("utf-8", "replace")) + 1)
    return usage


def epoch(moment: datetime) -> float:
    return moment.timestamp()


def scope_sql(scope: Scope, column: str = "tenant_id") -> tuple[str, list]:
    """The WHERE part that keeps a read inside the caller's scope (SQLite and PostgreSQL)."""
    parts: list[str] = []
    params: list = []
    if scope.tenant_ids is None:
        parts.append(f"{column} IS NOT NULL")
    elif scope.tenant_ids:
        ids = sorted(scope.tenant_ids)
        parts.append(f"{column} IN ({', '.join(['%s'] * len(ids))})")
        params.extend(ids)
    if scope.platform:
        parts.append(f"{column} IS NULL")
    if not parts:
        return "FALSE", []
    return "(" + " OR ".join(parts) + ")", params


def filters_sql(query: LogQuery, as_epoch: bool) -> tuple[list[str], list]:
    """Every filter of a query but its text, for both backends (`%s` placeholders)."""
    where, params = scope_sql(query.scope)
    clauses = [where]
    for column in ("job_id", "attempt", "replica"):
        value = getattr(query, column)
        if value is not None:
            clauses.append(f"{column} = %s")
            params.append(value)
    for column in ("level", "source", "request_id"):
        value = getattr(query, column)
        if value:
            clauses.append(f"{column} = %s")
            params.append(value)
    for bound, op in ((query.since, ">="), (query.until, "<")):
        if bound is not None:
            clauses.append(f"ts {op} %s")
            params.append(epoch(bound) if as_epoch else bound)
    if query.after_id is not None:
        clauses.append("id > %s")
        params.append(query.after_id)
    return clauses, params


def bucket_list(since: datetime, width: float, buckets: int,
                counts: dict[int, int]) -> list[Bucket]:
    return [Bucket(start=since + timedelta(seconds=width * index), count=counts.get(index, 0))
            for index in range(buckets)]


class SqlLogStore(LogStore):
    """The reads, on `%s` placeholders; one connection per thread, all closed by close()."""

    as_epoch = False  # times are stored as epoch seconds (SQLite), not timestamps
    bucket_sql = ""  # the bucket index of a line from two parameters: since, bucket width

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def _remember(self, db: Any) -> None:
        self._local.db = db
        with self._lock:
            self._all.append(db)

    @abstractmethod
    def _run(self, sql: str, params: Sequence = (), hints: Sequence[str] = ()) -> list[tuple]:
        """Run one statement in its own transaction; `hints` are statements run before it in
        that transaction (planner settings), where the backend has any."""

    def _hints(self, query: LogQuery) -> tuple[str, ...]:
        return ()

    @abstractmethod
    def _match(self, query: LogQuery) -> tuple[str, list]:
        """The WHERE part that keeps lines holding every phrase of the query."""

    def _time(self, moment: datetime) -> Any:
        return epoch(moment) if self.as_epoch else moment

    def _where(self, query: LogQuery) -> tuple[str, list]:
        clauses, params = filters_sql(query, as_epoch=self.as_epoch)
        if query.phrases:
            clause, more = self._match(query)
            clauses.append(clause)
            params += more
        return " AND ".join(clauses), params

    def cursors(self, keys: Iterable[str]) -> dict[str, Cursor]:
        keys = list(keys)
        found: dict[str, Cursor] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            for key, offset, line_no in self._run(
                    f'SELECT key, "offset", line_no FROM log_cursor WHERE key IN '
                    f"({', '.join(['%s'] * len(chunk))})", chunk):
                found[key] = Cursor(offset=offset, line_no=line_no)
        return found

    def search(self, query: LogQuery) -> list[StoredLine]:
        if query.scope.empty:
            return []
        where, params = self._where(query)
        order = "id" if query.after_id is not None else "ts DESC, id DESC"
        rows = self._run(f"SELECT {COLUMNS} FROM log_line WHERE {where} ORDER BY {order} "
                         f"LIMIT %s", [*params, min(query.limit, MAX_LIMIT)], self._hints(query))
        return [stored_line(row) for row in rows]

    def histogram(self, query: LogQuery, since: datetime, until: datetime,
                  buckets: int) -> list[Bucket]:
        width = max((until - since).total_seconds() / buckets, 1e-6)
        counts: dict[int, int] = {}
        if not query.scope.empty:
            where, params = self._where(replace(query, since=since, until=until,
                                                after_id=None))
            for index, count in self._run(
                    f"SELECT {self.bucket_sql} AS b, count(*) FROM log_line WHERE {where} "
                    f"GROUP BY b", [self._time(since), width, *params]):
                counts[index] = count
        return bucket_list(since, width, buckets, counts)

    def around(self, scope: Scope, *, job_id: int, attempt: int, replica: int, line_no: int,
               before: int, after: int) -> list[StoredLine]:
        if scope.empty:
            return []
        where, params = scope_sql(scope)
        rows = self._run(
            f"SELECT {COLUMNS} FROM log_line WHERE {where} AND job_id = %s AND attempt = %s "
            f"AND replica = %s AND line_no BETWEEN %s AND %s ORDER BY line_no",
            [*params, job_id, attempt, replica, line_no - before, line_no + after])
        return [stored_line(row) for row in rows]

    def usage(self, tenant_ids: Iterable[int | None] | None = None) -> list[DayUsage]:
        rows = self._run("SELECT tenant_key, day, lines, bytes FROM log_usage ORDER BY day")
        wanted = None if tenant_ids is None else {t or 0 for t in tenant_ids}
        return [DayUsage(tenant_id=key or None,
                         day=date.fromisoformat(day) if isinstance(day, str) else day,
                         lines=lines, bytes=size)
                for key, day, lines, size in rows if wanted is None or key in wanted]

    def add_dropped(self, source: str, count: int) -> None:
        self._run("INSERT INTO log_dropped (source, count) VALUES (%s, %s) ON CONFLICT (source) "
                  "DO UPDATE SET count = log_dropped.count + excluded.count", [source, count])

    def dropped(self) -> dict[str, int]:
        return dict(self._run("SELECT source, count FROM log_dropped"))

    def close(self) -> None:
        with self._lock:
            for db in self._all:
                db.close()
            self._all.clear()
        self._local = threading.local()


def stored_line(row: tuple) -> StoredLine:
    (id_, ts, tenant_id, job_id, attempt, replica, line_no, stream, level, source,
     request_id, context, message) = row
    if not isinstance(ts, datetime):
        ts = datetime.fromtimestamp(ts, UTC)
    return StoredLine(id=id_, ts=ts, tenant_id=tenant_id, job_id=job_id, attempt=attempt,
                      replica=replica, line_no=line_no, stream=stream, level=level,
                      source=source, request_id=request_id, context=context, message=message)
