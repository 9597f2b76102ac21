"""Elastic pools: buying nodes from a capacity provider, following them until they join their
cluster, and giving them back. What to buy and when is the scheduling layer's to decide
(`aistation.services.autoscale`); this module only carries it out and records it."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Q

from infra_os.models import Tenant, UsageRecord
from infra_os.services.usage import usage_record_create
from podsys.choices import PoolNodeState, ScaleEventKind
from podsys.drivers.base import DriverError
from podsys.models import ElasticPool, Node, NodeRequest, PoolNode, ScaleEvent
from podsys.providers.base import (
    CapacityProvider,
    NodeState,
    NodeType,
    ProviderError,
    StockOut,
    provider_for,
)
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_sync_nodes

logger = logging.getLogger(__name__)

MAX_TRIES = 3
BACKOFF_S = 60.0  # doubled each try: 60 s, 120 s, then an hour before the next round
ROUND_PAUSE_S = 3600.0
LIVE = (PoolNodeState.BOOTING, PoolNodeState.READY)


def pool_provider(pool: ElasticPool) -> CapacityProvider:
    provider = provider_for(pool.provider, name=pool.name, options=pool.provider_options)
    if getattr(provider, "needs_cluster", False):  # it asks the cluster's own autoscaler
        try:
            provider.attach(driver_for(pool.cluster))  # type: ignore[attr-defined]
        except DriverError as exc:
            raise ProviderError(str(exc)) from exc
    return provider


def pool_node_type(pool: ElasticPool) -> NodeType:
    return pool_provider(pool).node_type(pool.node_type)


def _event(pool: ElasticPool, kind: str, reason: str, now: datetime, *, nodes: int = 0,
           tenant: Tenant | None = None) -> None:
    ScaleEvent.objects.create(pool=pool, kind=kind, reason=reason, nodes=nodes, tenant=tenant,
                              created_at=now)


def retry_delay_s(tries: int) -> float:
    """How long after its `tries`-th failed try a request is tried again."""
    return BACKOFF_S * 2 ** (tries - 1) if tries < MAX_TRIES else ROUND_PAUSE_S


@transaction.atomic
def pool_request_nodes(*, pool: ElasticPool, tenant: Tenant, jobs: list[int], count: int,
                       why: str, now: datetime, tries: int = 1) -> NodeRequest:
    """Ask the provider for `count` nodes at once, for `jobs`: the first opened the request and
    claims every node (its gang), the others ride along on the first node's room. A refusal (a
    stock-out) is recorded on the request with when it is tried again; nothing is
    half-bought."""
    # Numbered within the pool: a pass that died after the provider answered asks again with
    # the same id (its request row went with it), and the provider buys nothing new.
    number = NodeRequest.objects.filter(pool=pool).count() + 1
    request = NodeRequest.objects.create(
        pool=pool, tenant=tenant, request_id=f"pool{pool.pk}-{number}-job{jobs[0]}",
        jobs=list(jobs), nodes=count, tries=tries, created_at=now)
    try:
        provider = pool_provider(pool)
        node_type = provider.node_type(pool.node_type)
        bought = provider.request(request_id=request.request_id, node_type=pool.node_type,
                                  count=count)
    except ProviderError as exc:
        request.failed = True
        request.retry_at = now + timedelta(seconds=retry_delay_s(tries))
        kind = "stock-out" if isinstance(exc, StockOut) else "refused"
        request.reason = f"{kind} at the provider (try {tries} of {MAX_TRIES}): {exc}"
        request.save(update_fields=["failed", "retry_at", "reason"])
        _event(pool, ScaleEventKind.FAILED, f"{count} {pool.node_type} for job "
               f"{', '.join(map(str, jobs))}: {request.reason}", now, nodes=count, tenant=tenant)
        return request
    PoolNode.objects.bulk_create([
        PoolNode(pool=pool, request=request, tenant=tenant, name=node.node_name or node.id,
                 provider_id=node.id, requested_at=now,
                 price_per_hour=Decimal(str(node_type.price_per_hour)), gpus=node_type.gpus,
                 gpu_model=node_type.gpu_model, claims=list(jobs) if i == 0 else jobs[:1])
        for i, node in enumerate(bought)
    ])
    _event(pool, ScaleEventKind.UP, f"requested {count} {pool.node_type} for {why}", now,
           nodes=count, tenant=tenant)
    return request


def pool_sync(*, pool: ElasticPool, now: datetime) -> list[PoolNode]:
    """Follow the provider: booting nodes that turned ready join the cluster (its node rows
    are synced), failed ones fail their whole request (the rest of it is given back, and the
    request is tried again after its backoff). Returns the nodes that turned ready."""
    try:
        reported = {node.id: node for node in pool_provider(pool).nodes()}
    except ProviderError as exc:
        logger.warning("Pool %s: the provider did not answer: %s", pool, exc)
        return []
    ready: list[PoolNode] = []
    failed_requests: dict[int, str] = {}
    for node in PoolNode.objects.filter(pool=pool, state=PoolNodeState.BOOTING):
        seen = reported.get(node.provider_id or node.name)
        if seen is not None and seen.state == NodeState.READY:
            node.state, node.ready_at = PoolNodeState.READY, now
            node.name = seen.node_name or seen.id  # known now, where the cluster named it
            node.save(update_fields=["state", "ready_at", "name"])
            ready.append(node)
        elif seen is None or seen.state == NodeState.FAILED:
            reason = seen.reason if seen is not None else "the provider no longer has it"
            node.state, node.reason, node.returned_at = PoolNodeState.FAILED, reason, now
            node.save(update_fields=["state", "reason", "returned_at"])
            try:  # a failed boot is not paid for; the provider forgets it
                pool_provider(pool).delete(node.provider_id or node.name)
            except ProviderError as exc:
                logger.warning("Pool %s: deleting failed %s: %s", pool, node.name, exc)
            if node.request_id:
                failed_requests[node.request_id] = reason
    for request in NodeRequest.objects.filter(pk__in=failed_requests):
        for node in PoolNode.objects.filter(request=request, state__in=LIVE):
            pool_return_node(node=node, now=now, reason="its request failed")
        request.failed = True
        request.retry_at = now + timedelta(seconds=retry_delay_s(request.tries))
        request.reason = (f"a node failed to boot (try {request.tries} of {MAX_TRIES}): "
                          f"{failed_requests[request.pk]}")
        request.save(update_fields=["failed", "retry_at", "reason"])
        _event(pool, ScaleEventKind.FAILED, request.reason, now, nodes=request.nodes,
               tenant=request.tenant)
    if ready:
        cluster_sync_nodes(cluster=pool.cluster)
    return ready


@transaction.atomic
def pool_return_node(*, node: PoolNode, now: datetime, reason: str) -> None:
    """Give a node back to the provider, take it out of its cluster, and bill the tenant it was
    bought for from its request until now (boot and idle time included)."""
    pool = node.pool
    try:
        pool_provider(pool).delete(node.provider_id or node.name)
    except ProviderError as exc:
        logger.warning("Pool %s: returning %s failed, tried again next time: %s", pool,
                       node.name, exc)
        return
    was_live = node.state in LIVE
    if node.state != PoolNodeState.FAILED:
        node.state = PoolNodeState.RETURNED
    node.returned_at, node.claims = now, []
    node.save(update_fields=["state", "returned_at", "claims"])
    Node.objects.filter(cluster=pool.cluster, name=node.name).delete()
    usage_record_create(
        tenant=node.tenant, kind=UsageRecord.Kind.LEASE,
        source=f"pool node {pool.pk}/{node.provider_id or node.name}",
        gpus=node.gpus, cpu_cores=0, gpu_model=node.gpu_model, started_at=node.requested_at,
        ended_at=now)
    if was_live and reason != "its request failed":
        _event(pool, ScaleEventKind.DOWN, f"returned {node.name}: {reason}", now, nodes=1,
               tenant=node.tenant)


def pool_spend(pool: ElasticPool, now: datetime, *, tenant: Tenant | None = None) -> Decimal:
    """What the pool's nodes (a tenant's, when given) cost in the calendar month of `now`."""
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nodes = PoolNode.objects.filter(pool=pool).filter(
        Q(returned_at__isnull=True) | Q(returned_at__gt=month))
    if tenant is not None:
        nodes = nodes.filter(tenant=tenant)
    total = Decimal(0)
    for node in nodes:
        start = max(node.requested_at, month)
        end = node.returned_at or now
        hours = Decimal(max(0.0, (end - start).total_seconds()) / 3600)
        total += hours * node.price_per_hour
    return total.quantize(Decimal("0.01"))
