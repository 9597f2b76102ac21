"""The OpenAI-compatible gateway (`mmodel.gateway`) behind `ogai.asgi`, served by uvicorn and
called with the official `openai` client (httpx where headers matter).

A stub model server (also under uvicorn) answers chat and text completions: it names the
model it was sent, reports 7 prompt and 3 completion tokens (a stream: one per content chunk),
streams with pauses, and answers 422 in FastAPI's shape when asked to. Deployments are rows
made here (replicas whose jobs RUNNING on the fake cluster point at the stub); waking and
marking unready go through the real `mmodel.services.deployments` functions, spied on."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import httpx
import openai
import pytest
import uvicorn
from django.test import Client
from django.utils import timezone

from aistation.choices import JobState
from aistation.models import Job
from infra_os.models import UsageRecord
from infra_os.services.tokens import api_token_create, api_token_revoke
from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
from mmodel.gateway import app as gateway_app
from mmodel.gateway import auth, limits, routing
from mmodel.gateway.stats import LATENCY_BUCKETS_MS, bucket_index, merge_buckets, percentile
from mmodel.models import (
    Deployment,
    DeploymentReplica,
    DeploymentStat,
    GatewayLimit,
    Model,
    ModelVersion,
)

pytestmark = pytest.mark.django_db(transaction=True)

STREAM_PAUSE_S = 0.15


# -- servers ----------------------------------------------------------------------------------


@dataclass
class Stub:
    url: str
    seen: list = field(default_factory=list)


def stub_app(seen: list):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body or b"{}")
        seen.append({"path": scope["path"], "body": request})
        model = request.get("model")
        text = json.dumps(request.get("messages") or request.get("prompt"))
        if "fail422" in text:
            data = json.dumps({"detail": "max_tokens is too large"}).encode()
            await send({"type": "http.response.start", "status": 422,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data})
            return
        words = ["Hello", " from", " ", model]
        if not request.get("stream"):
            if scope["path"] == "/v1/completions":
                choice = {"index": 0, "text": "".join(words), "finish_reason": "stop"}
                kind = "text_completion"
            else:
                choice = {"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": "".join(words)}}
                kind = "chat.completion"
            data = json.dumps({"id": "x1", "object": kind, "created": 1, "model": model,
                               "choices": [choice],
                               "usage": {"prompt_tokens": 7, "completion_tokens": 3,
                                         "total_tokens": 10}}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})

        async def event(payload) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload,
                                                                       separators=(",", ":"))
            await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(),
                        "more_body": True})

        for i, word in enumerate(words):
            await event({"id": "x1", "object": "chat.completion.chunk", "created": 1,
                         "model": model, "choices": [{"index": 0, "delta": {"content": word},
                                                      "finish_reason": None}]})
            if i == 1:
                await asyncio.sleep(STREAM_PAUSE_S)
        if (request.get("stream_options") or {}).get("include_usage"):
            await event({"id": "x1", "object": "chat.completion.chunk", "created": 1,
                         "model": model, "choices": [],
                         "usage": {"prompt_tokens": 7, "completion_tokens": len(words),
                                   "total_tokens": 7 + len(words)}})
        await event("[DONE]")
        await send({"type": "http.response.body", "body": b""})

    return app


@dataclass
class Served:
    url: str
    server: uvicorn.Server
    thread: threading.Thread


def _serve(app) -> Served:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    return Served(f"http://127.0.0.1:{port}", server, thread)


def _stop(served: Served) -> None:
    served.server.should_exit = True
    served.thread.join(5)


@pytest.fixture(scope="module")
def stub_server():
    seen: list = []
    served = _serve(stub_app(seen))
    yield Stub(url=served.url, seen=seen)
    _stop(served)


@pytest.fixture(scope="module")
def platform_server():
    from ogai.asgi import application

    served = _serve(application)
    yield served.url
    _stop(served)


@pytest.fixture
def stub(stub_server):
    stub_server.seen.clear()
    return stub_server


@pytest.fixture(autouse=True)
def fresh_gateway():
    """Each test starts with no routing table, no cached credentials, no counters, nothing
    buffered (the server lives across tests; the database does not)."""
    routing.reset()
    auth.forget_credentials()
    limits.reset()
    gateway_app.discard()
    yield
    gateway_app.discard()
    routing.reset()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- data -------------------------------------------------------------------------------------


@pytest.fixture
def gw(world, farm, stub, platform_server):
    """Tokens for alpha's and beta's members, and `gw.deploy(...)` making a deployment."""

    class Gateway:
        url = platform_server
        alpha = api_token_create(actor=world.alpha_member, name="t", expires_at=None).secret
        beta = api_token_create(actor=world.beta_member, name="t", expires_at=None).secret

        def deploy(self, name, tenant=None, *, upstreams=None, scaled_to_zero=False,
                   active=True):
            tenant = tenant or world.alpha
            model, _ = Model.objects.get_or_create(tenant=tenant, name=name)
            version = ModelVersion.objects.create(
                model=model, number=model.versions.count() + 1, status=VersionStatus.READY,
                source=VersionSource.IMPORT, format=WeightsFormat.SAFETENSORS)
            creator = world.alpha_member if tenant == world.alpha else world.beta_member
            deployment = Deployment.objects.create(
                tenant=tenant, name=name, version=version, queue=farm.queues[tenant.name],
                scaled_to_zero=scaled_to_zero, active=active, created_by=creator)
            for index, upstream in enumerate(
                    [stub.url] if upstreams is None else upstreams):
                job = Job.objects.create(
                    tenant=tenant, queue=farm.queues[tenant.name], cluster=farm.cluster,
                    owner=creator, name=f"{name}-{index}", command=["serve"], service=True,
                    state=JobState.RUNNING)
                DeploymentReplica.objects.create(
                    deployment=deployment, index=index, job=job, upstream=upstream,
                    served_model=f"/models/{tenant.name}/{name}", ready=True)
            routing.reload_now()
            return deployment

        def client(self, secret=None):
            return openai.OpenAI(base_url=f"{self.url}/v1", api_key=secret or self.alpha,
                                 max_retries=0, timeout=20)

        def post(self, path, body, secret=None, **extra):
            headers = {"Authorization": f"Bearer {secret or self.alpha}"}
            return httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=20,
                              **extra)

    return Gateway()


def chat(model, text="Hi", **extra):
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


@pytest.fixture
def spied(monkeypatch):
    """The deployment services the gateway calls, still doing their work, with their calls
    recorded."""
    from mmodel.services import deployments

    calls = {"wake": [], "unready": []}
    real_wake, real_unready = deployments.deployment_wake, deployments.replica_mark_unready

    def wake(*, deployment_id):
        calls["wake"].append(deployment_id)
        return real_wake(deployment_id=deployment_id)

    def unready(*, replica_id, reason):
        calls["unready"].append((replica_id, reason))
        return real_unready(replica_id=replica_id, reason=reason)

    monkeypatch.setattr(deployments, "deployment_wake", wake)
    monkeypatch.setattr(deployments, "replica_mark_unready", unready)
    return calls


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- completions ------------------------------------------------------------------------------


def test_chat_completion_answers_through_the_replica_and_records_usage(gw, stub, world):
    deployment = gw.deploy("chat")
    started = timezone.now()

    answer = gw.client().chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}])

    assert answer.choices[0].message.content == "Hello from /models/alpha/chat"
    assert answer.model == "chat"  # the server's own name for it stays inside
    assert answer.usage.prompt_tokens == 7
    assert stub.seen[-1]["body"]["model"] == "/models/alpha/chat"
    assert "stream_options" not in stub.seen[-1]["body"]

    gateway_app.flush_sync()
    record = UsageRecord.objects.get()
    assert (record.tenant, record.kind, record.model_name) == \
        (world.alpha, UsageRecord.Kind.TOKENS, "chat")
    assert (record.prompt_tokens, record.completion_tokens) == (7, 3)
    assert record.source.startswith("gateway ")
    assert started - timedelta(seconds=1) <= record.started_at <= record.ended_at
    stat = DeploymentStat.objects.get(deployment=deployment)
    assert (stat.requests, stat.errors, stat.prompt_tokens, stat.completion_tokens) == \
        (1, 0, 7, 3)
    assert sum(stat.latency_buckets) == 1 and stat.latency_ms_sum > 0
    deployment.refresh_from_db()
    assert deployment.last_request_at is not None


def test_a_stream_arrives_in_chunks_as_the_server_sends_them(gw, stub):
    gw.deploy("chat")
    arrivals = []
    stream = gw.client().chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}], stream=True)
    for chunk in stream:
        arrivals.append((time.monotonic(), chunk))

    chunks = [c for _, c in arrivals]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from /models/alpha/chat"
    assert len(chunks) == 4
    assert all(c.model == "chat" for c in chunks)
    # Not buffered: the first words came before the server's pause ended.
    assert arrivals[-1][0] - arrivals[0][0] >= STREAM_PAUSE_S * 0.8
    # The gateway asked for usage on the client's behalf, and kept that chunk to itself.
    assert stub.seen[-1]["body"]["stream_options"] == {"include_usage": True}
    assert all(c.choices for c in chunks)

    gateway_app.flush_sync()
    record = UsageRecord.objects.get()
    assert (record.prompt_tokens, record.completion_tokens) == (7, 4)


def test_a_stream_that_asked_for_usage_gets_it(gw):
    gw.deploy("chat")
    chunks = list(gw.client().chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}], stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 4


def test_text_completions(gw, stub):
    gw.deploy("chat")
    answer = gw.client().completions.create(model="chat", prompt="Once")
    assert answer.choices[0].text == "Hello from /models/alpha/chat"
    assert stub.seen[-1]["path"] == "/v1/completions"


def test_bad_requests_are_400_naming_the_field(gw):
    gw.deploy("chat")
    headers = {"Authorization": f"Bearer {gw.alpha}"}
    url = f"{gw.url}/v1/chat/completions"
    response = httpx.post(url, content=b"{not json", headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    response = gw.post("/v1/chat/completions", {"messages": []})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "model")
    response = gw.post("/v1/chat/completions", {"model": "chat"})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "messages")
    response = gw.post("/v1/completions", {"model": "chat"})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "prompt")
    assert httpx.get(f"{gw.url}/v1/chat/completions", headers=headers).status_code == 405
    assert httpx.get(f"{gw.url}/v1/nothing", headers=headers).status_code == 404


def test_an_upstream_refusal_passes_in_openais_shape(gw):
    gw.deploy("chat")
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        gw.client().chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "fail422"}])
    assert caught.value.body["message"] == "max_tokens is too large"


# -- who may call what ------------------------------------------------------------------------


def test_models_lists_only_the_callers_tenants(gw, world):
    gw.deploy("chat")
    gw.deploy("coder")
    gw.deploy("secret", world.beta)

    assert sorted(m.id for m in gw.client().models.list()) == ["chat", "coder"]
    assert [m.id for m in gw.client(gw.beta).models.list()] == ["secret"]
    assert gw.client().models.retrieve("chat").owned_by == "alpha"
    with pytest.raises(openai.NotFoundError):
        gw.client().models.retrieve("secret")


def test_another_tenants_model_is_404_like_a_missing_one(gw, world):
    gw.deploy("secret", world.beta)
    with pytest.raises(openai.NotFoundError) as hidden:
        gw.client().chat.completions.create(
            model="secret", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.NotFoundError) as missing:
        gw.client().chat.completions.create(
            model="nothing", messages=[{"role": "user", "content": "Hi"}])
    assert hidden.value.body["code"] == missing.value.body["code"] == "model_not_found"
    assert gw.post("/v1/chat/completions", chat("beta/secret")).status_code == 404


def test_a_name_in_two_of_the_callers_tenants_needs_the_tenant(gw, world):
    gw.deploy("chat")
    gw.deploy("chat", world.beta)
    both = api_token_create(actor=world.both, name="t", expires_at=None).secret

    assert sorted(m.id for m in gw.client(both).models.list()) == ["alpha/chat", "beta/chat"]
    response = gw.post("/v1/chat/completions", chat("chat"), secret=both)
    assert response.status_code == 400
    assert "beta/chat" in response.json()["error"]["message"]
    answer = gw.client(both).chat.completions.create(
        model="beta/chat", messages=[{"role": "user", "content": "Hi"}])
    assert answer.choices[0].message.content == "Hello from /models/beta/chat"


def test_no_invalid_revoked_or_expired_token_is_401(gw, world):
    gw.deploy("chat")
    for secret in ("", "ogai_nope_nope", "not-even-a-token"):
        response = httpx.post(f"{gw.url}/v1/chat/completions", json=chat("chat"),
                              headers={"Authorization": f"Bearer {secret}"} if secret else {})
        assert response.status_code == 401, secret
        assert response.json()["error"]["code"] == "invalid_api_key"

    issued = api_token_create(actor=world.alpha_member, name="t2", expires_at=None)
    assert gw.post("/v1/chat/completions", chat("chat"), secret=issued.secret).status_code \
        == 200
    api_token_revoke(actor=world.alpha_member, token=issued.token)
    # Within auth.CACHE_S the revoked token may still pass in a process that saw it; a fresh
    # look (here: forgetting the cache) refuses it.
    auth.forget_credentials()
    with pytest.raises(openai.AuthenticationError):
        gw.client(issued.secret).models.list()

    expiring = api_token_create(actor=world.alpha_member, name="t3",
                                expires_at=timezone.now() + timedelta(seconds=1))
    assert gw.post("/v1/chat/completions", chat("chat"), secret=expiring.secret)\
        .status_code == 200
    time.sleep(1.1)  # cached, but never past the token's expiry
    assert gw.post("/v1/chat/completions", chat("chat"), secret=expiring.secret)\
        .status_code == 401


def test_the_console_session_works_with_csrf_and_not_without(gw, world):
    from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret

    gw.deploy("chat")
    browser = Client()
    browser.force_login(world.alpha_member)
    session = browser.cookies["sessionid"].value
    secret = _get_new_csrf_string()
    host = gw.url.removeprefix("http://")
    cookies = {"sessionid": session, "csrftoken": secret}

    def post(headers):
        client = httpx.Client(base_url=gw.url, cookies=cookies)
        return client.post("/v1/chat/completions", json=chat("chat"), headers=headers)

    listed = httpx.get(f"{gw.url}/v1/models", cookies=cookies)
    assert [m["id"] for m in listed.json()["data"]] == ["chat"]
    same_origin = {"Origin": f"http://{host}"}
    assert post(same_origin).status_code == 403  # no CSRF token
    assert post({**same_origin, "X-CSRFToken": _get_new_csrf_string()}).status_code == 403
    assert post({"Origin": "http://evil.example", "X-CSRFToken": secret}).status_code == 403
    assert post({"X-CSRFToken": secret}).status_code == 403  # no Origin
    assert post({**same_origin, "X-CSRFToken": secret}).status_code == 200
    masked = _mask_cipher_secret(secret)  # as a page's {% csrf_token %} carries it
    assert post({**same_origin, "X-CSRFToken": masked}).status_code == 200
    browser.logout()
    auth.forget_credentials()
    assert post({**same_origin, "X-CSRFToken": secret}).status_code == 401


# -- limits -----------------------------------------------------------------------------------


def _refused(response, kind):
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", kind)
    assert 1 <= int(response.headers["retry-after"]) <= 60
    return error["message"]


def test_a_flood_past_the_tenants_requests_limit_is_429(gw, world):
    gw.deploy("chat")
    GatewayLimit.objects.create(tenant=world.alpha, requests_per_minute=3)
    routing.reload_now()
    statuses = [gw.post("/v1/chat/completions", chat("chat")).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    message = _refused(gw.post("/v1/chat/completions", chat("chat")), "requests")
    assert "tenant alpha" in message
    # beta is not alpha: its own limits.
    gw.deploy("other", world.beta)
    assert gw.post("/v1/chat/completions", chat("other"), secret=gw.beta).status_code == 200


def test_the_per_token_limit_leaves_other_tokens_alone(gw, world):
    gw.deploy("chat")
    GatewayLimit.objects.create(tenant=world.alpha, token_requests_per_minute=1)
    routing.reload_now()
    assert gw.post("/v1/chat/completions", chat("chat")).status_code == 200
    assert "this API token" in _refused(gw.post("/v1/chat/completions", chat("chat")),
                                        "requests")
    other = api_token_create(actor=world.alpha_admin, name="t", expires_at=None).secret
    assert gw.post("/v1/chat/completions", chat("chat"), secret=other).status_code == 200


def test_the_tokens_limit_refuses_once_the_window_has_used_it(gw, world, settings):
    settings.OGAI_GATEWAY_TENANT_TPM = 10
    gw.deploy("chat")  # reloads the table: the tenant limit is now 10 tokens a minute
    assert gw.post("/v1/chat/completions", chat("chat")).status_code == 200  # 7 + 3 tokens
    _refused(gw.post("/v1/chat/completions", chat("chat")), "tokens")


def test_limits_count_in_redis_when_the_cache_is_redis(gw, world, settings):
    import redis

    url = "redis://127.0.0.1:6379/15"
    try:
        server = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        server.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    for key in server.scan_iter("ogai:gw:*"):
        server.delete(key)
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": url}}
    limits.reset()
    try:
        gw.deploy("chat")
        GatewayLimit.objects.create(tenant=world.alpha, requests_per_minute=2)
        routing.reload_now()
        assert [gw.post("/v1/chat/completions", chat("chat")).status_code
                for _ in range(2)] == [200, 200]
        _refused(gw.post("/v1/chat/completions", chat("chat")), "requests")
        window = int(time.time() // 60)
        assert int(server.get(f"ogai:gw:r:T{world.alpha.pk}:{window}")) == 3
        wait_for(lambda: server.get(f"ogai:gw:k:T{world.alpha.pk}:{window}") is not None)
        assert int(server.get(f"ogai:gw:k:T{world.alpha.pk}:{window}")) == 20
    finally:
        for key in server.scan_iter("ogai:gw:*"):
            server.delete(key)
        limits.reset()


# -- replicas that cannot answer --------------------------------------------------------------


def test_a_deployment_scaled_to_zero_is_503_and_woken(gw, spied):
    deployment = gw.deploy("sleepy", upstreams=[], scaled_to_zero=True)
    response = gw.post("/v1/chat/completions", chat("sleepy"))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_starting"
    assert int(response.headers["retry-after"]) >= 1
    wait_for(lambda: spied["wake"] == [deployment.pk])
    # The real service ran: the deployment is starting again.
    wait_for(lambda: not Deployment.objects.get(pk=deployment.pk).scaled_to_zero)


def test_a_deployment_without_a_ready_replica_is_503(gw):
    gw.deploy("starting", upstreams=[])
    response = gw.post("/v1/chat/completions", chat("starting"))
    assert response.status_code == 503
    assert response.headers["retry-after"]


def test_a_dead_replica_is_marked_unready_and_another_answers(gw, stub, spied):
    dead = f"http://127.0.0.1:{_free_port()}"
    deployment = gw.deploy("chat", upstreams=[dead, stub.url])
    dead_replica = deployment.replica_set.get(index=0)
    answers = [gw.post("/v1/chat/completions", chat("chat")).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 200]
    wait_for(lambda: [r for r, _ in spied["unready"]] == [dead_replica.pk])
    wait_for(lambda: not DeploymentReplica.objects.get(pk=dead_replica.pk).ready)


def test_a_deployment_whose_only_replica_is_dead_is_503(gw, spied):
    deployment = gw.deploy("chat", upstreams=[f"http://127.0.0.1:{_free_port()}"])
    response = gw.post("/v1/chat/completions", chat("chat"))
    assert response.status_code == 503
    assert response.headers["retry-after"]
    wait_for(lambda: len(spied["unready"]) == 1)
    gateway_app.flush_sync()
    stat = DeploymentStat.objects.get(deployment=deployment)
    assert (stat.requests, stat.errors) == (1, 1)


@pytest.fixture
def hangs_up():
    """A server that reads a request and closes the connection without answering."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.2)
    running = True

    def serve():
        while running:
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    running = False
    thread.join(2)
    sock.close()


