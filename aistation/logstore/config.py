"""Which store this process uses: OGAI_LOGS_URL, or beside the platform's own database.

- unset: PostgreSQL when the platform's database is (the same database, its own connection and
  tables), else a SQLite file `logs.sqlite3` in OGAI_DATA_DIR;
- `postgresql://user:pass@host/db`: that PostgreSQL;
- `sqlite:///path/to/logs.sqlite3`: that file.

With OGAI_LOGS_OTLP_ENDPOINT set, every batch stored is also exported there (otlp.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from aistation.logstore.base import LogStore
from aistation.logstore.otlp import ExportingStore

_store: LogStore | None = None
_lock = threading.Lock()


def _django_params() -> dict:
    # Read when first used, so tests get the test database pytest-django made.
    db = connections["default"].settings_dict
    params = {"dbname": db["NAME"], "user": db.get("USER") or None,
              "password": db.get("PASSWORD") or None, "host": db.get("HOST") or None,
              "port": db.get("PORT") or None}
    return {key: value for key, value in params.items() if value is not None}


def build_store(url: str) -> LogStore:
    from aistation.logstore.postgres import PostgresLogStore
    from aistation.logstore.sqlite import SqliteLogStore

    if not url:
        if connections["default"].vendor == "postgresql":
            return PostgresLogStore(_django_params(), writers=settings.OGAI_LOGS_WRITERS)
        return SqliteLogStore(Path(settings.DATA_DIR) / "logs.sqlite3")
    if url.startswith(("postgres://", "postgresql://")):
        return PostgresLogStore(url.replace("postgres://", "postgresql://", 1),
                                writers=settings.OGAI_LOGS_WRITERS)
    if url.startswith("sqlite:///"):
        return SqliteLogStore(Path(url[len("sqlite:///"):]))
    raise ImproperlyConfigured(
        f"OGAI_LOGS_URL={url!r}: use postgresql://user:password@host/database or "
        "sqlite:///path/to/logs.sqlite3, or leave it unset.")


def get_store() -> LogStore:
    global _store
    with _lock:
        if _store is None:
            _store = build_store(settings.OGAI_LOGS_URL)
            if settings.OGAI_LOGS_OTLP_ENDPOINT:
                _store = ExportingStore(_store, settings.OGAI_LOGS_OTLP_ENDPOINT)
        return _store


def reset_store() -> None:
    """Forget this process's store (its connections closed): the next use builds it again."""
    global _store
    with _lock:
        if _store is not None:
            _store.close()
        _store = None
