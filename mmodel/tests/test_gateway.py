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
from mmodel.gateway import auth, context, limits, routing
from mmodel.gateway.stats import LATENCY_BUCKETS_MS, bucket_index, merge_buckets, percentile
from mmodel.models import (
    Deployment,
    DeploymentReplica,
    DeploymentStat,
    GatewayLimit,
    Model,
    ModelVersion,
)
from mmodel.runners.replica_guard import guarded
from mmodel.tests.tiny import tiny_model
from ogai.crypto import encrypt

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
        if scope["path"] == "/v1/embeddings":
            texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
            data = json.dumps({"object": "list", "model": model, "data": [
                {"object": "embedding", "index": i, "embedding": [0.5, -0.25]}
                for i in range(len(texts))],
                "usage": {"prompt_tokens": 4 * len(texts), "total_tokens": 4 * len(texts)}})
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data.encode()})
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
    context.forget()
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
                   active=True, key="", folder="", served_model=None):
            """`key`: the one its replicas require; `folder`: its weights' (config and
            tokenizer, for the context check)."""
            tenant = tenant or world.alpha
            model, _ = Model.objects.get_or_create(tenant=tenant, name=name)
            version = ModelVersion.objects.create(
                model=model, number=model.versions.count() + 1, status=VersionStatus.READY,
                source=VersionSource.IMPORT, format=WeightsFormat.SAFETENSORS,
                artifact_path=str(folder))
            creator = world.alpha_member if tenant == world.alpha else world.beta_member
            deployment = Deployment.objects.create(
                tenant=tenant, name=name, version=version, queue=farm.queues[tenant.name],
                scaled_to_zero=scaled_to_zero, active=active, created_by=creator,
                api_key=encrypt(key))
            for index, upstream in enumerate(
                    [stub.url] if upstreams is None else upstreams):
                job = Job.objects.create(
                    tenant=tenant, queue=farm.queues[tenant.name], cluster=farm.cluster,
                    owner=creator, name=f"{name}-{index}", command=["serve"], service=True,
                    state=JobState.RUNNING)
                DeploymentReplica.objects.create(
                    deployment=deployment, index=index, job=job, upstream=upstream,
                    served_model=served_model or f"/models/{tenant.name}/{name}", ready=True)
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


