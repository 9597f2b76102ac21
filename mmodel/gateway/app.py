"""The gateway's ASGI application: `GET /v1/models[/<id>]`, `POST /v1/completions`,
`POST /v1/chat/completions` and `POST /v1/embeddings`, answered by the deployments' model
servers.

Per request, nothing here touches the database or leaves the event loop (but for the first
sight of a credential, see `auth`): the caller, the routing table and the rate limits come from
memory (or Redis), and usage, statistics and `last_request_at` are buffered and written by a
background task every `FLUSH_S` seconds (and at exit; `flush()` / `flush_sync()` write at once).
Bodies to and from the model servers are not buffered: a stream is relayed as its events
arrive (an event cut across two reads waits for its end), rewriting only the model name.

A request to a deployment without a ready replica (scaled to zero: woken; or still starting)
waits for one up to `OGAI_GATEWAY_COLD_START_WAIT_S` instead of being refused; the answer
then says how long in `X-OGAI-Cold-Start-Ms`, and the deployment's statistics count it."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from django.conf import settings

from mmodel.gateway import auth, context, limits, routing, upstream
from mmodel.gateway.db import db_calls_in_flight, fire_and_forget, run_db
from mmodel.gateway.errors import (
    GatewayError,
    bad_request,
    may_not_call,
    send_error,
    send_json,
    unavailable,
    upstream_failed,
)
from mmodel.gateway.stats import StatsBuffer, write_stats
from mmodel.gateway.usage import TokenUse, UsageBuffer, new_source, write_usage
from ogai import json_input

logger = logging.getLogger("mmodel.gateway")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 32 * 1024 * 1024
FLUSH_S = 1.0
# A scaled-to-zero deployment is woken at most this often by one process.
WAKE_EVERY_S = 2.0
# A replica that refused is reported unready at most this often by one process.
MARK_EVERY_S = 5.0
# How often a request waiting for a replica looks at the routing table again.
WAIT_POLL_S = 0.25
COLD_START_HEADER = b"x-ogai-cold-start-ms"

COMPLETION_PATHS = {"/v1/chat/completions": True, "/v1/completions": False}
EMBEDDINGS_PATH = "/v1/embeddings"
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]

stats = StatsBuffer()
usage = UsageBuffer()
_interesting = auth.interesting_headers()
_background_loop: asyncio.AbstractEventLoop | None = None
_background_task: asyncio.Task | None = None
_flush_lock = threading.Lock()
_woken: dict[int, float] = {}
_marked: dict[int, float] = {}


class _ClientGone(Exception):
    pass


# -- the entry point -------------------------------------------------------------------------


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    kind = scope["type"]
    if kind == "http":
        _ensure_background()
        try:
            await _http(scope, receive, send)
        except GatewayError as error:
            await send_error(send, error)
        except _ClientGone:
            pass
        except Exception:
            # The database or the cache failing under us: an OpenAI-style answer the client
            # can act on, never a bare 500 (if nothing was sent yet; else the stream just ends).
            logger.exception("gateway: %s %s failed", scope.get("method"), scope.get("path"))
            with contextlib.suppress(Exception):  # a response was already started
                await send_error(send, unavailable(
                    "The gateway could not serve this request now; try again shortly.",
                    "gateway_unavailable", 5))
    elif kind == "lifespan":  # served on its own (ogai.asgi gives lifespan to Django)
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _ensure_background()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await flush()
                await send({"type": "lifespan.shutdown.complete"})
                return
    elif kind == "websocket" and (await receive())["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


async def _http(scope: Scope, receive: Receive, send: Send) -> None:
    path = scope["path"]
    method = scope["method"]
    chat = COMPLETION_PATHS.get(path)  # None: embeddings
    if chat is not None or path == EMBEDDINGS_PATH:
        if method != "POST":
            raise GatewayError(405, f"Use POST for {path}.", code="method_not_allowed",
                               headers=[(b"allow", b"POST")])
        await _complete(scope, receive, send, path, chat)
    elif path == "/v1/models" or path.startswith("/v1/models/"):
        if method != "GET":
            raise GatewayError(405, f"Use GET for {path}.", code="method_not_allowed",
                               headers=[(b"allow", b"GET")])
        await _models(scope, send, path)
    else:
        raise GatewayError(404, f"Invalid URL ({method} {path}).", code="unknown_url")


def _headers(scope: Scope) -> dict[bytes, str]:
    found: dict[bytes, str] = {}
    interesting = _interesting
    for name, value in scope["headers"]:
        if name in interesting:
            text = value.decode("latin-1")
            if name in found:  # several Cookie headers (HTTP/2) are one list
                text = found[name] + ("; " if name == b"cookie" else ", ") + text
            found[name] = text
    return found


# -- /v1/models -------------------------------------------------------------------------------


def _model_object(route: routing.Route, shown: str) -> dict:
    return {"id": shown, "object": "model", "created": route.created,
            "owned_by": route.tenant_name}


async def _models(scope: Scope, send: Send, path: str) -> None:
    caller = await auth.authenticate(_headers(scope), unsafe=False)
    table = await routing.table()
    if path.rstrip("/") == "/v1/models":
        routes = [r for r in routing.visible_routes(table, caller.tenant_ids) if r.active]
        served = [(route, name) for route in routes for name in (route.name, *route.members)]
        names: dict[str, int] = {}
        for _, name in served:
            names[name] = names.get(name, 0) + 1
        data = sorted(
            (_model_object(r, name if names[name] == 1 else f"{r.tenant_name}/{name}")
             for r, name in served),
            key=lambda item: item["id"])
        await send_json(send, 200, orjson.dumps({"object": "list", "data": data}))
        return
    model = path[len("/v1/models/"):]
    route = routing.resolve(table, model, caller.tenant_ids)
    await send_json(send, 200, orjson.dumps(_model_object(route, model)))


# -- completions ------------------------------------------------------------------------------


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    if message["type"] == "http.disconnect":
        raise _ClientGone
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise GatewayError(413, f"The request body is larger than {MAX_BODY} bytes.",
                               code="request_too_large")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _parse(body: bytes, chat: bool | None) -> dict:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise bad_request("The body is not valid JSON.") from None
    if not isinstance(payload, dict):
        raise bad_request("The body must be a JSON object.")
    if json_input.deeper_than(payload):
        # orjson reads 1,024 levels but writes 256: it would fail forwarding it (a 500).
        raise bad_request(f"The body is nested deeper than {json_input.MAX_DEPTH} levels.")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("Missing required parameter: 'model'.", param="model")
    if chat is None:
        found = payload.get("input")
        if not isinstance(found, (str, list)) or not found:
            raise bad_request("Missing required parameter: 'input' (a string or a non-empty "
                              "list).", param="input")
        if payload.get("stream"):
            raise bad_request("Embeddings are not streamed.", param="stream")
    elif chat:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("Missing required parameter: 'messages' (a non-empty list).",
                              param="messages")
    else:
        prompt = payload.get("prompt")
        if not isinstance(prompt, (str, list)) or not prompt:
            raise bad_request("Missing required parameter: 'prompt'.", param="prompt")
    stream = payload.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false.", param="stream")
    return payload


class _Exchange:
    """One request's bookkeeping, written into the buffers once it ends."""

    __slots__ = (
        "caller",
        "cold_start_ms",
        "completion_tokens",
        "error",
        "events",
        "member",
        "prompt_tokens",
        "recorded",
        "reported",
        "route",
        "started",
        "t0",
        "token_keys",
    )

    def __init__(self, route: routing.Route, caller: auth.Caller, t0: float, started: float,
                 token_keys: tuple[str, str]) -> None:
        self.route = route
        # The pool member asked for ("": the deployment's own model).
        self.member = ""
        self.caller = caller
        self.t0 = t0
        self.started = started
        self.token_keys = token_keys
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.error = False
        # Streamed events relayed, and whether the server reported usage at all.
        self.events = 0
        self.reported = False
        self.recorded = False
        self.cold_start_ms: float | None = None  # how long it waited for a replica

    @property
    def shown(self) -> str:
        """The model name the caller asked for, as answers name it."""
        return self.member or self.route.name

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """What the answer says of this request beside the model server's reply."""
        if self.cold_start_ms is None:
            return []
        return [(COLD_START_HEADER, str(round(self.cold_start_ms)).encode())]

    def usage_from(self, found: Any) -> None:
        if isinstance(found, dict):
            prompt = found.get("prompt_tokens")
            completion = found.get("completion_tokens")
            if isinstance(prompt, int) and prompt >= 0:
                self.prompt_tokens = prompt
            if isinstance(completion, int) and completion >= 0:
                self.completion_tokens = completion
            self.reported = True

    def done(self) -> None:
        if self.recorded:
            return
        self.recorded = True
        if self.events and not self.reported:
            # A stream that ended without its usage event (cut off): each content event
            # carried about one token; the prompt is unknown.
            self.completion_tokens = max(0, self.events - 1)
        ended = time.time()
        route = self.route
        stats.record(deployment_id=route.deployment_id, at=ended,
                     latency_ms=(time.perf_counter() - self.t0) * 1000.0, error=self.error,
                     prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                     cold_start_ms=self.cold_start_ms)
        tokens = self.prompt_tokens + self.completion_tokens
        if tokens:
            usage.add(TokenUse(tenant_id=route.tenant_id, model_name=self.shown,
                               prompt_tokens=self.prompt_tokens,
                               completion_tokens=self.completion_tokens,
                               started_at=self.started, ended_at=ended, source=new_source()))
            limits.add_tokens(self.token_keys, tokens)


