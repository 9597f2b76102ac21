"""The platform's own log lines on their way to the store: a bounded buffer and its flusher.

Logging never waits for the store. A line goes into this process's buffer (at most
OGAI_LOGS_BUFFER_LINES); a thread sends what is there in batches every second. When the store
is slow or down, lines wait in the buffer; when the buffer is full, new lines are dropped and
counted, and the count reaches the store (and /metrics) with the next batch that gets through.
The lines still go to stdout as JSON whatever happens here.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque

from aistation.logstore.base import LogLine, StoreDown

logger = logging.getLogger("aistation.logstore.buffer")
BATCH = 2000
FLUSH_S = 1.0


class LineBuffer:
    def __init__(self, capacity: int, source: str) -> None:
        self.capacity = capacity
        self.source = source
        self._lines: deque[LogLine] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self.dropped = 0  # since this process started
        self._unreported = 0  # dropped and not yet added to the store's count
        self.failures = 0
        # A forked child (a prefork worker) starts with a fresh lock and no flusher: the
        # parent's lock may have been held at the fork, and its thread is not the child's.
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None

    def __len__(self) -> int:
        return len(self._lines)

    @property
    def unreported(self) -> int:
        return self._unreported

    def put(self, line: LogLine) -> bool:
        with self._lock:
            if len(self._lines) >= self.capacity:
                self.dropped += 1
                self._unreported += 1
                return False
            self._lines.append(line)
        return True

    def flush(self, store) -> int:
        """Send everything buffered now; on StoreDown the batch goes back to the front (as much
        as fits) and the error is raised. Returns the lines sent."""
        sent = 0
        while True:
            with self._lock:
                batch = [self._lines.popleft() for _ in range(min(BATCH, len(self._lines)))]
                unreported, self._unreported = self._unreported, 0
            if not batch and not unreported:
                return sent
            try:
                store.append(batch)
                if unreported:
                    store.add_dropped(self.source, unreported)
            except StoreDown:
                self.failures += 1
                with self._lock:
                    room = max(0, self.capacity - len(self._lines))
                    kept = batch[:room]
                    self._lines.extendleft(reversed(kept))
                    lost = len(batch) - len(kept)
                    self.dropped += lost
                    self._unreported += unreported + lost
                raise
            sent += len(batch)

    def start(self, store_getter) -> None:
        """Run the flusher in this process (again after a fork: threads do not survive it)."""
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._pid == os.getpid() \
                    and self._thread.is_alive():
                return
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, args=(store_getter,),
                                            name="ogai-log-flusher", daemon=True)
            self._thread.start()

    def _run(self, store_getter) -> None:
        while True:
            self._wake.wait(FLUSH_S)
            self._wake.clear()
            try:
                self.flush(store_getter())
            except StoreDown:
                pass  # kept in the buffer (or counted as dropped): tried again next time
            except Exception:  # never let the flusher die; say so on stderr only
                logger.exception("sending platform log lines failed")
