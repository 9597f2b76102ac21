"""The scheduler over several cycles and many snapshots: the starvation bound (a large job behind
a stream of small ones), reservations, and random snapshots checked against every rule."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from aistation.scheduler import JobSnap, NodeSnap, QueueSnap, Snapshot, TenantSnap
from aistation.tests.test_scheduler_core import NOW, check, decide, job, nodes, running, snapshot

# "8 GPUs asked, 2 free on node node-1": a capacity wait that only GPUs bind.
GPUS_FREE = re.compile(r"(\d+) (?:\S+ )?GPUs? asked, (\d+) free on node ([^\s,;()]+)")

SMALL_RUN_S = 300.0  # how long each small job runs
CYCLE_S = 30.0  # time between scheduling cycles
STREAM = 6  # small jobs always waiting


def _stream_with_a_large_job(policy: str, starvation_s: float, horizon_s: float) -> float | None:
    """Four 8-GPU nodes kept busy by 2-GPU jobs of 300 s whose ends are staggered, so no node ever
    drains by itself; new small jobs keep arriving; an 8-GPU job was submitted at t=0. Runs a
    cycle every 30 s, finishing small jobs as time passes, and returns when the large job
    started (None if it did not within the horizon)."""
    cluster = nodes(4)
    queue = QueueSnap("a/q", "a", policy=policy)
    active: list[tuple[JobSnap, float]] = []  # running jobs and when they finish
    next_id = 100
    for slot in range(4):
        for n, node in enumerate(cluster):
            ends = CYCLE_S + (slot * 4 + n) * 17
            started = running(next_id, "a", 2, on=node.name, started_at=ends - SMALL_RUN_S)
            active.append((started, ends))
            next_id += 1
    large = job(1, "a", 8, submitted_at=0.0)
    pending = [large]
    now = 0.0
    while now <= horizon_s:
        active = [(j, ends) for j, ends in active if ends > now]
        while len(pending) - (large in pending) < STREAM:
            pending.append(job(next_id, "a", 2, submitted_at=now))
            next_id += 1
        snap = snapshot(
            cluster,
            quotas={"a": 1000},
            queues=[queue],
            running_jobs=[j for j, _ in active],
            pending=pending,
            now=now,
        )
        r = decide(snap, starvation_s=starvation_s)
        if 1 in r.starts:
            return now
        for start in r.decisions.starts:
            started = next(p for p in pending if p.id == start.job_id)
            active.append(
                (replace(started, placement=start.placement, started_at=now), now + SMALL_RUN_S)
            )
        # While the large job waits with nodes reserved, nothing else starts on them.
        reason = r.reason(1)
        if "reserved for job 1" in reason:
            reserved = reason.split("nodes ", 1)[1].split(" are reserved")[0].split(", ")
            assert not any(set(s.placement) & set(reserved) for s in r.decisions.starts)
        pending = [p for p in pending if p.id not in r.starts]
        now += CYCLE_S
    return None


@pytest.mark.parametrize("policy", ["fair", "backfill"])
def test_a_large_job_behind_a_stream_of_small_ones_starts_within_the_starvation_bound(policy):
    bound = 900.0
    started = _stream_with_a_large_job(policy, bound, horizon_s=4000)
    assert started is not None
    # Starving after `bound`, then its reserved node drains: at most one small job's run, and
    # the cycles' granularity on either side.
    assert started <= bound + SMALL_RUN_S + 2 * CYCLE_S


def test_without_the_bound_the_stream_would_starve_the_large_job():
    # The same stream with no effective bound: backfill alone never frees a whole node.
    assert _stream_with_a_large_job("fair", float("inf"), horizon_s=4000) is None


def _half_busy(pending: list[JobSnap]) -> Snapshot:
    return snapshot(
        nodes(3),
        quotas={"a": 100},
        running_jobs=[
            running(11, "a", 2, on="node-1"),
            running(12, "a", 2, on="node-1"),
            running(13, "a", 2, on="node-1"),
            running(14, "a", 2, on="node-2"),
            running(15, "a", 4, on="node-3"),
        ],
        pending=pending,
    )


def test_a_starving_job_gets_the_freest_nodes_reserved_and_others_backfill_elsewhere():
    small = [job(i, "a", 2) for i in range(20, 25)]
    r = decide(_half_busy([job(1, "a", 8, submitted_at=NOW - 1000), *small]))
    assert r.reason(1) == (
        "waiting: nodes node-2 are reserved for job 1, waiting for 1000 s (over the 900 s "
        "starvation bound); nothing else starts there while their running work drains"
    )
    assert not any("node-2" in s.placement for s in r.decisions.starts)
    assert len(r.starts) == 3, "one on node-1, two on node-3"
    assert r.reason(23) == (
        "waiting: 2 GPUs asked, 0 free on node node-1, the closest of 2 nodes looked at (job 11 "
        "holds 2, job 12 holds 2, job 13 holds 2 and 1 more); nodes node-2 are reserved for job 1"
    )


def test_no_reservation_before_the_bound():
    small = [job(i, "a", 2) for i in range(20, 25)]
    r = decide(_half_busy([job(1, "a", 8, submitted_at=NOW - 800), *small]))
    assert r.reason(1) == (
        "waiting: 8 GPUs asked, 2 free on node node-2, the closest of 3 nodes looked at (job 14 "
        "holds 2, job 23 holds 2, job 24 holds 2)"
    )
    assert len(r.starts) == 5


def _partly_busy(count: int, pending: list[JobSnap]) -> Snapshot:
    """`count` nodes: node-1 to node-4 hold 1, 4, 2 and 6 GPUs of work, the rest are full."""
    full = [running(20 + n, "a", 8, on=f"node-{n}") for n in range(5, count + 1)]
    return snapshot(
        nodes(count),
        quotas={"a": 100},
        running_jobs=[
            running(11, "a", 1, on="node-1"),
            running(12, "a", 4, on="node-2"),
            running(13, "a", 2, on="node-3"),
            running(14, "a", 6, on="node-4"),
            *full,
        ],
        pending=pending,
    )


def test_a_starving_gang_reserves_enough_of_the_freest_nodes():
    r = decide(_partly_busy(4, [job(1, "a", 8, replicas=2, submitted_at=NOW - 2000)]))
    assert r.reason(1).startswith("waiting: nodes node-1, node-3 are reserved for job 1")


def test_no_large_share_of_the_cluster_drains_for_a_job_that_waiting_work_would_preempt():
    """A gang starving at a high level, with work of a lower level waiting in its queue, would
    be preempted by that work once it had run its minimum run: draining more than an eighth of
    the cluster for it would idle those nodes for minutes of its work, again at every wait."""

    def cycle(attained_gpu_s: float, replicas: int):
        return decide(_partly_busy(8, [
            job(1, "a", 8, replicas=replicas, submitted_at=NOW - 2000,
                attained_gpu_s=attained_gpu_s),
            job(2, "a", 8),  # just submitted, nothing attained: the lowest level
        ]))

    outranked = cycle(attained_gpu_s=1e6, replicas=2)
    assert outranked.decisions.reservations == ()
    assert outranked.reason(1) == (
        "waiting: 2000 s, over the 900 s starvation bound, but no nodes drain for it while work "
        "its queue ranks above it waits: that work would preempt it once it had run 600 s; it "
        "starts where room frees up, and its total wait promotes it in time"
    )
    assert "reserved" not in outranked.reason(2)
    level = cycle(attained_gpu_s=0, replicas=2)  # nothing waiting ranks above it
    assert [r.nodes for r in level.decisions.reservations] == [("node-1", "node-3")]
    # An eighth of the cluster still drains for it: long single-node jobs take turns that way.
    single = cycle(attained_gpu_s=1e6, replicas=1)
    assert [r.nodes for r in single.decisions.reservations] == [("node-1",)]


def test_a_starving_job_goes_first_even_when_its_policy_would_put_it_later():
    snap = snapshot(
        nodes(1),
        pending=[
            job(1, "a", 8, submitted_at=NOW - 1000, attained_gpu_s=1e6),
            job(2, "a", 2, attained_gpu_s=0),
        ],
    )
    assert set(decide(snap).starts) == {1}
    assert set(decide(snap, starvation_s=2000).starts) == {2}, "fair order: least attained"


def test_a_starving_job_over_its_quota_reserves_nothing():
    r = decide(
        replace(
            _half_busy([job(1, "a", 8, submitted_at=NOW - 1000), job(20, "a", 2)]),
            tenants=(TenantSnap("a", 12),),
        )
    )
    assert "reserved" not in r.reason(1)



def test_a_queue_reserving_on_another_cluster_of_its_fleet_reserves_nothing_here():
    small = [job(i, "a", 2) for i in range(20, 25)]
    snap = _half_busy([job(1, "a", 8, submitted_at=NOW - 1000), *small])
    here = decide(snap)
    assert [tuple(r) for r in here.decisions.reservations] == [(1, "a/q", ("node-2",))]
    r = decide(replace(snap, reserved_elsewhere={"a/q": "job 7 on east"}))
    assert r.decisions.reservations == ()
    assert r.reason(1) == (
        "waiting: 1000 s, over the 900 s starvation bound; its queue's one reservation across "
        "the fleet is held for job 7 on east, and this job reserves nodes once that one has "
        "started"
    )
    assert len(r.starts) == 5, "nothing is drained here: the small jobs start on node-2 too"
    other = decide(replace(snap, reserved_elsewhere={"b/q": "job 7 on east"}))
    assert other.reason(1).startswith("waiting: nodes node-2 are reserved for job 1")


# -- random snapshots -------------------------------------------------------------------------


def _random_snapshot(rng: random.Random) -> Snapshot:
    models = ["", "H100", "A100"]
    node_list = [
        NodeSnap(
            name=f"n{i}",
            gpus=rng.choice([2, 4, 8, 8]),
            gpu_model=rng.choice(models),
            cpu_cores=rng.choice([0, 32, 64]),
            memory_mib=rng.choice([0, 262_144]),
            schedulable=rng.random() > 0.1,
        )
        for i in range(rng.randint(1, 7))
    ]
    tenants = tuple(
        TenantSnap(
            name=name,
            gpu_quota=rng.choice([0, 4, 8, 16, 32]),
            gpu_model_limits={"H100": rng.choice([2, 8])} if rng.random() < 0.3 else {},
            cpu_quota=rng.choice([None, None, 8, 20.5, 64]),
            memory_quota_mib=rng.choice([None, None, 65_536, 200_000]),
            cpu_held_elsewhere=rng.choice([0.0, 0.0, 4.0]),
            memory_mib_held_elsewhere=rng.choice([0, 0, 8192]),
        )
        for name in ("a", "b", "c")
    )
    queues = tuple(
        QueueSnap(
            key=f"{t.name}/{q}",
            tenant=t.name,
            gpu_limit=rng.choice([None, None, 4, 12]),
            policy=rng.choice(["fifo", "backfill", "fair"]),
        )
        for t in tenants
        for q in ("x", "y")
    )
    free = {n.name: [n.gpus, n.cpu_cores or 1e9, n.memory_mib or 1e12] for n in node_list}
    running_jobs = []
    next_id = 1
    for _ in range(rng.randint(0, 12)):
        gpus = rng.choice([1, 2, 4, 8])
        replicas = rng.choice([1, 1, 2])
        spots = [name for name, f in free.items() if f[0] >= gpus and f[1] >= 4 and f[2] >= 4096]
        if len(spots) < replicas:
            continue
        placement = tuple(rng.sample(spots, replicas))
        for name in placement:
            free[name][0] -= gpus
            free[name][1] -= 4
            free[name][2] -= 4096
        queue = rng.choice(queues)
        running_jobs.append(
            JobSnap(
                id=next_id,
                tenant=queue.tenant,
                queue=queue.key,
                priority=rng.choice([0, 0, 1, 5]),
                submitted_at=NOW - rng.uniform(500, 5000),
                gpus_per_replica=gpus,
                replicas=replicas,
                cpu_per_replica=4,
                memory_mib_per_replica=4096,
                placement=placement,
                started_at=NOW - rng.uniform(0, 500),
                borrowed=rng.random() < 0.3,
            )
        )
        next_id += 1
    pending = []
    for _ in range(rng.randint(0, 25)):
        queue = rng.choice(queues)
        names = [n.name for n in node_list]
        excluded = frozenset(rng.sample(names, 1)) if rng.random() < 0.2 else frozenset()
        pending.append(
            JobSnap(
                id=next_id,
                tenant=queue.tenant,
                queue=queue.key,
                priority=rng.choice([0, 0, 1, 5]),
                submitted_at=NOW - rng.uniform(0, 2000),
                gpus_per_replica=rng.choice([0, 1, 1, 2, 4, 8, 16]),
                replicas=rng.choice([1, 1, 1, 2, 3]),
                cpu_per_replica=rng.choice([1, 4, 48]),
                memory_mib_per_replica=rng.choice([1024, 65_536]),
                gpu_model=rng.choice(["", "", "H100", "A100", "B200"]),
                attained_gpu_s=rng.choice([0.0, 1e4]),
                excluded_nodes=excluded,
                not_before=NOW + 10 if rng.random() < 0.1 else 0.0,
            )
        )
        next_id += 1
    return Snapshot(
        now=NOW,
        nodes=tuple(node_list),
        tenants=tenants,
        queues=queues,
        running=tuple(running_jobs),
        pending=tuple(pending),
    )


@pytest.mark.parametrize("seed", range(6))
def test_random_snapshots_respect_every_rule(seed):
    rng = random.Random(seed)  # noqa: S311  (test data, not secrets)
    for _ in range(100):
        snap = _random_snapshot(rng)
        check(snap, schedule_checked(snap, starvation_s=rng.choice([900.0, 100.0])))


def schedule_checked(snap: Snapshot, **kw):
    from aistation.scheduler import schedule

    decisions = schedule(snap, **kw)
    assert schedule(snap, **kw) == decisions, "the same snapshot gives the same decisions"
    _capacity_reasons_are_true(snap, decisions)
    return decisions


def _capacity_reasons_are_true(snap: Snapshot, decisions) -> None:
    """A job told there is no room for it indeed has none in the cycle's final state."""
    if decisions.preemptions:
        return
    left = {n.name: [n.gpus, n.cpu_cores or 1e9, n.memory_mib or 1e12] for n in snap.nodes}
    pending = {j.id: j for j in snap.pending}
    placed = list(snap.running) + [
        replace(pending[s.job_id], placement=s.placement) for s in decisions.starts
    ]
    for j in placed:
        for name in j.placement:
            left[name][0] -= j.gpus_per_replica
            left[name][1] -= j.cpu_per_replica
            left[name][2] -= j.memory_mib_per_replica
    reserved = set()
    for w in decisions.waits:
        if " are reserved for job " in w.reason:
            reserved |= set(w.reason.split("nodes ", 1)[1].split(" are reserved")[0].split(", "))
    for w in decisions.waits:
        if not (w.reason.startswith("waiting: no ") or " asked, " in w.reason
                or " replicas of " in w.reason[:40]):
            continue
        j = pending[w.job_id]
        room = 0
        for node in snap.nodes:
            gpus, cpu, mem = left[node.name]
            if (
                not node.schedulable
                or node.name in reserved
                or node.name in j.excluded_nodes
                or (j.gpu_model and node.gpu_model != j.gpu_model)
            ):
                continue
            fit = gpus // j.gpus_per_replica if j.gpus_per_replica else j.replicas
            fit = min(fit, int(cpu // j.cpu_per_replica), int(mem // j.memory_mib_per_replica))
            room += max(fit, 0)
        assert room < j.replicas, f"job {j.id} told '{w.reason}' but fits"
        # The figures it names are those of the node it names, in the cycle's final state.
        said = GPUS_FREE.search(w.reason)
        if said:
            assert int(said[2]) == max(left[said[3]][0], 0) and int(said[1]) == j.gpus_per_replica
            assert said[3] not in reserved and said[3] not in j.excluded_nodes, w.reason


# -- a few more cases the cycles meet -----------------------------------------------------------


def test_a_starving_fifo_head_gets_its_reservation_and_still_blocks_its_queue():
    r = decide(
        snapshot(
            nodes(2),
            quotas={"a": 100},
            queues=[QueueSnap("a/q", "a", policy="fifo")],
            running_jobs=[running(11, "a", 6, on="node-1"), running(12, "a", 2, on="node-2")],
            pending=[job(1, "a", 8, submitted_at=NOW - 1000), job(2, "a", 1)],
        )
    )
    assert r.reason(1).startswith("waiting: nodes node-2 are reserved for job 1")
    assert r.reason(2) == "waiting: behind job 1 in a fifo queue"


def test_a_starving_job_that_fits_says_how_long_it_waited():
    r = decide(snapshot(nodes(1), pending=[job(1, "a", 2, submitted_at=NOW - 1200)]))
    assert r.starts[1].reason == (
        "admitted: tenant quota 2/8 GPUs, after waiting 1200 s (over the starvation bound)"
    )


def test_a_job_of_any_model_kept_off_a_full_model_limit_says_so():
    r = decide(
        snapshot(
            [NodeSnap("h-1", 8, "H100")],
            quotas={"a": 16, "b": 16},
            limits={"a": {"H100": 4}},
            running_jobs=[running(1, "a", 4, on="h-1"), running(2, "b", 4, on="h-1")],
            pending=[job(3, "a", 2)],
        )
    )
    assert r.reason(3) == (
        "waiting: the tenant's GPU model limits are in use (H100); no idle capacity to borrow: "
        "2 GPUs asked, 0 free on node h-1 (job 1 holds 4, other tenants' work holds 4)"
    )
