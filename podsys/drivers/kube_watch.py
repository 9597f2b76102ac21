"""Following a Kubernetes cluster's objects with watches instead of listing them on every
reconcile: the Kubernetes driver's view of its pods, Jobs, Deployments and nodes.

An `Informer` follows one collection (an API path and a label or field selector), as client-go's
informers do: one list (its items and its resourceVersion), then a watch from that version in a
daemon thread, applying ADDED, MODIFIED and DELETED events in order to a store of the objects
(raw JSON dicts, keyed by namespace/name, indexed by the workload label) and moving its version
on with every event and BOOKMARK. Watches ask for bookmarks (`allowWatchBookmarks`) and end
after a few minutes (`timeoutSeconds`), to be opened again from the last version seen; a
dropped connection is resumed the same way, after a capped exponential backoff with jitter.
A version too old for the server (410 Gone: an HTTP 410 answer, or, as real API servers send
it, an ERROR event whose Status has code 410) forces a clean list again: objects deleted in the
gap leave the store. (The client's own `kubernetes.watch.Watch` does not fit: on a 410 it
retries once from the same version and then raises, and with `deserialize=False` it reads an
ERROR event's `raw_object`, which only deserialized events carry.)

A managed object (one with the workload label) that is deleted is kept as a tombstone, its last
state, for `TOMBSTONE_TTL_S` and at most `TOMBSTONE_MAX` of them: a Job whose pods succeed and
which is then deleted before the next reconcile still reads as ended, where a list would find
nothing at all.

The store is eventually consistent. Before the driver answers from it, `ClusterWatch.sync`
reads each collection's current resourceVersion cheaply (a list with `limit=1` and the same
selector) and waits, at most `watch_lag_s`, until the informer has applied events or a bookmark
up to it; what has not arrived by then is answered at the next reconcile (and tombstones keep
every end until it is read). resourceVersions are opaque in principle; Kubernetes' are etcd
revisions, integers, and are compared as such when both are digits; otherwise the informer
counts as caught up only when it holds exactly that version, and the wait ends at
`watch_lag_s`. A real API server sends bookmarks about once a minute, and an informer is only
told of its own collection's changes: when nothing it watches changed but the cluster's
version moved on (another kind's objects did), the wait ends by `watch_lag_s`, not earlier.
The fake API server of the tests sends a bookmark soon after the version advances. When a
watch is down (the server unreachable, or refusing watches) and the informer did not catch up,
the collection is listed again there and then, so an answer is never staler than a list.

Watches live in a per-process registry keyed by the cluster's name and a fingerprint of its
connection options, so a worker process keeps them from one task to the next (drivers are made
per call). They start on first use in the process that uses them (threads never cross a fork:
a forked child, as Celery's prefork pool makes, starts its own), and stop after `watch_idle_s`
without a read, or all at once with `stop_all` (the tests do, after each test).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

TOMBSTONE_TTL_S = 900.0
TOMBSTONE_MAX = 10_000
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 30.0
WATCH_TIMEOUT_S = (240, 480)  # a watch ends after a random time in this range, then resumes
CONNECT_TIMEOUT_S = 10.0
FAILURES_BEFORE_WARNING = 5  # consecutive failures logged at debug level before a warning

Obj = dict[str, Any]
Key = tuple[str, str]
# How a list is made in the caller's thread: listing("list pods", fn) returns fn()'s answer.
Listing = Callable[[str, Callable[[], Any]], Any]


class Gone(Exception):
    """The server no longer has the version asked for (410): list again."""


@dataclass(frozen=True)
class WatchOptions:
    """The driver options about watches, checked."""

    watch: bool = True
    lag_s: float = 0.5
    idle_s: float = 600.0

    @classmethod
    def from_options(cls, options: dict) -> WatchOptions:
        watch = options.get("watch", True)
        if not isinstance(watch, bool):
            raise ValueError(f"option 'watch' must be true or false, not {watch!r}")
        values = {}
        for name, attr, default in (("watch_lag_s", "lag_s", cls.lag_s),
                                    ("watch_idle_s", "idle_s", cls.idle_s)):
            raw = options.get(name, default)
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise ValueError(f"option {name!r} must be a number of seconds, not {raw!r}")
            if raw < 0 or (attr == "idle_s" and raw == 0):
                wanted = "more than zero" if attr == "idle_s" else "zero or more"
                raise ValueError(f"option {name!r} must be {wanted} seconds, not {raw!r}")
            values[attr] = float(raw)
        return cls(watch=watch, **values)


@dataclass(frozen=True)
class Collection:
    """What an informer follows: a path of the API, a selector, and how to keep its objects."""

    name: str  # "pods", "jobs", ...: the words of error messages ("list pods")
    kind: str  # list items carry no kind: stored objects get it back
    path: str
    label_selector: str = ""
    field_selector: str = ""
    index_label: str = ""  # objects are indexed by this label's value
    slim: Callable[[Obj], Obj] | None = None  # keep only what is read (memory, at 50k pods)

    def query(self) -> list[tuple[str, str]]:
        params = []
        if self.label_selector:
            params.append(("labelSelector", self.label_selector))
        if self.field_selector:
            params.append(("fieldSelector", self.field_selector))
        return params

    def keep(self, obj: Obj) -> Obj:
        obj.setdefault("kind", self.kind)
        obj.get("metadata", {}).pop("managedFields", None)
        return self.slim(obj) if self.slim is not None else obj


def newer(version: str, than: str) -> bool:
    """Whether resourceVersion `version` is at least `than` (see the module docstring)."""
    if version.isdigit() and than.isdigit():
        return int(version) >= int(than)
    return version == than


def key_of(obj: Obj) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


class Store:
    """One collection's objects by namespace/name and by their index label's value, and the
    last state of the deleted ones that carried that label (tombstones)."""

    def __init__(self, collection: Collection, version: str = "") -> None:
        self.collection = collection
        self.objects: dict[Key, Obj] = {}
        self.index: dict[str, dict[Key, Obj]] = {}
        self.tombstones: OrderedDict[Key, tuple[float, Obj]] = OrderedDict()
        self.version = version

    @classmethod
    def of(cls, collection: Collection, items: Iterable[Obj], version: str) -> Store:
        store = cls(collection, version)
        for item in items:
            store.put(collection.keep(item))
        return store

    def _label(self, obj: Obj) -> str:
        if not self.collection.index_label:
            return ""
        return (obj["metadata"].get("labels") or {}).get(self.collection.index_label, "")

    def put(self, obj: Obj) -> None:
        key = key_of(obj)
        old = self.objects.get(key)
        if old is not None:
            self._unindex(key, old)
        self.objects[key] = obj
        self.tombstones.pop(key, None)
        if label := self._label(obj):
            self.index.setdefault(label, {})[key] = obj

    def _unindex(self, key: Key, obj: Obj) -> None:
        label = self._label(obj)
        if label and label in self.index:
            self.index[label].pop(key, None)
            if not self.index[label]:
                del self.index[label]

    def delete(self, obj: Obj) -> None:
        """Remove an object, keeping its last state when it carries the index label."""
        key = key_of(obj)
        old = self.objects.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        if self._label(obj):
            self.tombstones[key] = (time.monotonic(), obj)
            self.tombstones.move_to_end(key)
            self.expire()

    def expire(self) -> None:
        limit = time.monotonic() - TOMBSTONE_TTL_S
        while self.tombstones and (len(self.tombstones) > TOMBSTONE_MAX
                                   or next(iter(self.tombstones.values()))[0] < limit):
            self.tombstones.popitem(last=False)

    def replace(self, fresh: Store) -> None:
        """Take a new list's objects; those no longer there become tombstones."""
        for key, obj in self.objects.items():
            if key not in fresh.objects:
                fresh.delete(obj)
        for key, kept in self.tombstones.items():
            if key not in fresh.objects and key not in fresh.tombstones:
                fresh.tombstones[key] = kept
        self.objects, self.index = fresh.objects, fresh.index
        self.tombstones = OrderedDict(sorted(fresh.tombstones.items(), key=lambda i: i[1][0]))
        self.version = fresh.version
        self.expire()

    def labelled(self, label: str) -> list[Obj]:
        return list(self.index.get(label, {}).values())

    def ended(self, label: str) -> list[Obj]:
        """The tombstones of one index label's objects."""
        return [obj for _, obj in self.tombstones.values() if self._label(obj) == label]


