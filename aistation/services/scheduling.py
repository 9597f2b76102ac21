"""One scheduling cycle of a cluster: load a snapshot, let the pure core decide, apply the
decisions in one transaction, then launch and stop workloads through the driver."""

import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce
from django.utils import timezone

from aistation.choices import ACTIVE_STATES, LIVE_ATTEMPT_STATES, AttemptState, JobState
from aistation.labels import OWNER_LABEL, job_display
from aistation.models import Attempt, Job, JobEvent, Queue
from aistation.scheduler import schedule
from aistation.scheduler.types import (
    Decisions,
    JobSnap,
    NodeSnap,
    QueueSnap,
    Snapshot,
    TenantSnap,
)
from aistation.services.attempts import attempt_record_usage, attempts_launch, attempts_stop
from aistation.services.fleets import closed_to, pool_nodes_held
from aistation.services.transitions import log_events
from aistation.services.workloads import workload_id
from infra_os.models import Quota
from infra_os.selectors import leased_gpus_by_tenant
from ogai.bulk import bulk_set
from podsys.choices import NodeHealth
from podsys.models import Cluster, ElasticPool, Node, PoolNode
from podsys.providers.base import ProviderError
from podsys.services.pools import LIVE, pool_node_type


@dataclass
class CycleResult:
    started: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    waiting: int = 0
    skipped: bool = False  # another cycle looked after this one was asked for


def _ts(moment: datetime | None) -> float:
    return moment.timestamp() if moment else 0.0


# A cycle reads every queued and active job of the cluster and writes few: plain values, and
# only the fields the core reads for each kind (parsing dates and JSON is most of a cycle's cost).
PENDING_FIELDS = (
    "id", "queue_id", "reason", "position", "priority", "submitted", "gpus_per_replica",
    "replicas", "cpu_per_replica", "memory_mib_per_replica", "gpu_model", "attained_gpu_s",
    "excluded_nodes", "not_before", "waited_s", "reserved_nodes", "rdma_per_replica",
)
RUNNING_FIELDS = (
    "id", "queue_id", "priority", "gpus_per_replica", "replicas", "cpu_per_replica",
    "memory_mib_per_replica", "gpu_model", "placement", "borrowed", "attained_gpu_s",
    "waited_s", "name", "owner_label", "rdma_per_replica",
)


def _pending_snap(row: dict, tenant: str, queue: str) -> JobSnap:
    return JobSnap(
        id=row["id"], tenant=tenant, queue=queue, priority=row["priority"],
        submitted_at=_ts(row["submitted"]), gpus_per_replica=row["gpus_per_replica"],
        replicas=row["replicas"], cpu_per_replica=row["cpu_per_replica"],
        memory_mib_per_replica=row["memory_mib_per_replica"], gpu_model=row["gpu_model"],
        attained_gpu_s=row["attained_gpu_s"], excluded_nodes=frozenset(row["excluded_nodes"]),
        not_before=_ts(row["not_before"]), waited_s=row["waited_s"],
        rdma_per_replica=row["rdma_per_replica"],
    )


def _running_snap(row: dict, tenant: str, queue: str, started: datetime | None) -> JobSnap:
    # A running job's submission time plays no part in a decision; `started` is its current
    # attempt's start (the core adds that attempt's service to the attained service).
    return JobSnap(
        id=row["id"], tenant=tenant, queue=queue, priority=row["priority"], submitted_at=0.0,
        gpus_per_replica=row["gpus_per_replica"], replicas=row["replicas"],
        cpu_per_replica=row["cpu_per_replica"],
        memory_mib_per_replica=row["memory_mib_per_replica"], gpu_model=row["gpu_model"],
        placement=tuple(row["placement"]), started_at=_ts(started) or None,
        borrowed=row["borrowed"], attained_gpu_s=row["attained_gpu_s"],
        waited_s=row["waited_s"], display=job_display(row["owner_label"], row["id"], row["name"]),
        rdma_per_replica=row["rdma_per_replica"],
    )


NOTHING_HELD = (0, 0.0, 0, 0)


def _tenant_snap(
    quota: Quota, elsewhere: tuple[int, float, int, int], leased: int
) -> TenantSnap:
    """The tenant's quotas as the core takes them. A CPU, memory or RDMA quota of 0 means no
    limit (tenants are made with 0 there, and blocking all their work would help no one); a GPU
    quota of 0 means no GPUs of its own."""
    gpus, cpu, memory, rdma = elsewhere
    return TenantSnap(
        name=quota.tenant.name, gpu_quota=max(0, quota.gpus - gpus - leased),
        gpu_model_limits=dict(quota.gpu_model_limits),
        cpu_quota=float(quota.cpu_cores) if quota.cpu_cores > 0 else None,
        memory_quota_mib=quota.memory_gib * 1024 if quota.memory_gib > 0 else None,
        cpu_held_elsewhere=float(cpu), memory_mib_held_elsewhere=int(memory),
        rdma_quota=quota.rdma_devices if quota.rdma_devices > 0 else None,
        rdma_held_elsewhere=int(rdma),
    )


