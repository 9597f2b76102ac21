"""Quota holds under concurrent submissions and overlapping scheduling cycles (row locks on
PostgreSQL; SQLite serialises writers)."""

import threading

import pytest
from django.db import close_old_connections

from aistation.choices import ACTIVE_STATES
from aistation.models import Attempt, Job
from aistation.services import jobs as job_services
from aistation.services.scheduling import schedule_cluster

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
