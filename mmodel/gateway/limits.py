"""Rate limits per tenant and per caller (an API token; a user through the session): requests
and tokens per minute, in fixed 60-second windows counted in the platform's cache, so every web
process shares them when the cache is Redis.

A request counts against the requests limits when it arrives (refused ones too: a flood stays
refused until the window ends). The tokens limits refuse a request once the window's tokens
have reached the limit; a request's actual tokens are added when it ends. A limit of 0 means
no limit. With Redis the counters are read and written over redis.asyncio (one pipelined round
trip per check); with the in-memory cache (`make run`, tests: one process) they are counted in
this process without leaving the event loop; any other cache backend goes through a thread."""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from typing import Any

from django.conf import settings

from mmodel.gateway.auth import Caller
from mmodel.gateway.db import run_db
from mmodel.gateway.errors import GatewayError, retry_after
from mmodel.gateway.routing import Route

logger = logging.getLogger("mmodel.gateway")

WINDOW_S = 60
# Counters outlive their window a little (clocks of web processes differ slightly).
KEY_TTL_S = WINDOW_S + 5
REDIS_PREFIX = "ogai:gw:"


def _refused(what: str, who: str, limit: int, window_end: float) -> GatewayError:
    unit = "requests" if what == "requests" else "tokens"
    wait = max(1.0, window_end - time.time())
    return GatewayError(
        429, f"Rate limit reached for {who}: {limit} {unit} per minute. Retry after "
             f"{int(wait + 0.999)} s.",
        type=unit, code="rate_limit_exceeded", headers=[retry_after(wait)])


class _Counters(ABC):
    """The cache operations the limits need; `check` answers (tenant_n, caller_n,
    tenant_tokens, caller_tokens) for the window, having counted this request."""

    @abstractmethod
    async def check(self, keys: tuple[str, str, str, str], count_requests: tuple[bool, bool],
                    ) -> tuple[int, int, int, int]: ...

    @abstractmethod
    def add_tokens(self, keys: tuple[str, str], tokens: int) -> None: ...


