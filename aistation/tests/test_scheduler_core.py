"""The scheduler core: quotas, limits, priority, preemption, borrowing, gangs, best fit, policies,
never-fits and wording. Pure pytest: the core needs no database.

The builders below (`nodes`, `job`, `running`, `snapshot`, `decide`) keep snapshots readable;
`decide` also checks, on every cycle, what a cycle must always respect (`check`)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from aistation.scheduler import (
    Decisions,
    JobSnap,
    NodeSnap,
    QueueSnap,
    Snapshot,
    Start,
    TenantSnap,
    Wait,
    schedule,
)
from aistation.scheduler.policies import promotion_bounds

NOW = 10_000.0
REPO = Path(__file__).resolve().parents[2]


# -- builders ---------------------------------------------------------------------------------


def nodes(count: int, gpus: int = 8, model: str = "", prefix: str = "node", **kw) -> list[NodeSnap]:
    """`count` nodes named node-1, node-2, … (zero-padded when there are ten or more)."""
    width = len(str(count))
    return [
        NodeSnap(name=f"{prefix}-{i:0{width}d}", gpus=gpus, gpu_model=model, **kw)
        for i in range(1, count + 1)
    ]


def job(
    job_id: int,
    tenant: str = "a",
    gpus: int = 1,
    *,
    queue: str | None = None,
    priority: int = 0,
    submitted_at: float | None = None,
    **kw,
) -> JobSnap:
    """A pending job of `gpus` GPUs per replica in the queue "<tenant>/q" unless said, submitted
    at NOW - 500 + job_id unless said (so ids also give the age order, and no job is near the
    starvation bound)."""
    return JobSnap(
        id=job_id,
        tenant=tenant,
        queue=queue or f"{tenant}/q",
        priority=priority,
        submitted_at=NOW - 500 + job_id if submitted_at is None else submitted_at,
        gpus_per_replica=gpus,
        **kw,
    )


def running(job_id: int, tenant: str = "a", gpus: int = 1, *, on: str | Iterable[str], **kw):
    """A running job, one replica on each node named in `on`."""
    placement = (on,) if isinstance(on, str) else tuple(on)
    kw.setdefault("started_at", NOW - 500 + job_id)
    kw.setdefault("submitted_at", NOW - 2000 + job_id)
    return job(job_id, tenant, gpus, placement=placement, replicas=len(placement), **kw)


def snapshot(
    node_list: Iterable[NodeSnap],
    *,
    quotas: dict[str, int] | None = None,
    limits: dict[str, dict[str, int]] | None = None,
    queues: Iterable[QueueSnap] = (),
    running_jobs: Iterable[JobSnap] = (),
    pending: Iterable[JobSnap] = (),
    now: float = NOW,
) -> Snapshot:
    """Tenants from `quotas` (default "a" and "b", 8 GPUs each); a queue that a job names and
    `queues` does not list is a fair queue of the job's tenant without a limit."""
    quotas = {"a": 8, "b": 8} if quotas is None else quotas
    limits = limits or {}
    queue_list = list(queues)
    known = {q.key for q in queue_list}
    running_jobs, pending = list(running_jobs), list(pending)
    for j in (*running_jobs, *pending):
        if j.queue not in known:
            queue_list.append(QueueSnap(key=j.queue, tenant=j.tenant))
            known.add(j.queue)
    return Snapshot(
        now=now,
        nodes=tuple(node_list),
        tenants=tuple(
            TenantSnap(name=name, gpu_quota=quota, gpu_model_limits=limits.get(name, {}))
            for name, quota in quotas.items()
        ),
        queues=tuple(queue_list),
        running=tuple(running_jobs),
        pending=tuple(pending),
    )


@dataclass
class Result:
    snapshot: Snapshot
    decisions: Decisions
    starts: dict[int, Start] = field(default_factory=dict)
    waits: dict[int, Wait] = field(default_factory=dict)
    preempted: dict[int, str] = field(default_factory=dict)

    def reason(self, job_id: int) -> str:
        return self.waits[job_id].reason

    def borrowed(self) -> set[int]:
        return {i for i, s in self.starts.items() if s.borrowed}


def decide(snap: Snapshot, **kw) -> Result:
    """One cycle, checked against everything a cycle must always respect."""
    decisions = schedule(snap, **kw)
    check(snap, decisions)
    return Result(
        snap,
        decisions,
        starts={s.job_id: s for s in decisions.starts},
        waits={w.job_id: w for w in decisions.waits},
        preempted={p.job_id: p.reason for p in decisions.preemptions},
    )


