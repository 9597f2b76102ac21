"""Reads of fleets and their elastic pools: an operator's view, so platform admins see every
fleet and everyone else none. A summary costs a fixed number of queries plus one per pool
(its month's spend), however many nodes the fleet has."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Count, QuerySet

from infra_os.access import is_platform_admin
from podsys.allocations import gpu_allocations
from podsys.choices import PoolNodeState
from podsys.models import Cluster, ElasticPool, Fleet, Node, PoolNode, ScaleEvent
from podsys.services.pools import pool_spend

# The scale decisions a summary carries, newest first.
RECENT_EVENTS = 50


def fleet_list(*, user) -> QuerySet[Fleet]:
    """Every fleet with how many clusters and pools it has (platform admins only)."""
    if not is_platform_admin(user):
        return Fleet.objects.none()
    return Fleet.objects.annotate(cluster_count=Count("clusters", distinct=True),
                                  pool_count=Count("pools", distinct=True))


def scale_event_list(*, user, fleet: Fleet) -> QuerySet[ScaleEvent]:
    """The autoscaler's decisions on the fleet's pools, newest first (platform admins only)."""
    if not is_platform_admin(user):
        return ScaleEvent.objects.none()
    return ScaleEvent.objects.filter(pool__fleet=fleet).select_related("pool", "tenant") \
        .order_by("-created_at", "-id")


def cluster_lost(cluster: Cluster, now: datetime) -> bool:
    """Its driver has been failing for `OGAI_CLUSTER_LOST_S`: no node sync since then (the
    fleet's dispatcher moves its queued jobs away)."""
    seen = cluster.last_synced_at or cluster.created_at
    return bool(cluster.sync_error) and seen < now - timedelta(seconds=settings.OGAI_CLUSTER_LOST_S)


@dataclass(frozen=True)
class FleetCluster:
    cluster: Cluster
    nodes: int
    gpus: int
    gpus_held: int
    lost: bool

    @property
    def name(self) -> str:
        return self.cluster.name

    @property
    def driver(self) -> str:
        return self.cluster.driver

    @property
    def gpu_percent(self) -> int:
        return round(100 * self.gpus_held / self.gpus) if self.gpus else 0


@dataclass(frozen=True)
class FleetPool:
    pool: ElasticPool
    booting: int
    idle: int  # ready, nothing placed there and no job waiting for it
    busy: int  # ready, with GPUs held or claimed by a waiting job
    spend_this_month: Decimal

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def cluster(self) -> str:
        return self.pool.cluster.name

    @property
    def node_type(self) -> str:
        return self.pool.node_type

    @property
    def max_nodes(self) -> int:
        return self.pool.max_nodes

    @property
    def max_spend_per_month(self) -> Decimal:
        return self.pool.max_spend_per_month

    @property
    def live(self) -> int:
        return self.booting + self.idle + self.busy

    @property
    def spend_percent(self) -> int:
        """How much of its monthly budget is spent (0 when it has none)."""
        limit = self.pool.max_spend_per_month
        return min(100, round(100 * self.spend_this_month / limit)) if limit else 0


@dataclass(frozen=True)
class FleetSummary:
    fleet: Fleet
    clusters: list[FleetCluster] = field(default_factory=list)
    pools: list[FleetPool] = field(default_factory=list)
    events: list[ScaleEvent] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return sum(cluster.gpus for cluster in self.clusters)

    @property
    def gpus_held(self) -> int:
        return sum(cluster.gpus_held for cluster in self.clusters)


def fleet_summaries(fleets: Iterable[Fleet], now: datetime, *,
                    events: int = 0) -> dict[int, FleetSummary]:
    """Summaries of several fleets at once (a page of a list), by fleet id: the same queries
    however many fleets, plus one per pool. `events`: how many recent scale events each
    carries (each fleet's take one query)."""
    fleets = list(fleets)
    ids = [fleet.pk for fleet in fleets]
    clusters = list(Cluster.objects.filter(fleet_id__in=ids).order_by("name"))
    cluster_ids = [cluster.pk for cluster in clusters]
    held = gpu_allocations(cluster_ids)
    node_count: dict[int, int] = defaultdict(int)
    gpus: dict[int, int] = defaultdict(int)
    gpus_held: dict[int, int] = defaultdict(int)
    for cluster_id, name, node_gpus in Node.objects.filter(cluster_id__in=cluster_ids) \
            .values_list("cluster_id", "name", "gpus"):
        node_count[cluster_id] += 1
        gpus[cluster_id] += node_gpus
        # More held than the node has (it shrank under running work) counts it full.
        gpus_held[cluster_id] += min(held.get((cluster_id, name), 0), node_gpus)
    by_fleet: dict[int, FleetSummary] = {fleet.pk: FleetSummary(fleet) for fleet in fleets}
    for cluster in clusters:
        if cluster.fleet_id is None:  # left its fleet since the query
            continue
        by_fleet[cluster.fleet_id].clusters.append(FleetCluster(
            cluster=cluster, nodes=node_count[cluster.pk], gpus=gpus[cluster.pk],
            gpus_held=gpus_held[cluster.pk], lost=cluster_lost(cluster, now)))

    pools = list(ElasticPool.objects.filter(fleet_id__in=ids).select_related("cluster")
                 .order_by("name"))
    counts: dict[int, dict[str, int]] = defaultdict(lambda: {"booting": 0, "idle": 0, "busy": 0})
    for pool_id, cluster_id, name, state, claims in PoolNode.objects.filter(
            pool__in=pools, state__in=(PoolNodeState.BOOTING, PoolNodeState.READY)) \
            .values_list("pool_id", "pool__cluster_id", "name", "state", "claims"):
        if state == PoolNodeState.BOOTING:
            counts[pool_id]["booting"] += 1
        elif held.get((cluster_id, name), 0) or claims:
            counts[pool_id]["busy"] += 1
        else:
            counts[pool_id]["idle"] += 1
    for pool in pools:
        by_fleet[pool.fleet_id].pools.append(FleetPool(
            pool=pool, spend_this_month=pool_spend(pool, now), **counts[pool.pk]))

    if events:
        for fleet in fleets:
            by_fleet[fleet.pk].events.extend(
                ScaleEvent.objects.filter(pool__fleet=fleet).select_related("pool", "tenant")
                .order_by("-created_at", "-id")[:events])
    return by_fleet


def fleet_summary(fleet: Fleet, now: datetime) -> FleetSummary:
    """The fleet's clusters (GPUs held of their total, whether they answer), its pools (nodes
    booting, idle and busy, spend this month against the budget) and its last scale events."""
    return fleet_summaries([fleet], now, events=RECENT_EVENTS)[fleet.pk]
