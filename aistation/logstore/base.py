"""What crosses the log store's door: plain dataclasses, and the contract every backend keeps."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

from aistation.logstore.query import Phrase

MAX_LIMIT = 1000


class StoreDown(Exception):
    """The store could not be reached or refused the write: nothing of the call was kept."""


@dataclass(frozen=True)
class LogLine:
    """One line. Job output carries tenant, job, attempt, replica and its 1-based line number
    in that replica's log; the platform's own lines carry no tenant (operators only)."""

    ts: datetime
    message: str
    tenant_id: int | None = None
    job_id: int | None = None
    attempt: int | None = None
    replica: int | None = None
    line_no: int | None = None
    stream: str = "output"  # output: a job's stdout and stderr as its driver keeps them
    level: str = "info"
    source: str = "job"  # job, or the platform process: web, worker, beat
    request_id: str = ""
    context: str = ""  # the platform line's JSON context (user, tenant, task, logger)


@dataclass(frozen=True)
class StoredLine(LogLine):
    id: int = 0


@dataclass(frozen=True)
class Scope:
    """What a caller may see: lines of these tenants (None: of every tenant), and the
    platform's own lines only when `platform` is set."""

    tenant_ids: frozenset[int] | None
    platform: bool = False

    @property
    def empty(self) -> bool:
        return self.tenant_ids is not None and not self.tenant_ids and not self.platform


@dataclass(frozen=True)
class LogQuery:
    scope: Scope
    phrases: tuple[Phrase, ...] = ()  # every one must be in the line
    job_id: int | None = None
    attempt: int | None = None
    replica: int | None = None
    level: str = ""
    source: str = ""
    request_id: str = ""
    since: datetime | None = None
    until: datetime | None = None
    after_id: int | None = None  # live tail: lines after this one, oldest first
    limit: int = 100


@dataclass(frozen=True)
class Cursor:
    """How far a replica's log has been ingested: the driver's offset into it, and the lines
    taken so far (the next line's number is line_no + 1)."""

    offset: int = 0
    line_no: int = 0


@dataclass(frozen=True)
class DayUsage:
    tenant_id: int | None
    day: date
    lines: int
    bytes: int


@dataclass(frozen=True)
class Bucket:
    start: datetime
    count: int


@dataclass
class Expired:
    """What one retention pass removed."""

    days: list[tuple[int | None, date]] = field(default_factory=list)  # (tenant, day) removed
    partitions: list[date] = field(default_factory=list)  # whole days dropped for everyone
    lines: int = 0


class LogStore(ABC):
    """Append lines (with the ingest cursors they advance, in one transaction), search, tail,
    read around a line, count and expire. Every read takes a Scope; a backend never returns a
    line outside it. Calls raise StoreDown when the store cannot be used."""

    writers = 1  # appends that may run at once, each from its own thread

    @abstractmethod
    def append(self, lines: Sequence[LogLine],
               cursors: dict[str, Cursor] | None = None) -> None: ...

    @abstractmethod
    def cursors(self, keys: Iterable[str]) -> dict[str, Cursor]: ...

    @abstractmethod
    def search(self, query: LogQuery) -> list[StoredLine]:
        """Newest first; with `after_id`, the lines after it, oldest first."""

    @abstractmethod
    def histogram(self, query: LogQuery, since: datetime, until: datetime,
                  buckets: int) -> list[Bucket]: ...

    @abstractmethod
    def around(self, scope: Scope, *, job_id: int, attempt: int, replica: int, line_no: int,
               before: int, after: int) -> list[StoredLine]: ...

    @abstractmethod
    def usage(self, tenant_ids: Iterable[int | None] | None = None) -> list[DayUsage]: ...

    @abstractmethod
    def expire(self, cutoffs: dict[int | None, date], default_cutoff: date) -> Expired:
        """Remove every tenant's days before its cutoff (`default_cutoff` for tenants not
        named, such as deleted ones), whole days only."""

    @abstractmethod
    def add_dropped(self, source: str, count: int) -> None: ...

    @abstractmethod
    def dropped(self) -> dict[str, int]: ...

    @abstractmethod
    def clear(self) -> None:
        """Remove every line, cursor and count (tests, and `manage.py logs_clear`)."""

    def maintain(self) -> None:
        """Upkeep the backend needs now and then to keep searches fast (the hourly retention
        task runs it); nothing by default."""
        return None

    def close(self) -> None:
        return None