def check(snap: Snapshot, decisions: Decisions) -> None:
    pending = {j.id: j for j in snap.pending}
    run = {j.id: j for j in snap.running}
    node_of = {n.name: n for n in snap.nodes}
    tenants = {t.name: t for t in snap.tenants}
    queues = {q.key: q for q in snap.queues}

    # Exactly one decision per pending job, each with words.
    decided = Counter([s.job_id for s in decisions.starts] + [w.job_id for w in decisions.waits])
    assert set(decided) == set(pending), "every pending job gets a start or a wait"
    assert set(decided.values()) <= {1}, "never two decisions for one job"
    assert all(s.reason for s in decisions.starts)
    assert all(w.reason.startswith(("waiting: ", "never fits: ")) for w in decisions.waits)
    assert all(w.never_fits == w.reason.startswith("never fits: ") for w in decisions.waits)

    # Preemption: only running jobs, once; own lower-priority work, or others' borrowed work,
    # and always for a job that starts.
    preempted = {p.job_id: p.reason for p in decisions.preemptions}
    assert len(preempted) == len(decisions.preemptions)
    assert set(preempted) <= set(run), "only running jobs are preempted"
    started = {s.job_id for s in decisions.starts}
    for victim_id, reason in preempted.items():
        victim = run[victim_id]
        if m := re.fullmatch(r"preempted by job (\d+) \(priority (-?\d+)\)", reason):
            by = pending[int(m[1])]
            assert by.id in started, "never preempt for nothing"
            assert by.tenant == victim.tenant and victim.priority < by.priority == int(m[2])
        elif m := re.fullmatch(r"preempted for job (\d+), (which has had less service|promoted "
                               r"after waiting ([\d.]+) h in all): .*", reason):
            by = pending[int(m[1])]
            assert by.id in started, "never preempt for nothing"
            assert by.tenant == victim.tenant and by.priority == victim.priority
            if m[3] is None:
                assert by.attained_gpu_s < victim.attained_gpu_s + victim.gpus * (
                    snap.now - (victim.started_at or snap.now)), "only for less service"
            else:
                waited = by.waited_s + snap.now - by.submitted_at
                assert float(m[3]) == pytest.approx(waited / 3600, abs=0.05)
        else:
            m = re.fullmatch(r"reclaimed: tenant (\S+) needs its quota back for job (\d+)", reason)
            assert m, reason
            by = pending[int(m[2])]
            assert by.id in started and by.tenant == m[1] != victim.tenant
            assert victim.borrowed, "only borrowed work of another tenant is reclaimed"

    # Starts: whole gangs, where they may go, never on excluded nodes, never in backoff.
    for start in decisions.starts:
        j = pending[start.job_id]
        assert len(start.placement) == j.replicas, "all replicas placed, or none"
        assert j.not_before <= snap.now
        for name in start.placement:
            assert node_of[name].schedulable
            assert not j.gpu_model or node_of[name].gpu_model == j.gpu_model
            assert name not in j.excluded_nodes

    # After the cycle, no node that took new work is over its totals.
    placed = [j for j in snap.running if j.id not in preempted] + [
        replace(pending[s.job_id], placement=s.placement, borrowed=s.borrowed)
        for s in decisions.starts
    ]
    used: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for j in placed:
        for name in j.placement:
            used[name][0] += j.gpus_per_replica
            used[name][1] += j.cpu_per_replica
            used[name][2] += j.memory_mib_per_replica
    for name in {name for s in decisions.starts for name in s.placement}:
        node = node_of[name]
        assert used[name][0] <= node.gpus, f"{name} over its GPUs"
        assert not node.cpu_cores or used[name][1] <= node.cpu_cores + 1e-9
        assert not node.memory_mib or used[name][2] <= node.memory_mib

    # Quotas, model limits and queue limits: never exceeded by non-borrowed work (a snapshot
    # already over one gets nothing more under it).
    def usage(jobs: Iterable[JobSnap]) -> tuple[Counter, Counter, Counter]:
        quota: Counter[str] = Counter()
        model: Counter[tuple[str, str]] = Counter()
        queue: Counter[str] = Counter()
        for j in jobs:
            queue[j.queue] += j.gpus
            if not j.borrowed:
                quota[j.tenant] += j.gpus
                for name in j.placement:
                    model[(j.tenant, node_of[name].gpu_model)] += j.gpus_per_replica
        return quota, model, queue

    quota_0, model_0, queue_0 = usage(snap.running)
    quota_1, model_1, queue_1 = usage(placed)
    for tenant, gpus in quota_1.items():
        quota = tenants[tenant].gpu_quota if tenant in tenants else 0
        assert gpus <= max(quota, quota_0[tenant]), f"tenant {tenant} over its quota"
    for (tenant, model), gpus in model_1.items():
        limit = tenants[tenant].gpu_model_limits.get(model) if tenant in tenants else None
        if limit is not None:
            assert gpus <= max(limit, model_0[(tenant, model)]), f"{tenant} over its {model} limit"
    for key, gpus in queue_1.items():
        limit = queues[key].gpu_limit if key in queues else None
        if limit is not None:
            assert gpus <= max(limit, queue_0[key]), f"queue {key} over its limit"

    # CPU and memory quotas are hard: all of a tenant's work counts (borrowed too, and what it
    # holds elsewhere), and nothing starts past them.
    def cores(jobs: Iterable[JobSnap], tenant: TenantSnap) -> tuple[float, int]:
        mine = [j for j in jobs if j.tenant == tenant.name]
        return (
            tenant.cpu_held_elsewhere + sum(j.cpu_per_replica * j.replicas for j in mine),
            tenant.memory_mib_held_elsewhere + sum(
                j.memory_mib_per_replica * j.replicas for j in mine),
        )

    for tenant in tenants.values():
        (cpu_0, mem_0), (cpu_1, mem_1) = cores(snap.running, tenant), cores(placed, tenant)
        if tenant.cpu_quota is not None:
            assert cpu_1 <= max(tenant.cpu_quota, cpu_0) + 1e-9, f"{tenant.name} over its CPU"
        if tenant.memory_quota_mib is not None:
            assert mem_1 <= max(tenant.memory_quota_mib, mem_0), f"{tenant.name} over its memory"

    # Positions: 1..n within each queue.
    positions: defaultdict[str, list[int]] = defaultdict(list)
    for w in decisions.waits:
        positions[pending[w.job_id].queue].append(w.position)
    for found in positions.values():
        assert sorted(found) == list(range(1, len(found) + 1))


