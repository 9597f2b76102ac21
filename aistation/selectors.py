"""Reads, always scoped to the caller's tenants."""

from collections import defaultdict

from django.db.models import Count, F, Q, QuerySet, Sum

from aistation.choices import ACTIVE_STATES, JobState
from aistation.models import Job, Queue
from infra_os.access import scope_to_user


def queue_list(*, user) -> QuerySet[Queue]:
    active = Q(jobs__state__in=ACTIVE_STATES)
    return scope_to_user(Queue.objects.select_related("tenant", "cluster"), user).annotate(
        pending=Count("jobs", filter=Q(jobs__state=JobState.QUEUED)),
        running=Count("jobs", filter=active),
        gpus_in_use=Sum(F("jobs__gpus_per_replica") * F("jobs__replicas"), filter=active,
                        default=0),
    )


def job_list(*, user) -> QuerySet[Job]:
    return scope_to_user(
        Job.objects.select_related("tenant", "queue", "cluster", "owner"), user
    )


def job_detail(*, user, pk: int) -> Job:
    return job_list(user=user).prefetch_related("attempts", "events").get(pk=pk)


def gpu_allocations(cluster_ids) -> dict[tuple[int, str], int]:
    """GPUs held on each (cluster id, node name) by admitted or running jobs."""
    held: dict[tuple[int, str], int] = defaultdict(int)
    jobs = Job.objects.filter(cluster_id__in=cluster_ids, state__in=ACTIVE_STATES) \
        .values_list("cluster_id", "placement", "gpus_per_replica")
    for cluster_id, placement, gpus in jobs:
        for node in placement:
            held[(cluster_id, node)] += gpus
    return held
