"""Reads, scoped to the caller: clusters shared by every tenant, and the caller's own."""

from django.db.models import Count, Q, QuerySet, Sum

from infra_os.access import is_platform_admin, member_tenant_ids
from podsys.models import Cluster, Node


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
