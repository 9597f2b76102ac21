"""Clusters and their nodes."""

import logging

from django.db import transaction
from django.db.models import Count, Max, Sum
from django.utils import timezone

from infra_os.access import require_platform_admin
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from podsys.choices import NodeHealth
from podsys.drivers.base import DriverError
from podsys.models import Cluster, Node
from podsys.runtime import driver_for

logger = logging.getLogger(__name__)


@transaction.atomic
def cluster_create(
    *,
    actor,
    name: str,
    driver: str,
    options: dict | None = None,
    display_name: str = "",
    tenant: Tenant | None = None,
) -> Cluster:
    require_platform_admin(actor)
    cluster = Cluster(
        name=name, driver=driver, options=options or {}, display_name=display_name, tenant=tenant
    )
    cluster.full_clean()
    cluster.save()
    audit_record(
        actor=actor,
        action="cluster.create",
        obj=cluster,
        tenant=tenant,
        changes={"name": name, "driver": driver},
    )
    transaction.on_commit(lambda: _enqueue_sync(cluster.pk))
    return cluster


def _enqueue_sync(cluster_id: int) -> None:
    from podsys.tasks import sync_nodes

    sync_nodes.delay(cluster_id=cluster_id)


def cluster_sync_nodes(*, cluster: Cluster) -> list[Node]:
    """Make the cluster's Node rows match what its driver reports. A node the driver no longer
    reports is kept, marked lost, so its running work is noticed and moved."""
    now = timezone.now()
    try:
        reported = driver_for(cluster).nodes()
    except DriverError as exc:
        Cluster.objects.filter(pk=cluster.pk).update(sync_error=str(exc))
        logger.warning("Cluster %s: node sync failed: %s", cluster.name, exc)
        return list(cluster.nodes.all())
    with transaction.atomic():
        existing = {node.name: node for node in cluster.nodes.select_for_update()}
        seen = set()
        for info in reported:
            seen.add(info.name)
            node = existing.get(info.name) or Node(cluster=cluster, name=info.name)
            node.gpus = info.gpus
            node.gpu_model = info.gpu_model
            node.gpu_memory_mib = info.gpu_memory_mib
            node.cpu_cores = info.cpu_cores
            node.memory_mib = info.memory_mib
            node.labels = info.labels
            node.health = NodeHealth.HEALTHY if info.ready else NodeHealth.NOT_READY
            node.health_reason = info.reason
            if not info.schedulable:
                node.schedulable = False
            node.last_seen_at = now
            node.save()
        for name, node in existing.items():
            if name not in seen and node.health != NodeHealth.LOST:
                node.health = NodeHealth.LOST
                node.health_reason = "the cluster no longer reports this node"
                node.save(update_fields=["health", "health_reason", "updated_at"])
        Cluster.objects.filter(pk=cluster.pk).update(last_synced_at=now, sync_error="")
        cluster_refresh_capacity(cluster=cluster)
    return list(cluster.nodes.all())


def cluster_refresh_capacity(*, cluster: Cluster) -> dict:
    """Sum the cluster's nodes up, in all and per GPU model: how many, their GPUs, and the
    largest node's GPUs, CPU cores and memory. Lost nodes count: they may come back."""
    groups = {
        row["gpu_model"]: {"nodes": row["n"], "gpus": row["total"], "largest_gpus": row["largest"],
                           "cpu_cores": row["cpu"], "memory_mib": row["memory"]}
        for row in Node.objects.filter(cluster=cluster).order_by().values("gpu_model")
        .annotate(n=Count("pk"), total=Sum("gpus"), largest=Max("gpus"), cpu=Max("cpu_cores"),
                  memory=Max("memory_mib"))
    }
    every = list(groups.values())
    capacity = {
        "all": {
            "nodes": sum(g["nodes"] for g in every),
            "gpus": sum(g["gpus"] for g in every),
            "largest_gpus": max((g["largest_gpus"] for g in every), default=0),
            "cpu_cores": max((g["cpu_cores"] for g in every), default=0),
            "memory_mib": max((g["memory_mib"] for g in every), default=0),
        },
        "gpu_models": {model: group for model, group in groups.items() if model},
    }
    Cluster.objects.filter(pk=cluster.pk).update(capacity=capacity)
    cluster.capacity = capacity
    return capacity


@transaction.atomic
def node_set_schedulable(*, actor, node: Node, schedulable: bool, reason: str = "") -> Node:
    """Cordon (False) or uncordon (True): running work stays; nothing new is placed."""
    require_platform_admin(actor)
    node.schedulable = schedulable
    node.health_reason = reason if not schedulable else node.health_reason
    node.save(update_fields=["schedulable", "health_reason", "updated_at"])
    audit_record(
        actor=actor,
        action="node.cordon" if not schedulable else "node.uncordon",
        obj=node,
        changes={"reason": reason},
    )
    return node
