from django.conf import settings
from django.db import models

from infra_os.models.tenancy import Tenant


class AuditEvent(models.Model):
    """One state change made by someone. Names are copied so the record outlives what it names.
    Its links to the actor and the tenant have no database constraint (Django still sets them to
    null when those go): writing the record never locks the rows it names, which every audited
    change of a busy tenant would otherwise queue on."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", db_constraint=False,
    )
    actor_name = models.CharField(max_length=150, blank=True)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_events",
        db_constraint=False,
    )
    tenant_name = models.CharField(max_length=63, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    changes = models.JSONField(default=dict, blank=True)
    source_ip = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.actor_name or 'system'} {self.action} {self.object_repr}"
