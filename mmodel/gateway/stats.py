"""Per-deployment, per-minute request statistics: counted in memory on the request path, written
to `DeploymentStat` in batches. Latencies go into a histogram over fixed bounds so minutes and
processes add up exactly and percentiles come from the sums."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

# Upper bounds (ms, inclusive) of the latency buckets; one more bucket holds everything slower.
LATENCY_BUCKETS_MS: tuple[float, ...] = (
    5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
)
BUCKET_COUNT = len(LATENCY_BUCKETS_MS) + 1


def bucket_index(latency_ms: float) -> int:
    return bisect_left(LATENCY_BUCKETS_MS, latency_ms)


def merge_buckets(histograms: Iterable[Sequence[int]]) -> list[int]:
    """The element-wise sum of histograms (short or empty ones count as zeros)."""
    total = [0] * BUCKET_COUNT
    for histogram in histograms:
        for i, count in enumerate(histogram[:BUCKET_COUNT]):
            total[i] += int(count)
    return total


def percentile(buckets: Sequence[int], q: float) -> float | None:
    """The q-quantile (0 < q <= 1, e.g. 0.5 or 0.99) in ms of a latency histogram, interpolated
    linearly inside its bucket; the slowest bucket answers its lower bound. None when empty."""
    if not 0 < q <= 1:
        raise ValueError("q is a fraction in (0, 1]")
    total = sum(buckets)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(buckets):
        if count <= 0:
            continue
        if seen + count >= rank:
            if i >= len(LATENCY_BUCKETS_MS):
                return float(LATENCY_BUCKETS_MS[-1])
            lower = LATENCY_BUCKETS_MS[i - 1] if i > 0 else 0.0
            upper = LATENCY_BUCKETS_MS[i]
            return float(lower + (upper - lower) * (rank - seen) / count)
        seen += count
    return float(LATENCY_BUCKETS_MS[-1])


class _Minute:
    __slots__ = (
        "buckets",
        "cold_start_ms_max",
        "cold_starts",
        "completion_tokens",
        "errors",
        "latency_ms_sum",
        "prompt_tokens",
        "requests",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.latency_ms_sum = 0.0
        self.buckets = [0] * BUCKET_COUNT
        self.cold_starts = 0  # requests that waited for a replica to start
        self.cold_start_ms_max = 0.0


class StatsBuffer:
    """Counts of this process not yet written; `take()` hands them over and starts afresh."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._minutes: dict[tuple[int, int], _Minute] = {}
        self._last_request: dict[int, float] = {}
        # Requests in flight per deployment: a deployment answering a long generation is in
        # use, so each flush moves its last_request_at to now (scale to zero must not cut it).
        self._in_flight: dict[int, int] = {}

    def begin(self, deployment_id: int) -> None:
        with self._lock:
            self._in_flight[deployment_id] = self._in_flight.get(deployment_id, 0) + 1
            self._last_request[deployment_id] = time.time()

    def end(self, deployment_id: int) -> None:
        with self._lock:
            left = self._in_flight.get(deployment_id, 0) - 1
            if left > 0:
                self._in_flight[deployment_id] = left
            else:
                self._in_flight.pop(deployment_id, None)

    def record(self, *, deployment_id: int, at: float, latency_ms: float, error: bool,
               prompt_tokens: int = 0, completion_tokens: int = 0,
               cold_start_ms: float | None = None) -> None:
        key = (deployment_id, int(at // 60) * 60)
        with self._lock:
            minute = self._minutes.get(key)
            if minute is None:
                minute = self._minutes[key] = _Minute()
            minute.requests += 1
            minute.errors += error
            minute.prompt_tokens += prompt_tokens
            minute.completion_tokens += completion_tokens
            minute.latency_ms_sum += latency_ms
            minute.buckets[bisect_left(LATENCY_BUCKETS_MS, latency_ms)] += 1
            if cold_start_ms is not None:
                minute.cold_starts += 1
                minute.cold_start_ms_max = max(minute.cold_start_ms_max, cold_start_ms)
            if at > self._last_request.get(deployment_id, 0.0):
                self._last_request[deployment_id] = at

    def take(self) -> tuple[dict[tuple[int, int], _Minute], dict[int, float]]:
        with self._lock:
            minutes, self._minutes = self._minutes, {}
            last, self._last_request = self._last_request, {}
            now = time.time()
            for deployment_id in self._in_flight:
                last[deployment_id] = now
        return minutes, last

    def put_back(self, minutes: dict[tuple[int, int], _Minute], last: dict[int, float]) -> None:
        """After a failed write: merge what was taken back in (the next flush retries)."""
        with self._lock:
            for key, taken in minutes.items():
                minute = self._minutes.get(key)
                if minute is None:
                    self._minutes[key] = taken
                    continue
                minute.requests += taken.requests
                minute.errors += taken.errors
                minute.prompt_tokens += taken.prompt_tokens
                minute.completion_tokens += taken.completion_tokens
                minute.latency_ms_sum += taken.latency_ms_sum
                minute.cold_starts += taken.cold_starts
                minute.cold_start_ms_max = max(minute.cold_start_ms_max,
                                               taken.cold_start_ms_max)
                minute.buckets = [a + b for a, b in zip(minute.buckets, taken.buckets,
                                                        strict=True)]
            for deployment_id, at in last.items():
                if at > self._last_request.get(deployment_id, 0.0):
                    self._last_request[deployment_id] = at

    def __bool__(self) -> bool:
        return bool(self._minutes or self._last_request or self._in_flight)


def write_stats(minutes: dict[tuple[int, int], _Minute], last: dict[int, float]) -> None:
    """Add the counts to their DeploymentStat rows (created when missing) and move each
    deployment's last_request_at forward. Runs in a worker thread."""
    from django.db import IntegrityError, transaction
    from django.db.models import Q

    from mmodel.models import Deployment

    ids = {deployment_id for deployment_id, _ in minutes} | set(last)
    alive = set(Deployment.objects.filter(pk__in=ids).values_list("pk", flat=True))
    minutes = {key: value for key, value in minutes.items() if key[0] in alive}
    for attempt in range(2):
        try:
            with transaction.atomic():
                _add_minutes(minutes)
            break
        except IntegrityError:
            # Another process created one of the rows meanwhile: the second pass updates it.
            if attempt:
                raise
    for deployment_id, at in last.items():
        if deployment_id not in alive:
            continue
        when = datetime.fromtimestamp(at, tz=UTC)
        Deployment.objects.filter(pk=deployment_id).filter(
            Q(last_request_at__isnull=True) | Q(last_request_at__lt=when)
        ).update(last_request_at=when)


def _add_minutes(minutes: dict[tuple[int, int], _Minute]) -> None:
    from django.db.models import Q

    from mmodel.models import DeploymentStat

    if not minutes:
        return
    keyed = {(d, datetime.fromtimestamp(m, tz=UTC)): value for (d, m), value in minutes.items()}
    match = Q()
    for deployment_id, minute in keyed:
        match |= Q(deployment_id=deployment_id, minute=minute)
    existing = {
        (row.deployment_id, row.minute): row
        for row in DeploymentStat.objects.select_for_update().filter(match)
    }
    updates, creates = [], []
    for key, counts in keyed.items():
        row = existing.get(key)
        if row is None:
            row = DeploymentStat(deployment_id=key[0], minute=key[1],
                                 latency_buckets=[0] * BUCKET_COUNT)
            creates.append(row)
        else:
            updates.append(row)
        row.requests += counts.requests
        row.errors += counts.errors
        row.prompt_tokens += counts.prompt_tokens
        row.completion_tokens += counts.completion_tokens
        row.latency_ms_sum += counts.latency_ms_sum
        row.latency_buckets = merge_buckets([row.latency_buckets or [], counts.buckets])
        row.cold_starts += counts.cold_starts
        row.cold_start_ms_max = max(row.cold_start_ms_max, counts.cold_start_ms_max)
    fields = ["requests", "errors", "prompt_tokens", "completion_tokens", "latency_ms_sum",
              "latency_buckets", "cold_starts", "cold_start_ms_max"]
    if updates:
        DeploymentStat.objects.bulk_update(updates, fields)
    if creates:
        DeploymentStat.objects.bulk_create(creates)
