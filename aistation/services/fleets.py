"""Dispatching a fleet queue's jobs over the fleet's clusters (the rule: `scheduler.dispatch`).

A job is dispatched once when it is submitted, and again, in `fleet_redispatch`, while it waits
and has never started: to another cluster that would start it now (the first to admit wins), or
away from a cluster that stopped answering (`OGAI_CLUSTER_LOST_S`). A move is one transaction
that holds the fleet's cluster rows, which every scheduling cycle locks for its whole decision, so
no cycle can start a job while it moves: a job is on one cluster's queue at a time and never
starts twice. Running jobs never move.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from aistation.choices import ACTIVE_STATES, LIVE_ATTEMPT_STATES, JobState, QueuePolicy
from aistation.models import Attempt, Job, JobEvent
from aistation.scheduler.dispatch import ClusterView, Dispatcher, move_order
from aistation.scheduler.policies import DEFAULT_LEVELS_GPU_S, DEFAULT_MIN_RUN_S
from aistation.scheduler.types import JobSnap, NodeSnap
from aistation.services.transitions import log_events
from aistation.triggers import request_cycle
from podsys.choices import NodeHealth, PoolNodeState
from podsys.drivers.base import (
    FEATURE_NETWORKS,
    FEATURE_RAY,
    FEATURE_RDMA,
    FEATURE_SANDBOX,
    FEATURE_WORKDIR,
    DriverError,
)
from podsys.models import Cluster, Fleet, Node, PoolNode
from podsys.runtime import driver_for
from podsys.selectors_fleets import cluster_lost
from podsys.services.pools import LIVE


def pool_nodes_held(cluster_ids) -> dict[tuple[int, str], tuple[int, frozenset[int]]]:
    """Pool nodes in the clusters: (cluster id, node name) -> (the tenant they were bought for
    and bill, the jobs that claim them while they wait). Only that tenant's work goes there,
    and while a claim stands only the claiming jobs'."""
    return {
        (cluster_id, name): (tenant_id, frozenset(claims))
        for cluster_id, name, tenant_id, claims in PoolNode.objects.filter(
            pool__cluster_id__in=cluster_ids, state=PoolNodeState.READY)
        .values_list("pool__cluster_id", "name", "tenant_id", "claims")
    }


def closed_to(held: tuple[int, frozenset[int]], tenant_id: int, job_id: int | None) -> bool:
    """Whether a pool node (`held`, from `pool_nodes_held`) is closed to the job."""
    tenant, claims = held
    return tenant != tenant_id or (bool(claims) and job_id not in claims)


def fleet_views(clusters: list[Cluster], now: datetime, tenant_id: int) -> list[ClusterView]:
    """The clusters as the dispatcher sees them for a tenant's new job: nodes that take work
    (not pool nodes bought for other tenants or claimed), what active jobs hold there, and the
    GPUs waiting there."""
    ids = [c.pk for c in clusters]
    nodes: dict[int, list[NodeSnap]] = defaultdict(list)
    pooled = pool_nodes_held(ids)
    closed = {key for key, held in pooled.items() if closed_to(held, tenant_id, None)}
    for cluster_id, name, gpus, model, cpu, memory, schedulable, health, foreign, rdma in \
            Node.objects.filter(cluster_id__in=ids).values_list(
                "cluster_id", "name", "gpus", "gpu_model", "cpu_cores", "memory_mib",
                "schedulable", "health", "gpus_foreign", "rdma_devices"):
        nodes[cluster_id].append(NodeSnap(
            name=name, gpus=max(0, gpus - (foreign or 0)), gpu_model=model, cpu_cores=cpu,
            memory_mib=memory, schedulable=schedulable and health == NodeHealth.HEALTHY
            and (cluster_id, name) not in closed, rdma=rdma))
    held: dict[int, list] = defaultdict(list)
    # What the default policy puts before a new job (waiting work at its first level) and what
    # a new job may preempt (work past the first level that has had its minimum run).
    first = _first_level()
    min_run = settings.OGAI_SCHEDULER_MIN_RUN_S
    min_run = DEFAULT_MIN_RUN_S if min_run is None else min_run
    started = dict(Attempt.objects.filter(cluster_id__in=ids, state__in=LIVE_ATTEMPT_STATES)
                   .values_list("job_id", "started_at"))
    queued: dict[int, int] = defaultdict(int)
    preemptible: dict[int, int] = defaultdict(int)
    for pk, cluster_id, state, placement, gpus, replicas, cpu, memory, attained, rdma in \
            Job.objects.filter(cluster_id__in=ids, state__in=(*ACTIVE_STATES, JobState.QUEUED)) \
            .values_list("pk", "cluster_id", "state", "placement", "gpus_per_replica",
                         "replicas", "cpu_per_replica", "memory_mib_per_replica",
                         "attained_gpu_s", "rdma_per_replica"):
        if state == JobState.QUEUED:
            if attained < first:
                queued[cluster_id] += gpus * replicas
            continue
        held[cluster_id] += [(node, gpus, cpu, memory, rdma) for node in placement]
        since = started.get(pk)
        ran = (now - since).total_seconds() if since else 0.0
        if since and ran >= min_run and attained + gpus * replicas * ran >= first:
            preemptible[cluster_id] += gpus * replicas
    return [ClusterView(name=c.name, nodes=tuple(nodes[c.pk]), held=tuple(held[c.pk]),
                        queued_gpus=queued[c.pk], preemptible_gpus=preemptible[c.pk],
                        alive=not cluster_lost(c, now), unsupported=_unsupported(c))
            for c in clusters]


