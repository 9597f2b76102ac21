"""The playground in a real browser: two deployments answer one prompt side by side, streamed
through the platform's gateway (served by uvicorn with the console, as `make run` serves them)
from a stub model server; a vote on the two answers moves the arena's ratings."""

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import uvicorn
from django.conf import settings
from django.test import Client
from playwright.sync_api import Page, expect

from aistation.choices import JobState
from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
from mmodel.gateway import auth, limits, routing
from mmodel.models import ArenaVote, Deployment, DeploymentReplica, Model, ModelVersion
from tests.factories import JobFactory

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# What the stub says, a piece at a time; the last piece names the model it was asked for.
PIECES = ["Streamed", " answer", " from"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _StubModelServer(BaseHTTPRequestHandler):
    """An OpenAI-style chat endpoint that streams a fixed answer naming the model asked for,
    one Server-Sent Event every 50 ms (HTTP/1.0: the body ends when the connection closes)."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in [*PIECES, f" {body['model']}."]:
            chunk = {"id": "chatcmpl-stub", "object": "chat.completion.chunk",
                     "model": body["model"],
                     "choices": [{"index": 0, "delta": {"content": piece},
                                  "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.05)
        usage = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "model": body["model"],
                 "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_upstream():
    server = ThreadingHTTPServer(("127.0.0.1", _free_port()), _StubModelServer)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def platform_url():
    """The platform's ASGI application (the console + the gateway at /v1/) under uvicorn."""
    from ogai.asgi import application

    routing.reset()
    limits.reset()
    auth.forget_credentials()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    from mmodel.gateway import app

    # What the gateway buffered (usage, statistics) goes before the test database does.
    app.discard()
    routing.reset()
    auth.forget_credentials()


def _deployment(world, queue, name: str, upstream: str) -> Deployment:
    model = Model.objects.create(tenant=world.alpha, name=f"{name}-model")
    version = ModelVersion.objects.create(model=model, number=1, status=VersionStatus.READY,
                                          source=VersionSource.IMPORT,
                                          format=WeightsFormat.SAFETENSORS)
    deployment = Deployment.objects.create(tenant=world.alpha, name=name, version=version,
                                           queue=queue)
    job = JobFactory(queue=queue, state=JobState.RUNNING, service=True, ports=[8000])
    DeploymentReplica.objects.create(deployment=deployment, index=0, job=job, ready=True,
                                     upstream=upstream, served_model=f"/srv/{name}")
    return deployment


def test_two_models_stream_side_by_side_and_a_vote_moves_the_ratings(
        page: Page, farm, stub_upstream, platform_url):
    world = farm.world
    upstream = f"http://127.0.0.1:{stub_upstream.server_address[1]}"
    left = _deployment(world, farm.queues["alpha"], "left-chat", upstream)
    right = _deployment(world, farm.queues["alpha"], "right-chat", upstream)
    client = Client()
    client.force_login(world.alpha_member)
    page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME,
                               "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
                               "url": platform_url}])

    page.goto(f"{platform_url}/playground/")
    page.get_by_label("Beside it").select_option("alpha/right-chat")
    page.get_by_label("System prompt").fill("Answer briefly.")
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("32")
    page.get_by_label("Message").fill("Say something.")
    page.get_by_role("button", name="Send").click()

    left_answer = page.locator('[data-answer="left"]')
    right_answer = page.locator('[data-answer="right"]')
    expect(left_answer).to_have_text("Streamed answer from /srv/left-chat.")
    expect(right_answer).to_have_text("Streamed answer from /srv/right-chat.")
    expect(left_answer).to_have_attribute("data-streaming", "false")
    expect(page.locator("[data-error]")).to_have_count(0)
    # Both went through the gateway, to their own replica, with the page's settings.
    asked = sorted(stub_upstream.requests, key=lambda body: body["model"])
    assert [body["model"] for body in asked] == ["/srv/left-chat", "/srv/right-chat"]
    for body in asked:
        assert body["stream"] is True and body["max_tokens"] == 32
        assert body["temperature"] == 0
        assert body["messages"] == [{"role": "system", "content": "Answer briefly."},
                                    {"role": "user", "content": "Say something."}]

    ratings = page.locator("#arena-ratings")
    expect(ratings.get_by_text("No votes yet")).to_be_visible()
    page.get_by_role("button", name="Left is better").click()
    expect(page.locator('[data-rating-version="left-chat-model:v1"]')).to_have_attribute(
        "data-rating", "1016.0")
    expect(page.locator('[data-rating-version="right-chat-model:v1"]')).to_have_attribute(
        "data-rating", "984.0")
    expect(page.get_by_text("Vote recorded.")).to_be_visible()
    vote = ArenaVote.objects.get()
    assert (vote.left, vote.right, vote.vote, vote.prompt) == (
        left.version, right.version, "left", "Say something.")
    assert vote.user == world.alpha_member
