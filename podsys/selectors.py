"""Reads, scoped to the caller: clusters shared by every tenant, and the caller's own."""

from django.db.models import Count, Q, QuerySet, Sum

from infra_os.access import is_platform_admin, member_tenant_ids
from podsys.models import Cluster, Node
from podsys.models.accounts import ClusterGroup, ClusterUser
from podsys.selectors_environments import (  # noqa: F401
    cluster_environment_list,
    environments_visible,
)
from podsys.selectors_health import (  # noqa: F401
    health_check_history,
    health_check_run_list,
    node_health_summary,
)
from podsys.selectors_metrics import MetricsUnavailable, node_metric_series  # noqa: F401
from podsys.selectors_stack import (  # noqa: F401
    deployment_grid,
    deployment_run_list,
    stack_profile_list,
)


def cluster_list(*, user) -> QuerySet[Cluster]:
    queryset = Cluster.objects.select_related("tenant").annotate(
        node_count=Count("nodes", distinct=True),
        gpu_count=Sum("nodes__gpus"),
    )
    if is_platform_admin(user):
        return queryset
    if not user.is_authenticated:
        return queryset.none()
    return queryset.filter(
        Q(tenant__isnull=True) | Q(tenant_id__in=member_tenant_ids(user)), is_active=True
    )


def node_list(*, user) -> QuerySet[Node]:
    visible = cluster_list(user=user).values("pk")
    return Node.objects.select_related("cluster").filter(cluster_id__in=visible)


def cluster_account_list(*, user, cluster: Cluster | None = None) -> QuerySet[ClusterUser]:
    """Cluster accounts (active and removed) with their groups: an operator's concern, so
    platform admins see them and everyone else none."""
    if not is_platform_admin(user):
        return ClusterUser.objects.none()
    queryset = ClusterUser.objects.select_related("cluster", "primary_group", "user") \
        .prefetch_related("groups")
    return queryset.filter(cluster=cluster) if cluster is not None else queryset


def cluster_group_list(*, user, cluster: Cluster | None = None) -> QuerySet[ClusterGroup]:
    """Cluster groups with how many active accounts are in each (platform admins only)."""
    if not is_platform_admin(user):
        return ClusterGroup.objects.none()
    queryset = ClusterGroup.objects.select_related("cluster").annotate(
        member_count=Count("users", filter=Q(users__is_active=True), distinct=True))
    return queryset.filter(cluster=cluster) if cluster is not None else queryset
