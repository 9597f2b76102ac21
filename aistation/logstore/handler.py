"""The logging handler that sends the platform's own lines to the log store.

Configured in settings.LOGGING beside the JSON console handler. Each record becomes a line
with no tenant (only operators see platform lines), its level, the process it came from
(web, worker, beat), the request id and the job it is about, and its context as JSON.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from django.conf import settings

from aistation.logstore.base import LogLine
from aistation.logstore.buffer import LineBuffer
from ogai.log_context import current, message_of

_buffer: LineBuffer | None = None


def process_role(argv: list[str] | None = None) -> str:
    argv = sys.argv if argv is None else argv
    words = " ".join(argv)
    if "celery" in words:
        return "beat" if " beat" in words or "--beat" in words else "worker"
    return "web"


def platform_buffer() -> LineBuffer:
    global _buffer
    if _buffer is None:
        _buffer = LineBuffer(settings.OGAI_LOGS_BUFFER_LINES, process_role())
    return _buffer


def platform_line(record: logging.LogRecord) -> LogLine:
    context = current(record)
    job = context.get("job")
    return LogLine(
        ts=datetime.fromtimestamp(record.created, UTC), message=message_of(record),
        job_id=job if isinstance(job, int) else None, level=record.levelname.lower(),
        source=platform_buffer().source, stream="platform",
        request_id=str(context.pop("request_id", "")),
        context=json.dumps({"logger": record.name, **context}, default=str))


class StoreHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if not settings.OGAI_LOGS_PLATFORM or record.name.startswith("aistation.logstore"):
            return
        try:
            buffer = platform_buffer()
            buffer.put(platform_line(record))
            if settings.OGAI_LOGS_FLUSHER:
                from aistation.logstore.config import get_store

                buffer.start(get_store)
        except Exception:
            self.handleError(record)