# -- one decision per job ---------------------------------------------------------------------


def test_every_pending_job_gets_exactly_one_decision_with_words():
    r = decide(
        snapshot(
            nodes(2),
            running_jobs=[running(1, "b", 8, on="node-2")],
            pending=[
                job(10, "a", 4),
                job(11, "a", 8),
                job(12, "a", 16),
                job(13, "a", 1, not_before=NOW + 30),
                job(14, "b", 2),
            ],
        )
    )
    assert set(r.starts) == {10, 14}
    assert r.borrowed() == {14}, "b is at its quota: it borrows a's idle GPUs"
    assert set(r.waits) == {11, 12, 13}
    assert r.reason(11) == (
        "waiting: tenant quota 4/8 GPUs in use, job needs 8; no idle capacity to borrow: "
        "8 GPUs asked, 2 free on node node-1, the closest of 2 nodes looked at (job 10 holds 4, "
        "other tenants' work holds 2)"
    ), "tenant b's job 14 is not named to tenant a"
    assert r.waits[12].never_fits
    assert r.reason(13) == "waiting: retry backoff, 30 s left"
    assert r.starts[10].reason == "admitted: tenant quota 4/8 GPUs"


# -- quotas, model limits, queue limits --------------------------------------------------------


def test_quota_is_never_exceeded_across_many_jobs_in_one_cycle():
    r = decide(
        snapshot(
            nodes(2),
            pending=[job(i, "a", 1) for i in range(1, 21)]
            + [job(100 + i, "b", 1) for i in range(8)],
        )
    )
    a_started = [i for i in r.starts if i < 100]
    assert len(a_started) == 8 and not r.borrowed()
    assert {i for i in r.starts if i >= 100} == {100 + i for i in range(8)}, "b gets its quota"
    assert a_started == list(range(1, 9)), "oldest first"
    for i in range(9, 21):
        assert r.reason(i).startswith("waiting: tenant quota 8/8 GPUs in use, job needs 1")


def test_quota_counts_running_work_and_starts_earlier_in_the_cycle():
    r = decide(
        snapshot(
            nodes(2),
            running_jobs=[running(1, "b", 8, on="node-2")],
            pending=[job(10, "a", 2), job(11, "a", 4), job(12, "a", 4)],
            quotas={"a": 6, "b": 8},
        )
    )
    assert set(r.starts) == {10, 11}
    assert r.reason(12).startswith("waiting: tenant quota 6/6 GPUs in use, job needs 4")


def test_over_quota_jobs_borrow_idle_capacity_marked_borrowed():
    r = decide(snapshot(nodes(2), pending=[job(i, "a", 2) for i in range(1, 7)]))
    assert set(r.starts) == set(range(1, 7))
    assert r.borrowed() == {5, 6}
    assert r.starts[5].reason.startswith("borrowed: ")
    assert not r.starts[4].borrowed


def test_borrowers_go_last_after_every_job_within_its_quota():
    # a's jobs are older, but b is within its quota: b's jobs get the capacity first.
    r = decide(
        snapshot(
            nodes(1),
            quotas={"a": 4, "b": 4},
            pending=[job(i, "a", 1) for i in range(1, 9)] + [job(20 + i, "b", 1) for i in range(4)],
        )
    )
    assert set(r.starts) == {1, 2, 3, 4, 20, 21, 22, 23}
    assert not r.borrowed()
    assert r.reason(5).startswith("waiting: tenant quota 4/4 GPUs in use")
    assert "no idle capacity to borrow" in r.reason(5)


def test_a_job_bigger_than_its_quota_can_only_borrow():
    busy = snapshot(
        nodes(3),
        running_jobs=[running(1, "b", 8, on="node-1"), running(2, "b", 8, on="node-2")],
        pending=[job(10, "a", 8, replicas=2)],
        quotas={"a": 8, "b": 16},
    )
    r = decide(busy)
    wait = r.waits[10]
    assert wait.reason.startswith(
        "waiting: exceeds the tenant's quota of 8 GPUs; it can only run on borrowed capacity"
    )
    assert not wait.never_fits, "borrowing may still run it"

    idle = replace(busy, running=busy.running[:1])
    r = decide(idle)
    assert r.starts[10].borrowed and r.starts[10].placement == ("node-2", "node-3")