def _first_level() -> float:
    """The default policy's first level (GPU-seconds of attained service)."""
    return min(settings.OGAI_SCHEDULER_LEVELS_GPU_S or DEFAULT_LEVELS_GPU_S, default=0.0)


def _move_key(job: Job, first: float) -> tuple:
    """The order waiting jobs are offered other clusters in: their policy's (`move_order`)."""
    queued_at = job.queued_at or job.created_at
    return move_order(priority=job.priority, attained_gpu_s=job.attained_gpu_s,
                      queued_at=queued_at.timestamp(), ident=job.pk,
                      first_level=first if job.queue.policy == QueuePolicy.FAIR else None)


def _unsupported(cluster: Cluster) -> dict[str, str]:
    try:
        return dict(driver_for(cluster).unsupported)
    except DriverError:
        return {}  # a broken cluster says so when the job is launched


def job_snap(job: Job) -> JobSnap:
    return JobSnap(id=job.pk or 0, tenant="", queue="", priority=job.priority, submitted_at=0.0,
                   gpus_per_replica=job.gpus_per_replica, replicas=job.replicas,
                   cpu_per_replica=job.cpu_per_replica,
                   memory_mib_per_replica=job.memory_mib_per_replica, gpu_model=job.gpu_model,
                   rdma_per_replica=job.rdma_per_replica)


def fleet_clusters(fleet_id: int) -> list[Cluster]:
    return list(Cluster.objects.filter(fleet_id=fleet_id, is_active=True).order_by("pk"))


def needed_features(job: Job) -> dict[str, str]:
    """What a cluster must do to run the job ({feature: what of the job needs it}): what
    submission checks of a cluster, so the dispatcher skips clusters that would refuse it."""
    needs = {} if settings.OGAI_SINGLE_TENANT else {FEATURE_SANDBOX: "a tenant's work"}
    if job.workdir_id is not None:
        needs[FEATURE_WORKDIR] = "a job with a working folder"
    if job.rdma_per_replica:
        needs[FEATURE_RDMA] = "a job with RDMA devices"
    if job.networks:
        needs[FEATURE_NETWORKS] = "a job that attaches networks"
    if job.ray:
        needs[FEATURE_RAY] = "a Ray cluster"
    return needs


def job_dispatch(job: Job, fleet_id: int, now: datetime, *,
                 needs: dict[str, str] | None = None) -> None:
    """Choose the cluster of a job being submitted to a fleet queue (set on it, not saved);
    `needs`: what a cluster must do to run it ({feature: what needs it})."""
    clusters = fleet_clusters(fleet_id)
    choice = Dispatcher(fleet_views(clusters, now, job.tenant_id)).choose(
        job_snap(job), needs=needs or {})
    if choice.cluster is None:
        job.dispatch = choice.reason
        return  # stays on its queue's cluster, which says why it cannot run
    job.cluster = next(c for c in clusters if c.name == choice.cluster)
    job.dispatch = choice.reason


def _sooner_there(dispatcher: Dispatcher, snap: JobSnap, choice, here: str) -> bool:
    """It could start on the chosen cluster now by preempting what its policy puts below it,
    and not here, where another cluster has the GPUs free (the fleet replay's rule)."""
    if not any(m.free_gpus("") >= snap.gpus for name, m in dispatcher.members.items()
               if name != here):
        return False
    return choice.ahead < 0 <= dispatcher.ahead(snap, here)


