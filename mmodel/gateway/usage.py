"""Tokens per request, for billing: kept in memory on the request path and written as
`UsageRecord` rows (kind TOKENS) in batches."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime

# Kept at most this many unwritten records (a database down for long): the oldest go first.
MAX_PENDING = 200_000


@dataclass(slots=True)
class TokenUse:
    tenant_id: int
    model_name: str
    prompt_tokens: int
    completion_tokens: int
    started_at: float
    ended_at: float
    source: str


def new_source() -> str:
    """A unique source for the record ("gateway <32 hex>"), so a retried write never doubles."""
    return "gateway " + os.urandom(16).hex()


class UsageBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[TokenUse] = []

    def add(self, use: TokenUse) -> None:
        with self._lock:
            self._records.append(use)

    def take(self) -> list[TokenUse]:
        with self._lock:
            records, self._records = self._records, []
        return records

    def put_back(self, records: list[TokenUse]) -> None:
        with self._lock:
            self._records = (records + self._records)[-MAX_PENDING:]

    def __bool__(self) -> bool:
        return bool(self._records)


def write_usage(records: list[TokenUse]) -> None:
    """Insert the records (a record whose source is already there is skipped). Runs in a
    thread. One prepared INSERT for the batch: building a model instance per row cost more
    CPU than the request it records (~0.25 ms a row), and that thread shares the GIL with the
    event loop."""
    from django.db import connection, transaction
    from django.db.models.constants import OnConflict

    from infra_os.models import UsageRecord

    if not records:
        return
    meta = UsageRecord._meta
    varying = ["tenant", "kind", "source", "model_name", "prompt_tokens", "completion_tokens",
               "started_at", "ended_at", "created_at"]
    constant = [f for f in meta.concrete_fields if not f.primary_key and f.name not in varying]
    columns = [meta.get_field(name).column for name in varying] + [f.column for f in constant]
    fixed = tuple(f.get_db_prep_save(f.get_default(), connection) for f in constant)
    ops = connection.ops
    adapt = ops.adapt_datetimefield_value
    created = adapt(datetime.now(tz=UTC))
    kind = UsageRecord.Kind.TOKENS.value
    rows = []
    for use in records:
        started = datetime.fromtimestamp(use.started_at, tz=UTC)
        ended = datetime.fromtimestamp(max(use.ended_at, use.started_at), tz=UTC)
        rows.append((use.tenant_id, kind, use.source, use.model_name[:200], use.prompt_tokens,
                     use.completion_tokens, adapt(started), adapt(ended), created, *fixed))
    fields = [meta.get_field(name) for name in varying] + constant
    quote = ops.quote_name
    sql = "{} {} ({}) VALUES ({})".format(
        ops.insert_statement(on_conflict=OnConflict.IGNORE), quote(meta.db_table),
        ", ".join(quote(c) for c in columns), ", ".join(["%s"] * len(columns)))
    suffix = ops.on_conflict_suffix_sql(fields, OnConflict.IGNORE, None, None)
    if suffix:
        sql = f"{sql} {suffix}"
    with transaction.atomic(), connection.cursor() as cursor:
        for start in range(0, len(rows), 1000):
            cursor.executemany(sql, rows[start:start + 1000])
