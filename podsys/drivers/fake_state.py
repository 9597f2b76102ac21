"""Fakes that several processes share: a fake cluster's or simulated cloud's state in a file,
on the wall clock.

`manage.py runplatform` runs the web server, a worker of several processes and beat, and each
would otherwise hold its own in-memory fake: a job launched by one worker process would be
unknown to the next. With `OGAI_FAKE_STATE_DIR` set (by default DATA_DIR/fakes),
`fake_cluster` and `simulated_cloud` hand out a `SharedFake`: each call takes the file's lock,
loads the state, moves its clock on by the wall-clock time since the last call, runs the call
and saves the state. Set empty (the tests' own processes), fakes live in memory and only the
tests move their clocks.

The state is pickled: the folder is the platform's own, created private like its data folder,
and never a user's.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def shared_state_dir() -> Path | None:
    """Where shared fakes keep their state (`OGAI_FAKE_STATE_DIR`), or None: in memory."""
    from django.conf import settings

    found = getattr(settings, "OGAI_FAKE_STATE_DIR", "")
    return Path(found) if found else None


def state_file(folder: Path, kind: str, name: str) -> Path:
    """The state file of the fake `name` of `kind` ("cluster", "cloud")."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return folder / f"{kind}-{safe}.pickle"


@dataclass
class _State:
    fake: Any
    wall: float  # the wall-clock time its clock last moved to


class SharedFake:
    """A proxy for the fake in `path`, created by `create` if the file does not exist yet.
    Methods run under the file's lock on freshly loaded state; reading an attribute returns its
    current value."""

    def __init__(self, path: Path, kind: type, create: Callable[[], Any],
                 clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._kind = kind
        self._create = create
        self._clock = clock
        if not path.exists():  # created now, so the first creator's options apply
            with self._held():
                pass

    @contextmanager
    def _held(self) -> Iterator[Any]:
        self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self._path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = self._load()
                yield state.fake
                self._save(state)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _load(self) -> _State:
        now = self._clock()
        try:
            with open(self._path, "rb") as saved:
                state: _State = pickle.load(saved)  # noqa: S301 - the platform's own file
        except FileNotFoundError:
            return _State(self._create(), now)
        if now > state.wall:
            state.fake.advance(now - state.wall)
            state.wall = now
        return state

    def _save(self, state: _State) -> None:
        handle, temporary = tempfile.mkstemp(dir=self._path.parent, prefix=".state-")
        try:
            with os.fdopen(handle, "wb") as out:
                pickle.dump(state, out)
            os.replace(temporary, self._path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if callable(getattr(self._kind, name, None)):
            def call(*args: Any, **kwargs: Any) -> Any:
                with self._held() as fake:
                    return getattr(fake, name)(*args, **kwargs)
            return call
        with self._held() as fake:
            return getattr(fake, name)