def load_snapshot(cluster: Cluster, now: datetime) -> tuple[Snapshot, dict[int, dict]]:
    """The cluster as the core sees it, and each pending job's row."""
    # Its own queues, and its fleet's: their jobs dispatched here wait here.
    here = Q(cluster=cluster) | Q(fleet_id=cluster.fleet_id) if cluster.fleet_id \
        else Q(cluster=cluster)
    queues = {q.pk: q for q in Queue.objects.filter(here).select_related("tenant")}
    tenant_ids = {q.tenant_id for q in queues.values()}
    # Lock the quotas: cycles of other clusters serialise on the tenants they share.
    quotas = {q.tenant_id: q for q in Quota.objects.select_for_update(no_key=True).filter(
        tenant_id__in=tenant_ids).select_related("tenant").order_by("pk")}
    # What the tenants' work holds on other clusters: their GPUs within quota, and all their CPU
    # and memory (those quotas are hard: borrowed GPUs' work counts too).
    elsewhere = {
        tenant_id: (gpus or 0, cpu or 0.0, memory or 0, rdma or 0)
        for tenant_id, gpus, cpu, memory, rdma in
        Job.objects.filter(tenant_id__in=tenant_ids, state__in=ACTIVE_STATES)
        .exclude(cluster=cluster).values("tenant_id")
        .annotate(held_gpus=Sum(F("gpus_per_replica") * F("replicas"), filter=Q(borrowed=False)),
                  held_cpu=Sum(F("cpu_per_replica") * F("replicas")),
                  held_memory=Sum(F("memory_mib_per_replica") * F("replicas")),
                  held_rdma=Sum(F("rdma_per_replica") * F("replicas")))
        .values_list("tenant_id", "held_gpus", "held_cpu", "held_memory", "held_rdma")
    }
    # Servers leased whole to a tenant count against its GPU quota too.
    leased = leased_gpus_by_tenant(tenant_ids=tenant_ids, at=now)
    jobs = Job.objects.filter(cluster=cluster)
    rows = list(jobs.filter(state=JobState.QUEUED)
                .annotate(submitted=Coalesce("queued_at", "created_at")).values(*PENDING_FIELDS))
    keys = {pk: (q.tenant.name, f"{q.tenant.name}/{q.name}") for pk, q in queues.items()}
    pending = [_pending_snap(row, *keys[row["queue_id"]]) for row in rows]
    pooled = {name: held for (_, name), held in pool_nodes_held([cluster.pk]).items()}
    if pooled:  # bought for a tenant (and, while they wait, for some of its jobs): theirs alone
        tenant_of = {row["id"]: queues[row["queue_id"]].tenant_id for row in rows}
        pending = [replace(snap, excluded_nodes=snap.excluded_nodes | {
            name for name, held in pooled.items() if closed_to(held, tenant_of[snap.id], snap.id)
        }) for snap in pending]
    started = dict(Attempt.objects.filter(cluster=cluster, state__in=LIVE_ATTEMPT_STATES)
                   .values_list("job_id", "started_at"))
    running = [_running_snap(row, *keys[row["queue_id"]], started.get(row["id"]))
               for row in jobs.filter(state__in=ACTIVE_STATES)
               # Only the owner label is read out of the labels, by the database.
               .annotate(owner_label=KeyTextTransform(OWNER_LABEL, "labels"))
               .values(*RUNNING_FIELDS)]
    snapshot = Snapshot(
        now=now.timestamp(),
        nodes=tuple(  # schedulable: `Node.takes_work`, read from plain values
            # GPUs held by work the platform did not start are not the scheduler's to give.
            NodeSnap(name=name, gpus=max(0, gpus - (foreign or 0)), gpu_model=model,
                     cpu_cores=cpu, memory_mib=memory,
                     schedulable=schedulable and health == NodeHealth.HEALTHY, rdma=rdma)
            for name, gpus, model, cpu, memory, schedulable, health, foreign, rdma in
            Node.objects.filter(cluster=cluster).values_list(
                "name", "gpus", "gpu_model", "cpu_cores", "memory_mib", "schedulable", "health",
                "gpus_foreign", "rdma_devices")
        ),
        tenants=tuple(_tenant_snap(q, elsewhere.get(t, NOTHING_HELD), leased.get(t, 0))
                      for t, q in quotas.items()),
        queues=tuple(
            QueueSnap(key=f"{q.tenant.name}/{q.name}", tenant=q.tenant.name,
                      gpu_limit=q.gpu_limit, policy=q.policy)
            for q in queues.values()
        ),
        running=tuple(running),
        pending=tuple(pending),
        elastic=_elastic_nodes(cluster) if pending else (),
        reserved_elsewhere=_reserved_elsewhere(cluster, keys) if pending else {},
    )
    return snapshot, {row["id"]: row for row in rows}


