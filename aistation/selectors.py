"""Reads, always scoped to the caller's tenants."""

from collections import defaultdict

from django.db.models import Count, F, Q, QuerySet, Sum

from aistation.choices import ACTIVE_STATES, JobState
from aistation.models import Job, Notebook, Queue, Workdir
from infra_os.access import scope_to_user
from infra_os.choices import ADMIN_ROLES
from infra_os.models import Membership


def queue_list(*, user) -> QuerySet[Queue]:
    active = Q(jobs__state__in=ACTIVE_STATES)
    return scope_to_user(Queue.objects.select_related("tenant", "cluster", "fleet"), user).annotate(
        pending=Count("jobs", filter=Q(jobs__state=JobState.QUEUED)),
        running=Count("jobs", filter=active),
        gpus_in_use=Sum(F("jobs__gpus_per_replica") * F("jobs__replicas"), filter=active,
                        default=0),
    )


def job_waiting_reason(job: Job | None) -> str:
    """Why the job waits for the scheduler ("waiting: 2 CPU cores asked, 1 free on node local
    (the deployment demo holds 1)"), "" unless it waits. Read off a job the caller's query
    already joined (the runs' and deployments' list selectors do), so a page of them costs no
    query more."""
    if job is None or job.state != JobState.QUEUED:
        return ""
    return job.reason


def job_list(*, user) -> QuerySet[Job]:
    # A working folder's file list can be long: read only where a page shows it.
    return scope_to_user(
        Job.objects.select_related("tenant", "queue", "cluster", "owner", "workdir")
        .defer("workdir__files"), user
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


def notebook_list(*, user) -> QuerySet[Notebook]:
    """The notebooks of the caller's tenants that they may open: their own, and, for a
    tenant's admins, all of that tenant's."""
    own_or_admin = Q(owner=user) | Q(tenant_id__in=Membership.objects.filter(
        user=user, role__in=ADMIN_ROLES).values("tenant_id"))
    return scope_to_user(
        Notebook.objects.filter(deleted=False).select_related("tenant", "owner", "queue",
                                                             "queue__cluster", "job"),
        user,
    ).filter(own_or_admin)


def workdir_list(*, user) -> QuerySet[Workdir]:
    """The working folders of the caller's tenants."""
    return scope_to_user(Workdir.objects.select_related("tenant"), user)


def queue_tenants_run_there(cluster_id: int, tenant_ids) -> bool:
    """Whether one of the tenants (ids, or a subquery of them) has an active queue on the
    cluster: runs work there."""
    return Queue.objects.filter(cluster_id=cluster_id, is_active=True,
                                tenant_id__in=tenant_ids).exists()