def test_model_limit_caps_the_gpus_of_that_model():
    snap = snapshot(
        [NodeSnap("h-1", 8, "H100"), NodeSnap("x-1", 8, "A100")],
        quotas={"a": 16, "b": 16},
        limits={"a": {"H100": 4}},
        running_jobs=[running(1, "b", 4, on="h-1")],
        pending=[job(i, "a", 2, gpu_model="H100") for i in (10, 11, 12)],
    )
    r = decide(snap)
    assert set(r.starts) == {10, 11}
    assert r.reason(12).startswith("waiting: GPU model H100 limit 4/4 in use, job needs 2")


def test_model_limit_is_borrowable_and_any_model_jobs_avoid_the_full_model():
    r = decide(
        snapshot(
            [NodeSnap("h-1", 8, "H100"), NodeSnap("x-1", 8, "A100")],
            quotas={"a": 16},
            limits={"a": {"H100": 4}},
            pending=[
                job(10, "a", 4, gpu_model="H100"),
                job(11, "a", 2, gpu_model="H100"),
                job(12, "a", 2),
            ],
        )
    )
    assert not r.starts[10].borrowed
    assert r.starts[11].borrowed, "over its H100 limit: runs on idle H100s as borrowed"
    assert r.starts[12].placement == ("x-1",) and not r.starts[12].borrowed


def test_queue_limit_is_hard_even_with_idle_capacity():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 16},
            queues=[QueueSnap("a/q", "a", gpu_limit=4)],
            pending=[job(i, "a", 2) for i in range(1, 5)],
        )
    )
    assert set(r.starts) == {1, 2}
    assert not r.borrowed()
    assert r.reason(3) == "waiting: queue limit 4/4 GPUs in use, job needs 2"
    assert r.reason(4) == "waiting: queue limit 4/4 GPUs in use, job needs 2"


def test_queue_limit_counts_running_work_of_that_queue_only():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 16},
            queues=[QueueSnap("a/q", "a", gpu_limit=4), QueueSnap("a/other", "a")],
            running_jobs=[
                running(1, "a", 4, on="node-1"),
                running(2, "a", 2, on="node-1", queue="a/other"),
            ],
            pending=[job(10, "a", 1), job(11, "a", 2, queue="a/other")],
        )
    )
    assert set(r.starts) == {11}
    assert r.reason(10) == "waiting: queue limit 4/4 GPUs in use, job needs 1"


# -- priority and preemption -----------------------------------------------------------------


def test_higher_priority_goes_first():
    r = decide(snapshot(nodes(1), pending=[job(1, "a", 8), job(2, "a", 8, priority=5)]))
    assert set(r.starts) == {2}
    assert r.waits[1].position == 1


def test_preempts_own_lower_priority_work_when_that_lets_it_start():
    r = decide(
        snapshot(
            nodes(1),
            running_jobs=[running(1, "a", 8, on="node-1", priority=0)],
            pending=[job(2, "a", 8, priority=5)],
        )
    )
    assert r.preempted == {1: "preempted by job 2 (priority 5)"}
    assert r.starts[2].placement == ("node-1",)
    assert "after preempting job 1" in r.starts[2].reason


def test_preempts_lowest_priority_then_most_recent_and_no_more_than_needed():
    base = snapshot(
        nodes(1),
        running_jobs=[
            running(1, "a", 4, on="node-1", priority=1, started_at=NOW - 900),
            running(2, "a", 2, on="node-1", priority=0, started_at=NOW - 800),
            running(3, "a", 2, on="node-1", priority=0, started_at=NOW - 100),
        ],
        pending=[job(9, "a", 2, priority=5)],
    )
    assert set(decide(base).preempted) == {3}, "the most recently started of the lowest"
    r = decide(replace(base, pending=(job(9, "a", 4, priority=5),)))
    assert set(r.preempted) == {2, 3}, "both priority-0 jobs, never the priority-1 one"
    r = decide(replace(base, pending=(job(9, "a", 6, priority=5),)))
    assert set(r.preempted) == {1, 3}, "4 + 2 GPUs are enough: job 2 stays"


def test_never_preempts_for_nothing():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 24, "b": 8},
            running_jobs=[
                running(1, "a", 8, on="node-1", priority=0),
                running(2, "b", 8, on="node-2"),
            ],
            pending=[job(3, "a", 8, replicas=2, priority=5)],
        )
    )
    assert not r.preempted, "node-2 stays b's, so preempting job 1 would not let job 3 start"
    assert r.reason(3) == "waiting: 2 replicas of 8 GPUs need 2 free nodes (0 free)"