class Transport:
    """Raw GETs through the client's ApiClient (its authentication and TLS): the JSON of a
    list as dicts, or the streaming response of a watch."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def get(self, path: str, query: list[tuple[str, str]], timeout: Any = None) -> Any:
        return self.api.call_api(
            path, "GET", query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], response_types_map={},
            _return_http_data_only=True, _preload_content=False, _request_timeout=timeout)

    def list(self, collection: Collection, limit: int = 0) -> Obj:
        query = collection.query()
        if limit:
            query.append(("limit", str(limit)))
        response = self.get(collection.path, query)
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()

    def version(self, collection: Collection) -> str:
        """The collection's current resourceVersion, from a list of at most one item."""
        return str(self.list(collection, limit=1).get("metadata", {}).get("resourceVersion", ""))

    def watch(self, collection: Collection, version: str, timeout_s: int) -> Any:
        query = [*collection.query(), ("watch", "true"), ("resourceVersion", version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout_s))]
        return self.get(collection.path, query,
                        timeout=(CONNECT_TIMEOUT_S, timeout_s + CONNECT_TIMEOUT_S))


def events(response: Any) -> Iterable[Obj]:
    """The events of a watch response, one JSON object a line."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)


class Informer:
    """One collection, listed once and then watched in a daemon thread (see the module
    docstring). `lock` guards `store`: hold it while reading."""

    def __init__(self, collection: Collection, transport: Transport, *,
                 listing: Listing | None = None) -> None:
        self.collection = collection
        self.transport = transport
        # How the first list (and a list when the watch is down) is made in the caller's
        # thread: the driver wraps it in its retries and error words.
        self.listing: Listing = listing or (lambda what, fn: fn())
        self.store = Store(collection)
        self.lock = threading.Condition()
        self.connected = False  # the watch is open
        self.failures = 0  # consecutive
        self.watches = 0  # watch requests made
        self.lists = 0  # lists made (the first, after a 410, while the watch was down)
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None

    # -- the caller's side ---------------------------------------------------------------------

    def start(self) -> None:
        """The first list, in the caller's thread (its errors are the caller's), then the
        watch in the background."""
        self.relist(self.listing(f"list {self.collection.name}",
                                 lambda: self.transport.list(self.collection)))
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"kube-watch:{self.collection.name}")
        self._thread.start()

    def relist(self, listed: Obj) -> None:
        fresh = Store.of(self.collection, listed.get("items") or [],
                         str(listed.get("metadata", {}).get("resourceVersion", "")))
        with self.lock:
            self.store.replace(fresh)
            self.lists += 1
            self.lock.notify_all()

    def wait_for(self, version: str, deadline: float) -> bool:
        """Wait until the store holds `version` (or later), at most until `deadline`."""
        with self.lock:
            while not newer(self.store.version, version):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.lock.wait(left)
            return True

    def sync(self, deadline: float) -> None:
        """Bring the store up to the collection's current version, by the watch when it is
        up (waiting at most until `deadline`), else by listing now."""
        version = self.listing(f"list {self.collection.name}",
                               lambda: self.transport.version(self.collection))
        if self.wait_for(version, deadline):
            return
        if not self.connected:
            self.relist(self.listing(f"list {self.collection.name}",
                                 lambda: self.transport.list(self.collection)))

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:  # wake the thread out of its read
            with contextlib.suppress(Exception):
                response.shutdown()
        with self.lock:
            self.lock.notify_all()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the watch thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_once()
            except Gone:
                self._relist_in_thread()
                continue
            except Exception as exc:  # any failure: back off, then resume from the version
                self._failed(exc)
            else:
                continue
            self._stop.wait(self._backoff())

    def _relist_in_thread(self) -> None:
        try:
            self.relist(self.transport.list(self.collection))
        except Exception as exc:
            self._failed(exc)
            self._stop.wait(self._backoff())

    def _failed(self, exc: Exception) -> None:
        self.connected = False
        if self._stop.is_set():
            return
        self.failures += 1
        level = logging.WARNING if self.failures == FAILURES_BEFORE_WARNING else logging.DEBUG
        logger.log(level, "watch of %s failed (%d in a row): %s", self.collection.name,
                   self.failures, _words(exc))

    def _backoff(self) -> float:
        """Capped exponential, with jitter (half to all of it)."""
        ceiling = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(self.failures - 1, 0))
        return ceiling * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret

    def _watch_once(self) -> None:
        with self.lock:
            version = self.store.version
        timeout_s = random.randint(*WATCH_TIMEOUT_S)  # noqa: S311 - spread, not a secret
        self.watches += 1
        try:
            response = self.transport.watch(self.collection, version, timeout_s)
        except Exception as exc:
            if getattr(exc, "status", None) == 410:  # Gone, as an HTTP answer
                raise Gone(str(getattr(exc, "reason", "Gone"))) from None
            raise
        self._response = response
        try:
            if self._stop.is_set():
                return
            self.connected = True
            for event in events(response):
                if self._stop.is_set():
                    return
                self._apply(event)
                self.failures = 0
        finally:
            self._response = None
            self.connected = False
            with contextlib.suppress(Exception):  # a watch's connection is not reused
                response.close()
                response.release_conn()

    def _apply(self, event: Obj) -> None:
        type_, obj = event.get("type"), event.get("object") or {}
        if type_ == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message", "410 Gone"))
            raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
        version = str(obj.get("metadata", {}).get("resourceVersion", ""))
        with self.lock:
            comparable = version.isdigit() and self.store.version.isdigit()
            if comparable and int(version) <= int(self.store.version):
                return  # already in the store (a list made since, while the watch was down)
            if type_ in ("ADDED", "MODIFIED"):
                self.store.put(self.collection.keep(obj))
            elif type_ == "DELETED":
                self.store.delete(self.collection.keep(obj))
            elif type_ != "BOOKMARK":
                return
            if version:
                self.store.version = version
            self.lock.notify_all()


def _words(exc: Exception) -> str:
    """An error in a few words, never a request's headers (they carry the token)."""
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"{type(exc).__name__} {status} {reason or ''}".strip()
    return type(exc).__name__


