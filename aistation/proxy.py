"""The platform's reverse proxy: puts each running JupyterLab server under `/notebooks/<id>/`,
and each Ray job's dashboard (`ray.dashboard: true`) under `/ray-dashboards/<job id>/`.

An ASGI application, mounted beside Django by `ogai.asgi` (setting `OGAI_ASGI_MOUNTS`). Every
HTTP request and every WebSocket handshake is authenticated against the platform's Django
session (the session cookie, checked like `AuthenticationMiddleware` does, session auth hash
included) and the notebook is looked up with `aistation.services.notebooks`:

- not signed in: HTTP 302 to `LOGIN_URL?next=...`; WebSocket refused (302, or close 4401);
- no such notebook, or not the user's to reach: 404 (WebSocket close 4404);
- notebook not running: 503 with the reason (WebSocket close 4503);
- a cross-origin WebSocket handshake or unsafe HTTP request (its `Origin` is neither this host
  nor in `CSRF_TRUSTED_ORIGINS`): 403 (WebSocket close 4403), because the proxy authenticates
  upstream with the server's token, which turns Jupyter's own xsrf and origin checks off;
- the Jupyter server does not answer: 502.

Otherwise the request goes to the Jupyter server (its `base_url` is `/notebooks/<id>/`, so the
path travels unchanged) with `Authorization: token <token>`, without the platform's session
and CSRF cookies and without hop-by-hop headers; bodies stream both ways without buffering.
WebSockets are accepted only once the upstream handshake succeeded, with the subprotocol the
upstream chose, then frames are pumped both ways until one side closes; the close code is passed
on. Browser activity is recorded with `notebook_touch`, at most once a minute per notebook.

A Ray dashboard is reached the same way, with two differences: the path goes upstream without
its `/ray-dashboards/<id>` prefix (Ray's dashboard serves at its root, with relative links),
and besides the session an API token is accepted (`Authorization: Bearer ogai_…`, as the API
takes it), so that the SDK's `RayCluster.submit` can use Ray's `JobSubmissionClient` through
the proxy; the header never goes upstream. Who may reach it: `aistation.services.ray_clusters`
(the job's owner and the tenant's admins); anyone else gets 404, as for a job they cannot see.

Tokens and cookies are never logged.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PATH_RE = re.compile(r"^/notebooks/([1-9][0-9]{0,17})(/.*)$", re.DOTALL)
RAY_PATH_RE = re.compile(r"^/ray-dashboards/([1-9][0-9]{0,17})(/.*)?$", re.DOTALL)

# How often an open WebSocket's user is checked again (sign-out, lost access, stopped).
RECHECK_S = 60.0

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host",
})
# Request headers the proxy sets itself (never the client's).
OWN_REQUEST_HEADERS = frozenset({
    "authorization", "cookie", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host",
})
# WebSocket handshake headers the websockets client writes itself.
WS_HANDSHAKE_HEADERS = frozenset({
    "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
    "sec-websocket-protocol", "sec-websocket-accept", "origin", "content-length", "user-agent",
})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

CONNECT_TIMEOUT_S = 5.0
TOUCH_EVERY_S = 60.0
NOT_ANSWERING = "the notebook server does not answer (it may be starting)"
RAY_NOT_ANSWERING = "the Ray dashboard does not answer (it may be starting)"

_client: httpx.AsyncClient | None = None
_client_loop: asyncio.AbstractEventLoop | None = None
_last_touch: dict[int, float] = {}


def _not_answering(route: Route) -> str:
    return NOT_ANSWERING if route.notebook_id is not None else RAY_NOT_ANSWERING


class Denied(Exception):
    """Refuse the request: an HTTP status, a text body, extra headers."""

    def __init__(self, status: int, body: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(body)
        self.status = status
        self.body = body
        self.headers = list(headers)


@dataclass(frozen=True)
class Route:
    """Where one request goes: `upstream` (http://host:port) and `path_qs` (path and query
    there); `token` for the upstream's Authorization header (Jupyter's) or None; set-cookies
    from upstream must stay under `cookie_prefix`; `notebook_id` is touched on activity."""

    label: str
    upstream: str
    path_qs: str
    token: str | None
    cookie_prefix: str
    notebook_id: int | None = None


@dataclass
class _SessionHolder:
    """Just enough of a request for `django.contrib.auth.get_user`."""

    session: Any


# -- the entry point -------------------------------------------------------------------------


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http":
        await _http(scope, receive, send)
    elif scope["type"] == "websocket":
        await _websocket(scope, receive, send)
    elif scope["type"] == "lifespan":  # mounted on its own: nothing to start or stop
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


# -- shared: headers, authentication, lookup ---------------------------------------------------


def _headers(scope: Scope) -> list[tuple[str, str]]:
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _cookies(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The cookie pairs of the Cookie header(s), in order (name, value)."""
    pairs = []
    for key, value in headers:
        if key != "cookie":
            continue
        for part in value.split(";"):
            name, sep, val = part.strip().partition("=")
            if sep and name:
                pairs.append((name, val))
    return pairs