def test_a_server_that_hangs_up_before_answering_is_502(gw, hangs_up):
    deployment = gw.deploy("chat", upstreams=[hangs_up])
    response = gw.post("/v1/chat/completions", chat("chat"))
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_error"
    # Connected, so not a dead replica: it stays in rotation.
    assert DeploymentReplica.objects.get(deployment=deployment).ready


# -- statistics -------------------------------------------------------------------------------


def test_percentiles_come_from_the_histogram():
    buckets = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    for latency in [3] * 50 + [40] * 49 + [20000]:
        buckets[bucket_index(latency)] += 1
    assert percentile(buckets, 0.5) == 5.0  # the top of the first bucket
    assert 25 < percentile(buckets, 0.9) <= 50
    assert percentile(buckets, 1.0) == 30000.0
    assert percentile([0] * len(buckets), 0.5) is None
    assert merge_buckets([buckets, buckets])[0] == 100


def test_statistics_of_one_minute_add_up_across_flushes(gw):
    deployment = gw.deploy("chat")
    for _ in range(2):
        assert gw.post("/v1/chat/completions", chat("chat")).status_code == 200
        gateway_app.flush_sync()
    stat = DeploymentStat.objects.get(deployment=deployment)
    assert (stat.requests, stat.completion_tokens) == (2, 6)
    assert sum(stat.latency_buckets) == 2
    assert UsageRecord.objects.count() == 2


def test_a_deployment_answering_a_long_request_is_in_use_until_it_ends():
    """Scale to zero reads last_request_at: every flush while a request is in flight moves it
    to the flush's time, so a long generation is never cut off as idle."""
    from mmodel.gateway.stats import StatsBuffer

    buffer = StatsBuffer()
    buffer.begin(7)
    _, first = buffer.take()
    time.sleep(0.01)
    _, during = buffer.take()
    assert during[7] > first[7]  # still answering: in use now
    buffer.record(deployment_id=7, at=time.time(), latency_ms=5.0, error=False)
    buffer.end(7)
    buffer.take()
    assert buffer.take() == ({}, {})  # ended: nothing more to say
    assert not buffer
