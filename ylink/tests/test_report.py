"""The runners' Reporter against a real local HTTP server."""

import io
import json
import socket
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ylink.runners.report import EVENTS_PATH, Reporter

FAST = {"interval": 0.02, "initial_backoff": 0.02, "max_backoff": 0.1, "request_timeout": 5}


class PlatformStub:
    """Records the event batches it accepts. `answers` is the list of statuses to give to the
    first requests (then 200); `refuse_kind` answers 400 to any batch holding that kind."""

    def __init__(self, port: int = 0, answers: list[int] | None = None,
                 refuse_kind: str | None = None):
        self.answers = list(answers or [])
        self.refuse_kind = refuse_kind
        self.accepted: list[dict] = []
        self.requests: list[tuple[str, str, int]] = []  # (path, authorization, status)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                events = body["events"]
                if stub.answers:
                    status = stub.answers.pop(0)
                elif stub.refuse_kind and any(e["kind"] == stub.refuse_kind for e in events):
                    status = 400
                else:
                    status = 200
                stub.requests.append((self.path, self.headers.get("Authorization"), status))
                if status == 200:
                    stub.accepted.extend(events)
                payload = b'{"code": "invalid", "message": "unknown event kind"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_events_survive_refused_connections_and_503_in_order_once():
    port = free_port()  # nothing listens there yet: connections are refused
    out = io.StringIO()
    reporter = Reporter(f"http://127.0.0.1:{port}", "job-token", batch_size=16, stdout=out,
                        **FAST)
    for step in range(30):
        reporter.send("metric", step=step, loss=1.0 / (step + 1))
    time.sleep(0.3)  # several failed attempts meanwhile; send() never blocked
    assert reporter.pending() == 30

    stub = PlatformStub(port, answers=[503, 503, 503])
    try:
        for step in range(30, 50):
            reporter.send("metric", step=step, loss=0.5)
        assert reporter.flush(timeout=10)
        reporter.close(timeout=5)
    finally:
        stub.close()

    assert [e["data"]["step"] for e in stub.accepted] == list(range(50))
    assert all(e["kind"] == "metric" for e in stub.accepted)
    datetime.fromisoformat(stub.accepted[0]["at"])
    statuses = [status for _, _, status in stub.requests]
    assert statuses[:3] == [503, 503, 503]
    assert {path for path, _, _ in stub.requests} == {EVENTS_PATH}
    assert {auth for _, auth, _ in stub.requests} == {"Bearer job-token"}
    # batches of at most 16 events
    assert len([s for s in statuses if s == 200]) >= 4
    # every event was also printed once for the job log
    printed = [line for line in out.getvalue().splitlines() if line.startswith("OGAI-EVENT ")]
    assert len(printed) == 50
    assert json.loads(printed[0][len("OGAI-EVENT "):])["data"]["step"] == 0


def test_a_400_drops_that_batch_with_a_line_and_the_rest_goes_on():
    stub = PlatformStub(refuse_kind="bogus")
    out = io.StringIO()
    reporter = Reporter(f"http://127.0.0.1:{stub.port}", "t", stdout=out, **FAST)
    try:
        reporter.send("progress", step=1)
        assert reporter.flush(timeout=10)
        reporter.send("bogus", step=2)
        assert reporter.flush(timeout=10)
        reporter.send("progress", step=3)
        reporter.close(timeout=10)
    finally:
        stub.close()
    assert [(e["kind"], e["data"]["step"]) for e in stub.accepted] == [
        ("progress", 1), ("progress", 3)]
    refused = [line for line in out.getvalue().splitlines() if "refused" in line]
    assert len(refused) == 1
    assert "HTTP 400" in refused[0] and "unknown event kind" in refused[0]
    assert reporter.refused == 1


def test_without_ogai_url_events_are_only_printed(monkeypatch, capsys):
    monkeypatch.delenv("OGAI_URL", raising=False)
    monkeypatch.setenv("OGAI_RUN_TOKEN", "secret")
    reporter = Reporter.from_env()
    reporter.send("started", attempt=1, world_size=1, resumed_from_step=None)
    assert reporter.flush(timeout=0.1)
    reporter.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("OGAI-EVENT ")
    event = json.loads(lines[0][len("OGAI-EVENT "):])
    assert event["kind"] == "started" and event["data"]["world_size"] == 1

    silent = Reporter.from_env(enabled=False)
    silent.send("metric", step=1)
    silent.close()
    assert capsys.readouterr().out == ""


def test_from_env_posts_with_the_job_token(monkeypatch):
    stub = PlatformStub()
    monkeypatch.setenv("OGAI_URL", f"http://127.0.0.1:{stub.port}/")
    monkeypatch.setenv("OGAI_RUN_TOKEN", "scoped")
    try:
        reporter = Reporter.from_env(interval=0.02, stdout=io.StringIO())
        reporter.send("done", output={"path": "/x"})
        reporter.close(timeout=10)
    finally:
        stub.close()
    assert stub.accepted[0]["data"] == {"output": {"path": "/x"}}
    assert stub.requests[0][:2] == (EVENTS_PATH, "Bearer scoped")


def test_full_queue_drops_oldest_metrics_first():
    port = free_port()
    # a long interval: nothing is posted while the queue fills
    reporter = Reporter(f"http://127.0.0.1:{port}", "t", max_queue=5, interval=30,
                        initial_backoff=0.02, max_backoff=0.1, stdout=io.StringIO())
    for i in range(3):
        reporter.send("metric", step=i)
        reporter.send("progress", step=i)
    reporter.send("progress", step=3)
    assert reporter.pending() == 5 and reporter.dropped == 2
    stub = PlatformStub(port)
    try:
        assert reporter.flush(timeout=10)
        reporter.close(timeout=5)
    finally:
        stub.close()
    assert [(e["kind"], e["data"]["step"]) for e in stub.accepted] == [
        ("progress", 0), ("progress", 1), ("metric", 2), ("progress", 2), ("progress", 3)]


def test_close_gives_up_after_its_timeout_and_says_so():
    out = io.StringIO()
    reporter = Reporter(f"http://127.0.0.1:{free_port()}", "t", stdout=out, **FAST)
    reporter.send("metric", step=1)
    started = time.monotonic()
    reporter.close(timeout=0.3)
    assert time.monotonic() - started < 5
    assert "1 events could not be delivered" in out.getvalue()


@pytest.mark.parametrize("bad", [object(), {1, 2}])
def test_send_never_raises_on_odd_data(bad):
    out = io.StringIO()
    reporter = Reporter(stdout=out)
    reporter.send("metric", step=1, odd=bad)  # serialised with str()
    assert out.getvalue().startswith("OGAI-EVENT ")
