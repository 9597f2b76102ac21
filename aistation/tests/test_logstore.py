"""The log store's contract, on the backend the tests' database uses (SQLite here by default,
PostgreSQL in CI) and on SQLite always."""

import threading
import time
from datetime import UTC, date, datetime, timedelta

import pytest

from aistation.logstore.base import Cursor, LogLine, LogQuery, Scope
from aistation.logstore.query import QueryError, highlight_spans, matches, parse
from aistation.logstore.sqlite import SqliteLogStore

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
ALPHA, BETA = 1, 2
ALL = Scope(tenant_ids=None, platform=True)


@pytest.fixture(params=["configured", "sqlite"])
def store(request, tmp_path, db):
    if request.param == "sqlite":
        found = SqliteLogStore(tmp_path / "logs.sqlite3")
        yield found
        found.close()
    else:
        yield request.getfixturevalue("log_store")


def line(message, *, tenant=ALPHA, job=10, attempt=1, replica=0, line_no=1, ts=NOW, **kw):
    return LogLine(ts=ts, message=message, tenant_id=tenant, job_id=job, attempt=attempt,
                   replica=replica, line_no=line_no, **kw)


def search(store, text="", scope=ALL, **kw):
    return store.search(LogQuery(scope=scope, phrases=parse(text), **kw))


def test_words_and_phrases_match_like_the_query_says(store):
    store.append([
        line("NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory", line_no=1),
        line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20 MiB", line_no=2),
        line("step 10 loss 2.31", line_no=3),
        line("memory out of order", line_no=4),
    ])
    assert [h.line_no for h in search(store, "nccl")] == [1]
    assert [h.line_no for h in search(store, '"out of memory"')] == [2]
    assert sorted(h.line_no for h in search(store, "out memory")) == [2, 4]
    assert [h.line_no for h in search(store, "torch.OutOfMemoryError")] == [2]
    assert [h.line_no for h in search(store, "ibv_reg_mr")] == [1]
    assert search(store, "loss nccl") == []
    assert len(search(store, "")) == 4


def test_newest_first_and_limit_and_time_window(store):
    store.append([line(f"tick {i}", line_no=i, ts=NOW + timedelta(minutes=i))
                  for i in range(1, 11)])
    hits = search(store, "tick", limit=3)
    assert [h.line_no for h in hits] == [10, 9, 8]
    window = search(store, "tick", since=NOW + timedelta(minutes=3),
                    until=NOW + timedelta(minutes=5))
    assert [h.line_no for h in window] == [4, 3]
    tail = search(store, "", after_id=hits[1].id)
    assert [h.line_no for h in tail] == [10]


def test_scope_keeps_tenants_and_platform_apart(store):
    store.append([line("secret alpha NCCL", tenant=ALPHA), line("beta NCCL", tenant=BETA),
                  LogLine(ts=NOW, message="platform NCCL", source="web", stream="platform",
                          request_id="req-123456")])
    beta_member = Scope(tenant_ids=frozenset({BETA}))
    assert [h.message for h in search(store, "NCCL", beta_member)] == ["beta NCCL"]
    assert search(store, "secret", beta_member) == []
    assert search(store, "", beta_member, request_id="req-123456") == []
    assert search(store, "", Scope(tenant_ids=frozenset())) == []
    operator = [h.message for h in search(store, "", ALL, request_id="req-123456")]
    assert operator == ["platform NCCL"]
    tenants_only = Scope(tenant_ids=None)
    assert len(search(store, "NCCL", tenants_only)) == 2


def test_cursors_move_with_their_lines(store):
    store.append([line("a")], {"w-1/0": Cursor(offset=2, line_no=1)})
    assert store.cursors(["w-1/0", "w-1/1"]) == {"w-1/0": Cursor(offset=2, line_no=1)}
    store.append([line("b", line_no=2)], {"w-1/0": Cursor(offset=4, line_no=2)})
    assert store.cursors(["w-1/0"])["w-1/0"] == Cursor(offset=4, line_no=2)


