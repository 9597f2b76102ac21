"""Clusters and their nodes."""

import dataclasses
import json
import logging

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Max, Sum
from django.utils import timezone

from infra_os.access import require_platform_admin
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from ogai.crypto import encrypt
from podsys.choices import CordonSource, NodeHealth
from podsys.drivers import local_environments
from podsys.drivers.base import (
    CORDONED_BY_PLATFORM,
    ClusterDriver,
    ConnectionReport,
    DriverError,
)
from podsys.drivers.kube_manifests import KubeOptions
from podsys.drivers.kube_watch import WatchOptions
from podsys.health import NODE_LABEL_PREFIX
from podsys.models import Cluster, Node
from podsys.runtime import driver_for
from podsys.services.health import exclusive_check_running, held_reason

logger = logging.getLogger(__name__)


def _check_credentials(driver: str, options: dict, kubeconfig: str) -> str:
    """The credentials to store, encrypted: a kubeconfig for a Kubernetes cluster unless it
    runs in-cluster. Errors never quote the kubeconfig."""
    if "kubeconfig" in options:
        raise ValidationError({"options": "Give the kubeconfig in its own field: options are "
                               "shown to operators, credentials never are."})
    if driver != "kubernetes":
        if kubeconfig:
            raise ValidationError({"kubeconfig": f"The {driver} driver takes no kubeconfig."})
        return ""
    try:
        KubeOptions.from_options(options)
        WatchOptions.from_options(options)
    except ValueError as exc:
        raise ValidationError({"options": str(exc)}) from None
    if options.get("in_cluster"):
        if kubeconfig:
            raise ValidationError({"kubeconfig": "Give a kubeconfig or in_cluster, not both."})
        return ""
    if not kubeconfig:
        raise ValidationError({"kubeconfig": "A Kubernetes cluster needs a kubeconfig, or "
                               "options {\"in_cluster\": true} when OGAI runs inside it."})
    try:
        parsed = yaml.safe_load(kubeconfig)
    except yaml.YAMLError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
            isinstance(parsed.get(key), list) and parsed[key]
            for key in ("clusters", "contexts", "users")):
        raise ValidationError({"kubeconfig": "This is not a kubeconfig: it needs clusters, "
                               "contexts and users (the file kubectl reads)."})
    return encrypt(json.dumps({"kubeconfig": kubeconfig}))


@transaction.atomic
def cluster_create(
    *,
    actor,
    name: str,
    driver: str,
    options: dict | None = None,
    display_name: str = "",
    tenant: Tenant | None = None,
    kubeconfig: str = "",
) -> Cluster:
    """Register a cluster. A Kubernetes cluster's kubeconfig is stored encrypted and never
    returned, logged or audited."""
    require_platform_admin(actor)
    options = options or {}
    cluster = Cluster(
        name=name, driver=driver, options=options, display_name=display_name, tenant=tenant
    )
    cluster.full_clean()
    if driver == "local":
        try:  # its named environments, checked now rather than at the first job
            local_environments.configured(options)
        except DriverError as exc:
            raise ValidationError({"options": str(exc)}) from None
    if driver == "slurm":
        from podsys.drivers.slurm import SlurmDriver

        try:
            SlurmDriver.check_options(options)
        except ValueError as exc:
            raise ValidationError({"options": str(exc)}) from None
    cluster.credentials = _check_credentials(driver, options, kubeconfig)
    cluster.save()
    audit_record(
        actor=actor,
        action="cluster.create",
        obj=cluster,
        tenant=tenant,
        changes={"name": name, "driver": driver, "credentials": bool(cluster.credentials)},
    )
    transaction.on_commit(lambda: _enqueue_sync(cluster.pk))
    return cluster


def cluster_check_connection(*, actor, cluster: Cluster) -> ConnectionReport:
    """Reach the cluster through its driver and say what it offers, in plain words."""
    require_platform_admin(actor)
    try:
        return driver_for(cluster).check_connection()
    except DriverError as exc:
        return ConnectionReport(ok=False, message=str(exc))


def _enqueue_sync(cluster_id: int) -> None:
    from podsys.tasks import sync_nodes

    sync_nodes.delay(cluster_id=cluster_id)


def cluster_sync_nodes(*, cluster: Cluster) -> list[Node]:
    """Make the cluster's Node rows match what its driver reports. A node the driver no longer
    reports is kept, marked lost, so its running work is noticed and moved."""
    now = timezone.now()
    try:
        driver = driver_for(cluster)
        reported = _mirror_cordons(cluster, driver, driver.nodes())
    except DriverError as exc:
        Cluster.objects.filter(pk=cluster.pk).update(sync_error=str(exc))
        logger.warning("Cluster %s: node sync failed: %s", cluster.name, exc)
        return list(cluster.nodes.all())
    with transaction.atomic():
        # The cluster row first, then its nodes: the order scheduling cycles and health checks
        # lock them in, so a sync never deadlocks with either.
        Cluster.objects.select_for_update(no_key=True).filter(pk=cluster.pk).first()
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
            # The health checks' labels are the platform's own: the cluster never reports them.
            node.labels = {**info.labels, **{key: value for key, value in node.labels.items()
                                             if key.startswith(NODE_LABEL_PREFIX)}}
            node.taints = list(info.taints)
            node.gpus_in_use = info.gpus_allocated
            node.gpus_foreign = info.gpus_foreign
            node.rdma_devices = max(0, info.rdma)
            node.rdma_in_use = info.rdma_allocated
            if info.address:  # else an address set by hand stays
                node.address = info.address
            node.health = NodeHealth.HEALTHY if info.ready else NodeHealth.NOT_READY
            if info.reason or not node.cordon_source:  # a cordon's reason stays while it does
                node.health_reason = info.reason
            if not info.schedulable and info.labels.get(CORDONED_BY_PLATFORM) != "true":
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