async def _complete(scope: Scope, receive: Receive, send: Send, path: str,
                    chat: bool | None) -> None:
    """A completion, a chat completion or (`chat` None) embeddings, through a replica."""
    t0 = time.perf_counter()
    started = time.time()
    caller = await auth.authenticate(_headers(scope), unsafe=True)
    payload = _parse(await _read_body(receive), chat)
    table = await routing.table()
    route = routing.resolve(table, payload["model"], caller.tenant_ids)
    if route.tenant_id not in caller.call_tenant_ids:
        # Before the limits: a caller who may not spend the budget does not use it up either.
        raise may_not_call(route.tenant_name)
    token_keys = await limits.check(route, caller)
    member = routing.member_of(route, payload["model"])
    # Before any replica (and before waking one): a prompt that cannot fit never reaches it.
    # (An embedding model's server cuts each text to the model's length itself.)
    if chat is not None:
        await context.check(route.members[member] if member else route.folder, payload, chat)
    exchange = _Exchange(route, caller, t0, started, token_keys)
    exchange.member = member
    refusal = routing.state_error(route)
    if refusal is not None and route.active:
        waiting = time.perf_counter()
        route = exchange.route = await _wait_for_replica(route, payload["model"], caller)
        refusal = routing.state_error(route)
        if refusal is None:
            exchange.cold_start_ms = (time.perf_counter() - waiting) * 1000.0
    if refusal is not None:
        exchange.error = True
        exchange.done()
        raise refusal

    stream = payload.get("stream") is True
    client_wants_usage = False
    if stream:
        options = payload.get("stream_options")
        if isinstance(options, dict):
            client_wants_usage = bool(options.get("include_usage"))
            payload["stream_options"] = {**options, "include_usage": True}
        else:
            payload["stream_options"] = {"include_usage": True}

    # Watch for the client leaving (the body is read: the next message can only be that), so
    # an abandoned generation stops at once instead of running to its end upstream.
    task = asyncio.current_task()
    state = {"finished": False, "gone": False}

    def on_disconnect(future: asyncio.Future) -> None:
        if state["finished"] or future.cancelled() or task is None:
            return
        state["gone"] = True
        task.cancel()

    watcher = asyncio.ensure_future(receive())
    watcher.add_done_callback(on_disconnect)
    stats.begin(route.deployment_id)
    try:
        await _forward(send, route, payload, path, stream, client_wants_usage, exchange)
    except asyncio.CancelledError:
        if not state["gone"] or task is None:
            raise
        task.uncancel()
        exchange.done()
    finally:
        stats.end(route.deployment_id)
        state["finished"] = True
        if not watcher.done():
            watcher.cancel()


