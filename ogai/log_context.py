"""Structured platform logs: who and what a log line is about, carried without arguments.

A request gets an id (the client's `X-Request-ID` when it is a sane token, else a new one),
answered in the response's `X-Request-ID` header and in every line logged while it runs. A
task sent during the request carries the id in its message headers, so the worker's lines for
that work carry it too: a request is followed from the API through the worker to the job.
`bound(job=42)` adds fields to the lines logged inside it.

`JsonFormatter` writes each record as one JSON object (time, level, logger, message, the
context, the exception): what log shippers read.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

request_id: ContextVar[str] = ContextVar("ogai_request_id", default="")
_request: ContextVar[Any] = ContextVar("ogai_request", default=None)
_fields: ContextVar[dict[str, Any]] = ContextVar("ogai_log_fields", default={})  # noqa: B039

HEADER = "X-Request-ID"
TASK_HEADER = "ogai_request_id"
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{8,64}")
RECORD_FIELDS = ("job", "tenant", "user", "task")  # `extra=` keys that become context


def new_request_id() -> str:
    return uuid.uuid4().hex


def sane_request_id(value: str | None) -> str:
    return value if value and _SANE_ID.fullmatch(value) else new_request_id()


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    token = _fields.set({**_fields.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _fields.reset(token)


@contextmanager
def request_bound(rid: str, request: Any = None) -> Iterator[None]:
    rid_token, request_token = request_id.set(rid), _request.set(request)
    try:
        yield
    finally:
        request_id.reset(rid_token)
        _request.reset(request_token)


def _username(request: Any) -> str | None:
    """The request's user once authentication has run, without running it for a log line."""
    from django.utils.functional import empty

    user = request.__dict__.get("user") if request is not None else None
    wrapped = getattr(user, "_wrapped", user)
    if wrapped is None or wrapped is empty:  # a lazy user not yet read
        return None
    if getattr(wrapped, "is_authenticated", False):
        return wrapped.get_username()
    return None


def current(record: logging.LogRecord | None = None) -> dict[str, Any]:
    """The context of a line logged now: request id, user, and the bound fields (a record's
    own `extra=` fields win)."""
    found: dict[str, Any] = dict(_fields.get())
    user = _username(_request.get())
    if user:
        found.setdefault("user", user)
    if record is not None:
        request = record.__dict__.get("request")  # django.request's lines, logged after
        rid = getattr(request, "request_id", None)  # the middleware has returned
        if rid:
            found.setdefault("request_id", rid)
            user = _username(request)
            if user:
                found.setdefault("user", user)
        for key in RECORD_FIELDS:
            if key in record.__dict__:
                found[key] = record.__dict__[key]
    rid = request_id.get()
    if rid:
        found.setdefault("request_id", rid)
    return found


def message_of(record: logging.LogRecord) -> str:
    """The record's message with its exception, if any."""
    text = record.getMessage()
    if record.exc_info:
        text = f"{text}\n{logging.Formatter().formatException(record.exc_info)}"
    elif record.exc_text:
        text = f"{text}\n{record.exc_text}"
    return text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
                 "level": record.levelname.lower(), "logger": record.name,
                 "message": message_of(record), **current(record)}
        return json.dumps(entry, default=str, ensure_ascii=False)


class RequestIdMiddleware:
    """Gives every request its id, and answers it in the X-Request-ID header."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        rid = sane_request_id(request.headers.get(HEADER))
        request.request_id = rid
        with request_bound(rid, request):
            response = self.get_response(request)
        response[HEADER] = rid
        return response


def connect_celery() -> None:
    """Tasks carry the id of the request that sent them, and log with it and their name."""
    from celery.signals import before_task_publish, task_postrun, task_prerun

    tokens: dict[str, tuple] = {}

    @before_task_publish.connect(weak=False)
    def _carry(headers=None, **_kwargs):
        rid = request_id.get()
        if rid and headers is not None:
            headers.setdefault(TASK_HEADER, rid)

    @task_prerun.connect(weak=False)
    def _enter(task_id=None, task=None, **_kwargs):
        # A worker's request holds the message's headers as attributes; an eager apply()
        # keeps them in `headers`.
        rid = getattr(task.request, TASK_HEADER, None) or \
            (getattr(task.request, "headers", None) or {}).get(TASK_HEADER)
        tokens[task_id] = (request_id.set(rid or request_id.get()),
                           _fields.set({**_fields.get(), "task": task.name}))

    @task_postrun.connect(weak=False)
    def _leave(task_id=None, **_kwargs):
        found = tokens.pop(task_id, None)
        if found:
            request_id.reset(found[0])
            _fields.reset(found[1])
