"""The named environments a cluster offers jobs, for those who may run work there."""

from django.core.exceptions import ValidationError

from infra_os.access import is_platform_admin, member_tenant_ids
from podsys.cluster_tenants import tenants_run_there
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
    return tenants_run_there(cluster.pk, member_tenant_ids(user))


def cluster_environment_list(*, user, cluster: Cluster) -> list[EnvironmentInfo] | None:
    """What the cluster's driver offers, the default first; None when the user may not see
    it (callers answer 404, as for a cluster they cannot see). A driver that cannot say is a
    ValidationError in its words."""
    if not environments_visible(user=user, cluster=cluster):
        return None
    try:
        return driver_for(cluster).environments()
    except DriverError as exc:
        raise ValidationError({"cluster": str(exc)}) from None