def cluster_cleanup(*, cluster: Cluster) -> int:
    """Delete finished workloads' leftovers on the cluster once their logs are kept (the
    retention is a cluster option); a failure is logged and tried again next time."""
    try:
        return driver_for(cluster).cleanup()
    except DriverError as exc:
        logger.warning("Cluster %s: cleanup failed: %s", cluster.name, exc)
        return 0


def _mirror_cordons(cluster: Cluster, driver, reported: list) -> list:
    """Make the cluster's own cordons (Slurm's drain) follow the platform's: a node the
    platform cordoned (an operator, a failed health check) is cordoned there, and one it
    cordoned there and has since returned to service is uncordoned. A node held only while
    an exclusive health check runs stays open there: the check itself runs on it. Returns what
    the driver reports afterwards."""
    if type(driver).set_schedulable is ClusterDriver.set_schedulable:
        return reported  # the cluster keeps no cordons of its own
    wanted = {
        node.name: node.health_reason
        for node in cluster.nodes.filter(schedulable=False).exclude(
            cordon_source__in=[CordonSource.NONE, CordonSource.CHECK_RUNNING])
    }
    changed = False
    for info in reported:
        ours = info.labels.get(CORDONED_BY_PLATFORM) == "true"
        if info.name in wanted and info.schedulable:
            driver.set_schedulable(info.name, False, wanted[info.name])
            changed = True
        elif info.name not in wanted and ours:
            driver.set_schedulable(info.name, True)
            changed = True
    if not changed:
        return reported
    resumed = {info.name for info in reported if info.name not in wanted
               and info.labels.get(CORDONED_BY_PLATFORM) == "true"}
    # A node just resumed is back in service for the platform at once, even while the
    # cluster still pings it.
    return [dataclasses.replace(info, ready=True, schedulable=True, reason="")
            if info.name in resumed else info
            for info in driver.nodes()]


def cluster_refresh_capacity(*, cluster: Cluster) -> dict:
    """Sum the cluster's nodes up, in all and per GPU model: how many, their GPUs, and the
    largest node's GPUs, CPU cores, memory and RDMA devices, and all its RDMA devices. Lost
    nodes count: they may come back."""
    groups = {
        row["gpu_model"]: {"nodes": row["n"], "gpus": row["total"], "largest_gpus": row["largest"],
                           "cpu_cores": row["cpu"], "memory_mib": row["memory"],
                           "rdma": row["rdma"] or 0, "largest_rdma": row["largest_rdma"] or 0}
        for row in Node.objects.filter(cluster=cluster).order_by().values("gpu_model")
        .annotate(n=Count("pk"), total=Sum("gpus"), largest=Max("gpus"), cpu=Max("cpu_cores"),
                  memory=Max("memory_mib"), rdma=Sum("rdma_devices"),
                  largest_rdma=Max("rdma_devices"))
    }
    every = list(groups.values())
    capacity = {
        "all": {
            "nodes": sum(g["nodes"] for g in every),
            "gpus": sum(g["gpus"] for g in every),
            "largest_gpus": max((g["largest_gpus"] for g in every), default=0),
            "cpu_cores": max((g["cpu_cores"] for g in every), default=0),
            "memory_mib": max((g["memory_mib"] for g in every), default=0),
            "rdma": sum(g["rdma"] for g in every),
            "largest_rdma": max((g["largest_rdma"] for g in every), default=0),
        },
        "gpu_models": {model: group for model, group in groups.items() if model},
    }
    Cluster.objects.filter(pk=cluster.pk).update(capacity=capacity)
    cluster.capacity = capacity
    return capacity


@transaction.atomic
def node_set_schedulable(*, actor, node: Node, schedulable: bool, reason: str = "") -> Node:
    """Cordon (False) or uncordon (True): running work stays; nothing new is placed. A node
    held for an exclusive health check (`CHECK_RUNNING`) is not uncordoned: it returns by
    itself when the check ends; one uncordoned while such a check runs there is held until it
    ends. A cordon is the operator's, whoever held the node before."""
    require_platform_admin(actor)
    if schedulable:
        # The cluster row first, as the health checks lock it while they mark an exclusive
        # check RUNNING: one starting there now is seen below.
        Cluster.objects.select_for_update(no_key=True).filter(pk=node.cluster_id).first()
    was = Node.objects.select_for_update().values_list("cordon_source", flat=True) \
        .get(pk=node.pk)
    running = exclusive_check_running(node.pk) if schedulable else ""
    if running and was == CordonSource.CHECK_RUNNING:
        raise ValidationError({"node": f"Node {node.name} is held while health check {running} "
                               "runs; it returns by itself when the check ends."})
    node.schedulable = schedulable and not running
    # An operator's cordon is theirs: health checks passing never lift it.
    node.cordon_source = (CordonSource.OPERATOR if not schedulable else
                          CordonSource.CHECK_RUNNING if running else CordonSource.NONE)
    if not schedulable:
        node.health_reason = reason
    elif running:
        node.health_reason = held_reason(running)
    elif was in (CordonSource.HEALTH_CHECK, CordonSource.CHECK_RUNNING):
        node.health_reason = ""
    node.save(update_fields=["schedulable", "cordon_source", "health_reason", "updated_at"])
    # The cluster's own cordon (Slurm's drain) follows at the next sync: this one.
    cluster_id = node.cluster_id
    transaction.on_commit(lambda: _enqueue_sync(cluster_id))
    audit_record(
        actor=actor,
        action="node.cordon" if not schedulable else "node.uncordon",
        obj=node,
        changes={"reason": reason, **({"held_for": running} if running else {})},
    )
    return node
