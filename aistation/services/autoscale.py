"""An elastic pool's autoscaler: buy whole gangs of nodes for work that fits nowhere in the
fleet, give empty nodes back after the cool-down (the rules: `scheduler.scaling`; carrying them
out: `podsys.services.pools`). Every decision is a scale event, and a job waiting on the pool
says what it waits for in its `dispatch` text."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from aistation.choices import ACTIVE_STATES, JobState
from aistation.models import Attempt, Job
from aistation.scheduler.dispatch import Dispatcher
from aistation.scheduler.scaling import NodeShape, OpenRoom, plan_scale_up, scale_down
from aistation.scheduler.scaling import PoolNode as PoolNodeSnap
from aistation.services.fleets import fleet_clusters, fleet_views, job_move, job_snap
from aistation.triggers import request_cycle
from infra_os.models import Quota
from podsys.choices import PoolNodeState, ScaleEventKind
from podsys.models import Cluster, ElasticPool, NodeRequest, PoolBudget, PoolNode, ScaleEvent
from podsys.providers.base import ProviderError
from podsys.services.pools import (
    LIVE,
    MAX_TRIES,
    pool_node_type,
    pool_request_nodes,
    pool_return_node,
    pool_spend,
    pool_sync,
)


@dataclass
class AutoscaleResult:
    requested: list[int] = field(default_factory=list)  # NodeRequest ids
    returned: list[str] = field(default_factory=list)  # node names
    refused: dict[int, str] = field(default_factory=dict)  # job id -> why the pool cannot help


def fleet_autoscale(*, pool: ElasticPool, now: datetime | None = None) -> AutoscaleResult:
    """One pass of the pool's autoscaler. Passes of one pool never overlap (its row is held),
    so two workers never buy twice for one job; a pass that dies after the provider answered
    asks again with the same request id, which buys nothing new."""
    now = now or timezone.now()
    result = AutoscaleResult()
    with transaction.atomic():
        pool = ElasticPool.objects.select_for_update().select_related("fleet", "cluster") \
            .get(pk=pool.pk)
        if pool_sync(pool=pool, now=now):
            request_cycle(pool.cluster_id)  # its claimed jobs start now that all are ready
        _drop_claims(pool)
        _scale_up(pool, now, result)
        _scale_down(pool, now, result)
    return result


def _drop_claims(pool: ElasticPool) -> None:
    """A claim lasts while its job waits: started, cancelled or gone, the node is anyone's. A
    job that started on them says so instead of what it waited for."""
    nodes = list(PoolNode.objects.filter(pool=pool, state__in=LIVE).exclude(claims=[]))
    states = dict(Job.objects.filter(pk__in={i for n in nodes for i in n.claims})
                  .values_list("pk", "state"))
    for node in nodes:
        kept = [i for i in node.claims if states.get(i) == JobState.QUEUED]
        if kept != node.claims:
            node.claims = kept
            node.save(update_fields=["claims"])
    for job_id in (pk for pk, state in states.items() if state in ACTIVE_STATES):
        Job.objects.filter(pk=job_id).update(
            dispatch=f"started on {pool.cluster.name}, on nodes pool {pool.name} bought for it")


def _tell(job: Job, text: str) -> None:
    if job.dispatch != text:
        Job.objects.filter(pk=job.pk).update(dispatch=text)
        job.dispatch = text


def _scale_up(pool: ElasticPool, now: datetime, result: AutoscaleResult) -> None:
    clusters = fleet_clusters(pool.fleet_id)
    live = list(PoolNode.objects.filter(pool=pool, state__in=LIVE))
    claimed = {i for node in live for i in node.claims}
    jobs = [job for job in Job.objects.filter(cluster__in=clusters, state=JobState.QUEUED)
            .select_related("tenant", "queue").order_by("queued_at", "pk") if job.pk not in claimed
            and job.gpus_per_replica > 0]
    if not jobs:
        return
    dispatchers: dict[int, Dispatcher] = {}  # one per tenant: pool nodes are theirs

    def fits_nowhere(job: Job) -> bool:
        if job.tenant_id not in dispatchers:
            dispatchers[job.tenant_id] = Dispatcher(fleet_views(clusters, now, job.tenant_id))
        return not any(dispatchers[job.tenant_id].fits_now(job_snap(job), c.name)
                       for c in clusters)

    jobs = [job for job in jobs if fits_nowhere(job)]
    if not jobs:
        return
    last_try = _last_tries(pool, [job.pk for job in jobs])
    try:
        node_type = pool_node_type(pool)
    except ProviderError as exc:
        for job in jobs:
            result.refused[job.pk] = f"pool {pool.name}: {exc}"
        return
    shape = NodeShape(node_type.gpus, node_type.gpu_model, node_type.cpu_cores,
                      node_type.memory_mib)
    ready_for: list[Job] = []
    quota_left = _quota_left({job.tenant_id for job in jobs})
    for job in jobs:
        tried = last_try.get(job.pk)
        if tried is not None and tried.retry_at and tried.retry_at > now:
            result.refused[job.pk] = tried.reason
            _tell(job, f"waiting for pool {pool.name}: {tried.reason}; tries again at "
                       f"{tried.retry_at:%H:%M:%S}")
            continue
        if job.gpus > quota_left.get(job.tenant_id, job.gpus):
            continue  # its own quota holds it back: nodes would not help
        if job.cluster_id != pool.cluster_id and (
                job.attempt_count or not job.queue.fleet_id or not _move(job, pool)):
            continue  # it stays where it ran before (or started meanwhile)
        ready_for.append(job)
    by_tenant: dict[int, list[Job]] = defaultdict(list)
    for job in ready_for:
        by_tenant[job.tenant_id].append(job)
    spent = pool_spend(pool, now) if pool.max_spend_per_month else None
    for tenant_jobs in by_tenant.values():
        tenant = tenant_jobs[0].tenant
        headroom, why_not = _headroom(pool, tenant, live, now, spent)
        if headroom <= 0:
            for job in tenant_jobs:
                _refuse(pool, job, why_not, now, result)
            continue
        room = [OpenRoom(n.name, n.gpus - sum(_gpus_of(i, tenant_jobs) for i in n.claims),
                         claims=list(n.claims))
                for n in live if n.state == PoolNodeState.BOOTING and n.tenant_id == tenant.pk]
        plan = plan_scale_up([job_snap(job) for job in tenant_jobs], shape,
                             max_new_nodes=headroom, open_room=room)
        by_id = {job.pk: job for job in tenant_jobs}
        for job_id, reason in plan.refused.items():
            _refuse(pool, by_id[job_id], reason, now, result)
        for job_id, (name,) in plan.rides.items():
            node = next(n for n in live if n.name == name)
            node.claims = sorted({*node.claims, job_id})
            node.save(update_fields=["claims"])
            _tell(by_id[job_id], f"waiting for {name} from pool {pool.name} (booting), bought "
                                 f"with room for it")
        for request in plan.requests:
            opener = by_id[request.jobs[0]]
            tried = last_try.get(opener.pk)
            tries = tried.tries % MAX_TRIES + 1 if tried is not None and tried.failed else 1
            nodes = request.nodes
            made = pool_request_nodes(
                pool=pool, tenant=tenant, jobs=list(request.jobs), count=nodes, now=now,
                tries=tries,
                why=f"job {opener.pk} ({opener.gpus} GPUs fit nowhere in fleet "
                    f"{pool.fleet.name})" + (f" and {len(request.jobs) - 1} small jobs riding "
                                             "along" if len(request.jobs) > 1 else ""))
            result.requested.append(made.pk)
            for job_id in request.jobs:
                job = by_id[job_id]
                if made.failed:
                    _tell(job, f"waiting for pool {pool.name}: {made.reason}; tries again at "
                               f"{made.retry_at:%H:%M:%S}")
                else:
                    _tell(job, f"waiting for {nodes} new {pool.node_type} node"
                               f"{'s' if nodes > 1 else ''} from pool {pool.name} (requested "
                               f"{now:%H:%M:%S}); it starts when all are ready")
            live = list(PoolNode.objects.filter(pool=pool, state__in=LIVE))


def _move(job: Job, pool: ElasticPool) -> bool:
    """Send a never-started job to the pool's cluster, where its nodes will join, holding both
    cluster rows as a cycle holds them."""
    with transaction.atomic():
        list(Cluster.objects.select_for_update(no_key=True)
             .filter(pk__in=(job.cluster_id, pool.cluster_id)).order_by("pk"))
        return job_move(job, pool.cluster, why=f"moved to {pool.cluster.name}, where pool "
                        f"{pool.name}'s nodes join: it fits nowhere in fleet {pool.fleet.name}")


def _gpus_of(job_id: int, jobs: list[Job]) -> int:
    return next((j.gpus_per_replica for j in jobs if j.pk == job_id), 0)


def _last_tries(pool: ElasticPool, job_ids: list[int]) -> dict[int, NodeRequest]:
    """Each job's newest request that it opened."""
    last: dict[int, NodeRequest] = {}
    for request in NodeRequest.objects.filter(pool=pool).order_by("created_at", "pk"):
        if request.jobs and request.jobs[0] in job_ids:
            last[request.jobs[0]] = request
    return last


