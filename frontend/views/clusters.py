"""Clusters the current tenant may run on (shared ones and its own), each drawn node by node
with its GPUs, CPU cores and memory allocated and free; platform admins add clusters, sync and
cordon nodes."""

from dataclasses import dataclass

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from frontend.access import console_access, current_tenant
from frontend.allocations import (
    Held,
    Usage,
    cpu_usage,
    memory_usage,
    node_allocations,
    rdma_usage,
)
from frontend.forms import ClusterCreateForm, add_service_errors
from frontend.lists import list_response
from frontend.responses import safe_next, wants_partial
from frontend.tables_jobs import ClusterTable
from infra_os.selectors import tenant_list
from podsys.allocations import gpu_allocations
from podsys.filtersets import ClusterFilterSet
from podsys.models import Node
from podsys.selectors import cluster_environment_list, cluster_list, node_list
from podsys.services.clusters import (
    cluster_check_connection,
    cluster_create,
    cluster_sync_nodes,
    node_set_schedulable,
)


def _current_clusters(request):
    """Shared clusters and the current tenant's own (platform admins see every cluster of
    the tenant the switcher shows, as on every other page)."""
    tenant = current_tenant(request)
    shared = Q(tenant__isnull=True)
    return cluster_list(user=request.user).filter(
        shared | Q(tenant_id=tenant.pk) if tenant else shared
    )


@login_required
def clusters(request):
    queryset = _current_clusters(request)
    held: dict[int, int] = {}
    for (cluster_id, _node), gpus in gpu_allocations(queryset.values_list("pk", flat=True)) \
            .items():
        held[cluster_id] = held.get(cluster_id, 0) + gpus
    return list_response(
        request,
        template="frontend/clusters/list.html",
        table_class=ClusterTable,
        queryset=queryset,
        filterset_class=ClusterFilterSet,
        filter_labels={"driver": "Driver", "is_active": "Active"},
        table_kwargs={"allocated": held},
    )


@dataclass(frozen=True)
class NodeCard:
    node: Node
    allocated: int
    cpu: Usage
    memory: Usage
    rdma: Usage

    @property
    def free(self) -> int:
        return max(self.node.gpus - self.allocated, 0)

    @property
    def squares(self) -> list[bool]:
        """One square per GPU: True for an allocated one. More held than the node has (it
        shrank under running work) fills them all."""
        held = min(self.allocated, self.node.gpus)
        return [True] * held + [False] * (self.node.gpus - held)


@login_required
def cluster_detail(request, name: str):
    """The cluster's nodes as cards, one square per GPU. An htmx request (the page's poller)
    gets the nodes area alone."""
    cluster = get_object_or_404(_current_clusters(request), name=name)
    nodes = list(node_list(user=request.user).filter(cluster_id=cluster.pk).order_by("name"))
    held = node_allocations([cluster.pk])
    cards = []
    for node in nodes:
        here = held.get((cluster.pk, node.name), Held())
        cards.append(NodeCard(node, here.gpus, cpu_usage(node, here), memory_usage(node, here),
                              rdma_usage(node, here)))
    total = sum(node.gpus for node in nodes)
    allocated = sum(min(card.allocated, card.node.gpus) for card in cards)
    context = {
        "cluster": cluster,
        "cards": cards,
        "gpus_total": total,
        "gpus_allocated": allocated,
        "gpus_free_schedulable": sum(card.free for card in cards if card.node.takes_work),
        "nodes_taking_work": sum(1 for node in nodes if node.takes_work),
        "gpu_percent": round(100 * allocated / total) if total else 0,
        "cpu": Usage(sum(card.cpu.allocated for card in cards),
                     sum(card.cpu.total for card in cards)),
        "memory": Usage(sum(card.memory.allocated for card in cards),
                        sum(card.memory.total for card in cards)),
        "rdma": Usage(sum(card.rdma.allocated for card in cards),
                      sum(card.rdma.total for card in cards)),
    }
    if wants_partial(request):
        template = "frontend/clusters/nodes.html"
    else:
        template = "frontend/clusters/detail.html"
        context |= _environments_context(request, cluster)
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