def test_equal_priority_never_preempts():
    r = decide(
        snapshot(
            nodes(1),
            running_jobs=[running(1, "a", 8, on="node-1", priority=3)],
            pending=[job(2, "a", 8, priority=3)],
        )
    )
    assert not r.preempted and not r.starts


def test_never_preempts_another_tenants_work_within_its_quota():
    r = decide(
        snapshot(
            nodes(1),
            running_jobs=[running(1, "b", 8, on="node-1", priority=0)],
            pending=[job(2, "a", 8, priority=9)],
        )
    )
    assert not r.preempted
    assert r.reason(2) == (
        "waiting: 8 GPUs asked, 0 free on node node-1 (other tenants' work holds 8)")


def test_preempts_own_work_to_get_back_within_its_quota():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 4},
            running_jobs=[running(1, "a", 4, on="node-1", priority=0)],
            pending=[job(2, "a", 4, priority=5)],
        )
    )
    assert set(r.preempted) == {1}
    assert not r.starts[2].borrowed


def test_queue_limit_can_be_freed_by_preempting_own_lower_priority_work_in_that_queue():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 16},
            queues=[QueueSnap("a/q", "a", gpu_limit=4)],
            running_jobs=[running(1, "a", 4, on="node-1", priority=0)],
            pending=[job(2, "a", 4, priority=5)],
        )
    )
    assert set(r.preempted) == {1}
    assert 2 in r.starts


# -- borrowing and reclaim ----------------------------------------------------------------------


def test_borrowed_work_is_reclaimed_when_its_owner_needs_its_quota():
    first = decide(snapshot(nodes(2), pending=[job(1, "a", 8), job(2, "a", 8)]))
    assert first.borrowed() == {2}
    # Next cycle: both run; b, within its quota, wants a whole node.
    now = NOW + 60
    running_now = [
        running(s.job_id, "a", 8, on=s.placement, borrowed=s.borrowed, started_at=NOW)
        for s in first.decisions.starts
    ]
    r = decide(snapshot(nodes(2), running_jobs=running_now, pending=[job(3, "b", 8)], now=now))
    assert r.preempted == {2: "reclaimed: tenant b needs its quota back for job 3"}
    assert not r.starts[3].borrowed
    assert r.starts[3].placement == first.starts[2].placement


def test_reclaims_the_most_recently_started_borrowed_work_and_only_what_is_needed():
    r = decide(
        snapshot(
            nodes(1),
            quotas={"a": 0, "b": 8},
            running_jobs=[
                running(1, "a", 4, on="node-1", borrowed=True, started_at=NOW - 300),
                running(2, "a", 2, on="node-1", borrowed=True, started_at=NOW - 200),
                running(3, "a", 2, on="node-1", borrowed=True, started_at=NOW - 100),
            ],
            pending=[job(4, "b", 2)],
        )
    )
    assert set(r.preempted) == {3}


def test_no_reclaim_when_it_would_not_make_room():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 8, "b": 16},
            running_jobs=[
                running(1, "a", 8, on="node-1"),
                running(2, "a", 8, on="node-2", borrowed=True),
            ],
            pending=[job(3, "b", 8, replicas=2)],
        )
    )
    assert not r.preempted, "node-1 is a's own quota: reclaiming node-2 alone would not fit"


def test_no_reclaim_for_a_job_over_its_own_quota():
    r = decide(
        snapshot(
            nodes(1),
            quotas={"a": 8, "b": 4},
            running_jobs=[running(1, "a", 8, on="node-1", borrowed=True)],
            pending=[job(2, "b", 8)],
        )
    )
    assert not r.preempted and not r.starts


# -- gangs and best fit -----------------------------------------------------------------------


def test_a_gang_is_never_partially_started():
    r = decide(
        snapshot(
            nodes(4),
            quotas={"a": 32, "b": 8},
            running_jobs=[running(1, "b", 8, on="node-4")],
            pending=[job(2, "a", 8, replicas=4)],
        )
    )
    assert not r.starts
    assert r.reason(2) == "waiting: 4 replicas of 8 GPUs need 4 free nodes (3 free)"


def test_a_gang_of_small_replicas_says_how_many_fit():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 32, "b": 16},
            running_jobs=[running(1, "b", 6, on="node-1"), running(2, "b", 4, on="node-2")],
            pending=[job(3, "a", 3, replicas=3)],
        )
    )
    assert r.reason(3) == (
        "waiting: 3 replicas of 3 GPUs must start together and the free GPUs hold 1 of them"
    )


def test_big_gangs_take_whole_free_nodes():
    r = decide(
        snapshot(
            nodes(4),
            quotas={"a": 16, "b": 16},
            running_jobs=[running(1, "b", 4, on="node-1"), running(2, "b", 4, on="node-3")],
            pending=[job(3, "a", 8, replicas=2)],
        )
    )
    assert r.starts[3].placement == ("node-2", "node-4")


def test_replicas_of_a_gang_share_a_node_when_they_fit():
    r = decide(snapshot(nodes(2), pending=[job(1, "a", 4, replicas=2)]))
    assert r.starts[1].placement == ("node-1", "node-1")