def test_embeddings_answer_through_the_replica_and_record_usage(gw, stub, world):
    deployment = gw.deploy("embedder")
    answer = gw.client().embeddings.create(model="embedder", input=["one", "two"],
                                           encoding_format="float")
    assert [item.embedding for item in answer.data] == [[0.5, -0.25], [0.5, -0.25]]
    assert answer.model == "embedder" and answer.usage.prompt_tokens == 8
    assert stub.seen[-1]["path"] == "/v1/embeddings"
    assert stub.seen[-1]["body"] == {"model": "/models/alpha/embedder", "input": ["one", "two"],
                                     "encoding_format": "float"}
    gateway_app.flush_sync()
    record = UsageRecord.objects.get()
    assert (record.model_name, record.prompt_tokens, record.completion_tokens) == \
        ("embedder", 8, 0)
    stat = DeploymentStat.objects.get(deployment=deployment)
    assert (stat.requests, stat.errors, stat.prompt_tokens) == (1, 0, 8)

    missing = gw.post("/v1/embeddings", {"model": "embedder"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "input"
    streamed = gw.post("/v1/embeddings", {"model": "embedder", "input": "x", "stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"
    wrong = httpx.get(f"{gw.url}/v1/embeddings", headers={"Authorization": f"Bearer {gw.alpha}"})
    assert wrong.status_code == 405
    # Another tenant's member cannot embed with it.
    hidden = gw.post("/v1/embeddings", {"model": "embedder", "input": "x"}, secret=gw.beta)
    assert hidden.status_code == 404
    assert len(stub.seen) == 1


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
    # Nested past what the gateway could forward (orjson writes 256 levels), and far past it.
    for depth in (300, 5000):
        deep = b'{"model": "chat", "prompt": "x", "extra": ' + b"[" * depth + b"]" * depth + b"}"
        response = httpx.post(f"{gw.url}/v1/completions", content=deep, headers=headers)
        assert response.status_code == 400, (depth, response.text[:200])
        assert response.json()["error"]["type"] == "invalid_request_error"
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
        model="alpha/chat", messages=[{"role": "user", "content": "Hi"}])
    assert answer.choices[0].message.content == "Hello from /models/alpha/chat"
    # In beta `both` is a viewer: it sees beta's model but may not call it.
    assert gw.post("/v1/chat/completions", chat("beta/chat"), secret=both).status_code == 403


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


def test_a_request_to_a_deployment_scaled_to_zero_waits_for_its_replica(gw, stub, spied,
                                                                         settings):
    settings.OGAI_GATEWAY_COLD_START_WAIT_S = 20
    deployment = gw.deploy("sleepy", scaled_to_zero=True)
    # As scaling to zero left it: its replica's job ended, nothing to route to.
    asleep = deployment.replica_set.get()
    Job.objects.filter(pk=asleep.job_id).update(state=JobState.CANCELLED)
    DeploymentReplica.objects.filter(pk=asleep.pk).update(ready=False, upstream="")
    routing.reload_now()
    started = threading.Event()

    def replica_starts():
        # The wake submits a new job; once its server answers /health the deployment watch
        # marks the replica ready (done here by hand, a second later).
        wait_for(lambda: DeploymentReplica.objects.get(pk=asleep.pk).job_id != asleep.job_id,
                 timeout=15)
        time.sleep(1.0)
        replica = DeploymentReplica.objects.get(pk=asleep.pk)
        Job.objects.filter(pk=replica.job_id).update(state=JobState.RUNNING)
        DeploymentReplica.objects.filter(pk=replica.pk).update(upstream=stub.url, ready=True)
        started.set()

    thread = threading.Thread(target=replica_starts)
    thread.start()
    try:
        response = gw.post("/v1/chat/completions", chat("sleepy"))
    finally:
        thread.join()
    assert started.is_set()
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "sleepy"
    assert spied["wake"][0] == deployment.pk
    waited = int(response.headers["x-ogai-cold-start-ms"])
    assert 1000 <= waited < 20000
    # Once up, no wait and no header.
    again = gw.post("/v1/chat/completions", chat("sleepy"))
    assert again.status_code == 200 and "x-ogai-cold-start-ms" not in again.headers
    gateway_app.flush_sync()
    stat = DeploymentStat.objects.get(deployment=deployment)
    assert (stat.requests, stat.errors, stat.cold_starts) == (2, 0, 1)
    assert stat.cold_start_ms_max == pytest.approx(waited, abs=1)


def test_a_request_waits_no_longer_than_the_bound(gw, spied, settings):
    settings.OGAI_GATEWAY_COLD_START_WAIT_S = 1
    gw.deploy("starting", upstreams=[])
    began = time.monotonic()
    response = gw.post("/v1/chat/completions", chat("starting"))
    assert 1.0 <= time.monotonic() - began < 5.0
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_ready_replica"


def test_a_deployment_scaled_to_zero_is_503_and_woken(gw, spied, settings):
    settings.OGAI_GATEWAY_COLD_START_WAIT_S = 0  # no wait: refused at once
    deployment = gw.deploy("sleepy", upstreams=[], scaled_to_zero=True)
    response = gw.post("/v1/chat/completions", chat("sleepy"))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_starting"
    assert int(response.headers["retry-after"]) >= 1
    wait_for(lambda: spied["wake"] == [deployment.pk])
    # The real service ran: the deployment is starting again.
    wait_for(lambda: not Deployment.objects.get(pk=deployment.pk).scaled_to_zero)


def test_a_deployment_without_a_ready_replica_is_503(gw, settings):
    settings.OGAI_GATEWAY_COLD_START_WAIT_S = 0
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


# -- who may spend the tenant's tokens --------------------------------------------------------


def test_a_viewers_token_sees_the_models_but_may_not_call_them(gw, world, stub):
    from django.urls import reverse

    gw.deploy("chat")
    GatewayLimit.objects.create(tenant=world.alpha, requests_per_minute=2)
    routing.reload_now()
    viewer = api_token_create(actor=world.alpha_viewer, name="t", expires_at=None).secret
    assert [m.id for m in gw.client(viewer).models.list()] == ["chat"]  # reading is theirs
    for path, body in (("/v1/chat/completions", chat("chat")),
                       ("/v1/completions", {"model": "chat", "prompt": "Hi"}),
                       ("/v1/chat/completions", chat("alpha/chat", stream=True))):
        refused = gw.post(path, body, secret=viewer)
        assert refused.status_code == 403, path
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error",
                                                  "insufficient_permissions")
        assert "a viewer reads only" in error["message"] and "token budget" in error["message"]
    with pytest.raises(openai.PermissionDeniedError):
        gw.client(viewer).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Hi"}])
    assert stub.seen == []  # nothing reached the replica

    # Members and tenant admins spend it; the viewer's refusals used none of its 2 requests.
    admin = api_token_create(actor=world.alpha_admin, name="t", expires_at=None).secret
    assert gw.post("/v1/chat/completions", chat("chat"), secret=admin).status_code == 200
    assert gw.post("/v1/chat/completions", chat("chat")).status_code == 200
    gateway_app.flush_sync()
    assert UsageRecord.objects.filter(tenant=world.alpha).count() == 2

    # The playground says so to a viewer instead of offering a chat the gateway refuses (to
    # the viewer's session too).
    from django.middleware.csrf import _get_new_csrf_string

    browser = Client()
    browser.force_login(world.alpha_viewer)
    page = browser.get(reverse("frontend:playground")).content.decode()
    assert "A viewer does not chat" in page and "data-chat-form" not in page
    csrf = _get_new_csrf_string()
    session = httpx.post(
        f"{gw.url}/v1/chat/completions", json=chat("chat"),
        cookies={"sessionid": browser.cookies["sessionid"].value, "csrftoken": csrf},
        headers={"Origin": gw.url, "X-CSRFToken": csrf})
    assert session.status_code == 403
    assert session.json()["error"]["code"] == "insufficient_permissions"
    browser.force_login(world.alpha_member)
    assert "data-chat-form" in browser.get(reverse("frontend:playground")).content.decode()


# -- the replicas' key ------------------------------------------------------------------------


def _with_health(app):
    async def served(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"status": "ok"}'})
            return
        await app(scope, receive, send)
    return served


@pytest.fixture(scope="module")
def keyed_servers():
    """Two model servers, each behind the launcher's check (`replica_guard.guarded`)
    with its own deployment's key."""
    seen: list = []
    servers = {key: _serve(guarded(_with_health(stub_app(seen)), key))
               for key in ("key-of-alpha", "key-of-beta")}
    yield seen, {key: served.url for key, served in servers.items()}
    for served in servers.values():
        _stop(served)


def test_a_replica_answers_only_the_gateway_with_its_deployments_key(gw, world, keyed_servers):
    seen, urls = keyed_servers
    seen.clear()
    replica = urls["key-of-alpha"]
    gw.deploy("chat", upstreams=[replica], key="key-of-alpha")
    gw.deploy("other", world.beta, upstreams=[urls["key-of-beta"]], key="key-of-beta")

    # As a job of any tenant that can reach the replica's address would try it.
    attempts = [{}, {"Authorization": "Bearer key-of-beta"},  # another deployment's key
                {"Authorization": f"Bearer {gw.alpha}"},  # a platform token of its tenant
                {"Authorization": "key-of-alpha"}, {"Authorization": "Basic key-of-alpha"},
                {"X-Api-Key": "key-of-alpha"}, {"Authorization": "Bearer key-of-alph"}]
    for headers in attempts:
        for path in ("/v1/chat/completions", "/v1/completions", "/load_model", "/reset",
                     "/health"):
            response = httpx.post(f"{replica}{path}", json=chat("/models/alpha/chat"),
                                  headers=headers)
            assert response.status_code == 401, (path, headers)
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{replica}/v1/models", headers=headers).status_code == 401
    assert seen == []
    # Only the readiness probe's door is open, and it says nothing but its health.
    assert httpx.get(f"{replica}/health").json() == {"status": "ok"}

    # The gateway sends each deployment's own key.
    assert gw.post("/v1/chat/completions", chat("chat")).status_code == 200
    assert gw.post("/v1/completions", {"model": "other", "prompt": "Hi"},
                   secret=gw.beta).status_code == 200
    assert [entry["path"] for entry in seen] == ["/v1/chat/completions", "/v1/completions"]


def test_a_replica_refusing_the_gateways_key_is_a_502_not_the_callers_401(gw, keyed_servers):
    _, urls = keyed_servers
    gw.deploy("chat", upstreams=[urls["key-of-alpha"]], key="a-stale-key")
    response = gw.post("/v1/chat/completions", chat("chat"))
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_error"


# -- prompts longer than the context ----------------------------------------------------------

SENTENCE = "The quick brown fox jumps over the lazy dog. "


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A model of 256 positions, with its tokenizer and chat template."""
    return tiny_model(tmp_path_factory.mktemp("gateway") / "tiny")


def _tokens(folder, text) -> int:
    from tokenizers import Tokenizer

    return len(Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids)


def test_a_prompt_longer_than_the_context_is_400_before_any_replica(gw, stub, tiny_folder,
                                                                     monkeypatch):
    loads = []
    real_load = context.load
    monkeypatch.setattr(context, "load", lambda folder: loads.append(folder) or
                        real_load(folder))
    gw.deploy("tiny", folder=tiny_folder)
    long = SENTENCE * 40  # 680 tokens
    fits = SENTENCE * 10  # 450 bytes, but 170 tokens: counted, not judged by its bytes
    assert len(fits.encode()) > 256 and _tokens(tiny_folder, fits) == 170
    refused = [
        ("/v1/chat/completions", chat("tiny", long), "messages"),
        ("/v1/chat/completions", chat("tiny", long, stream=True), "messages"),
        ("/v1/chat/completions", chat("tiny", "Hi", max_tokens=300), "messages"),
        ("/v1/chat/completions", chat("tiny", fits, max_completion_tokens=100), "messages"),
        ("/v1/completions", {"model": "tiny", "prompt": long}, "prompt"),
        ("/v1/completions", {"model": "tiny", "prompt": ["Hi", long]}, "prompt"),
        # Token ids: 241 with OpenAI's default of 16 for the completion is one too many.
        ("/v1/completions", {"model": "tiny", "prompt": [40] * 241}, "prompt"),
        ("/v1/completions", {"model": "tiny", "prompt": "x" * 300_000}, "prompt"),
    ]
    for path, body, param in refused:
        response = gw.post(path, body)
        assert response.status_code == 400, (path, response.text[:200])
        error = response.json()["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error", param, "context_length_exceeded"), path
        assert error["message"].startswith("This model's maximum context length is 256 tokens")
    with pytest.raises(openai.BadRequestError) as caught:
        gw.client().completions.create(model="tiny", prompt=long, max_tokens=8)
    assert "However, you requested 688 tokens (680 in the prompt, 8 in the completion)" \
        in caught.value.body["message"]
    assert stub.seen == []  # none of them reached the replica

    # The deployment serves on, up to the last token that fits.
    assert gw.post("/v1/chat/completions", chat("tiny", "Hi", max_tokens=16)).status_code == 200
    assert gw.post("/v1/chat/completions", chat("tiny", fits, max_tokens=32)).status_code == 200
    assert gw.post("/v1/completions", {"model": "tiny", "prompt": [40] * 240}).status_code \
        == 200
    assert gw.post("/v1/completions", {"model": "tiny", "prompt": fits, "max_tokens": 86}) \
        .status_code == 200  # 170 + 86 = 256
    assert gw.post("/v1/completions", {"model": "tiny", "prompt": fits, "max_tokens": 87}) \
        .status_code == 400
    assert len(stub.seen) == 4
    assert loads == [str(tiny_folder)]  # its tokenizer, loaded once


def test_a_model_without_a_tokenizer_is_not_checked_here(gw, stub, tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 8}')
    gw.deploy("opaque", folder=tmp_path)
    response = gw.post("/v1/chat/completions", chat("opaque", SENTENCE * 40))
    assert response.status_code == 200  # the replica judges it
    assert len(stub.seen) == 1


def test_the_context_follows_the_config_as_vllm_derives_it():
    assert context.context_limit({"max_position_embeddings": 4096}) == 4096
    assert context.context_limit({"n_positions": 1024, "n_ctx": 2048}) == 1024
    assert context.context_limit({"text_config": {"max_position_embeddings": 8192}}) == 8192
    assert context.context_limit({"max_position_embeddings": 32768, "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}) == 131072
    assert context.context_limit({"max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0}}) == 131072
    assert context.context_limit({"hidden_size": 8}) is None


@pytest.fixture(scope="module")
def real_replica(tiny_folder, tmp_path_factory):
    """The transformers runtime as a replica runs it: `transformers serve` of the tiny model
    behind the launcher (`python -m mmodel.runners.serve_transformers`), with its key."""
    import os
    import signal
    import subprocess
    import sys

    key = "the-real-replicas-key"
    port = _free_port()
    log_path = tmp_path_factory.mktemp("replica") / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "mmodel.runners.serve_transformers", "serve",
             str(tiny_folder), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
             "--continuous-batching", "--cb-num-blocks", "16", "--cb-max-batch-tokens", "256"],
            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                 "OGAI_REPLICA_API_KEY": key},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.3)
        yield url, key
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.slow
def test_a_real_replica_answers_only_the_gateway_and_outlives_a_long_prompt(gw, tiny_folder,
                                                                           real_replica):
    url, key = real_replica
    gw.deploy("tiny", upstreams=[url], key=key, folder=tiny_folder,
              served_model=str(tiny_folder))
    body = {**chat(str(tiny_folder), "Hi"), "max_tokens": 4}
    for headers in ({}, {"Authorization": "Bearer another-deployments-key"},
                    {"Authorization": f"Bearer {gw.alpha}"}):
        assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers) \
            .status_code == 401
        # Nor may anyone make it load other weights, or drop its model.
        assert httpx.post(f"{url}/load_model", json={"model": "/etc"}, headers=headers) \
            .status_code == 401
        assert httpx.post(f"{url}/reset", headers=headers).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200

    def ask():
        return gw.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)

    assert ask().usage.completion_tokens > 0
    with pytest.raises(openai.BadRequestError) as caught:
        gw.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": SENTENCE * 40}], max_tokens=4)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert ask().usage.completion_tokens > 0  # the next request is served
    assert httpx.get(f"{url}/health").status_code == 200


def test_a_table_the_background_did_not_refresh_is_loaded_by_the_next_request(gw):
    """The background refresh runs on the server's loop; where it stopped, a stale table would
    keep answering 404 for a model deployed since. The next request loads a fresh one."""
    old = routing.reload_now()
    gw.deploy("late")  # reloads; put the old table back, aged past STALE_S
    routing._table = routing.Table(by_name=old.by_name,
                                   loaded_at=old.loaded_at - routing.STALE_S - 1)
    assert "late" not in routing._table.by_name
    assert gw.post("/v1/chat/completions", chat("late")).status_code == 200