async def _wait_for_replica(route: routing.Route, model: str,
                            caller: auth.Caller) -> routing.Route:
    """The deployment's route once it has a ready replica, or as it stands when the wait
    (`OGAI_GATEWAY_COLD_START_WAIT_S`) is over or it was stopped; one scaled to zero is woken."""
    deadline = time.monotonic() + settings.OGAI_GATEWAY_COLD_START_WAIT_S
    while True:
        if route.active and route.scaled_to_zero:
            _wake(route)
        if route.replicas or not route.active or time.monotonic() >= deadline:
            return route
        await asyncio.sleep(WAIT_POLL_S)
        route = routing.resolve(await routing.table(), model, caller.tenant_ids)


async def _forward(send: Send, route: routing.Route, payload: dict, path: str, stream: bool,
                   client_wants_usage: bool, exchange: _Exchange) -> None:
    client = upstream.session()
    tried: set[int] = set()
    resent = False
    while True:
        replica = routing.pick(route, tried, exchange.member)
        if replica is None:
            exchange.error = True
            exchange.done()
            raise unavailable(f"No replica of `{route.name}` answers; retry shortly.",
                              "no_ready_replica", routing.STARTING_RETRY_AFTER_S)
        payload["model"] = exchange.member or replica.served_model
        routing.begin(replica)
        try:
            response = await client.post(replica.upstream + path, data=orjson.dumps(payload),
                                         headers=route.headers)
        except upstream.REFUSED as exc:
            routing.end(replica)
            _refused(route, replica, exc)
            tried.add(replica.id)
            continue
        except upstream.DROPPED:
            routing.end(replica)
            if resent:
                exchange.error = True
                exchange.done()
                raise upstream_failed(f"The model server of `{route.name}` closed the "
                                      "connection without answering.") from None
            resent = True
            continue
        except upstream.FAILED as exc:
            routing.end(replica)
            exchange.error = True
            exchange.done()
            logger.warning("gateway: %s replica %s failed: %s", route.name, replica.id,
                           type(exc).__name__)
            raise upstream_failed(f"The model server of `{route.name}` failed before "
                                  "answering.") from None
        break
    try:
        if response.status in (401, 403):
            # The replica refused the gateway's own key: not the caller's fault.
            exchange.error = True
            exchange.done()
            logger.error("gateway: %s replica %s refused the deployment's key (%s)",
                         route.name, replica.id, response.status)
            raise upstream_failed(f"The model server of `{route.name}` refused the gateway.")
        if response.status != 200:
            await _relay_error(send, response, exchange)
        elif stream:
            await _relay_stream(send, response, route, replica, payload["model"],
                                client_wants_usage, exchange)
        else:
            await _relay_json(send, response, route, exchange)
    finally:
        routing.end(replica)
        # Back to the pool when read to its end; closed (the server stops) when cut short.
        response.release()


