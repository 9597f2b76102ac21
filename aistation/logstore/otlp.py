"""Every line also to an OpenTelemetry collector, for sites whose logs live in another stack
(Loki, OpenSearch, Splunk... behind an OTel collector): OTLP over HTTP with its JSON encoding,
set by OGAI_LOGS_OTLP_ENDPOINT (e.g. http://otel-collector:4318/v1/logs).

The export follows a batch's commit to the store and never undoes it: a collector that is down
costs the exported copy of that batch (counted, logged), never the store's lines.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import date, datetime

import httpx

from aistation.logstore.base import (
    Bucket,
    Cursor,
    DayUsage,
    Expired,
    LogLine,
    LogQuery,
    LogStore,
    Scope,
    StoredLine,
)

logger = logging.getLogger("aistation.logstore.otlp")
SEVERITY = {"debug": 5, "info": 9, "warning": 13, "error": 17, "critical": 21}
TIMEOUT_S = 5.0


def _attribute(key: str, value) -> dict:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def log_record(line: LogLine) -> dict:
    attributes = [_attribute(f"ogai.{name}", getattr(line, name))
                  for name in ("tenant_id", "job_id", "attempt", "replica", "line_no")
                  if getattr(line, name) is not None]
    attributes += [_attribute(f"ogai.{name}", getattr(line, name))
                   for name in ("stream", "source", "request_id") if getattr(line, name)]
    return {"timeUnixNano": str(int(line.ts.timestamp() * 1e9)),
            "severityText": line.level.upper(),
            "severityNumber": SEVERITY.get(line.level, 9),
            "body": {"stringValue": line.message}, "attributes": attributes}


def otlp_payload(lines: Sequence[LogLine]) -> dict:
    return {"resourceLogs": [{
        "resource": {"attributes": [_attribute("service.name", "ogai")]},
        "scopeLogs": [{"scope": {"name": "ogai.logs"},
                       "logRecords": [log_record(line) for line in lines]}]}]}


class ExportingStore(LogStore):
    """A store whose appends are also sent to an OTLP/HTTP endpoint; everything else is the
    wrapped store's."""

    def __init__(self, inner: LogStore, endpoint: str) -> None:
        self.inner = inner
        self.writers = inner.writers
        self.endpoint = endpoint
        self.failures = 0
        self._client = httpx.Client(timeout=TIMEOUT_S)

    def append(self, lines: Sequence[LogLine], cursors: dict[str, Cursor] | None = None) -> None:
        self.inner.append(lines, cursors)
        if not lines:
            return
        try:
            response = self._client.post(self.endpoint, json=otlp_payload(lines))
            response.raise_for_status()
        except httpx.HTTPError as exc:
            self.failures += 1
            logger.warning("OTLP export of %s log lines to %s failed: %s", len(lines),
                           self.endpoint, exc)

    def cursors(self, keys: Iterable[str]) -> dict[str, Cursor]:
        return self.inner.cursors(keys)

    def search(self, query: LogQuery) -> list[StoredLine]:
        return self.inner.search(query)

    def histogram(self, query: LogQuery, since: datetime, until: datetime,
                  buckets: int) -> list[Bucket]:
        return self.inner.histogram(query, since, until, buckets)

    def around(self, scope: Scope, *, job_id: int, attempt: int, replica: int, line_no: int,
               before: int, after: int) -> list[StoredLine]:
        return self.inner.around(scope, job_id=job_id, attempt=attempt, replica=replica,
                                 line_no=line_no, before=before, after=after)

    def usage(self, tenant_ids: Iterable[int | None] | None = None) -> list[DayUsage]:
        return self.inner.usage(tenant_ids)

    def expire(self, cutoffs: dict[int | None, date], default_cutoff: date) -> Expired:
        return self.inner.expire(cutoffs, default_cutoff)

    def add_dropped(self, source: str, count: int) -> None:
        self.inner.add_dropped(source, count)

    def dropped(self) -> dict[str, int]:
        return self.inner.dropped()

    def clear(self) -> None:
        self.inner.clear()

    def close(self) -> None:
        self._client.close()
        self.inner.close()