def _elastic_nodes(cluster: Cluster) -> tuple[NodeSnap, ...]:
    """The nodes the active pools whose nodes join this cluster could still buy: a gang only
    they would hold waits for the pool's autoscaler instead of failing as too big."""
    nodes: list[NodeSnap] = []
    for pool in ElasticPool.objects.filter(cluster=cluster, is_active=True):
        try:
            kind = pool_node_type(pool)
        except ProviderError:
            continue  # the autoscaler says why on the pool's events
        bought = PoolNode.objects.filter(pool=pool, state__in=LIVE).count()
        nodes += [NodeSnap(name=f"{pool.name}:unbought-{i}", gpus=kind.gpus,
                           gpu_model=kind.gpu_model, cpu_cores=kind.cpu_cores,
                           memory_mib=kind.memory_mib)
                  for i in range(max(0, pool.max_nodes - bought))]
    return tuple(nodes)


def _reserved_elsewhere(cluster: Cluster, keys: dict[int, tuple[str, str]]) -> dict[str, str]:
    """The fleet queues whose starvation reservation another cluster of the fleet holds (read
    under the tenants' quota locks, which that cluster's cycle holds while it decides)."""
    if not cluster.fleet_id:
        return {}
    held = (Job.objects.filter(queue__fleet_id=cluster.fleet_id, state=JobState.QUEUED)
            .exclude(cluster=cluster).exclude(reserved_nodes=[])
            .values_list("pk", "queue_id", "cluster__name"))
    return {keys[queue][1]: f"job {pk} on {where}" for pk, queue, where in held if queue in keys}


def _apply(decisions: Decisions, rows: dict[int, dict], cluster: Cluster, now: datetime,
           result: CycleResult) -> tuple[list[Attempt], list[Attempt]]:
    decided = [start.job_id for start in decisions.starts]
    decided += [preempt.job_id for preempt in decisions.preemptions]
    decided += [wait.job_id for wait in decisions.waits if wait.never_fits]
    jobs = Job.objects.select_related("tenant").in_bulk(decided)
    events: list[JobEvent] = []
    reasons: dict[int, str] = {}
    positions: dict[int, int | None] = {}
    failed: list[Job] = []
    for wait in decisions.waits:
        if wait.never_fits:
            job = jobs[wait.job_id]
            job.finished_at = now
            events.append(_event(job, JobState.FAILED, f"can never run: {wait.reason}"))
            failed.append(job)
            result.failed.append(job.pk)
            continue
        # Only what changed is written: a long backlog costs nothing while it stands still.
        row = rows[wait.job_id]
        if row["reason"] != wait.reason:
            reasons[wait.job_id] = wait.reason
        if row["position"] != wait.position:
            positions[wait.job_id] = wait.position
    result.waiting = len(decisions.waits) - len(result.failed)
    bulk_set(Job, "reason", reasons)
    bulk_set(Job, "position", positions)
    # Every pending job's, so a job that starts or fails now keeps none.
    drained = {r.job_id: list(r.nodes) for r in decisions.reservations}
    bulk_set(Job, "reserved_nodes", {
        pk: drained.get(pk, []) for pk, row in rows.items()
        if row["reserved_nodes"] != drained.get(pk, [])})
    for job in failed:
        job.position = None
        job.save(update_fields=["state", "reason", "position", "finished_at", "updated_at"])

    stopped = _apply_preemptions(decisions, jobs, now, events, result)

    attempts = []
    waited: dict[int, float] = {}
    placements: dict[int, list[str]] = {}
    for start in decisions.starts:
        job = jobs[start.job_id]
        job.attempt_count += 1
        attempts.append(Attempt(
            job=job, number=job.attempt_count, workload_id=workload_id(job.pk, job.attempt_count),
            cluster=cluster, placement=list(start.placement), borrowed=start.borrowed,
        ))
        placements[job.pk] = list(start.placement)
        result.started.append(job.pk)
        row = rows[job.pk]
        waited[job.pk] = row["waited_s"] + max(0.0, (now - row["submitted"]).total_seconds())
    Attempt.objects.bulk_create(attempts, batch_size=1000)
    for attempt in attempts:
        nodes = ", ".join(sorted(set(attempt.placement))) or "no node"
        where = f"admitted on {nodes}" + (" (borrowed capacity)" if attempt.borrowed else "")
        events.append(_event(attempt.job, JobState.ADMITTED, where, attempt))
    started = Job.objects.filter(pk__in=result.started)
    started.update(state=JobState.ADMITTED, reason="admitted; launching", position=None,
                   borrowed=False, attempt_count=F("attempt_count") + 1, updated_at=now)
    started.filter(pk__in=[a.job_id for a in attempts if a.borrowed]).update(borrowed=True)
    bulk_set(Job, "placement", placements)
    bulk_set(Job, "waited_s", waited)
    JobEvent.objects.bulk_create(events, batch_size=1000)
    log_events(events)
    return attempts, stopped