@dataclass
class RedispatchResult:
    moved: dict[int, str] = field(default_factory=dict)  # job id -> the cluster it went to
    stuck: dict[int, str] = field(default_factory=dict)  # job id -> why no cluster takes it


def fleet_redispatch(*, fleet: Fleet, now: datetime | None = None) -> RedispatchResult:
    """Move the fleet's waiting jobs where they start now, and off lost clusters."""
    now = now or timezone.now()
    result = RedispatchResult()
    with transaction.atomic():
        # The order cycles and node syncs lock cluster rows in: never a deadlock with them.
        clusters = list(Cluster.objects.select_for_update(no_key=True)
                        .filter(fleet=fleet, is_active=True).order_by("pk"))
        if len(clusters) < 2:
            return result
        by_name = {c.name: c for c in clusters}
        lost = {c.name for c in clusters if cluster_lost(c, now)}
        dispatchers: dict[int, Dispatcher] = {}  # one per tenant: pool nodes are theirs
        # Never failed: a retrying job stays where it ran (its checkpoints); a preempted one
        # resumes wherever it starts. The first its policy would start is offered first.
        first = _first_level()
        waiting = sorted(Job.objects.filter(cluster__in=clusters, queue__fleet=fleet,
                                            state=JobState.QUEUED)
                         .filter(Q(restarts=0) | Q(cluster__name__in=lost))
                         .select_related("cluster", "queue"),
                         key=lambda job: _move_key(job, first))
        # Jobs nodes are being bought for, or were bought for, stay: the nodes join here.
        claimed = {job_id for claims in PoolNode.objects.filter(
            pool__cluster__in=clusters, state__in=LIVE).values_list("claims", flat=True)
            for job_id in claims}
        events: list[JobEvent] = []
        for job in waiting:
            here = job.cluster.name
            if job.pk in claimed and here not in lost:
                continue  # nodes were bought for it here
            if job.tenant_id not in dispatchers:
                dispatchers[job.tenant_id] = Dispatcher(fleet_views(clusters, now, job.tenant_id))
            dispatcher = dispatchers[job.tenant_id]
            snap = job_snap(job)
            choice = dispatcher.choose(snap, exclude=frozenset({here}),
                                       needs=needed_features(job))
            if choice.cluster is None or not (choice.fits_now or here in lost
                                              or _sooner_there(dispatcher, snap, choice, here)):
                why = f"waits on {here}" + (
                    f"; no other cluster takes it now ({choice.reason.split(': ', 1)[-1]})"
                    if choice.cluster is None or not choice.fits_now else "")
                if job.dispatch != why and here not in lost:
                    Job.objects.filter(pk=job.pk).update(dispatch=why)
                result.stuck[job.pk] = why
                continue
            reason = (f"moved from {here} (not answering since "
                      f"{(job.cluster.last_synced_at or job.cluster.created_at):%H:%M}): "
                      if here in lost else f"moved from {here}: ") + choice.reason
            target = by_name[choice.cluster]
            if job_move(job, target, why=reason, record=False):
                events.append(JobEvent(job_id=job.pk, from_state=JobState.QUEUED,
                                       to_state=JobState.QUEUED, reason=reason))
                result.moved[job.pk] = target.name
        JobEvent.objects.bulk_create(events)
        log_events(events)
    return result


def job_move(job: Job, target: Cluster, *, why: str, record: bool = True) -> bool:
    """Send a queued job to `target` (the caller holds both clusters' rows, as a cycle does
    while it decides): only while it is still queued where it was, so a start that won is
    never undone. Its event is written unless the caller writes them in bulk (`record`); a
    cycle of `target` is asked for."""
    moved = Job.objects.filter(pk=job.pk, state=JobState.QUEUED, cluster_id=job.cluster_id) \
        .update(cluster=target, dispatch=why, position=None, excluded_nodes=[],
                reserved_nodes=[], reason=f"dispatched; waiting for the scheduler of {target.name}")
    if not moved:
        return False
    if record:
        log_events([JobEvent.objects.create(job_id=job.pk, from_state=JobState.QUEUED,
                                            to_state=JobState.QUEUED, reason=why)])
    job.cluster, job.dispatch = target, why
    request_cycle(target.pk)
    return True
