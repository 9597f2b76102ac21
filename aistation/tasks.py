"""Thin tasks: load by id, call a service. All on the `cluster` queue."""

import logging

from celery import shared_task
from django.core.cache import cache

from aistation.choices import LIVE_ATTEMPT_STATES, AttemptState, JobState
from aistation.logstore.base import StoreDown
from aistation.models import Attempt, Job
from aistation.services.attempts import attempt_stop
from aistation.services.autoscale import fleet_autoscale, fleet_pools
from aistation.services.fleets import fleet_redispatch
from aistation.services.log_retention import logs_expire as expire_logs
from aistation.services.log_retention import logs_maintain
from aistation.services.log_shipping import logs_ship as ship_logs
from aistation.services.notebooks import notebook_cull
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from aistation.triggers import request_cycle
from podsys.drivers.base import DriverError
from podsys.models import Cluster, Fleet

logger = logging.getLogger(__name__)
SHIP_LOCK = "aistation.logs_ship.running"


@shared_task(name="aistation.schedule_cycle", queue="cluster", time_limit=120,
             soft_time_limit=100)
def schedule_cycle(cluster_id: int | None = None, requested_at: float | None = None) -> int:
    """One cycle for a cluster, or for every cluster with queued jobs. Returns jobs started."""
    if cluster_id is not None:
        return len(schedule_cluster(cluster_id=cluster_id, requested_at=requested_at).started)
    clusters = list(Job.objects.filter(state=JobState.QUEUED)
                    .values_list("cluster_id", flat=True).distinct())
    return sum(len(schedule_cluster(cluster_id=pk).started) for pk in clusters)


@shared_task(name="aistation.reconcile", queue="cluster", time_limit=300, soft_time_limit=280)
def reconcile() -> int:
    """Repair every cluster with live attempts; ask for a cycle where work ended."""
    ended = 0
    cluster_ids = Attempt.objects.filter(state__in=LIVE_ATTEMPT_STATES) \
        .values_list("cluster_id", flat=True).distinct()
    for cluster in Cluster.objects.filter(pk__in=list(cluster_ids)):
        try:
            result = reconcile_cluster(cluster=cluster)
        except DriverError as exc:  # one unreachable cluster must not hold up the others
            logger.warning("Cluster %s: reconcile failed: %s", cluster.name, exc)
            continue
        if result.ended or result.stopped:
            ended += result.ended
            request_cycle(cluster.pk)
    return ended


@shared_task(name="aistation.cancel_job", queue="cluster", time_limit=120, soft_time_limit=100)
def cancel_job(job_id: int) -> int:
    attempts = list(Attempt.objects.select_related("cluster", "job")
                    .filter(job_id=job_id, state__in=LIVE_ATTEMPT_STATES))
    for attempt in attempts:
        attempt_stop(attempt, AttemptState.CANCELLED, "the job was cancelled")
    if attempts:
        request_cycle(attempts[0].cluster_id)
    return len(attempts)


@shared_task(name="aistation.cull_notebooks", queue="cluster", time_limit=300,
             soft_time_limit=280)
def cull_notebooks() -> int:
    """Stop the notebooks idle past their tenant's limit (their home folders stay)."""
    return len(notebook_cull())


@shared_task(name="aistation.fleet_dispatch", queue="cluster", acks_late=True,
             reject_on_worker_lost=True, time_limit=120, soft_time_limit=100)
def fleet_dispatch() -> int:
    """Every fleet: move waiting jobs where they start now or off lost clusters, then let each
    elastic pool buy or return nodes. Returns the jobs moved."""
    moved = 0
    for fleet in Fleet.objects.all():
        moved += len(fleet_redispatch(fleet=fleet).moved)
        for pool in fleet_pools(fleet.pk):
            fleet_autoscale(pool=pool)
    return moved


@shared_task(name="aistation.logs_ship", queue="cluster", time_limit=120, soft_time_limit=100,
             ignore_result=True)
def logs_ship() -> int:
    """Every job's new output into the log store; one pass at a time (a pass still running
    when the next is due makes that one skip). The store down: nothing lost, tried again."""
    if not cache.add(SHIP_LOCK, 1, timeout=110):
        return 0
    try:
        return ship_logs().lines
    except StoreDown as exc:
        logger.warning("log shipping waits for the log store: %s", exc)
        return 0
    finally:
        cache.delete(SHIP_LOCK)


@shared_task(name="aistation.logs_expire", queue="cluster", time_limit=1800,
             soft_time_limit=1700, ignore_result=True)
def logs_expire() -> int:
    """Drop the log store's days past each tenant's retention, then its upkeep."""
    lines = expire_logs().lines
    logs_maintain()
    return lines