def test_around_a_line_of_one_replica(store):
    store.append([line(f"l{i}", line_no=i) for i in range(1, 21)]
                 + [line("other replica", replica=1, line_no=10)]
                 + [line("other attempt", attempt=2, line_no=10)])
    found = store.around(Scope(tenant_ids=frozenset({ALPHA})), job_id=10, attempt=1,
                         replica=0, line_no=10, before=2, after=3)
    assert [h.message for h in found] == ["l8", "l9", "l10", "l11", "l12", "l13"]
    assert store.around(Scope(tenant_ids=frozenset({BETA})), job_id=10, attempt=1, replica=0,
                        line_no=10, before=2, after=3) == []


def test_histogram_counts_per_bucket(store):
    store.append([line("hit", ts=NOW + timedelta(minutes=m)) for m in (0, 1, 1, 5)]
                 + [line("miss", ts=NOW)])
    buckets = store.histogram(LogQuery(scope=ALL, phrases=parse("hit")), NOW,
                              NOW + timedelta(minutes=6), 3)
    assert [b.count for b in buckets] == [3, 0, 1]
    assert buckets[1].start == NOW + timedelta(minutes=2)


def test_expiry_removes_whole_days_of_each_tenant(store):
    day = timedelta(days=1)
    lines = []
    for offset in range(4):  # Dec 3..6, early and late in each day
        for hour in (0, 23):
            ts = datetime(2026, 12, 3, hour, 30, tzinfo=UTC) + offset * day
            lines += [line(f"alpha {offset} {hour}", tenant=ALPHA, ts=ts),
                      line(f"beta {offset} {hour}", tenant=BETA, ts=ts),
                      LogLine(ts=ts, message=f"platform {offset} {hour}", source="web")]
    store.append(lines)
    # alpha keeps Dec 5 on, beta Dec 4 on, the platform Dec 6 only.
    expired = store.expire({ALPHA: date(2026, 12, 5), BETA: date(2026, 12, 4),
                            None: date(2026, 12, 6)}, date(2026, 12, 6))
    left = {h.message for h in search(store, "", limit=1000)}
    assert left == {f"alpha {d} {h}" for d in (2, 3) for h in (0, 23)} \
        | {f"beta {d} {h}" for d in (1, 2, 3) for h in (0, 23)} \
        | {"platform 3 0", "platform 3 23"}
    assert expired.lines == 2 * (2 + 1 + 3)
    assert (ALPHA, date(2026, 12, 3)) in expired.days
    usage = {(u.tenant_id, u.day): u.lines for u in store.usage()}
    assert usage[(ALPHA, date(2026, 12, 5))] == 2
    assert (ALPHA, date(2026, 12, 4)) not in usage


def test_usage_counts_bytes_per_tenant_and_day(store):
    store.append([line("12345"), line("123", tenant=BETA)])
    usage = {u.tenant_id: u.bytes for u in store.usage()}
    assert usage == {ALPHA: 6, BETA: 4}


def test_dropped_lines_add_up(store):
    store.add_dropped("web", 3)
    store.add_dropped("web", 2)
    assert store.dropped() == {"web": 5}


def test_query_parsing_refuses_what_it_cannot_mean():
    assert parse('NCCL "out of  memory" nccl') == (("nccl",), ("out", "of", "memory"))
    with pytest.raises(QueryError, match="quote"):
        parse('"open')
    with pytest.raises(QueryError, match="at most"):
        parse(" ".join(f"w{i}" for i in range(40)))
    assert parse("... --- !!!") == ()


def test_highlights_are_the_matched_words():
    text = "NCCL WARN: out of memory (CUDA out of memory)"
    spans = highlight_spans(text, parse('"out of memory" nccl'))
    assert [text[a:b] for a, b in spans] == ["NCCL", "out of memory", "out of memory"]
    assert matches(text, parse("cuda memory")) and not matches(text, parse("oom"))


def test_a_job_scoped_search_keeps_to_the_job(store):
    store.append([line("NCCL WARN from 10", job=10), line("NCCL WARN from 11", job=11),
                  line("NCCL WARN from 110", job=110), line("no match", job=10)])
    assert [h.message for h in search(store, "NCCL WARN", job_id=10)] == ["NCCL WARN from 10"]
    assert [h.message for h in search(store, "", job_id=11)] == ["NCCL WARN from 11"]
    assert search(store, "j10", job_id=10) == []  # the store's own job lexeme is no word


