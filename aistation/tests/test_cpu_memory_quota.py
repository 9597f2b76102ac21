"""CPU and memory quotas in the scheduler core: hard limits on all of a tenant's work, held like
the GPU quota, with words and positions; never borrowed above; preemption only when it gives
back enough of them. Pure pytest: the core needs no database.

Every cycle goes through `decide`, whose `check` also asserts that no tenant ends a cycle past
its CPU or memory quota."""

from __future__ import annotations

from dataclasses import replace

from aistation.scheduler import NodeSnap, QueueSnap, Snapshot
from aistation.tests.test_scheduler_core import (
    NOW,
    Result,
    decide,
    job,
    nodes,
    running,
    snapshot,
)

GIB = 1024


def capped(snap: Snapshot, **quotas: dict) -> Snapshot:
    """The snapshot with tenants' CPU/memory quotas set: capped(snap, a={"cpu_quota": 1})."""
    tenants = tuple(replace(t, **quotas.get(t.name, {})) for t in snap.tenants)
    return replace(snap, tenants=tenants)


def cpu_jobs(*ids: int, cpu: float = 0.6, tenant: str = "a", **kw):
    """CPU-only jobs (no GPU), as in the report: `python3 -c …` with 0.6 cores each."""
    return [job(i, tenant, 0, cpu_per_replica=cpu, **kw) for i in ids]


# -- the reported case ------------------------------------------------------------------------


def test_a_1_core_quota_runs_one_of_two_jobs_of_0_6_cores_and_the_other_waits_saying_why():
    r = decide(capped(snapshot(nodes(2), pending=cpu_jobs(1, 2)), a={"cpu_quota": 1}))
    assert set(r.starts) == {1}
    assert not r.borrowed(), "CPU is not borrowed above the quota, however idle the cluster"
    wait = r.waits[2]
    assert wait.reason == "waiting: tenant quota 0.6/1 CPU cores in use, job needs 0.6"
    assert wait.position == 1 and not wait.never_fits


def test_running_work_counts_against_the_cpu_quota_and_positions_are_kept():
    r = decide(capped(snapshot(
        nodes(2),
        running_jobs=[running(1, "a", 0, on="node-1", cpu_per_replica=0.6)],
        pending=cpu_jobs(2, 3, 4),
    ), a={"cpu_quota": 1.5}))
    assert set(r.starts) == {2}
    assert [r.waits[i].position for i in (3, 4)] == [1, 2]
    assert r.reason(3) == "waiting: tenant quota 1.2/1.5 CPU cores in use, job needs 0.6"


def test_gpu_jobs_hold_the_cpu_quota_too_and_replicas_count_each():
    r = decide(capped(snapshot(
        nodes(2),
        pending=[job(1, "a", 1, replicas=2, cpu_per_replica=2), job(2, "a", 1, cpu_per_replica=1)],
    ), a={"cpu_quota": 4}))
    assert set(r.starts) == {1}
    assert r.reason(2) == "waiting: tenant quota 4/4 CPU cores in use, job needs 1"


def test_a_memory_quota_holds_the_same_way():
    r = decide(capped(snapshot(
        nodes(2),
        running_jobs=[running(1, "a", 1, on="node-1", memory_mib_per_replica=12 * GIB)],
        pending=[job(2, "a", 1, memory_mib_per_replica=8 * GIB),
                 job(3, "a", 1, memory_mib_per_replica=4 * GIB)],
    ), a={"memory_quota_mib": 16 * GIB}))
    assert set(r.starts) == {3}, "the smaller job behind still fits the memory left"
    # Worded when it was tried, as every wait is: before job 3 took the rest.
    assert r.reason(2) == "waiting: tenant quota 12/16 GiB memory in use, job needs 8 GiB"
    assert r.waits[2].position == 1


def test_no_cpu_or_memory_quota_means_no_limit():
    # The core's None is the platform's 0 (see the cycle tests): nothing but the nodes binds.
    r = decide(snapshot(nodes(1, cpu_cores=8), pending=cpu_jobs(*range(1, 11))))
    assert set(r.starts) == set(range(1, 11))
    assert r.snapshot.tenants[0].cpu_quota is None


def test_only_the_tenant_with_the_quota_is_held():
    snap = snapshot(nodes(1), pending=cpu_jobs(1, 2) + cpu_jobs(3, 4, tenant="b"))
    r = decide(capped(snap, a={"cpu_quota": 1}))
    assert set(r.starts) == {1, 3, 4}


def test_work_held_on_other_clusters_counts():
    r = decide(capped(snapshot(nodes(1), pending=cpu_jobs(1)),
                      a={"cpu_quota": 1, "cpu_held_elsewhere": 0.6}))
    assert not r.starts
    assert r.reason(1) == "waiting: tenant quota 0.6/1 CPU cores in use, job needs 0.6"


