"""The named environments a cluster offers jobs, for those who may run work there."""

from django.core.exceptions import ValidationError

from infra_os.access import is_platform_admin, member_tenant_ids
from podsys.cluster_tenants import cluster_tenant_ids
from podsys.drivers.base import DriverError, EnvironmentInfo
from podsys.models import Cluster
from podsys.runtime import driver_for


def environments_visible(*, user, cluster: Cluster) -> bool:
    """Platform admins, and members of a tenant with a queue on the cluster: an environment's
    folder or image says how the machine is laid out, which is nobody else's business."""
    if is_platform_admin(user):
        return True
    if not user.is_authenticated:
        return False
    mine = {row["tenant_id"] for row in member_tenant_ids(user)}
    return bool(cluster_tenant_ids(cluster.pk) & mine)


def cluster_environment_list(*, user, cluster: Cluster) -> list[EnvironmentInfo]:
    """What the cluster's driver offers, the default first. Callers check
    `environments_visible` first (and answer 404 when not). A driver that cannot say is a
    ValidationError in its words."""
    if not environments_visible(user=user, cluster=cluster):
        raise Cluster.DoesNotExist(f"no cluster {cluster.name}")
    try:
        return driver_for(cluster).environments()
    except DriverError as exc:
        raise ValidationError({"cluster": str(exc)}) from None