class _InProcess(_Counters):
    """The in-memory cache serves one process: count in a dict, on the event loop. Cleared
    with the cache (tests clear it between tests): a marker entry kept in the cache's own
    storage goes when the cache is cleared, and the counters go with it."""

    def __init__(self) -> None:
        from django.core.cache import caches

        self.cache = caches.create_connection("default")
        self.storage = getattr(self.cache, "_cache", None)
        self.marker = self.cache.make_key("gateway-counters")
        self.counts: dict[str, int] = {}
        self.window = 0

    def _current(self) -> dict[str, int]:
        storage = self.storage
        if storage is not None and self.marker not in storage:
            self.counts.clear()
            self.cache.set("gateway-counters", 1, None)
        window = int(time.time() // WINDOW_S)
        if window != self.window:
            # Keys end with their window: keep the current and the last one only.
            keep = (f":{window}", f":{window - 1}")
            self.counts = {k: v for k, v in self.counts.items() if k.endswith(keep)}
            self.window = window
        return self.counts

    async def check(self, keys, count_requests):
        counts = self._current()
        tenant_n = caller_n = 0
        if count_requests[0]:
            tenant_n = counts[keys[0]] = counts.get(keys[0], 0) + 1
        if count_requests[1]:
            caller_n = counts[keys[1]] = counts.get(keys[1], 0) + 1
        return tenant_n, caller_n, counts.get(keys[2], 0), counts.get(keys[3], 0)

    def add_tokens(self, keys, tokens) -> None:
        counts = self._current()
        for key in keys:
            counts[key] = counts.get(key, 0) + tokens


class _DjangoCache(_Counters):
    """Any other cache backend (database, files, memcached): through a thread."""

    def __init__(self) -> None:
        from django.core.cache import caches

        self.cache = caches.create_connection("default")

    def _incr(self, key: str, delta: int) -> int:
        try:
            return self.cache.incr(key, delta)
        except ValueError:
            if self.cache.add(key, delta, timeout=KEY_TTL_S):
                return delta
            return self.cache.incr(key, delta)

    def _check(self, keys, count_requests) -> tuple[int, int, int, int]:
        tenant_n = self._incr(keys[0], 1) if count_requests[0] else 0
        caller_n = self._incr(keys[1], 1) if count_requests[1] else 0
        tokens = self.cache.get_many(keys[2:])
        return tenant_n, caller_n, tokens.get(keys[2], 0), tokens.get(keys[3], 0)

    def _add(self, keys, tokens) -> None:
        for key in keys:
            self._incr(key, tokens)

    async def check(self, keys, count_requests):
        return await run_db(self._check, keys, count_requests)

    def add_tokens(self, keys, tokens) -> None:
        from mmodel.gateway.db import fire_and_forget

        fire_and_forget(self._add, keys, tokens)


class _Redis(_Counters):
    def __init__(self, url: str) -> None:
        self.url = url
        self._clients: dict[int, Any] = {}
        self._tasks: set[asyncio.Task] = set()

    def _client(self):
        import redis.asyncio as redis

        loop = asyncio.get_running_loop()
        client = self._clients.get(id(loop))
        if client is None:
            client = self._clients[id(loop)] = redis.Redis.from_url(self.url)
        return client

    async def check(self, keys, count_requests):
        pipe = self._client().pipeline(transaction=False)
        for key, counted in zip(keys[:2], count_requests, strict=True):
            if counted:
                pipe.incr(REDIS_PREFIX + key)
                pipe.expire(REDIS_PREFIX + key, KEY_TTL_S)
        pipe.mget([REDIS_PREFIX + keys[2], REDIS_PREFIX + keys[3]])
        results = await pipe.execute()
        it = iter(results)
        tenant_n = next(it) if count_requests[0] else 0
        if count_requests[0]:
            next(it)
        caller_n = next(it) if count_requests[1] else 0
        if count_requests[1]:
            next(it)
        tokens = next(it)
        return tenant_n, caller_n, int(tokens[0] or 0), int(tokens[1] or 0)

    def add_tokens(self, keys, tokens) -> None:
        async def add() -> None:
            pipe = self._client().pipeline(transaction=False)
            for key in keys:
                pipe.incrby(REDIS_PREFIX + key, tokens)
                pipe.expire(REDIS_PREFIX + key, KEY_TTL_S)
            await pipe.execute()

        task = asyncio.get_running_loop().create_task(add())
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("gateway: could not count tokens in Redis: %s", task.exception())


_counters: _Counters | None = None


def counters() -> _Counters:
    global _counters
    if _counters is None:
        config = settings.CACHES["default"]
        backend = config["BACKEND"]
        if backend.endswith("RedisCache"):
            location = config["LOCATION"]
            _counters = _Redis(location[0] if isinstance(location, list) else location)
        elif backend.endswith("LocMemCache"):
            _counters = _InProcess()
        else:
            _counters = _DjangoCache()
    return _counters


def reset() -> None:
    """Choose the backend again from the settings (tests)."""
    global _counters
    _counters = None


def _keys(route: Route, caller: Caller, window: int) -> tuple[str, str, str, str]:
    # A caller's counters are kept per tenant: its limits are that tenant's.
    tenant = f"T{route.tenant_id}"
    return (f"r:{tenant}:{window}", f"r:{tenant}:{caller.limit_key}:{window}",
            f"k:{tenant}:{window}", f"k:{tenant}:{caller.limit_key}:{window}")


async def check(route: Route, caller: Caller) -> tuple[str, str]:
    """Count this request; raise 429 if a limit is reached. Answers the keys its tokens are
    added to when it ends."""
    limits = route.limits
    now = time.time()
    window = int(now // WINDOW_S)
    window_end = (window + 1) * WINDOW_S
    keys = _keys(route, caller, window)
    counted = (limits.tenant_rpm > 0, limits.token_rpm > 0)
    tenant_n, caller_n, tenant_tokens, caller_tokens = await counters().check(keys, counted)
    who_caller = "this API token" if caller.token_id is not None else "your user"
    tenant = f"tenant {route.tenant_name}"
    if counted[0] and tenant_n > limits.tenant_rpm:
        raise _refused("requests", tenant, limits.tenant_rpm, window_end)
    if counted[1] and caller_n > limits.token_rpm:
        raise _refused("requests", f"{who_caller} in {tenant}", limits.token_rpm, window_end)
    if limits.tenant_tpm > 0 and tenant_tokens >= limits.tenant_tpm:
        raise _refused("tokens", tenant, limits.tenant_tpm, window_end)
    if limits.token_tpm > 0 and caller_tokens >= limits.token_tpm:
        raise _refused("tokens", f"{who_caller} in {tenant}", limits.token_tpm, window_end)
    return keys[2], keys[3]


def add_tokens(keys: tuple[str, str], tokens: int) -> None:
    """Add a finished request's tokens to the current window (its own keys' window may have
    ended; the tokens then count in the new one, where they were mostly spent)."""
    if tokens <= 0:
        return
    window = int(time.time() // WINDOW_S)
    current = tuple(key.rsplit(":", 1)[0] + f":{window}" for key in keys)
    try:
        counters().add_tokens(current, tokens)  # type: ignore[arg-type]
    except Exception:
        logger.exception("gateway: could not count tokens")