# -- the registry ---------------------------------------------------------------------------------


@dataclass
class ClusterWatch:
    """A cluster's informers, started one by one as they are first needed."""

    transport: Transport
    idle_s: float
    informers: dict[str, Informer] = field(default_factory=dict)
    last_read: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # What the driver derived from the stores, by the objects' resourceVersions (so a reconcile
    # recomputes only what changed); read and written under the informers' locks.
    memo: dict[str, dict] = field(default_factory=dict)

    def informer(self, collection: Collection,
                 listing: Listing | None = None) -> Informer:
        self.last_read = time.monotonic()
        with self.lock:
            found = self.informers.get(collection.name)
            if found is None or not found.alive:
                found = Informer(collection, self.transport, listing=listing)
                found.start()
                self.informers[collection.name] = found
            return found

    def sync(self, collections: list[Collection], lag_s: float,
             listing: Listing | None = None) -> dict[str, Informer]:
        """Each collection's informer, its store brought up to the collection's current
        version (see the module docstring). Read a store under its informer's lock."""
        deadline = time.monotonic() + lag_s
        found = {}
        for collection in collections:
            informer = self.informer(collection, listing)
            informer.sync(deadline)
            found[collection.name] = informer
        self.last_read = time.monotonic()
        return found

    def stop(self) -> None:
        with self.lock:
            informers = list(self.informers.values())
            self.informers.clear()
        for informer in informers:
            informer.stop()
        for informer in informers:
            informer.join(5)
        with contextlib.suppress(Exception):
            self.transport.api.close()