def _quota_left(tenant_ids: set[int]) -> dict[int, int]:
    """GPUs each tenant's quota leaves for more work (its work within quota counted); a tenant
    without a quota row is not limited."""
    held = dict(Job.objects.filter(tenant_id__in=tenant_ids, state__in=ACTIVE_STATES,
                                   borrowed=False).values("tenant_id")
                .annotate(g=Sum(F("gpus_per_replica") * F("replicas")))
                .values_list("tenant_id", "g"))
    return {tenant_id: gpus - (held.get(tenant_id) or 0) for tenant_id, gpus in
            Quota.objects.filter(tenant_id__in=tenant_ids).values_list("tenant_id", "gpus")}


def _headroom(pool: ElasticPool, tenant, live: list[PoolNode], now: datetime,
              spent) -> tuple[int, str]:
    """Nodes the pool may still buy for the tenant, and why none when 0."""
    if spent is not None and spent >= pool.max_spend_per_month:
        return 0, (f"pool {pool.name} has spent {spent} of its {pool.max_spend_per_month} this "
                   "month")
    left = pool.max_nodes - len(live)
    why = f"pool {pool.name} holds {len(live)} of its {pool.max_nodes} nodes"
    budget = PoolBudget.objects.filter(pool=pool, tenant=tenant).first()
    if budget is not None:
        if budget.max_spend_per_month:
            mine = pool_spend(pool, now, tenant=tenant)
            if mine >= budget.max_spend_per_month:
                return 0, (f"tenant {tenant.name} has spent {mine} of its "
                           f"{budget.max_spend_per_month} on pool {pool.name} this month")
        if budget.max_nodes:
            held = sum(1 for n in live if n.tenant_id == tenant.pk)
            if budget.max_nodes - held < left:
                left = budget.max_nodes - held
                why = (f"tenant {tenant.name} holds {held} of its {budget.max_nodes} nodes of "
                       f"pool {pool.name}")
    return max(0, left), why


