from django.db import models

from infra_os.models import AuditEvent, Tenant
from ogai import request_context


def audit_record(
    *,
    actor,
    action: str,
    obj: models.Model | None = None,
    tenant: Tenant | None = None,
    changes: dict | None = None,
) -> AuditEvent:
    """Write one audit event. Called by every service that changes state, inside its
    transaction, so the event exists exactly when the change does."""
    is_user = actor is not None and getattr(actor, "is_authenticated", False)
    return AuditEvent.objects.create(
        actor=actor if is_user else None,
        actor_name=actor.get_username() if is_user else "system",
        tenant=tenant,
        tenant_name=tenant.name if tenant else "",
        action=action,
        object_type=obj._meta.label_lower if obj is not None else "",
        object_id=str(obj.pk) if obj is not None else "",
        object_repr=str(obj)[:200] if obj is not None else "",
        changes=changes or {},
        source_ip=request_context.source_ip.get(),
    )
