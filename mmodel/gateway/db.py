"""The gateway's database work (routing table loads, credential look-ups on a cache miss,
batched writes, calls into the deployment services) runs in a few threads of its own, never on
the event loop and never in the thread Django's sync views share."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

logger = logging.getLogger("mmodel.gateway")

T = TypeVar("T")

_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-db")
# Fire-and-forget calls still running (a reference keeps their futures alive).
_background: set[asyncio.Future] = set()


def _in_thread(fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
    from django.db import close_old_connections

    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()


async def run_db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor, _in_thread, fn, args, kwargs)


def db_calls_in_flight() -> set[asyncio.Future]:
    """The fire-and-forget calls not finished yet."""
    return set(_background)


def fire_and_forget(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Run `fn` in a database thread without waiting; failures are logged."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_executor, _in_thread, fn, args, kwargs)
    _background.add(future)

    def done(f: asyncio.Future) -> None:
        _background.discard(f)
        if not f.cancelled() and f.exception() is not None:
            logger.error("gateway: %s failed", getattr(fn, "__name__", fn),
                         exc_info=f.exception())

    future.add_done_callback(done)