def test_best_fit_keeps_a_whole_node_free_for_a_big_job():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 16, "b": 8},
            running_jobs=[running(1, "b", 4, on="node-2")],
            pending=[job(2, "a", 4), job(3, "a", 8)],
        )
    )
    assert r.starts[2].placement == ("node-2",), "the node with the fewest free GPUs that fits"
    assert r.starts[3].placement == ("node-1",)


def test_best_fit_picks_the_fewest_free_gpus_that_still_fit_ties_by_name():
    r = decide(
        snapshot(
            nodes(4),
            quotas={"a": 8, "b": 32},
            running_jobs=[
                running(1, "b", 2, on="node-1"),
                running(2, "b", 5, on="node-2"),
                running(3, "b", 6, on="node-3"),
                running(4, "b", 5, on="node-4"),
            ],
            pending=[job(5, "a", 3)],
        )
    )
    assert r.starts[5].placement == ("node-2",)


# -- where a job may go -----------------------------------------------------------------------


def test_excluded_nodes_are_avoided():
    snap = snapshot(nodes(2), pending=[job(1, "a", 8, excluded_nodes=frozenset({"node-1"}))])
    assert decide(snap).starts[1].placement == ("node-2",)
    busy = replace(snap, running=(running(2, "b", 8, on="node-2"),))
    r = decide(busy)
    assert not r.starts, "waits rather than going back to a node it failed on"
    assert not r.waits[1].never_fits


def test_a_job_only_excluded_nodes_could_hold_never_fits_and_says_so():
    r = decide(
        snapshot(
            [NodeSnap("big", 8), NodeSnap("small", 2)],
            pending=[job(1, "a", 8, excluded_nodes=frozenset({"big"}))],
        )
    )
    wait = r.waits[1]
    assert wait.never_fits
    assert wait.reason == (
        "never fits: only nodes it failed on before (big) could hold it, and they stay excluded"
    )


def test_retry_backoff_is_respected():
    snap = snapshot(nodes(1), pending=[job(1, "a", 1, not_before=NOW + 30)])
    assert decide(snap).reason(1) == "waiting: retry backoff, 30 s left"
    assert 1 in decide(replace(snap, now=NOW + 30)).starts


def test_unschedulable_nodes_take_no_new_work():
    r = decide(
        snapshot(
            [NodeSnap("node-1", 8, schedulable=False), NodeSnap("node-2", 8)],
            pending=[job(1, "a", 8), job(2, "b", 8)],
        )
    )
    assert [s.placement for s in r.decisions.starts] == [("node-2",)]


def test_a_gpu_model_goes_only_on_nodes_of_that_model():
    r = decide(
        snapshot(
            [NodeSnap("a100", 8, "A100"), NodeSnap("h100", 8, "H100")],
            pending=[job(1, "a", 2, gpu_model="H100")],
        )
    )
    assert r.starts[1].placement == ("h100",)


def test_cpu_and_memory_are_respected():
    r = decide(
        snapshot(
            [NodeSnap("node-1", 8, cpu_cores=16, memory_mib=65536)],
            quotas={"a": 8},
            pending=[
                job(1, "a", 1, cpu_per_replica=12),
                job(2, "a", 1, cpu_per_replica=8),
                job(3, "a", 1, memory_mib_per_replica=40000),
            ],
        )
    )
    assert set(r.starts) == {1, 3}
    assert r.reason(2) == (
        "waiting: 8 CPU cores asked, 3 free on node node-1 (job 1 holds 12, job 3 holds 1)"
    )


# -- policies ---------------------------------------------------------------------------------


def _head_of_line(policy: str) -> Result:
    return decide(
        snapshot(
            nodes(1),
            quotas={"a": 8, "b": 8},
            queues=[QueueSnap("a/q", "a", policy=policy)],
            running_jobs=[running(1, "b", 4, on="node-1")],
            pending=[job(2, "a", 8), job(3, "a", 2), job(4, "a", 2)],
        )
    )


def test_fifo_is_strict_the_head_blocks_its_queue():
    r = _head_of_line("fifo")
    assert not r.starts
    assert r.reason(2) == (
        "waiting: 8 GPUs asked, 4 free on node node-1 (other tenants' work holds 4)")
    assert r.reason(3) == "waiting: behind job 2 in a fifo queue"
    assert [r.waits[i].position for i in (2, 3, 4)] == [1, 2, 3]


@pytest.mark.parametrize("policy", ["backfill", "fair"])
def test_backfill_and_fair_let_later_jobs_start_where_they_fit(policy):
    r = _head_of_line(policy)
    assert set(r.starts) == {3, 4}
    assert r.waits[2].position == 1


def test_a_fifo_head_that_never_fits_does_not_block_the_queue():
    r = decide(
        snapshot(
            nodes(1),
            queues=[QueueSnap("a/q", "a", policy="fifo")],
            pending=[job(1, "a", 16), job(2, "a", 2)],
        )
    )
    assert r.waits[1].never_fits and 2 in r.starts


