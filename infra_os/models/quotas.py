from django.core.exceptions import ValidationError
from django.db import models

from infra_os.models.tenancy import Tenant
from ogai.models import TimeStampedModel


class Quota(TimeStampedModel):
    """What a tenant may hold at once. `gpu_model_limits` caps GPUs of one model within `gpus`,
    e.g. `{"H100": 8}` for a tenant that may use at most 8 of its GPUs as H100s."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="quota")
    gpus = models.PositiveIntegerField(default=0)
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_gib = models.PositiveIntegerField(default=0)
    storage_gib = models.PositiveIntegerField(default=0)
    # RDMA devices (a cluster's RDMA resource) its jobs may hold at once, on all clusters;
    # 0: no limit, like CPU and memory.
    rdma_devices = models.PositiveIntegerField(default=0)
    gpu_model_limits = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["tenant__name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(gpus__gte=0, cpu_cores__gte=0, memory_gib__gte=0,
                                   storage_gib__gte=0),
                name="quota_non_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"Quota of {self.tenant.name}"

    def clean(self) -> None:
        limits = self.gpu_model_limits
        if not isinstance(limits, dict):
            raise ValidationError(
                {"gpu_model_limits": "Give an object mapping a GPU model to a number of GPUs."}
            )
        for model, count in limits.items():
            if not isinstance(model, str) or not model.strip():
                raise ValidationError({"gpu_model_limits": "A GPU model name cannot be empty."})
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValidationError(
                    {"gpu_model_limits": f"{model}: the limit must be a whole number >= 0."}
                )
            if count > self.gpus:
                raise ValidationError(
                    {"gpu_model_limits": f"{model}: {count} GPUs is above the tenant's "
                     f"{self.gpus} GPUs in all."}
                )
