"""RDMA devices in the scheduler core: a replica fits a node only if its GPUs and its RDMA
devices both fit; waits and never-fits say so in words; preemption frees RDMA devices it
counts; the tenant's RDMA quota is hard, like CPU and memory. Pure: no database."""

from __future__ import annotations

from aistation.scheduler import JobSnap, NodeSnap, QueueSnap, Snapshot, TenantSnap, schedule

NOW = 1000.0


def snap(nodes, pending=(), running=(), quota=64, rdma_quota=None, rdma_elsewhere=0):
    return Snapshot(
        now=NOW, nodes=tuple(nodes),
        tenants=(TenantSnap(name="a", gpu_quota=quota, rdma_quota=rdma_quota,
                            rdma_held_elsewhere=rdma_elsewhere),),
        queues=(QueueSnap(key="a/q", tenant="a", policy="backfill"),),
        running=tuple(running), pending=tuple(pending))


def job(job_id, *, gpus=1, replicas=1, rdma=0, priority=0, placement=(), started=None):
    return JobSnap(id=job_id, tenant="a", queue="a/q", priority=priority,
                   submitted_at=NOW - 10 + job_id, gpus_per_replica=gpus, replicas=replicas,
                   cpu_per_replica=0, memory_mib_per_replica=0, rdma_per_replica=rdma,
                   placement=tuple(placement), started_at=started)


def ib_nodes(count, rdma=2, gpus=8):
    return [NodeSnap(name=f"n{i}", gpus=gpus, rdma=rdma) for i in range(1, count + 1)]


def test_a_gang_needing_2_rdma_each_spreads_over_nodes_offering_2():
    decisions = schedule(snap(ib_nodes(2), pending=[job(1, replicas=2, rdma=2)]))
    [start] = decisions.starts
    assert sorted(start.placement) == ["n1", "n2"]


def test_it_never_lands_twice_on_a_node_offering_2_and_says_why():
    decisions = schedule(snap(ib_nodes(1), pending=[job(1, replicas=2, rdma=2)]))
    assert not decisions.starts
    [wait] = decisions.waits
    assert wait.never_fits
    assert wait.reason.startswith("never fits: 2 replicas of 1 GPU"), wait.reason


def test_without_rdma_the_same_gang_shares_one_node():
    decisions = schedule(snap(ib_nodes(1), pending=[job(1, replicas=2)]))
    [start] = decisions.starts
    assert start.placement == ("n1", "n1")


def test_a_cluster_without_rdma_never_holds_a_replica_asking_for_it():
    decisions = schedule(snap(ib_nodes(2, rdma=0), pending=[job(1, rdma=1)]))
    [wait] = decisions.waits
    assert wait.never_fits
    assert wait.reason == ("never fits: no node with 1 GPU has 1 RDMA device, 0 CPU cores and "
                           "0 GiB of memory for one replica"), wait.reason


def test_a_replica_waits_in_words_while_the_rdma_devices_are_held():
    running = [job(1, rdma=2, placement=["n1"], started=0.0)]
    decisions = schedule(snap(ib_nodes(1), pending=[job(2, rdma=1), job(3)], running=running))
    assert [s.job_id for s in decisions.starts] == [3]
    [wait] = decisions.waits
    assert wait.reason == ("waiting: 1 RDMA device asked, 0 free on node n1 (job 1 holds 2)"), \
        wait.reason


def test_a_gang_waits_naming_the_rdma_devices():
    running = [job(1, rdma=1, placement=["n1"], started=0.0)]
    decisions = schedule(snap(ib_nodes(2), pending=[job(2, replicas=2, rdma=2)],
                              running=running))
    [wait] = decisions.waits
    assert wait.reason == ("waiting: 2 replicas of 2 RDMA devices must start together and the "
                           "free RDMA devices of 2 nodes hold 1 of them (job 1 holds 1)")


def test_preemption_frees_the_rdma_devices_it_needs():
    running = [job(1, rdma=2, placement=["n1"], started=0.0, priority=0)]
    urgent = job(2, rdma=2, priority=10)
    decisions = schedule(snap(ib_nodes(1), pending=[urgent], running=running))
    assert [p.job_id for p in decisions.preemptions] == [1]
    assert [(s.job_id, s.placement) for s in decisions.starts] == [(2, ("n1",))]


def test_preemption_takes_only_what_frees_rdma():
    # Job 1 holds GPUs but no RDMA: preempting it would not let job 3 start.
    running = [job(1, gpus=4, placement=["n1"], started=0.0),
               job(2, gpus=1, rdma=2, placement=["n1"], started=0.0)]
    decisions = schedule(snap(ib_nodes(1), pending=[job(3, gpus=1, rdma=1, priority=5)],
                              running=running))
    assert [p.job_id for p in decisions.preemptions] == [2]


def test_the_rdma_quota_holds_and_counts_other_clusters():
    decisions = schedule(snap(ib_nodes(2), pending=[job(1, rdma=2), job(2, rdma=1)],
                              rdma_quota=3, rdma_elsewhere=1))
    assert [s.job_id for s in decisions.starts] == [1]
    [wait] = decisions.waits
    assert wait.reason == "waiting: tenant quota 3/3 RDMA devices in use, job needs 1"


def test_a_job_bigger_than_the_rdma_quota_never_fits():
    decisions = schedule(snap(ib_nodes(2), pending=[job(1, replicas=2, rdma=2)], rdma_quota=3))
    [wait] = decisions.waits
    assert wait.never_fits
    assert wait.reason == "never fits: needs 4 RDMA devices, more than the tenant's RDMA " \
                          "quota of 3"


def test_own_lower_priority_work_makes_way_under_the_rdma_quota():
    running = [job(1, rdma=2, placement=["n1"], started=0.0)]
    decisions = schedule(snap(ib_nodes(2), pending=[job(2, rdma=2, priority=5)],
                              running=running, rdma_quota=2))
    assert [p.job_id for p in decisions.preemptions] == [1]
    assert [s.job_id for s in decisions.starts] == [2]