def _environments_context(request, cluster) -> dict:
    """The environments jobs there may name, for those who run there (and admins)."""
    try:
        offered = cluster_environment_list(user=request.user, cluster=cluster)
    except ValidationError as exc:
        return {"show_environments": True, "environments": [],
                "environments_error": " ".join(exc.messages)}
    return {"show_environments": offered is not None, "environments": offered or [],
            "environments_error": ""}


@login_required
@require_POST
def cluster_sync(request, name: str):
    cluster = get_object_or_404(_current_clusters(request), name=name)
    # cluster_sync_nodes takes no actor (a periodic task calls it); the API lets only platform
    # admins ask for it, and so does the console.
    if not console_access(request).platform_admin:
        raise PermissionDenied("Only a platform admin can sync a cluster's nodes.")
    nodes = cluster_sync_nodes(cluster=cluster)
    cluster.refresh_from_db(fields=["sync_error", "last_synced_at"])
    if cluster.sync_error:
        messages.error(request, f"Sync of {cluster.name} failed: {cluster.sync_error}")
    else:
        gpus = sum(node.gpus for node in nodes)
        messages.success(request, f"Synced {cluster.name}: {len(nodes)} "
                         f"node{'s' if len(nodes) != 1 else ''}, {gpus} GPUs.")
    return redirect("frontend:cluster", name=cluster.name)


@login_required
@require_POST
def cluster_check(request, name: str):
    """Reach the cluster and say what it offers (version, GPUs, Kueue or Volcano)."""
    cluster = get_object_or_404(_current_clusters(request), name=name)
    if not console_access(request).platform_admin:
        raise PermissionDenied("Only a platform admin can check a cluster's connection.")
    report = cluster_check_connection(actor=request.user, cluster=cluster)
    if report.ok:
        messages.success(request, f"{cluster.name} answers: {report.message}")
    else:
        messages.error(request, f"{cluster.name} cannot be reached: {report.message}")
    return redirect("frontend:cluster", name=cluster.name)


@login_required
@require_POST
def node_schedulable(request, name: str, pk: int):
    """Cordon (schedulable=0) or uncordon (schedulable=1) a node."""
    cluster = get_object_or_404(_current_clusters(request), name=name)
    node = get_object_or_404(node_list(user=request.user).filter(cluster_id=cluster.pk), pk=pk)
    schedulable = request.POST.get("schedulable") == "1"
    try:
        node_set_schedulable(actor=request.user, node=node, schedulable=schedulable,
                             reason="" if schedulable else "cordoned in the console by "
                             f"{request.user.get_username()}")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        _say_schedulable(request, node, schedulable)
    # The node's own page sends `next` to come back to it.
    return redirect(safe_next(request, reverse("frontend:cluster", args=[cluster.name])))


def _say_schedulable(request, node: Node, schedulable: bool) -> None:
    if schedulable and not node.schedulable:  # an exclusive health check runs there
        messages.success(request, f"Node {node.name} uncordoned: {node.health_reason}; it takes "
                         "new work once that check ends.")
    elif schedulable:
        messages.success(request, f"Node {node.name} takes new work again.")
    else:
        messages.success(request, f"Node {node.name} cordoned: what runs there goes on; "
                         "nothing new is placed on it.")


@login_required
def cluster_create_view(request):
    if not console_access(request).platform_admin:
        raise PermissionDenied("Only a platform admin can add clusters.")
    form = ClusterCreateForm(request.POST or None, drivers=settings.OGAI_CLUSTER_DRIVERS,
                             tenants=tenant_list(user=request.user))
    if request.method == "POST" and form.is_valid():
        try:
            cluster = cluster_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Cluster {cluster.name} added; its nodes appear once "
                             "the first sync has run.")
            return redirect("frontend:cluster", name=cluster.name)
    return render(request, "frontend/clusters/form.html", {"form": form})
