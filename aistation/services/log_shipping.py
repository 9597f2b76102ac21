"""Every job's output into the log store, as it is written.

A pass reads each launched attempt's replicas from where the last pass stopped (the cursor the
store keeps beside the lines, moved in the same transaction), through the cluster's driver, so
local, Slurm and Kubernetes jobs are read alike. The driver's log (a file, or the pod's log and
the copy kept when the pod goes) stays the source of truth until a line is in the store: when
the store is down the pass fails whole, and the next pass after it returns reads the same
lines again. Once an attempt has ended and every replica was read to its end, it is marked
shipped and never read again.
"""

from __future__ import annotations

import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone

from aistation.choices import LIVE_ATTEMPT_STATES
from aistation.logstore.base import Cursor, LogLine, LogStore, StoreDown
from aistation.logstore.config import get_store
from aistation.models import Attempt
from podsys.drivers.base import ClusterDriver, DriverError
from podsys.runtime import driver_for

logger = logging.getLogger(__name__)

BATCH_LINES = 20_000
PARALLEL_FROM_LINES = 2_000  # fewer lines go in one transaction
GIVE_UP_AFTER = timedelta(hours=1)  # an ended attempt whose logs its driver cannot give
_LEVELS = (
    ("error", re.compile(r"\b(?:fatal|critical|error|exception|traceback)\b", re.I)),
    ("warning", re.compile(r"\bwarn(?:ing)?\b", re.I)),
    ("debug", re.compile(r"\bdebug\b", re.I)),
)


def line_level(text: str) -> str:
    """A job line's level, as far as its words say: error, warning, debug or info."""
    for level, pattern in _LEVELS:
        if pattern.search(text):
            return level
    return "info"


def cursor_key(workload_id: str, replica: int) -> str:
    return f"{workload_id}/{replica}"


@dataclass
class ShipReport:
    lines: int = 0
    attempts_done: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def logs_ship(*, batch_lines: int = BATCH_LINES) -> ShipReport:
    """One pass over every attempt whose output is not all in the store yet. Raises StoreDown
    when the store cannot be used: what it took is kept, the rest is read again next time."""
    report = ShipReport()
    store = get_store()
    attempts = list(Attempt.objects.filter(launched=True, logs_shipped=False)
                    .select_related("job", "cluster").order_by("pk"))
    keys = [cursor_key(a.workload_id, r) for a in attempts for r in range(a.job.replicas)]
    cursors = store.cursors(keys)
    now = timezone.now()
    pending: dict[str, tuple[list[LogLine], Cursor]] = {}
    pending_lines = 0
    done: list[int] = []
    drivers: dict[int, ClusterDriver] = {}

    def flush() -> None:
        nonlocal pending_lines
        store_pending(store, pending)
        if done:
            Attempt.objects.filter(pk__in=done).update(logs_shipped=True)
        report.lines += pending_lines
        report.attempts_done.extend(done)
        pending.clear()
        done.clear()
        pending_lines = 0

    for attempt in attempts:
        ended = attempt.state not in LIVE_ATTEMPT_STATES
        complete = ended
        try:
            driver = drivers.get(attempt.cluster_id) or driver_for(attempt.cluster)
            drivers[attempt.cluster_id] = driver
            for replica in range(attempt.job.replicas):
                key = cursor_key(attempt.workload_id, replica)
                at = cursors.get(key, Cursor())
                chunk = driver.read_log(attempt.workload_id, replica=replica,
                                        offset=at.offset, final=ended)
                complete = complete and not chunk.more
                if chunk.offset == at.offset:
                    continue
                pending[key] = (
                    [LogLine(ts=now, message=text, tenant_id=attempt.job.tenant_id,
                             job_id=attempt.job_id, attempt=attempt.number, replica=replica,
                             line_no=at.line_no + index, level=line_level(text))
                     for index, text in enumerate(chunk.lines, start=1)],
                    Cursor(offset=chunk.offset, line_no=at.line_no + len(chunk.lines)))
                pending_lines += len(chunk.lines)
        except DriverError as exc:
            report.errors.append(f"job {attempt.job_id} attempt {attempt.number}: {exc}")
            finished = attempt.finished_at or attempt.created_at
            complete = ended and now - finished > GIVE_UP_AFTER
            if complete:
                logger.warning("job %s attempt %s: its output could not be read since it ended "
                               "(%s); the log store keeps what it had", attempt.job_id,
                               attempt.number, exc, extra={"job": attempt.job_id})
        if complete:
            done.append(attempt.pk)
        if pending_lines >= batch_lines:
            flush()
    flush()
    return report


def store_pending(store: LogStore, pending: dict[str, tuple[list[LogLine], Cursor]]) -> None:
    """Each replica's new lines with its cursor, in one transaction per writer. A store that
    takes concurrent writes (PostgreSQL) gets `store.writers` of them at once, the replicas
    dealt out by size: on two cores one writer leaves a core idle while the database works.
    StoreDown from any writer is raised once all have finished; replicas whose writer
    committed are kept."""
    if not pending:
        return
    writers = min(store.writers, len(pending))
    total = sum(len(found) for found, _cursor in pending.values())
    if writers <= 1 or total < PARALLEL_FROM_LINES:
        store.append([line for found, _cursor in pending.values() for line in found],
                     {key: cursor for key, (_found, cursor) in pending.items()})
        return
    shares: list[tuple[list[LogLine], dict[str, Cursor]]] = [([], {}) for _ in range(writers)]
    for key, (found, cursor) in sorted(pending.items(), key=lambda item: -len(item[1][0])):
        lines, moves = min(shares, key=lambda share: len(share[0]))
        lines.extend(found)
        moves[key] = cursor
    failures = [exc for exc in _writer_pool(writers).map(
        lambda share: _append(store, *share), shares) if exc is not None]
    if failures:
        raise failures[0]


def _append(store: LogStore, lines: list[LogLine], moves: dict[str, Cursor]) -> Exception | None:
    try:
        store.append(lines, moves)
    except StoreDown as exc:
        return exc
    return None


_pool: ThreadPoolExecutor | None = None
_pool_pid = 0


def _writer_pool(size: int) -> ThreadPoolExecutor:
    """Writer threads kept between passes (each keeps its store connection), one set per
    process (a forked worker makes its own)."""
    global _pool, _pool_pid
    if _pool is None or _pool_pid != os.getpid() or _pool._max_workers != size:
        _pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="ogai-log-writer")
        _pool_pid = os.getpid()
    return _pool