def _upstream_cookie(headers: list[tuple[str, str]]) -> str | None:
    """The Cookie header for the upstream: the client's, less the platform's own cookies."""
    own = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    kept = [f"{name}={value}" for name, value in _cookies(headers) if name not in own]
    return "; ".join(kept) or None


def _path_qs(scope: Scope) -> str:
    """The request's path (still percent-encoded, as the client sent it) and query string."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(scope["path"])
    query = scope.get("query_string", b"").decode("latin-1")
    return f"{path}?{query}" if query else path


def _notebook_id(scope: Scope) -> int:
    match = PATH_RE.match(scope["path"])
    if match is None:
        raise Denied(404, "No such notebook")
    return int(match.group(1))


def _origin_allowed(headers: list[tuple[str, str]]) -> bool:
    """No Origin (not a browser), or this very host, or one of `CSRF_TRUSTED_ORIGINS`."""
    origin = _header(headers, "origin")
    if origin is None:
        return True
    if origin == "null":
        return False
    host = (_header(headers, "host") or "").lower()
    if urlsplit(origin).netloc.lower() == host and host:
        return True
    for trusted in getattr(settings, "CSRF_TRUSTED_ORIGINS", []):
        if trusted == origin:
            return True
        scheme, _, pattern = trusted.partition("://")
        if pattern.startswith("*.") and origin.startswith(f"{scheme}://"):
            netloc = origin.split("://", 1)[1].lower()
            if netloc.endswith(pattern[1:].lower()):
                return True
    return False


def _login_redirect(scope: Scope) -> Denied:
    from django.shortcuts import resolve_url

    login = str(resolve_url(settings.LOGIN_URL))
    sep = "&" if "?" in login else "?"
    location = f"{login}{sep}next={quote(_path_qs(scope), safe='/')}"
    return Denied(302, "Sign in first", [("location", location)])


def _session_user(session_key: str | None) -> Any:
    """The signed-in user of a session cookie, or None (in the ORM's thread)."""
    from django.contrib.auth import get_user

    if not session_key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(_SessionHolder(session=store))  # type: ignore[arg-type]
    return user if user.is_authenticated else None


def _token_user(authorization: str) -> Any:
    """The user of an API token (`Bearer ogai_…` or `Token ogai_…`), or Denied 401."""
    from infra_os.services.tokens import api_token_authenticate

    keyword, _, secret = authorization.strip().partition(" ")
    token = api_token_authenticate(secret.strip()) \
        if keyword.lower() in ("bearer", "token") and secret.strip() else None
    if token is None:
        raise Denied(401, "The token is unknown, expired or revoked",
                     [("www-authenticate", 'Bearer realm="api"')])
    return token.user


def _in_orm_thread(user_of: Callable[[], Any], target_of: Callable[[Any], Any]) -> Any:
    """In the ORM's thread: the signed-in user, then what it may reach (None when nobody is
    signed in; target_of raises Denied), with the thread's old connections closed around."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        user = user_of()
        return None if user is None else target_of(user)
    finally:
        close_old_connections()


def _resolve_sync(session_key: str | None, notebook_id: int) -> Any:
    """The notebook's ProxyTarget for the session's user; or Denied."""
    from aistation.services import notebooks  # at call time: tests replace its functions

    def target_of(user: Any) -> Any:
        try:
            return notebooks.notebook_proxy_target(user=user, notebook_id=notebook_id)
        except notebooks.NotebookNotFound:
            raise Denied(404, "No such notebook") from None
        except notebooks.NotebookNotRunning as exc:
            raise Denied(503, str(exc) or "The notebook is not running") from None

    return _in_orm_thread(lambda: _session_user(session_key), target_of)


def _resolve_ray_sync(session_key: str | None, authorization: str | None, job_id: int) -> Any:
    """The upstream of Ray job `job_id`'s dashboard for the user of an API token, else of the
    session; or Denied."""
    from aistation.services import ray_clusters

    def target_of(user: Any) -> Any:
        try:
            return ray_clusters.ray_dashboard_upstream(user=user, job_id=job_id)
        except ray_clusters.RayDashboardNotFound:
            raise Denied(404, "No such Ray dashboard") from None
        except ray_clusters.RayDashboardNotRunning as exc:
            raise Denied(503, str(exc) or "The Ray cluster is not running") from None

    return _in_orm_thread(
        lambda: _token_user(authorization) if authorization else _session_user(session_key),
        target_of)


def _raw_path(scope: Scope) -> str:
    raw = scope.get("raw_path")
    return raw.decode("latin-1") if raw else quote(scope["path"])


async def _authorize(scope: Scope, headers: list[tuple[str, str]]) -> Route:
    """Where the request goes, or Denied (login redirect, 401, 404, 503)."""
    key = dict(_cookies(headers)).get(settings.SESSION_COOKIE_NAME)
    ray = RAY_PATH_RE.match(scope["path"])
    if ray is not None:
        job_id = int(ray.group(1))
        prefix = f"/ray-dashboards/{job_id}"
        if not ray.group(2):
            raise Denied(302, "The dashboard is a folder", [("location", prefix + "/")])
        upstream = await sync_to_async(_resolve_ray_sync, thread_sensitive=True)(
            key, _header(headers, "authorization"), job_id)
        if upstream is None:
            raise _login_redirect(scope)
        rest = _path_qs(scope)[len(_raw_path(scope)):]
        return Route(label=f"Ray dashboard of job {job_id}", upstream=upstream,
                     path_qs=_raw_path(scope)[len(prefix):] + rest, token=None,
                     cookie_prefix=prefix + "/")
    notebook_id = _notebook_id(scope)
    target = await sync_to_async(_resolve_sync, thread_sensitive=True)(key, notebook_id)
    if target is None:
        raise _login_redirect(scope)
    return Route(label=f"notebook {notebook_id}", upstream=target.upstream,
                 path_qs=_path_qs(scope), token=target.token,
                 cookie_prefix=f"/notebooks/{notebook_id}/", notebook_id=notebook_id)


def _touch_sync(notebook_id: int) -> None:
    from django.db import close_old_connections

    from aistation.services import notebooks

    close_old_connections()
    try:
        notebooks.notebook_touch(notebook_id=notebook_id)
    finally:
        close_old_connections()


async def _touch(notebook_id: int) -> None:
    """Record browser activity, at most once a minute per notebook (in this process)."""
    now = time.monotonic()
    last = _last_touch.get(notebook_id)
    if last is not None and now - last < TOUCH_EVERY_S:
        return
    _last_touch[notebook_id] = now
    try:
        await sync_to_async(_touch_sync, thread_sensitive=True)(notebook_id)
    except Exception:
        logger.exception("could not record activity on notebook %s", notebook_id)


def _forwarded_headers(scope: Scope, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    client = scope.get("client")
    client_ip = client[0] if client else None
    chain = [v for k, v in headers if k == "x-forwarded-for"]
    if client_ip:
        chain.append(client_ip)
    scheme = scope.get("scheme", "http")
    proto = {"ws": "http", "wss": "https"}.get(scheme) or str(scheme)
    out: list[tuple[str, str]] = [("x-forwarded-proto", proto)]
    if chain:
        out.append(("x-forwarded-for", ", ".join(chain)))
    host = _header(headers, "host")
    if host:
        out.append(("x-forwarded-host", host))
    return out


def _cookie_allowed(name: bytes, value: bytes, prefix: str) -> bool:
    """A notebook server or Ray dashboard (whose code its owner controls) may set cookies only
    for its own path (`prefix`), never the platform's cookies: no session fixation through
    the shared origin."""
    if name.lower() != b"set-cookie":
        return True
    text = value.decode("latin-1")
    cookie = text.split("=", 1)[0].strip()
    if cookie in (settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME):
        return False
    path = re.search(r";\s*path=([^;]*)", text, re.IGNORECASE)
    return path is not None and path.group(1).strip().startswith(prefix)


# -- HTTP -------------------------------------------------------------------------------------


def _get_client() -> httpx.AsyncClient:
    """One pooled client per event loop (a server runs one; its connections belong to it)."""
    global _client, _client_loop
    loop = asyncio.get_running_loop()
    if _client is None or _client_loop is not loop:
        _client_loop = loop
        _client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            follow_redirects=False,
            trust_env=False,  # never route 127.0.0.1 through an HTTP(S)_PROXY
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=50),
        )
    return _client


def _plain_head(data: bytes, headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    head = [(b"content-type", b"text/plain; charset=utf-8")]
    head.append((b"content-length", str(len(data)).encode()))
    return head + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def _respond(
    send: Send, status: int, body: str, headers: Iterable[tuple[str, str]] = ()
) -> None:
    data = body.encode()
    head = _plain_head(data, headers)
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": data, "more_body": False})


async def _http(scope: Scope, receive: Receive, send: Send) -> None:
    headers = _headers(scope)
    method = scope["method"]
    try:
        if method not in SAFE_METHODS and not _origin_allowed(headers):
            raise Denied(403, "Cross-origin request refused")
        route = await _authorize(scope, headers)
    except Denied as denied:
        await _respond(send, denied.status, denied.body, denied.headers)
        return
    if route.notebook_id is not None:
        await _touch(route.notebook_id)

    out = [(k, v) for k, v in headers if k not in HOP_BY_HOP and k not in OWN_REQUEST_HEADERS]
    cookie = _upstream_cookie(headers)
    if cookie:
        out.append(("cookie", cookie))
    if route.token:
        out.append(("authorization", f"token {route.token}"))
    out += _forwarded_headers(scope, headers)

    # The body: a complete first message goes as bytes (a plain Content-Length); a longer one
    # streams from receive(), chunked unless the client said its Content-Length.
    first = await receive()
    if first["type"] == "http.disconnect":
        return
    body_done = asyncio.Event()
    content: bytes | AsyncIterator[bytes]
    if not first.get("more_body", False):
        content = first.get("body", b"")
        body_done.set()
    else:
        async def stream_body() -> AsyncIterator[bytes]:
            yield first.get("body", b"")
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ConnectionAbortedError("the client went away")
                yield message.get("body", b"")
                if not message.get("more_body", False):
                    break
            body_done.set()

        content = stream_body()

    client = _get_client()
    url = route.upstream + route.path_qs
    request = client.build_request(method, url, headers=out, content=content)
    try:
        response = await client.send(request, stream=True)
    except (httpx.TransportError, ConnectionAbortedError) as exc:
        if isinstance(exc, ConnectionAbortedError):
            return
        logger.warning(
            "%s: upstream %s does not answer: %s", route.label, route.upstream,
            type(exc).__name__,
        )
        await _respond(send, 502, _not_answering(route))
        return

    async def relay() -> None:
        await send({
            "type": "http.response.start",
            "status": response.status_code,
            "headers": [
                (k, v) for k, v in response.headers.raw
                if k.decode("latin-1").lower() not in HOP_BY_HOP
                and _cookie_allowed(k, v, route.cookie_prefix)
            ],
        })
        try:
            async for chunk in response.aiter_raw():
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.TransportError:
            logger.warning("%s: upstream broke off a response", route.label)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def watch_disconnect() -> None:
        # Once the request body is read, the next message can only be the client leaving.
        await body_done.wait()
        while (await receive())["type"] != "http.disconnect":
            pass

    try:
        relay_task = asyncio.ensure_future(relay())
        watch_task = asyncio.ensure_future(watch_disconnect())
        await asyncio.wait({relay_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        for task in (relay_task, watch_task):
            task.cancel()
        await asyncio.gather(relay_task, watch_task, return_exceptions=True)
        if relay_task.done() and not relay_task.cancelled():
            failure = relay_task.exception()
            if failure is not None and not isinstance(failure, OSError):  # OSError: client left
                raise failure
    finally:
        await response.aclose()


# -- WebSocket --------------------------------------------------------------------------------

# Close codes a WebSocket endpoint may send (1005, 1006 and 1015 are reserved for reporting).
def _sendable_close(code: int | None, fallback: int) -> int:
    if code is None:
        return fallback
    if code in (1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014):
        return code
    if 3000 <= code <= 4999:
        return code
    return fallback


async def _ws_deny(
    scope: Scope, send: Send, status: int, body: str, headers: Iterable[tuple[str, str]] = ()
) -> None:
    if "websocket.http.response" in (scope.get("extensions") or {}):
        data = body.encode()
        head = _plain_head(data, headers)
        await send({"type": "websocket.http.response.start", "status": status, "headers": head})
        await send({"type": "websocket.http.response.body", "body": data, "more_body": False})
    else:
        code = {302: 4401, 401: 4401}.get(status, 4000 + status if 400 <= status < 1000 else 4000)
        await send({"type": "websocket.close", "code": code, "reason": body[:120]})


async def _websocket(scope: Scope, receive: Receive, send: Send) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
    from websockets.typing import Origin, Subprotocol

    message = await receive()
    if message["type"] != "websocket.connect":
        return
    headers = _headers(scope)
    try:
        if not _origin_allowed(headers):
            raise Denied(403, "Cross-origin WebSocket refused")
        route = await _authorize(scope, headers)
    except Denied as denied:
        await _ws_deny(scope, send, denied.status, denied.body, denied.headers)
        return
    notebook_id = route.notebook_id

    upstream_origin = route.upstream.rstrip("/")
    ws_url = "ws" + upstream_origin[len("http"):] + route.path_qs
    extra = [
        (k, v) for k, v in headers
        if k not in HOP_BY_HOP and k not in OWN_REQUEST_HEADERS and k not in WS_HANDSHAKE_HEADERS
    ]
    cookie = _upstream_cookie(headers)
    if cookie:
        extra.append(("cookie", cookie))
    if route.token:
        extra.append(("authorization", f"token {route.token}"))
    extra += _forwarded_headers(scope, headers)
    subprotocols = [Subprotocol(p) for p in scope.get("subprotocols") or []] or None

    try:
        upstream = await connect(
            ws_url,
            origin=Origin(upstream_origin),  # Jupyter checks Origin against its own host
            subprotocols=subprotocols,
            additional_headers=extra,
            user_agent_header=_header(headers, "user-agent"),
            proxy=None,
            max_size=None,
            open_timeout=CONNECT_TIMEOUT_S,
            compression=None,  # frames pass through; the browser<->proxy hop may compress
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        logger.warning("%s: upstream refused the WebSocket with %s", route.label, status)
        shown = status if 400 <= status < 600 else 502
        what = "the notebook server" if notebook_id is not None else "the Ray dashboard"
        await _ws_deny(scope, send, shown, f"{what} answered {status}")
        return
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        name = type(exc).__name__
        logger.warning("%s: upstream WebSocket failed: %s", route.label, name)
        await _ws_deny(scope, send, 502, _not_answering(route))
        return

    try:
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        if notebook_id is not None:
            await _touch(notebook_id)

        async def client_to_upstream() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "websocket.receive":
                    text = msg.get("text")
                    await upstream.send(text if text is not None else (msg.get("bytes") or b""))
                    if notebook_id is not None:
                        await _touch(notebook_id)
                elif msg["type"] == "websocket.disconnect":
                    await upstream.close(code=_sendable_close(msg.get("code"), 1000))
                    return

        async def upstream_to_client() -> None:
            try:
                async for frame in upstream:
                    if isinstance(frame, str):
                        await send({"type": "websocket.send", "text": frame})
                    else:
                        await send({"type": "websocket.send", "bytes": frame})
            except ConnectionClosed:
                pass
            code = _sendable_close(upstream.close_code, 1011)
            reason = upstream.close_reason or ""
            await send({"type": "websocket.close", "code": code, "reason": reason})

        async def still_allowed() -> None:
            """A signed-out user, or one who lost access, keeps no open kernel channel."""
            while True:
                await asyncio.sleep(RECHECK_S)
                try:
                    await _authorize(scope, headers)
                except Denied as denied:
                    code = 4401 if denied.status == 302 else 4000 + denied.status
                    await send({"type": "websocket.close", "code": code,
                                "reason": "access ended"})
                    return

        tasks = {
            asyncio.ensure_future(client_to_upstream()),
            asyncio.ensure_future(upstream_to_client()),
            asyncio.ensure_future(still_allowed()),
        }
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            failure = task.exception()
            if failure is not None and not isinstance(failure, (OSError, ConnectionClosed)):
                logger.error("%s: WebSocket relay failed", route.label, exc_info=failure)
    finally:
        await upstream.close()
