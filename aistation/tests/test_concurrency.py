"""Quotas (GPUs; CPU cores across two clusters) hold under concurrent submissions and overlapping
scheduling cycles (row locks on PostgreSQL; SQLite serialises writers)."""

import threading

import pytest
from django.db import close_old_connections

from aistation.choices import ACTIVE_STATES, JobState
from aistation.models import Attempt, Job
from aistation.services import jobs as job_services
from aistation.services.queues import queue_create
from aistation.services.scheduling import schedule_cluster
from infra_os.services.quotas import quota_update
from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes

SUBMISSIONS = 64


@pytest.mark.django_db(transaction=True)
def test_quota_is_never_exceeded_across_64_concurrent_submissions(farm, world, monkeypatch):
    monkeypatch.setattr(job_services, "request_cycle", lambda cluster_id: None)
    queue = farm.queues["alpha"]
    member = world.alpha_member
    worst: list[int] = []
    errors: list[BaseException] = []
    submitting = threading.Barrier(SUBMISSIONS)

    def own_gpus() -> int:
        return sum(j.gpus for j in Job.objects.filter(tenant=queue.tenant, borrowed=False,
                                                       state__in=ACTIVE_STATES))

    def submit(index: int) -> None:
        try:
            submitting.wait()
            job_services.job_submit(actor=member, tenant=queue.tenant, queue=queue,
                                    name=f"burst-{index}", command=["train"],
                                    gpus_per_replica=1)
        except BaseException as exc:  # reported below, with every other thread's
            errors.append(exc)
        finally:
            close_old_connections()

    def schedule(rounds: int) -> None:
        try:
            for _ in range(rounds):
                schedule_cluster(cluster_id=farm.cluster.pk)
                worst.append(own_gpus())
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(SUBMISSIONS)]
    threads += [threading.Thread(target=schedule, args=(20,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    schedule_cluster(cluster_id=farm.cluster.pk)
    worst.append(own_gpus())

    assert Job.objects.count() == SUBMISSIONS
    assert max(worst) <= queue.tenant.quota.gpus
    # The rest of the cluster is lent, never more than it has, and no launch was refused.
    active = Job.objects.filter(state__in=ACTIVE_STATES)
    assert sum(j.gpus for j in active) == 16
    assert not Attempt.objects.filter(reason__startswith="launch failed").exists()


CPU_SUBMISSIONS = 40
CPU_QUOTA = 3  # cores: room for five jobs of 0.6


@pytest.mark.django_db(transaction=True)
def test_the_cpu_quota_holds_across_concurrent_submissions_on_two_clusters(farm, world,
                                                                          monkeypatch):
    # The reported case at scale: jobs of 0.6 cores submitted at once into queues on two
    # clusters, while cycles of both run; the quota counts all clusters together.
    monkeypatch.setattr(job_services, "request_cycle", lambda cluster_id: None)
    quota_update(actor=world.operator, quota=world.alpha.quota, cpu_cores=CPU_QUOTA)
    other = Cluster.objects.create(name="farm-2", driver="fake",
                                   options={"nodes": 1, "gpus_per_node": 8})
    cluster_sync_nodes(cluster=other)
    queues = [farm.queues["alpha"],
              queue_create(actor=world.operator, tenant=world.alpha, name="other", cluster=other)]
    clusters = [farm.cluster.pk, other.pk]
    worst: list[float] = []
    errors: list[BaseException] = []
    submitting = threading.Barrier(CPU_SUBMISSIONS)

    def own_cores() -> float:
        return sum(j.cpu_per_replica * j.replicas
                   for j in Job.objects.filter(tenant=world.alpha, state__in=ACTIVE_STATES))

    def submit(index: int) -> None:
        try:
            submitting.wait()
            job_services.job_submit(actor=world.alpha_member, tenant=world.alpha,
                                    queue=queues[index % 2], name=f"cores-{index}",
                                    command=["python3", "-c", "pass"], cpu_per_replica=0.6)
        except BaseException as exc:  # reported below, with every other thread's
            errors.append(exc)
        finally:
            close_old_connections()

    def schedule(cluster_id: int, rounds: int) -> None:
        try:
            for _ in range(rounds):
                schedule_cluster(cluster_id=cluster_id)
                worst.append(own_cores())
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(CPU_SUBMISSIONS)]
    threads += [threading.Thread(target=schedule, args=(cluster_id, 15))
                for cluster_id in clusters for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for cluster_id in clusters:
        schedule_cluster(cluster_id=cluster_id)
    worst.append(own_cores())

    assert Job.objects.filter(tenant=world.alpha).count() == CPU_SUBMISSIONS
    assert max(worst) <= CPU_QUOTA + 1e-9
    # The quota is filled, not just respected, and every other job says why it waits.
    active = Job.objects.filter(tenant=world.alpha, state__in=ACTIVE_STATES)
    assert active.count() == 5
    waiting = Job.objects.filter(tenant=world.alpha, state=JobState.QUEUED)
    assert waiting.count() == CPU_SUBMISSIONS - 5
    assert {j.reason for j in waiting} == {
        "waiting: tenant quota 3/3 CPU cores in use, job needs 0.6"}
    for queue in queues:
        positions = sorted(j.position for j in waiting.filter(queue=queue))
        assert positions == list(range(1, len(positions) + 1))