def test_work_on_borrowed_gpus_counts_against_the_cpu_quota():
    # a has no GPUs of its own: its GPU jobs borrow, but their cores are its own to count.
    r = decide(capped(snapshot(
        nodes(2), quotas={"a": 0, "b": 8},
        running_jobs=[running(1, "a", 1, on="node-1", cpu_per_replica=0.6, borrowed=True)],
        pending=[job(2, "a", 1, cpu_per_replica=0.6)],
    ), a={"cpu_quota": 1}))
    assert not r.starts
    assert r.reason(2) == "waiting: tenant quota 0.6/1 CPU cores in use, job needs 0.6"


def test_a_borrower_over_its_gpu_quota_still_keeps_to_its_cpu_quota():
    r = decide(capped(snapshot(
        nodes(2), quotas={"a": 1},
        pending=[job(1, "a", 1, cpu_per_replica=0.6), job(2, "a", 1, cpu_per_replica=0.6)],
    ), a={"cpu_quota": 1}))
    assert set(r.starts) == {1} and not r.borrowed()
    assert r.reason(2) == "waiting: tenant quota 0.6/1 CPU cores in use, job needs 0.6"


def test_fractions_add_up_without_float_noise():
    r = decide(capped(snapshot(nodes(1), pending=cpu_jobs(*range(1, 12), cpu=0.1)),
                      a={"cpu_quota": 1}))
    assert len(r.starts) == 10, "ten jobs of 0.1 cores fill a 1-core quota exactly"
    assert r.reason(11) == "waiting: tenant quota 1/1 CPU cores in use, job needs 0.1"


def test_a_cpu_wait_at_the_head_of_a_fifo_queue_blocks_it():
    r = decide(capped(snapshot(
        nodes(1), queues=[QueueSnap("a/q", "a", policy="fifo")],
        running_jobs=[running(1, "a", 0, on="node-1", cpu_per_replica=0.5)],
        pending=[*cpu_jobs(2, cpu=0.8), *cpu_jobs(3, cpu=0.2)],
    ), a={"cpu_quota": 1}))
    assert not r.starts
    assert r.reason(2) == "waiting: tenant quota 0.5/1 CPU cores in use, job needs 0.8"
    assert r.reason(3) == "waiting: behind job 2 in a fifo queue"
    assert [r.waits[i].position for i in (2, 3)] == [1, 2]


def test_a_starving_job_over_its_cpu_quota_reserves_nothing_and_says_why():
    old = NOW - 10 * 86400
    r = decide(capped(snapshot(
        nodes(1),
        running_jobs=[running(1, "a", 0, on="node-1", cpu_per_replica=0.6)],
        pending=[*cpu_jobs(2, submitted_at=old), job(3, "b", 4)],
    ), a={"cpu_quota": 1}))
    assert r.reason(2) == "waiting: tenant quota 0.6/1 CPU cores in use, job needs 0.6"
    assert 3 in r.starts, "no node is held for a job its quota keeps waiting"


# -- never fits -------------------------------------------------------------------------------


def test_a_job_asking_more_than_the_whole_cpu_quota_never_fits_and_says_so():
    r = decide(capped(snapshot(nodes(1), pending=[*cpu_jobs(1, cpu=2),
                                                  job(2, "a", 0, cpu_per_replica=0.6, replicas=2)]),
                      a={"cpu_quota": 1}))
    assert r.waits[1].never_fits
    assert r.reason(1) == "never fits: needs 2 CPU cores, more than the tenant's CPU quota of 1"
    assert r.waits[2].never_fits, "a gang counts all its replicas"
    assert r.reason(2) == "never fits: needs 1.2 CPU cores, more than the tenant's CPU quota of 1"


def test_a_job_asking_more_than_the_whole_memory_quota_never_fits_and_says_so():
    r = decide(capped(snapshot(nodes(1), pending=[job(1, "a", 1, memory_mib_per_replica=20 * GIB)]),
                      a={"memory_quota_mib": 16 * GIB}))
    assert r.waits[1].never_fits
    assert r.reason(1) == ("never fits: needs 20 GiB of memory, more than the tenant's memory "
                           "quota of 16 GiB")


def test_a_job_of_exactly_the_quota_fits():
    r = decide(capped(snapshot(nodes(1), pending=cpu_jobs(1, cpu=1)), a={"cpu_quota": 1}))
    assert set(r.starts) == {1}


# -- preemption, reclaim and the fair policy ----------------------------------------------------


