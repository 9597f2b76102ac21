from django.db import models

from aistation.choices import QueuePolicy
from infra_os.models import Tenant
from infra_os.models.tenancy import slug_validator
from ogai.models import TimeStampedModel
from podsys.models import Cluster, Fleet


class Queue(TimeStampedModel):
    """Where a tenant's jobs wait for one cluster, or for a fleet's clusters, with an optional GPU
    limit below its quota."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="queues")
    name = models.CharField(max_length=63, validators=[slug_validator])
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="queues")
    # A fleet queue: its jobs are dispatched over the fleet's clusters (`cluster` is one of
    # them, where it sends work when the fleet has no other answer).
    fleet = models.ForeignKey(Fleet, null=True, blank=True, on_delete=models.PROTECT,
                              related_name="queues")
    description = models.CharField(max_length=200, blank=True)
    default_priority = models.IntegerField(default=0)
    gpu_limit = models.PositiveIntegerField(null=True, blank=True,
                                            help_text="GPUs this queue may hold; empty: quota.")
    policy = models.CharField(max_length=16, choices=QueuePolicy.choices,
                              default=QueuePolicy.FAIR)
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="queue_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.name}/{self.name}"