async def _relay_json(send: Send, response, route: routing.Route, exchange: _Exchange) -> None:
    try:
        body = await response.read()
    except upstream.FAILED:
        exchange.error = True
        exchange.done()
        raise upstream_failed(f"The model server of `{route.name}` broke off its answer.") \
            from None
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    if isinstance(answer, dict):
        exchange.usage_from(answer.get("usage"))
        if "model" in answer:
            answer["model"] = exchange.shown
            body = orjson.dumps(answer)
    exchange.done()
    await send_json(send, 200, body, exchange.headers)


async def _relay_error(send: Send, response, exchange: _Exchange) -> None:
    """An upstream refusal passes with its status; a body not in OpenAI's shape is wrapped."""
    status = response.status
    try:
        body = await response.read()
    except upstream.FAILED:
        body = b""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    if not (isinstance(answer, dict) and isinstance(answer.get("error"), dict)):
        detail = answer.get("detail") if isinstance(answer, dict) else None
        message = str(detail) if detail else body.decode("utf-8", "replace")[:2000]
        body = orjson.dumps({"error": {
            "message": message or f"The model server answered {status}.",
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": None, "code": "upstream_error"}})
    exchange.error = status >= 500
    exchange.done()
    await send_json(send, status, body, exchange.headers)


async def _relay_stream(send: Send, response, route: routing.Route, replica: routing.Replica,
                        sent_model: str, client_wants_usage: bool, exchange: _Exchange) -> None:
    served = orjson.dumps(sent_model)
    shown = orjson.dumps(exchange.shown)
    renames = [(b'"model":' + served, b'"model":' + shown),
               (b'"model": ' + served, b'"model": ' + shown)]
    renames = [(a, b) for a, b in renames if a != b]
    await send({"type": "http.response.start", "status": 200,
                "headers": SSE_HEADERS + exchange.headers})
    pending = b""
    try:
        async for chunk in response.content.iter_any():
            pending = pending + chunk if pending else chunk
            end = pending.rfind(b"\n\n")
            if end >= 0:
                end += 2
            crlf = pending.rfind(b"\r\n\r\n")
            if crlf >= 0 and crlf + 4 > end:
                end = crlf + 4
            if end < 0:
                continue
            ready, pending = pending[:end], pending[end:]
            for old, new in renames:
                if old in ready:
                    ready = ready.replace(old, new)
            if b'"usage":{' in ready or b'"usage": {' in ready:
                ready = _take_usage(ready, exchange, client_wants_usage)
            else:
                exchange.events += ready.count(b"data:")
            if b"[DONE]" in ready:
                exchange.done()  # before the client can see the end
            if ready:
                await send({"type": "http.response.body", "body": ready, "more_body": True})
    except upstream.FAILED:
        exchange.error = True
        logger.warning("gateway: %s replica %s broke off a stream", route.name, replica.id)
        error = upstream_failed(f"The model server of `{route.name}` broke off its answer.")
        pending += b"data: " + error.body() + b"\n\n"
    exchange.done()
    if pending:
        await send({"type": "http.response.body", "body": pending, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _take_usage(ready: bytes, exchange: _Exchange, client_wants_usage: bool) -> bytes:
    """Read the usage from its event in `ready`; drop that event when it is usage only and
    the client did not ask for it (`stream_options.include_usage` was added on its behalf)."""
    at = ready.find(b'"usage":{')
    if at < 0:
        at = ready.find(b'"usage": {')
    start = ready.rfind(b"data:", 0, at)
    if at < 0 or start < 0:
        return ready
    end = ready.find(b"data:", at)  # the next event, or the end of the block
    if end < 0:
        end = len(ready)
    try:
        chunk = orjson.loads(ready[start + 5:end])
    except orjson.JSONDecodeError:
        return ready
    if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
        exchange.usage_from(chunk["usage"])
        if not client_wants_usage and chunk.get("choices") == []:
            return ready[:start] + ready[end:]
    return ready


# -- the deployment services, called in the background ----------------------------------------


def _wake_sync(deployment_id: int) -> None:
    from mmodel.services.deployments import deployment_wake

    deployment_wake(deployment_id=deployment_id)


def _mark_unready_sync(replica_id: int, reason: str) -> None:
    from mmodel.services.deployments import replica_mark_unready

    replica_mark_unready(replica_id=replica_id, reason=reason)


def _wake(route: routing.Route) -> None:
    now = time.monotonic()
    if now - _woken.get(route.deployment_id, -WAKE_EVERY_S) >= WAKE_EVERY_S:
        _woken[route.deployment_id] = now
        fire_and_forget(_wake_sync, route.deployment_id)


def _refused(route: routing.Route, replica: routing.Replica, exc: Exception) -> None:
    routing.drop(route, replica)
    now = time.monotonic()
    if now - _marked.get(replica.id, -MARK_EVERY_S) >= MARK_EVERY_S:
        _marked[replica.id] = now
        logger.warning("gateway: %s replica %s at %s does not answer: %s", route.name,
                       replica.id, replica.upstream, type(exc).__name__)
        fire_and_forget(_mark_unready_sync, replica.id,
                        f"the gateway could not connect: {type(exc).__name__}")


# -- buffers and the background task ----------------------------------------------------------


def flush_sync() -> None:
    """Write the buffered usage records and statistics now (in this thread). A flush already
    under way elsewhere is waited for, so what was buffered before the call is written when it
    returns. On a database error the data is kept for the next flush, unless the error is about
    the data itself (a tenant or deployment deleted meanwhile)."""
    from django.db import IntegrityError

    with _flush_lock:
        records = usage.take()
        if records:
            try:
                write_usage(records)
            except IntegrityError:
                logger.exception("gateway: %d usage records could not be written",
                                 len(records))
            except Exception:
                usage.put_back(records)
                raise
        minutes, last = stats.take()
        if minutes or last:
            try:
                write_stats(minutes, last)
            except IntegrityError:
                logger.exception("gateway: request statistics could not be written")
            except Exception:
                stats.put_back(minutes, last)
                raise


async def flush() -> None:
    if usage or stats:
        await run_db(flush_sync)


def discard() -> None:
    """Drop what is buffered (tests, before their database goes away)."""
    usage.take()
    stats.take()


async def _background() -> None:
    """Refresh the routing table and write the buffers, until the server's loop ends: then
    (its remaining tasks are cancelled, this one too) write the last of them and close the
    upstream connections. No lifespan needed: ogai.asgi gives lifespan to Django."""
    last_flush = time.monotonic()
    failing = {"refresh": False, "flush": False}  # log a failure once, not every second

    async def attempt(what: str, step) -> None:
        try:
            await step()
        except Exception:
            if not failing[what]:
                logger.exception("gateway: %s failed (retrying every second)", what)
            failing[what] = True
        else:
            if failing[what]:
                logger.warning("gateway: %s works again", what)
            failing[what] = False

    try:
        while True:
            await asyncio.sleep(routing.REFRESH_S)
            await attempt("refresh", routing.refresh)
            if time.monotonic() - last_flush >= FLUSH_S:
                last_flush = time.monotonic()
                await attempt("flush", flush)
    finally:
        try:
            await flush()
        except Exception:
            logger.exception("gateway: could not write usage and statistics at shutdown")
        await upstream.close()


def quiesce(timeout: float = 10.0) -> None:
    """From outside the server's loop: stop the background task (it writes what is buffered)
    and wait for the database calls in flight; the next request starts the task again. Tests
    call it before emptying their database, which a routing refresh running into it could
    deadlock."""
    global _background_loop, _background_task
    loop, task = _background_loop, _background_task
    _background_loop = _background_task = None
    if loop is None or task is None or loop.is_closed() or not loop.is_running():
        return

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        pending = list(db_calls_in_flight())
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout)


def _ensure_background() -> None:
    global _background_loop, _background_task
    loop = asyncio.get_running_loop()
    if _background_loop is loop:
        return
    _background_loop = loop
    _background_task = loop.create_task(_background())


def _flush_at_exit() -> None:
    if not (usage or stats):
        return
    try:
        from django.db import close_old_connections

        flush_sync()
        close_old_connections()
    except Exception:
        logger.exception("gateway: could not write usage and statistics at exit")


atexit.register(_flush_at_exit)