_watches: dict[tuple[str, str], ClusterWatch] = {}
_registry_lock = threading.Lock()
_registry_pid = os.getpid()
_reaper: threading.Thread | None = None


def fingerprint(options: dict) -> str:
    """What a cluster's watches depend on: its connection options, hashed."""
    connection = {name: options.get(name) for name in ("kubeconfig", "in_cluster")}
    return hashlib.sha256(json.dumps(connection, sort_keys=True, default=str).encode()).hexdigest()


def cluster_watch(cluster: str, options: dict, make_api: Callable[[], Any],
                  idle_s: float) -> ClusterWatch:
    """This process's watches of a cluster, made on first use."""
    global _reaper
    key = (cluster, fingerprint(options))
    with _registry_lock:
        _forget_after_fork()
        found = _watches.get(key)
        if found is None:
            found = _watches[key] = ClusterWatch(Transport(make_api()), idle_s)
        found.idle_s = idle_s
        found.last_read = time.monotonic()
        if _reaper is None or not _reaper.is_alive():
            _reaper = threading.Thread(target=_reap, daemon=True, name="kube-watch-reaper")
            _reaper.start()
        return found


def _forget_after_fork() -> None:
    """A forked child has the parent's registry but none of its threads: start afresh."""
    global _registry_pid, _reaper
    if os.getpid() != _registry_pid:
        _watches.clear()
        _reaper = None
        _registry_pid = os.getpid()


def _reap() -> None:
    """Stop the watches nobody read for their `idle_s`; end when none is left."""
    while True:
        time.sleep(1.0)
        with _registry_lock:
            if os.getpid() != _registry_pid or not _watches:
                return
            now = time.monotonic()
            idle = [key for key, watch in _watches.items() if now - watch.last_read > watch.idle_s]
            stopping = [_watches.pop(key) for key in idle]
        for watch in stopping:
            watch.stop()


def stop_all() -> None:
    """Stop every watch of this process and wait for their threads (for tests and shutdown)."""
    with _registry_lock:
        _forget_after_fork()
        stopping = list(_watches.values())
        _watches.clear()
    for watch in stopping:
        watch.stop()


def running_threads() -> list[threading.Thread]:
    """The watch threads still alive (the tests check none outlives its test)."""
    return [thread for thread in threading.enumerate()
            if thread.name.startswith("kube-watch:") and thread.is_alive()]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forget_after_fork())