def test_fifo_order_is_by_priority_then_submission():
    r = decide(
        snapshot(
            nodes(1),
            queues=[QueueSnap("a/q", "a", policy="fifo")],
            pending=[job(1, "a", 8), job(2, "a", 8, priority=1), job(3, "a", 8)],
        )
    )
    assert set(r.starts) == {2}
    assert r.reason(1).startswith("waiting: tenant quota 8/8 GPUs in use, job needs 8")
    assert r.reason(3) == "waiting: behind job 1 in a fifo queue"
    assert [r.waits[i].position for i in (1, 3)] == [1, 2]


def test_fair_serves_the_tenant_furthest_below_its_share_first():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 8, "b": 8, "c": 8},
            running_jobs=[running(1, "a", 4, on="node-1"), running(2, "c", 8, on="node-2")],
            pending=[job(3, "a", 4, submitted_at=NOW - 800), job(4, "b", 4, submitted_at=NOW)],
        )
    )
    # a runs 4/8 (half its share), b 0/8: b's newer job goes first onto the last 4 GPUs.
    assert set(r.starts) == {4}


def test_fair_serves_the_least_attained_service_first_then_the_oldest():
    r = decide(
        snapshot(
            nodes(1),
            pending=[
                job(1, "a", 8, attained_gpu_s=5000),
                job(2, "a", 8, attained_gpu_s=10),
                job(3, "a", 8, attained_gpu_s=10),
            ],
        )
    )
    assert set(r.starts) == {2}
    assert [r.waits[i].position for i in (3, 1)] == [1, 2]


def _promotion_cycle(waiting: int, **settings) -> Result:
    """Job 1 has run 650 s on all of a's quota (5,200 GPU-seconds: a level down) after waiting 2
    hours in all; `waiting` new jobs of a's whole quota wait behind it."""
    return decide(
        snapshot(
            nodes(1),
            quotas={"a": 8},
            running_jobs=[running(1, "a", 8, on="node-1", started_at=NOW - 650, waited_s=7200)],
            pending=[job(10 + k, "a", 8) for k in range(waiting)],
        ),
        levels_gpu_s=(3600,), min_run_s=600, promote_after_s=3600, **settings,
    )


def test_a_job_past_the_promotion_bound_is_not_preempted_by_level():
    # One quota's worth waits: the bound is promote_after_s, and job 1 is past it.
    r = _promotion_cycle(1)
    assert r.preempted == {}
    assert set(r.waits) == {10}


def test_a_deep_backlog_stretches_the_promotion_bound():
    # Four quotas' worth waits: the bound is 1 h x (1 + 1.25 x (4 - 1.5)) = 4.1 h, past job 1's
    # 2 h, so job 1 ranks by its service again and the new job preempts it.
    r = _promotion_cycle(4)
    assert r.preempted == {1: "preempted for job 10, which has had less service: attained "
                              "1.4 GPU-hours, level 0 → 1"}
    assert set(r.starts) == {10}
    # Never past promote_max_s: with a 2-hour ceiling, job 1 is promoted whatever waits.
    assert _promotion_cycle(4, promote_max_s=7200).preempted == {}
    # A fixed bound (no stretch) promotes it too.
    assert _promotion_cycle(4, promote_stretch=0).preempted == {}


def _promoted_waiter(deep: bool) -> Result:
    """Job 1 runs as in `_promotion_cycle`, without a wait of its own; job 10 waits with more
    service (20,000 GPU-seconds) and 2 hours of waiting in all. With `deep`, three jobs of a
    lower priority (which cannot preempt job 1) wait too: four quotas' worth."""
    others = [job(20 + k, "a", 8, priority=-1) for k in range(3)] if deep else []
    return decide(
        snapshot(
            nodes(1),
            quotas={"a": 8},
            running_jobs=[running(1, "a", 8, on="node-1", started_at=NOW - 650)],
            pending=[job(10, "a", 8, attained_gpu_s=20000, waited_s=7200 - 490), *others],
        ),
        levels_gpu_s=(3600,), min_run_s=600, promote_after_s=3600,
    )


def test_a_waiting_job_past_its_bound_is_promoted_and_preempts_a_lower_level():
    r = _promoted_waiter(deep=False)
    assert r.preempted == {1: "preempted for job 10, promoted after waiting 2.0 h in all: "
                              "attained 1.4 GPU-hours, level 0 → 1"}
    assert set(r.starts) == {10}
    # Behind a deep backlog the bound (4.1 h) is past its wait: it ranks by its service, the
    # level of job 1, and waits.
    r = _promoted_waiter(deep=True)
    assert r.preempted == {}
    assert not r.starts