def _refuse(pool: ElasticPool, job: Job, why: str, now: datetime,
            result: AutoscaleResult) -> None:
    result.refused[job.pk] = why
    text = f"fits nowhere in fleet {pool.fleet.name}, and the pool cannot help: {why}"
    if job.dispatch != text:
        ScaleEvent.objects.create(pool=pool, tenant=job.tenant, kind=ScaleEventKind.REFUSED,
                                  reason=f"job {job.pk}: {why}", created_at=now)
    _tell(job, text)


def _scale_down(pool: ElasticPool, now: datetime, result: AutoscaleResult) -> None:
    ready = list(PoolNode.objects.filter(pool=pool, state=PoolNodeState.READY))
    if not ready:
        return
    busy = {name for placement in Job.objects.filter(
        cluster_id=pool.cluster_id, state__in=ACTIVE_STATES).values_list("placement", flat=True)
        for name in placement}
    # Work that came and went between two passes counts too: empty only since it ended.
    ended: dict[str, datetime] = {}
    oldest = min((n.empty_since for n in ready if n.empty_since), default=None)
    if oldest is not None:
        for placement, finished in Attempt.objects.filter(
                cluster_id=pool.cluster_id, finished_at__gt=oldest).values_list(
                "placement", "finished_at"):
            for name in placement:
                if finished is not None and (name not in ended or finished > ended[name]):
                    ended[name] = finished
    for node in ready:
        since: datetime | None = None
        if node.name not in busy and not node.claims:
            since = node.empty_since or now
            last_end = ended.get(node.name)
            if last_end is not None and last_end > since:
                since = last_end
        if since != node.empty_since:
            node.empty_since = since
            node.save(update_fields=["empty_since"])
    snaps = [PoolNodeSnap(n.name, n.requested_at.timestamp(),
                          n.empty_since.timestamp() if n.empty_since else None) for n in ready]
    by_name = {n.name: n for n in ready}
    for name in scale_down(snaps, now.timestamp(), float(pool.cool_down_s)):
        node = by_name[name]
        pool_return_node(node=node, now=now, reason=f"empty since {node.empty_since:%H:%M:%S}, "
                                                    f"past its {pool.cool_down_s} s cool-down")
        result.returned.append(name)


def fleet_pools(fleet_id: int) -> list[ElasticPool]:
    return list(ElasticPool.objects.filter(fleet_id=fleet_id, is_active=True)
                .select_related("fleet", "cluster"))