def _event(job: Job, to_state: str, reason: str, attempt: Attempt | None = None) -> JobEvent:
    event = JobEvent(job=job, attempt=attempt, from_state=job.state, to_state=to_state,
                     reason=reason)
    job.state, job.reason = to_state, reason
    return event


def _apply_preemptions(decisions: Decisions, jobs: dict[int, Job], now: datetime,
                       events: list[JobEvent], result: CycleResult) -> list[Attempt]:
    if not decisions.preemptions:
        return []
    reasons = {p.job_id: p.reason for p in decisions.preemptions}
    stopped = list(Attempt.objects.select_related("job", "job__tenant").filter(
        job_id__in=reasons, state__in=LIVE_ATTEMPT_STATES))
    for attempt in stopped:
        job = jobs[attempt.job_id]
        attempt.job = job
        attempt.state, attempt.finished_at = AttemptState.PREEMPTED, now
        attempt.reason = reasons[job.pk]
        attempt_record_usage(attempt, now)
        if attempt.started_at:
            job.attained_gpu_s += job.gpus * (now - attempt.started_at).total_seconds()
        events.append(_event(job, JobState.PREEMPTED, reasons[job.pk], attempt))
        events.append(_event(job, JobState.QUEUED, "back in its queue after preemption"))
        job.placement, job.borrowed, job.updated_at, job.queued_at = [], False, now, now
        result.preempted.append(job.pk)
    Attempt.objects.bulk_update(stopped, ["state", "finished_at", "reason"])
    Job.objects.bulk_update([jobs[a.job_id] for a in stopped],
                            ["state", "reason", "placement", "borrowed", "attained_gpu_s",
                             "queued_at", "updated_at"])
    return stopped


def policy_settings() -> dict:
    """The policy settings the operator set; the core's defaults stand for the others."""
    chosen = {
        "starvation_s": settings.OGAI_SCHEDULER_STARVATION_S,
        "levels_gpu_s": settings.OGAI_SCHEDULER_LEVELS_GPU_S,
        "min_run_s": settings.OGAI_SCHEDULER_MIN_RUN_S,
        "promote_after_s": settings.OGAI_SCHEDULER_PROMOTE_AFTER_S,
        "promote_backlog": settings.OGAI_SCHEDULER_PROMOTE_BACKLOG,
        "promote_stretch": settings.OGAI_SCHEDULER_PROMOTE_STRETCH,
        "promote_max_s": settings.OGAI_SCHEDULER_PROMOTE_MAX_S,
    }
    return {name: value for name, value in chosen.items() if value is not None}


def schedule_cluster(*, cluster_id: int, requested_at: float | None = None) -> CycleResult:
    """Run one cycle. Cycles of one cluster never overlap: the cluster row is locked, with
    FOR NO KEY UPDATE so submissions (whose foreign keys take KEY SHARE locks) never wait.
    A cycle requested (after a commit) at `requested_at` is skipped when another cycle has
    looked since: many processes asking at once cost one cycle. Each cycle run (not skipped)
    is counted and timed on the cluster row, for /metrics."""
    started = time.perf_counter()
    result = _cycle(cluster_id, requested_at)
    if not result.skipped:
        elapsed = time.perf_counter() - started
        Cluster.objects.filter(pk=cluster_id).update(
            cycles_total=F("cycles_total") + 1,
            cycle_seconds_total=F("cycle_seconds_total") + elapsed,
            cycle_seconds_last=elapsed,
        )
    return result


def _cycle(cluster_id: int, requested_at: float | None) -> CycleResult:
    result = CycleResult()
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update(no_key=True).get(pk=cluster_id)
        now = timezone.now()
        if requested_at is not None and cluster.cycle_at is not None \
                and cluster.cycle_at.timestamp() >= requested_at:
            result.skipped = True
            return result
        Cluster.objects.filter(pk=cluster_id).update(cycle_at=now)
        snapshot, rows = load_snapshot(cluster, now)
        if not snapshot.pending:
            return result
        decisions = schedule(snapshot, **policy_settings())
        attempts, stopped = _apply(decisions, rows, cluster, now, result)
    # Stop the preempted first: the new work takes their place on the same GPUs.
    attempts_stop(cluster, stopped)
    attempts_launch(cluster, attempts)
    return result