def test_the_backlog_is_counted_per_tenant_against_its_quota():
    snap = snapshot(
        nodes(2),  # 16 GPUs
        quotas={"a": 8, "b": 0, "c": 64},
        pending=[job(1, "a", 8, replicas=4), job(2, "b", 8, replicas=2), job(3, "c", 8),
                 job(4, "c", 8, replicas=5)],
    )
    bounds = promotion_bounds(snap, 3600, backlog=1.5, stretch=1.25, longest_s=10**9)
    # a: 32 GPUs against its 8: 4 quotas' worth. b, without a quota: 16 against the cluster's
    # 16, shallow. c: 48 against the cluster's 16 (its quota is more than the cluster has): 3.
    assert bounds == {"a": pytest.approx(3600 * (1 + 1.25 * 2.5)), "b": 3600,
                      "c": pytest.approx(3600 * (1 + 1.25 * 1.5))}
    # Jobs in retry backoff do not count, nor do nodes that take no work.
    snap = replace(snap, pending=(*snap.pending, job(5, "b", 8, replicas=2, not_before=NOW + 60)),
                   nodes=(*snap.nodes, *nodes(1, prefix="down", schedulable=False)))
    assert promotion_bounds(snap, 3600, backlog=1.5, stretch=1.25, longest_s=10**9) == bounds


def test_fair_interleaves_tenants_as_their_shares_grow():
    r = decide(
        snapshot(
            nodes(1),
            quotas={"a": 8, "b": 8},
            pending=[job(i, "a", 1) for i in range(1, 9)] + [job(i, "b", 1) for i in range(11, 19)],
        )
    )
    assert set(r.starts) == {1, 2, 3, 4, 11, 12, 13, 14}


# -- never fits -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "reason"),
    [
        (job(1, "a", 16), "never fits: needs 16 GPUs per replica, more than any node has (8)"),
        (
            job(1, "a", 8, replicas=5, gpu_model=""),
            "never fits: needs 40 GPUs in total, more than the whole cluster has (32 GPUs)",
        ),
        (
            job(1, "a", 5, replicas=3),
            "never fits: 3 replicas of 5 GPUs, and the whole cluster holds only 2",
        ),
        (job(1, "a", 1, gpu_model="B200"), "never fits: no node has GPU model B200"),
        (
            job(1, "a", 8, gpu_model="H100"),
            "never fits: needs 8 GPUs per replica, more than any H100 node has (4)",
        ),
        (job(1, "a", 1, replicas=0), "never fits: it has no replicas to place"),
    ],
)
def test_never_fits_is_detected_with_the_reason(pending, reason):
    cluster = [*nodes(2), NodeSnap("h-1", 4, "H100"), NodeSnap("h-2", 4, "H100")]
    cluster = [replace(n, gpu_model="A100") if n.name.startswith("node") else n for n in cluster]
    if pending.gpus == 40:
        cluster = nodes(4)
    if pending.gpus_per_replica == 5:
        cluster = nodes(2)
    r = decide(snapshot(cluster, quotas={"a": 64}, pending=[pending]))
    assert r.waits[1].never_fits
    assert r.reason(1) == reason


def test_a_job_bigger_than_its_queue_limit_never_fits():
    r = decide(
        snapshot(
            nodes(2),
            queues=[QueueSnap("a/q", "a", gpu_limit=4)],
            pending=[job(1, "a", 8)],
        )
    )
    assert r.waits[1].never_fits
    assert r.reason(1) == "never fits: needs 8 GPUs, more than its queue's limit of 4"


# -- positions --------------------------------------------------------------------------------


def test_positions_follow_the_queue_order_among_jobs_still_waiting():
    r = decide(
        snapshot(
            nodes(1),
            queues=[QueueSnap("a/q", "a", policy="backfill")],
            running_jobs=[running(1, "b", 6, on="node-1")],
            pending=[
                job(2, "a", 4),
                job(3, "a", 4, priority=2),
                job(4, "a", 2),
                job(5, "a", 4, priority=1),
                job(6, "b", 4, queue="b/other"),
            ],
        )
    )
    assert set(r.starts) == {4}
    assert [r.waits[i].position for i in (3, 5, 2)] == [1, 2, 3]
    assert r.waits[6].position == 1


# -- purity -----------------------------------------------------------------------------------


def test_the_core_imports_no_django():
    code = (
        "import sys, aistation.scheduler; "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework')]"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_without_explaining_a_cycle_decides_the_same_and_lists_no_waits():
    """The trace replay asks for no wait reasons (explain=False): the starts and preemptions are
    those of the cycle that explains, under every policy."""
    for policy in ("fifo", "backfill", "fair"):
        queues = [QueueSnap(key="a/q", tenant="a", policy=policy)]
        snap = snapshot(
            nodes(2),
            quotas={"a": 16},
            queues=queues,
            running_jobs=[running(1, gpus=8, on="node-1", attained_gpu_s=10**6)],
            pending=[job(2, gpus=8), job(3, gpus=4), job(4, gpus=8, replicas=2), job(5, gpus=2)],
        )
        explained = schedule(snap)
        plain = schedule(snap, explain=False)
        assert explained.waits and not plain.waits
        assert plain.starts == explained.starts
        assert plain.preemptions == explained.preemptions
