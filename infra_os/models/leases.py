from django.conf import settings
from django.db import models

from infra_os.choices import LeaseState
from infra_os.models.servers import Server
from infra_os.models.tenancy import Tenant
from ogai.models import TimeStampedModel


class Lease(TimeStampedModel):
    """A server rented whole to one tenant from `starts_at` to `ends_at` (bare-metal service).
    Its GPUs count against the tenant's GPU quota while it runs."""

    server = models.ForeignKey(Server, on_delete=models.PROTECT, related_name="leases")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="leases")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=LeaseState.choices,
                             default=LeaseState.SCHEDULED)
    # Copied at creation, so quota and billing do not move when the inventory does.
    gpu_model = models.CharField(max_length=64, blank=True)
    gpus = models.PositiveIntegerField(default=0)
    note = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL,
                                   null=True, related_name="+")
    # When it really ended (cancelled early, or at `ends_at`).
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-starts_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(ends_at__gt=models.F("starts_at")),
                                   name="lease_ends_after_start"),
        ]
        indexes = [models.Index(fields=["server", "starts_at"]),
                   models.Index(fields=["tenant", "state"])]

    def __str__(self) -> str:
        return f"{self.server.name} to {self.tenant.name}"
