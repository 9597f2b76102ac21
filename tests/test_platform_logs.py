"""The platform's own logs: JSON with the request id, into the log store for operators only,
carried from a request into the tasks it sends; a slow store never blocks a request."""

import json
import logging

import pytest
from celery import shared_task
from celery.signals import before_task_publish

from aistation.logstore.base import StoreDown
from aistation.logstore.buffer import LineBuffer
from aistation.logstore.handler import platform_buffer
from ogai.log_context import JsonFormatter, bound, request_bound, request_id


def _search(api, user, **params):
    response = api.as_user(user).get("/api/v1/aistation/logs/", params)
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_operator_finds_the_lines_of_a_failing_request_by_its_id(api, world, log_store):
    client = api.as_user(world.alpha_member)
    failed = client.post("/api/v1/aistation/jobs/", {"name": "x"}, format="json")
    assert failed.status_code == 400
    rid = failed["X-Request-ID"]
    platform_buffer().flush(log_store)
    lines = _search(api, world.operator, request_id=rid)
    assert lines, "the operator finds the failing request's lines"
    assert any("Bad Request: /api/v1/aistation/jobs/" in line["message"] for line in lines)
    assert all(line["request_id"] == rid and line["tenant"] is None for line in lines)
    assert json.loads(lines[0]["context"])["user"] == "alpha-member"
    # Members never see platform lines, even their own request's.
    assert _search(api, world.alpha_member, request_id=rid) == []
    assert _search(api, world.alpha_member, q="Bad Request") == []


def test_a_clients_request_id_is_kept_when_sane():
    from django.test import Client

    response = Client().get("/healthz", HTTP_X_REQUEST_ID="trace-0123456789")
    assert response["X-Request-ID"] == "trace-0123456789"
    spoofed = Client().get("/healthz", HTTP_X_REQUEST_ID="<script>")
    assert spoofed["X-Request-ID"] != "<script>" and len(spoofed["X-Request-ID"]) == 32


def test_job_transitions_are_platform_lines_about_the_job(farm, log_store, api):
    with request_bound("req-submit-0001"):
        job = farm.submit(name="traced")
    farm.cycle()
    platform_buffer().flush(log_store)
    lines = _search(api, farm.world.operator, job=job.pk, source="web")
    states = [line["message"] for line in reversed(lines)]
    assert any("-> queued" in text for text in states)
    assert any("-> running" in text for text in states)
    submitted = next(line for line in lines if "-> queued" in line["message"])
    assert submitted["request_id"] == "req-submit-0001" and submitted["job"] == job.pk


@shared_task(name="tests.request_id_seen")
def request_id_seen() -> dict:
    record = logging.LogRecord("aistation.tasks", logging.INFO, __file__, 1, "cycle %s", (3,),
                               None)
    return json.loads(JsonFormatter().format(record))


def test_tasks_carry_the_request_id_and_log_with_it():
    headers = {}
    with request_bound("req-celery-0001"):
        before_task_publish.send(sender="tests.request_id_seen", headers=headers)
    assert headers == {"ogai_request_id": "req-celery-0001"}
    # In a worker: the header arrives with the message; its lines carry it and the task.
    entry = request_id_seen.apply(headers=headers).get()
    assert entry["request_id"] == "req-celery-0001"
    assert entry["task"] == "tests.request_id_seen"
    assert entry["message"] == "cycle 3" and entry["level"] == "info"
    assert request_id.get() == ""


def test_json_lines_carry_bound_fields_and_exceptions():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), None)
        import sys

        record.exc_info = sys.exc_info()
    with bound(job=7, tenant=3):
        entry = json.loads(JsonFormatter().format(record))
    assert entry["job"] == 7 and entry["tenant"] == 3
    assert "ValueError: boom" in entry["message"]


class _SlowStore:
    def __init__(self):
        self.down = True
        self.lines = []
        self.dropped = {}

    def append(self, lines, cursors=None):
        if self.down:
            raise StoreDown("down")
        self.lines.extend(lines)

    def add_dropped(self, source, count):
        self.dropped[source] = self.dropped.get(source, 0) + count


def test_a_full_buffer_drops_and_counts_and_a_down_store_loses_what_fits():
    from datetime import UTC, datetime

    from aistation.logstore.base import LogLine

    buffer = LineBuffer(capacity=5, source="web")
    store = _SlowStore()
    for i in range(8):
        buffer.put(LogLine(ts=datetime.now(UTC), message=f"line {i}"))
    assert len(buffer) == 5 and buffer.dropped == 3
    with pytest.raises(StoreDown):
        buffer.flush(store)
    assert len(buffer) == 5  # kept for the next try
    store.down = False
    assert buffer.flush(store) == 5
    assert [line.message for line in store.lines] == [f"line {i}" for i in range(5)]
    assert store.dropped == {"web": 3}


def test_metrics_show_dropped_and_buffered_lines(client, log_store, settings):
    log_store.add_dropped("worker", 4)
    buffer = platform_buffer()
    buffer.flush(log_store)
    text = client.get("/metrics").content.decode()
    assert 'ogai_logs_dropped_lines_total{source="worker"} 4.0' in text
    assert "ogai_logs_buffered_lines 0.0" in text
    assert "ogai_logs_store_up 1.0" in text
