"""Events from a runner to the platform.

Every event is printed to stdout as `OGAI-EVENT {json}` (so the job log shows it) and, when the job
was given OGAI_URL and OGAI_RUN_TOKEN, queued for a background thread that POSTs batches to the
platform. The run never waits on the network: when the platform is unreachable or answers 5xx/429
the events stay queued and are sent later, in order; a 4xx answer drops that batch with one line.
"""

import contextlib
import json
import os
import sys
import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["EVENTS_PATH", "Reporter"]

EVENTS_PATH = "/api/v1/ylink/runner/events/"
EVENT_PREFIX = "OGAI-EVENT "


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Reporter:
    """Sends runner events; see the module docstring. Thread-safe."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        enabled: bool = True,
        path: str = EVENTS_PATH,
        batch_size: int = 200,
        interval: float = 1.0,
        initial_backoff: float = 1.0,
        max_backoff: float = 30.0,
        request_timeout: float = 10.0,
        max_queue: int = 100_000,
        stdout: TextIO | None = None,
    ):
        self.enabled = enabled
        # Each layer's runners report to their own endpoint (`path`).
        self.url = url.rstrip("/") + path if (url and token and enabled) else None
        self.token = token
        self.batch_size = batch_size
        self.interval = interval
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.request_timeout = request_timeout
        self.max_queue = max_queue
        self._stdout = stdout
        self.dropped = 0  # events dropped because the queue was full
        self.refused = 0  # events the platform refused (4xx)
        self._queue: deque[tuple[int, dict]] = deque()
        self._seq = 0
        self._in_flight = 0  # highest seq of the batch being posted, 0 when none
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._thread: threading.Thread | None = None
        if self.url:
            self._thread = threading.Thread(target=self._loop, name="ogai-reporter", daemon=True)
            self._thread.start()

    @classmethod
    def from_env(cls, *, enabled: bool = True, **kwargs: Any) -> "Reporter":
        """Posts to OGAI_URL with OGAI_RUN_TOKEN when both are set; otherwise only prints.
        Ranks other than 0 pass enabled=False and report nothing."""
        return cls(
            os.environ.get("OGAI_URL") or None,
            os.environ.get("OGAI_RUN_TOKEN") or None,
            enabled=enabled,
            **kwargs,
        )

    # -- public API -------------------------------------------------------------------------
    def send(self, kind: str, **data: Any) -> None:
        """Prints the event and queues it for the platform. Never blocks on the network and
        never raises."""
        if not self.enabled:
            return
        try:
            event = {"kind": kind, "at": _now(), "data": data}
            line = EVENT_PREFIX + json.dumps(event, default=str, separators=(",", ":"))
            self._print(line)
            if self.url is None:
                return
            with self._lock:
                self._seq += 1
                self._queue.append((self._seq, event))
                if len(self._queue) > self.max_queue:
                    self._shed()
                if len(self._queue) >= self.batch_size:
                    self._wake.notify_all()
        except Exception as exc:  # a report must never break the run
            self._print(f"OGAI reporter: could not record a {kind!r} event: {exc}")

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def flush(self, timeout: float = 10.0) -> bool:
        """Waits until every queued event is delivered (or dropped); True when none is left."""
        if self.url is None:
            return True
        deadline = time.monotonic() + timeout
        with self._lock:
            self._wake.notify_all()
            while self._queue:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._wake.wait(min(left, 0.05))
            return True

    def close(self, timeout: float = 60.0) -> None:
        """Flushes what it can within `timeout`, then stops the background thread."""
        if self.url is None:
            return
        delivered = self.flush(timeout)
        with self._lock:
            self._stop = True
            left = len(self._queue)
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.request_timeout + 1)
            self._thread = None
        if not delivered and left:
            self._print(f"OGAI reporter: {left} events could not be delivered to the platform")

    # -- internals --------------------------------------------------------------------------
    def _print(self, line: str) -> None:
        stream = self._stdout or sys.stdout
        with contextlib.suppress(Exception):  # a closed stdout must not break the run
            stream.write(line + "\n")
            stream.flush()

    def _shed(self) -> None:
        """Queue over its bound (lock held): drop the oldest metric event not being posted,
        else the oldest event not being posted."""
        victim = None
        for position, (seq, event) in enumerate(self._queue):
            if seq <= self._in_flight:
                continue
            if event["kind"] == "metric":
                victim = position
                break
            if victim is None:
                victim = position
        if victim is not None:
            del self._queue[victim]
            self.dropped += 1

    def _next_batch(self) -> list[tuple[int, dict]]:
        return [item for _, item in zip(range(self.batch_size), self._queue, strict=False)]

    def _loop(self) -> None:
        import httpx

        backoff = self.initial_backoff
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(timeout=self.request_timeout, headers=headers) as client:
            while True:
                with self._lock:
                    if not self._queue and not self._stop:
                        self._wake.wait(self.interval)
                    if not self._queue:
                        if self._stop:
                            return
                        continue
                    batch = self._next_batch()
                    self._in_flight = batch[-1][0]
                outcome, detail = self._post(client, [event for _, event in batch])
                with self._lock:
                    self._in_flight = 0
                    if outcome in ("ok", "refused"):
                        last = batch[-1][0]
                        while self._queue and self._queue[0][0] <= last:
                            self._queue.popleft()
                        self._wake.notify_all()
                    stopping = self._stop
                if outcome == "refused":
                    self.refused += len(batch)
                    self._print(
                        f"OGAI reporter: the platform refused {len(batch)} events ({detail}); "
                        "dropped them"
                    )
                if outcome == "retry":
                    if stopping:
                        return
                    with self._lock:
                        self._wake.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                else:
                    backoff = self.initial_backoff

    def _post(self, client: Any, events: list[dict]) -> tuple[str, str]:
        try:
            response = client.post(self.url, json={"events": events})
        except Exception as exc:  # network errors, timeouts: keep the events
            return "retry", f"{type(exc).__name__}: {exc}"
        status = response.status_code
        if 200 <= status < 300:
            return "ok", ""
        if status == 429 or status >= 500 or status < 400:
            return "retry", f"HTTP {status}"
        body = response.text.strip().replace("\n", " ")[:300]
        return "refused", f"HTTP {status}: {body}" if body else f"HTTP {status}"
