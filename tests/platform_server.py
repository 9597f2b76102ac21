"""The platform's ASGI app (Django and the gateway) under uvicorn in a thread, for tests that
call it as clients do (the `openai` client through the gateway)."""

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def platform_server() -> Iterator[str]:
    """Yields the server's base URL; stops it on leaving."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config("ogai.asgi:application", host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the platform's server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
