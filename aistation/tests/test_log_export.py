"""The optional OTLP/HTTP export: what a collector receives, and a collector that is down
costing the store nothing."""

import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aistation.logstore.base import LogLine, LogQuery, Scope
from aistation.logstore.config import get_store, reset_store


@pytest.fixture
def collector():
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1/logs", received
    server.shutdown()


def _line(message):
    return LogLine(ts=datetime(2026, 12, 6, 12, tzinfo=UTC), message=message, tenant_id=3,
                   job_id=42, attempt=3, replica=1, line_no=7, level="error")


def test_lines_reach_the_collector_as_otlp(log_store, settings, collector):
    endpoint, received = collector
    settings.OGAI_LOGS_OTLP_ENDPOINT = endpoint
    reset_store()
    try:
        get_store().append([_line("CUDA out of memory")])
    finally:
        reset_store()
    [(path, kind, body)] = received
    assert path == "/v1/logs" and kind == "application/json"
    [record] = body["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    assert record["body"] == {"stringValue": "CUDA out of memory"}
    assert record["severityText"] == "ERROR" and record["severityNumber"] == 17
    assert record["timeUnixNano"] == str(int(datetime(2026, 12, 6, 12, tzinfo=UTC)
                                             .timestamp() * 1e9))
    attributes = {a["key"]: a["value"] for a in record["attributes"]}
    assert attributes["ogai.job_id"] == {"intValue": "42"}
    assert attributes["ogai.attempt"] == {"intValue": "3"}


def test_a_collector_that_is_down_costs_the_store_nothing(log_store, settings):
    settings.OGAI_LOGS_OTLP_ENDPOINT = "http://127.0.0.1:9/v1/logs"  # nothing listens there
    reset_store()
    try:
        store = get_store()
        store.append([_line("kept whatever the collector does")])
        assert store.failures == 1
        found = store.search(LogQuery(scope=Scope(tenant_ids=None)))
        assert [h.message for h in found] == ["kept whatever the collector does"]
    finally:
        reset_store()
