"""The client to the model servers: one aiohttp session per event loop, its connections kept
alive, and how a server's failures are told apart."""

from __future__ import annotations

import asyncio

import aiohttp

CONNECT_TIMEOUT_S = 5.0
# Below the model servers' own keep-alive (uvicorn's 5 s), so a pooled connection is never one
# the server is closing.
KEEPALIVE_S = 4.0

# Nothing was sent: another replica may take the request.
REFUSED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
# A pooled connection the server dropped before answering: the request may be sent again.
DROPPED = (aiohttp.ServerDisconnectedError,)
FAILED = (aiohttp.ClientError, asyncio.TimeoutError)

_last: tuple[asyncio.AbstractEventLoop | None, aiohttp.ClientSession | None] = (None, None)
_sessions: dict[int, aiohttp.ClientSession] = {}


def session() -> aiohttp.ClientSession:
    global _last
    loop = asyncio.get_running_loop()
    cached_loop, cached = _last
    if cached_loop is loop and cached is not None and not cached.closed:
        return cached
    client = _sessions.get(id(loop))
    if client is None or client.closed:
        client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S,
                                           ttl_dns_cache=60),
            # No read timeout (a timer per read costs on every chunk): a generation runs as long
            # as it runs, and a client that gives up cuts it off (the app watches for that).
            timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S),
            cookie_jar=aiohttp.DummyCookieJar(),  # model servers set none worth keeping
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            trust_env=False,  # never route model servers through an HTTP(S)_PROXY
        )
        _sessions[id(loop)] = client
    _last = (loop, client)
    return client


async def close() -> None:
    """Close this loop's session (the server is stopping)."""
    global _last
    loop = asyncio.get_running_loop()
    client = _sessions.pop(id(loop), None)
    if _last[0] is loop:
        _last = (None, None)
    if client is not None and not client.closed:
        await client.close()
