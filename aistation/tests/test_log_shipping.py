"""Job output reaches the log store: every replica and attempt, kept apart, nothing lost
while the store is down; searched through the API inside the caller's tenant."""

import pytest

from aistation.logstore.base import StoreDown
from aistation.models import Attempt
from aistation.services.log_shipping import line_level, logs_ship
from aistation.services.reconcile import reconcile_cluster


@pytest.fixture
def running(farm, log_store):
    """A 2-replica alpha job running on the fake cluster, allowed one restart."""
    job = farm.submit(replicas=2, max_restarts=1, name="trainer")
    farm.cycle()
    job.refresh_from_db()
    return job


def _workload(job, number=None):
    attempts = job.attempts.order_by("-number")
    attempt = attempts.get(number=number) if number else attempts.first()
    return attempt.workload_id


def _search(api, user, **params):
    response = api.as_user(user).get("/api/v1/aistation/logs/", params)
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_every_replica_and_attempt_is_searchable_apart(farm, running, api):
    world = farm.world
    first = _workload(running)
    farm.fake.append_log(first, "step 1 loss 2.5", replica=0)
    farm.fake.append_log(first, "NCCL WARN net ib0 flapped", replica=1)
    logs_ship()
    hits = _search(api, world.alpha_member, q="NCCL", job=running.pk)
    assert [(h["attempt"], h["replica"], h["message"]) for h in hits] == \
        [(1, 1, "NCCL WARN net ib0 flapped")]
    assert hits[0]["line"] == 2  # the fake's first line says where the replica started
    assert hits[0]["level"] == "warning"
    assert hits[0]["highlights"] == [[0, 4]]

    farm.fake.crash(first, replica=1, exit_code=1)
    reconcile_cluster(cluster=farm.cluster)
    farm.cycle()
    second = _workload(running)
    assert second != first
    farm.fake.append_log(second, "NCCL WARN again, attempt 2", replica=1)
    logs_ship()
    found = {(h["attempt"], h["message"]) for h in
             _search(api, world.alpha_member, q="NCCL WARN", job=running.pk)}
    assert found == {(1, "NCCL WARN net ib0 flapped"), (2, "NCCL WARN again, attempt 2")}
    only_second = _search(api, world.alpha_member, q="NCCL", job=running.pk, attempt=2)
    assert [h["attempt"] for h in only_second] == [2]
    # The first attempt ended and was read to its end: it is not read again.
    assert Attempt.objects.get(workload_id=first).logs_shipped


def test_a_second_pass_adds_only_new_lines(farm, running, log_store):
    workload = _workload(running)
    farm.fake.append_log(workload, "one")
    assert logs_ship().lines == 3  # each replica's "started" line, and "one"
    assert logs_ship().lines == 0
    farm.fake.append_log(workload, "two")
    assert logs_ship().lines == 1


def test_store_down_loses_no_lines(farm, running, log_store, monkeypatch):
    workload = _workload(running)
    farm.fake.append_log(workload, "before the outage")
    logs_ship()
    farm.fake.append_log(workload, "during the outage 1")
    farm.fake.append_log(workload, "during the outage 2")

    def down(*_args, **_kwargs):
        raise StoreDown("log store: connection refused")

    with monkeypatch.context() as patch:
        patch.setattr(type(log_store), "append", down)
        with pytest.raises(StoreDown):
            logs_ship()
    logs_ship()
    from aistation.logstore.base import LogQuery, Scope
    from aistation.logstore.query import parse

    found = [h.message for h in log_store.search(LogQuery(
        scope=Scope(tenant_ids=None), phrases=parse("outage"), job_id=running.pk))]
    assert sorted(found) == ["before the outage", "during the outage 1",
                             "during the outage 2"]


def test_other_tenants_find_nothing(farm, running, api):
    world = farm.world
    farm.fake.append_log(_workload(running), "alpha secret token-xyz in NCCL init")
    logs_ship()
    assert _search(api, world.alpha_member, q="secret")
    for params in ({"q": "secret"}, {"q": ""}, {"q": "NCCL", "since": "7d"},
                   {"source": "job"}, {"level": "info"}):
        assert _search(api, world.beta_member, **params) == []
    client = api.as_user(world.beta_member)
    assert client.get("/api/v1/aistation/logs/", {"job": running.pk}).status_code == 404
    around = client.get("/api/v1/aistation/logs/around/", {"job": running.pk, "line": 2})
    assert around.status_code == 404
    histogram = client.get("/api/v1/aistation/logs/histogram/", {"q": "secret"}).json()
    assert histogram["total"] == 0


