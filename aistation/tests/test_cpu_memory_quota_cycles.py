"""CPU and memory quotas in the platform: submitted through `job_submit`, scheduled by real
cycles on the fake driver. A quota of 0 means no limit; over a quota a job waits and says why;
a job bigger than the whole quota fails with the reason; other clusters' work counts."""

import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from aistation.choices import JobState
from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import load_snapshot, schedule_cluster
from infra_os.services.quotas import quota_update
from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes

WAITING = "waiting: tenant quota 0.6/1 CPU cores in use, job needs 0.6"


def set_quota(world, tenant="alpha", **fields):
    tenant = getattr(world, tenant)
    quota_update(actor=world.operator, quota=tenant.quota, **fields)


def states(*jobs):
    for job in jobs:
        job.refresh_from_db()
    return [job.state for job in jobs]


def test_two_jobs_of_0_6_cores_under_a_1_core_quota_one_runs_the_other_waits(farm, world):
    set_quota(world, cpu_cores=1)
    first = farm.submit(gpus=0, cpu_per_replica=0.6, duration=5, name="first")
    second = farm.submit(gpus=0, cpu_per_replica=0.6, name="second")
    farm.cycle()
    assert states(first, second) == [JobState.RUNNING, JobState.QUEUED]
    assert second.reason == WAITING
    assert second.position == 1
    assert not second.borrowed and not second.attempts.exists()

    # Another cycle with the cluster still idle changes nothing: CPU is never borrowed.
    farm.cycle()
    assert states(second) == [JobState.QUEUED] and second.reason == WAITING

    # When the first ends, the second runs.
    farm.fake.advance(6)
    reconcile_cluster(cluster=farm.cluster)
    farm.cycle()
    assert states(first, second) == [JobState.SUCCEEDED, JobState.RUNNING]


def test_a_memory_quota_holds_the_same_way(farm, world):
    set_quota(world, memory_gib=16)
    big = farm.submit(gpus=1, memory_mib_per_replica=12 * 1024)
    more = farm.submit(gpus=1, memory_mib_per_replica=8 * 1024)
    farm.cycle()
    assert states(big, more) == [JobState.RUNNING, JobState.QUEUED]
    assert more.reason == "waiting: tenant quota 12/16 GiB memory in use, job needs 8 GiB"


def test_a_quota_of_0_cores_and_0_gib_means_no_limit(farm, world):
    set_quota(world, cpu_cores=0, memory_gib=0)
    jobs = [farm.submit(gpus=0, cpu_per_replica=0.6, memory_mib_per_replica=64 * 1024)
            for _ in range(6)]
    farm.cycle()
    assert states(*jobs) == [JobState.RUNNING] * 6
    snapshot, _rows = load_snapshot(farm.cluster, timezone.now())
    alpha = next(t for t in snapshot.tenants if t.name == "alpha")
    assert (alpha.cpu_quota, alpha.memory_quota_mib) == (None, None)


def test_the_api_says_what_0_means():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    quota = schema["components"]["schemas"]["Quota"]["properties"]
    assert "0: no CPU limit" in quota["cpu_cores"]["description"]
    assert "0: no memory limit" in quota["memory_gib"]["description"]


def test_a_job_bigger_than_the_whole_cpu_quota_fails_with_the_reason(farm, world):
    set_quota(world, cpu_cores=1)
    job = farm.submit(gpus=0, cpu_per_replica=0.6, replicas=2)
    farm.cycle()
    assert states(job) == [JobState.FAILED]
    assert job.reason == ("can never run: never fits: needs 1.2 CPU cores, more than the "
                          "tenant's CPU quota of 1")


def test_a_job_bigger_than_the_whole_memory_quota_fails_with_the_reason(farm, world):
    set_quota(world, memory_gib=16)
    job = farm.submit(gpus=1, memory_mib_per_replica=20 * 1024)
    farm.cycle()
    assert states(job) == [JobState.FAILED]
    assert job.reason == ("can never run: never fits: needs 20 GiB of memory, more than the "
                          "tenant's memory quota of 16 GiB")


@pytest.fixture
def second_cluster(farm, world):
    cluster = Cluster.objects.create(name="farm-2", driver="fake",
                                     options={"nodes": 1, "gpus_per_node": 8})
    cluster_sync_nodes(cluster=cluster)
    return queue_create(actor=world.operator, tenant=world.alpha, name="other", cluster=cluster)


def test_work_on_another_cluster_counts_against_the_quota(farm, world, second_cluster):
    set_quota(world, cpu_cores=1)
    # Alpha's borrowed GPU work elsewhere holds cores too: those quotas count all its work.
    set_quota(world, gpus=0)
    there = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=second_cluster,
                       name="there", command=["train"], gpus_per_replica=1, cpu_per_replica=0.6)
    schedule_cluster(cluster_id=second_cluster.cluster_id)
    there.refresh_from_db()
    assert there.state == JobState.RUNNING and there.borrowed
    here = farm.submit(gpus=0, cpu_per_replica=0.6)
    farm.cycle()
    assert states(here) == [JobState.QUEUED]
    assert here.reason == WAITING


def test_preemption_gives_back_cores_for_higher_priority_work(farm, world):
    set_quota(world, cpu_cores=1)
    low = farm.submit(gpus=0, cpu_per_replica=0.6, priority=0)
    farm.cycle()
    high = farm.submit(gpus=0, cpu_per_replica=0.6, priority=5)
    farm.cycle()
    assert states(low, high) == [JobState.QUEUED, JobState.RUNNING]
    assert low.events.get(to_state=JobState.PREEMPTED).reason == (
        f"preempted by job {high.pk} (priority 5)")
    farm.cycle()
    assert states(low) == [JobState.QUEUED] and low.reason == WAITING
