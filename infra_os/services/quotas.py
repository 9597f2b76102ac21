from django.db import transaction

from infra_os.access import require_platform_admin
from infra_os.models import Quota
from infra_os.services.audit import audit_record
from ogai.models import assign_changes

QUOTA_FIELDS = ("gpus", "cpu_cores", "memory_gib", "storage_gib", "rdma_devices",
                "gpu_model_limits")


@transaction.atomic
def quota_update(*, actor, quota: Quota, **fields) -> Quota:
    """Operators set quotas; a tenant cannot raise its own."""
    require_platform_admin(actor)
    quota = Quota.objects.select_for_update().get(pk=quota.pk)
    changes = assign_changes(quota, fields, allowed=QUOTA_FIELDS)
    if changes:
        quota.full_clean()
        quota.save()
        audit_record(actor=actor, action="quota.update", obj=quota, tenant=quota.tenant,
                     changes=changes)
    return quota