def _one_node_full_of_a(victim_priority: int) -> Snapshot:
    """node-1 (8 GPUs) is full with a's job 1 (8 GPUs, 1 core, priority 0); a's job 2 (no GPU,
    3 cores, priority `victim_priority`) holds the rest of its 4-core quota. Job 3 (priority 5,
    4 GPUs, 2 cores) needs GPUs that only job 1 gives back, and cores that job 1 alone does
    not."""
    return capped(snapshot(
        nodes(1), quotas={"a": 8},
        running_jobs=[running(1, "a", 8, on="node-1", cpu_per_replica=1),
                      running(2, "a", 0, on="node-1", cpu_per_replica=3,
                              priority=victim_priority)],
        pending=[job(3, "a", 4, cpu_per_replica=2, priority=5)],
    ), a={"cpu_quota": 4})


def test_preemption_gives_back_enough_cpu_quota_as_well_as_room():
    r = decide(_one_node_full_of_a(victim_priority=0))
    assert set(r.preempted) == {1, 2}, "job 1 makes room, job 2 gives back the cores"
    assert set(r.starts) == {3}


def test_a_preemption_that_frees_gpus_but_not_enough_cpu_is_not_made():
    # Job 2 ranks above job 3: only job 1 could go, and its one core leaves job 3 a core short.
    r = decide(_one_node_full_of_a(victim_priority=9))
    assert not r.preempted and not r.starts
    assert r.reason(3) == "waiting: tenant quota 4/4 CPU cores in use, job needs 2"


def test_preemption_for_cpu_alone_takes_no_more_than_needed():
    r = decide(capped(snapshot(
        nodes(1),
        running_jobs=[running(1, "a", 0, on="node-1", cpu_per_replica=0.5),
                      running(2, "a", 0, on="node-1", cpu_per_replica=0.5)],
        pending=cpu_jobs(3, cpu=0.5, priority=5),
    ), a={"cpu_quota": 1}))
    assert set(r.preempted) == {2}, "the most recently started, and one is enough"
    assert r.preempted[2] == "preempted by job 3 (priority 5)"
    assert set(r.starts) == {3}


def test_a_job_over_its_cpu_quota_never_reclaims_other_tenants_borrowed_work():
    # b borrows all of node-1; a's job is within its GPU quota, so it would reclaim, but a's
    # cores are spent: taking b's work back would start nothing.
    r = decide(capped(snapshot(
        nodes(1), quotas={"a": 8, "b": 0},
        running_jobs=[running(1, "b", 8, on="node-1", borrowed=True),
                      running(2, "a", 0, on="node-1", cpu_per_replica=1)],
        pending=[job(3, "a", 4, cpu_per_replica=1)],
    ), a={"cpu_quota": 1}))
    assert not r.preempted and not r.starts
    assert r.reason(3) == "waiting: tenant quota 1/1 CPU cores in use, job needs 1"


def test_a_job_within_its_cpu_quota_still_reclaims_borrowed_work():
    r = decide(capped(snapshot(
        nodes(1), quotas={"a": 8, "b": 0},
        running_jobs=[running(1, "b", 8, on="node-1", borrowed=True)],
        pending=[job(2, "a", 4, cpu_per_replica=1)],
    ), a={"cpu_quota": 1}))
    assert r.preempted == {1: "reclaimed: tenant a needs its quota back for job 2"}
    assert set(r.starts) == {2}


def _fair_level_cycle(fresh_cpu: float) -> Result:
    """A fair queue: job 1 has run 650 s on 2 of a's 4 cores (8 GPUs: a level down); job 2 is new,
    asks `fresh_cpu` cores and no GPU, and job 1's node has GPUs and cores to spare."""
    return decide(capped(snapshot(
        [NodeSnap("node-1", 8, cpu_cores=64)], quotas={"a": 8},
        running_jobs=[running(1, "a", 8, on="node-1", started_at=NOW - 650, cpu_per_replica=2),
                      running(5, "a", 0, on="node-1", started_at=NOW - 650, cpu_per_replica=2,
                              attained_gpu_s=0)],
        pending=cpu_jobs(2, cpu=fresh_cpu),
    ), a={"cpu_quota": 4}), levels_gpu_s=(3600,), min_run_s=600)


def test_the_fair_policy_preempts_a_lower_level_for_cpu_quota_only_when_that_is_enough():
    # Job 1 (a level down) gives back 2 cores: enough for a 2-core job, which preempts it.
    r = _fair_level_cycle(2)
    assert r.preempted == {1: "preempted for job 2, which has had less service: attained "
                              "1.4 GPU-hours, level 0 → 1"}
    assert set(r.starts) == {2}
    # 3 cores would need job 5 too, at job 2's level: nothing is preempted in vain.
    r = _fair_level_cycle(3)
    assert not r.preempted and not r.starts
    assert r.reason(2) == "waiting: tenant quota 4/4 CPU cores in use, job needs 3"