def test_around_and_histogram(farm, running, api):
    workload = _workload(running)
    for i in range(1, 31):
        farm.fake.append_log(workload, f"line {i}" + (" OOM here" if i == 15 else ""))
    logs_ship()
    client = api.as_user(farm.world.alpha_member)
    hit = _search(api, farm.world.alpha_member, q="OOM")[0]
    around = client.get("/api/v1/aistation/logs/around/", {
        "job": running.pk, "attempt": hit["attempt"], "line": hit["line"], "context": 2,
        "q": "OOM"}).json()
    assert [line["message"] for line in around["lines"]] == \
        ["line 13", "line 14", "line 15 OOM here", "line 16", "line 17"]
    assert around["lines"][2]["highlights"] == [[8, 11]]
    histogram = client.get("/api/v1/aistation/logs/histogram/",
                           {"q": "line", "since": "1h", "buckets": 12}).json()
    assert histogram["total"] == 30 and len(histogram["buckets"]) == 12


@pytest.mark.parametrize("params,field", [
    ({"q": '"open'}, "q"), ({"since": "yesterday"}, "since"), ({"limit": 5000}, "limit"),
    ({"attempt": 2}, "job"), ({"level": "loud"}, "level"),
    ({"since": "1h", "until": "2h"}, "until"),
])
def test_bad_searches_say_what_to_fix(params, field, api, world, log_store):
    response = api.as_user(world.alpha_member).get("/api/v1/aistation/logs/", params)
    assert response.status_code == 400
    assert field in response.json()["fields"]


def test_store_down_answers_503(api, world, log_store, monkeypatch):
    def down(*_args, **_kwargs):
        raise StoreDown("log store: connection refused")

    monkeypatch.setattr(type(log_store), "search", down)
    response = api.as_user(world.alpha_member).get("/api/v1/aistation/logs/", {"q": "x"})
    assert response.status_code == 503
    assert response.json()["code"] == "log_store_unavailable"


def test_levels_follow_the_words():
    assert line_level("Traceback (most recent call last):") == "error"
    assert line_level("NCCL WARN Call to connect returned") == "warning"
    assert line_level("RuntimeError: CUDA error: an illegal memory access") == "error"
    assert line_level("step 10 loss 2.3") == "info"
    assert line_level("no errors found") == "info"


class _RecordingStore:
    """Takes appends from several threads; the second writer's fails when told to."""

    def __init__(self, fail_with=None, together=1):
        import threading

        self.writers = 2
        self.appends = []
        self.fail_with = fail_with
        self._lock = threading.Lock()
        self._together = threading.Barrier(together, timeout=10)

    def append(self, lines, cursors=None):
        import threading

        self._together.wait()  # with together=2: only if two appends run at once
        with self._lock:
            if self.fail_with and self.appends:
                raise self.fail_with
            self.appends.append((threading.current_thread().name, list(lines),
                                 dict(cursors)))


def _pending(sizes):
    from datetime import UTC, datetime

    from aistation.logstore.base import Cursor, LogLine

    return {f"w/{replica}": ([LogLine(ts=datetime.now(UTC), message=f"r{replica} {n}",
                                      replica=replica, line_no=n) for n in range(1, size + 1)],
                             Cursor(offset=size * 10, line_no=size))
            for replica, size in enumerate(sizes)}


def test_big_passes_are_written_by_several_writers_each_replica_whole():
    from aistation.services.log_shipping import store_pending

    store = _RecordingStore(together=2)
    store_pending(store, _pending([3000, 2000, 1500, 10]))
    assert len(store.appends) == 2
    for _thread, lines, cursors in store.appends:
        # A replica's lines and its cursor always travel in the same transaction.
        assert {f"w/{line.replica}" for line in lines} == set(cursors)
    assert sorted(len(lines) for _t, lines, _c in store.appends) == [3010, 3500]
    small = _RecordingStore()
    store_pending(small, _pending([10, 20]))
    assert len(small.appends) == 1  # not worth a second transaction


def test_a_failing_writer_keeps_what_the_other_committed():
    from aistation.services.log_shipping import store_pending

    store = _RecordingStore(fail_with=StoreDown("log store: connection reset"))
    with pytest.raises(StoreDown):
        store_pending(store, _pending([3000, 3000]))
    assert len(store.appends) == 1  # one replica's lines and cursor are in, the other's not