def test_upkeep_keeps_every_answer(store):
    store.append([line(f"rank {i} Init COMPLETE", line_no=i, ts=NOW + timedelta(seconds=i))
                  for i in range(1, 6)])
    store.maintain()
    store.append([line("rank 6 Init COMPLETE", line_no=6, ts=NOW + timedelta(seconds=6))])
    assert [h.line_no for h in search(store, '"Init COMPLETE"', limit=3)] == [6, 5, 4]


def postgres_store(store):
    from aistation.logstore.postgres import PostgresLogStore

    if not isinstance(store, PostgresLogStore):
        pytest.skip("the tests' database is not PostgreSQL")
    return store


def test_postgres_upkeep_merges_pending_index_entries_and_learns_the_words(store):
    store = postgres_store(store)
    store.append([line(f"rank {i} Init COMPLETE", line_no=i) for i in range(1, 301)])
    store.maintain()
    indexes = store._run(
        "SELECT i.indexrelid::regclass::text FROM pg_inherits p JOIN pg_index i "
        "ON i.indrelid = p.inhrelid WHERE p.inhparent = 'log_line'::regclass "
        "AND i.indexrelid::regclass::text LIKE '%%tsv%%'")
    assert indexes
    for (index,) in indexes:  # nothing left for a search to read through unindexed
        assert store._run("SELECT gin_clean_pending_list(%s::regclass)", [index]) == [(0,)]
    assert store._word_frequencies()["complete"] == pytest.approx(1.0)


def test_postgres_phrase_of_common_words_walks_the_newest_lines_first(store, monkeypatch):
    store = postgres_store(store)
    walked = []
    walk = store._walk
    monkeypatch.setattr(store, "_walk", lambda query: walked.append(walk(query)) or walked[-1])
    # Both words in every line, the phrase in every fourth; the oldest line alone has them the
    # other way round.
    lines = [line(f"rank {i} Init COMPLETE" if i % 4 == 0 else f"rank {i} Init not COMPLETE",
                  line_no=i, ts=NOW + timedelta(seconds=i)) for i in range(1, 1201)]
    lines[0] = line("rank 1 COMPLETE Init", line_no=1, ts=NOW + timedelta(seconds=1))
    lines.append(line("rank 1200 Init COMPLETE", tenant=BETA, ts=NOW + timedelta(hours=1)))
    store.append(lines)
    store.maintain()
    alpha = Scope(tenant_ids=frozenset({ALPHA}))

    hits = search(store, '"Init COMPLETE"', scope=alpha, limit=5)
    assert [h.line_no for h in hits] == [1200, 1196, 1192, 1188, 1184]
    assert len(walked) == 1 and len(walked[0]) == 5  # the walk alone answered
    # A limit of 1 walks the newest 200 lines: the oldest hit is found by the index instead.
    hits = search(store, '"COMPLETE Init"', scope=alpha, limit=1)
    assert [(h.line_no, h.tenant_id) for h in hits] == [(1, ALPHA)]
    assert len(walked) == 2 and walked[1] == []
    # A rare word, or another tenant too: no walk.
    assert search(store, '"rank 1196"', scope=alpha)[0].line_no == 1196
    both = Scope(tenant_ids=frozenset({ALPHA, BETA}))
    assert search(store, '"Init COMPLETE"', scope=both, limit=1)[0].tenant_id == BETA
    assert len(walked) == 2
    # In one job a common single word walks the job's newest lines too.
    store.append([line("rank 9 Init", job=11, line_no=9, ts=NOW + timedelta(hours=2))])
    assert [h.line_no for h in search(store, "Init", scope=alpha, job_id=10, limit=2)] \
        == [1200, 1199]
    assert len(walked) == 3 and len(walked[2]) == 2


def test_closing_the_sqlite_store_while_another_thread_writes_loses_nothing(tmp_path):
    """The platform's log flusher writes from its own thread while another closes the store
    (a reset): sqlite3 crashed the process when a connection closed under a statement."""
    store = SqliteLogStore(tmp_path / "logs.sqlite3")
    stop, written = threading.Event(), []

    def write():
        count = 0
        while not stop.is_set():
            store.append([line(f"step {count + i}", line_no=count + i) for i in range(20)])
            count += 20
        written.append(count)

    writer = threading.Thread(target=write)
    writer.start()
    for _ in range(200):
        store.close()
        time.sleep(0.002)
    stop.set()
    writer.join()
    assert written[0] > 0
    assert sum(day.lines for day in store.usage()) == written[0]
    store.close()
