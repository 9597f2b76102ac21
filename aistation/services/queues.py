from django.core.exceptions import ValidationError
from django.db import transaction

from aistation.models import Queue
from infra_os.access import require_role
from infra_os.choices import ADMIN_ROLES
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from ogai.models import assign_changes
from podsys.models import Cluster, Fleet

QUEUE_FIELDS = ("description", "default_priority", "gpu_limit", "policy", "is_active")


@transaction.atomic
def queue_create(*, actor, tenant: Tenant, name: str, cluster: Cluster, description: str = "",
                 default_priority: int = 0, gpu_limit: int | None = None,
                 policy: str = "fair", fleet: Fleet | None = None) -> Queue:
    """A queue of `cluster`, or with `fleet` of all the fleet's clusters (`cluster` one of
    them)."""
    require_role(actor, tenant, ADMIN_ROLES)
    if cluster.tenant_id not in (None, tenant.pk):
        raise ValidationError({"cluster": f"Cluster {cluster.name} belongs to another tenant."})
    if fleet is not None:
        if cluster.fleet_id != fleet.pk:
            raise ValidationError({"fleet": f"Cluster {cluster.name} is not in fleet "
                                   f"{fleet.name}."})
        if Cluster.objects.filter(fleet=fleet).exclude(tenant=None).exclude(
                tenant=tenant).exists():
            raise ValidationError({"fleet": f"Fleet {fleet.name} has another tenant's "
                                   "clusters."})
    if Queue.objects.filter(tenant=tenant, name=name).exists():
        raise ValidationError({"name": f"{tenant.name} already has a queue named {name}."})
    queue = Queue(tenant=tenant, name=name, cluster=cluster, description=description,
                  default_priority=default_priority, gpu_limit=gpu_limit, policy=policy,
                  fleet=fleet)
    queue.full_clean()
    queue.save()
    audit_record(actor=actor, action="queue.create", obj=queue, tenant=tenant,
                 changes={"cluster": cluster.name, "gpu_limit": gpu_limit, "policy": policy,
                          **({"fleet": fleet.name} if fleet else {})})
    return queue


@transaction.atomic
def queue_update(*, actor, queue: Queue, **fields) -> Queue:
    require_role(actor, queue.tenant, ADMIN_ROLES)
    changes = assign_changes(queue, fields, allowed=QUEUE_FIELDS)
    if changes:
        queue.full_clean()
        queue.save()
        audit_record(actor=actor, action="queue.update", obj=queue, tenant=queue.tenant,
                     changes=changes)
    return queue
