from django.core.exceptions import ValidationError
from django.db import transaction

from infra_os.access import require_platform_admin
from infra_os.models import Quota
from infra_os.services.audit import audit_record
from ogai.models import assign_changes

QUOTA_FIELDS = ("gpus", "cpu_cores", "memory_gib", "storage_gib", "gpu_model_limits")


@transaction.atomic
def quota_update(*, actor, quota: Quota, **fields) -> Quota:
    """Operators set quotas; a tenant cannot raise its own."""
    require_platform_admin(actor)
    unknown = set(fields) - set(QUOTA_FIELDS)
    if unknown:
        raise ValidationError({name: "This field cannot be changed." for name in sorted(unknown)})
    quota = Quota.objects.select_for_update().get(pk=quota.pk)
    changes = assign_changes(quota, fields)
    if changes:
        quota.full_clean()
        quota.save()
        audit_record(actor=actor, action="quota.update", obj=quota, tenant=quota.tenant,
                     changes=changes)
    return quota
