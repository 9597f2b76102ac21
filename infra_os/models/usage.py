from django.db import models

from infra_os.models.tenancy import Tenant


class UsageRecord(models.Model):
    """What a tenant consumed, written when the consuming thing ends (a job attempt, a lease) or
    as it happens (tokens through the gateway); billing rates these. Names are copied so records
    outlive their sources. Billing reads time from `started_at`/`ended_at` (exact), never from
    the float seconds kept for charts."""

    class Kind(models.TextChoices):
        JOB = "job", "Job"
        LEASE = "lease", "Server lease"
        TOKENS = "tokens", "Tokens"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_records")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    source = models.CharField(max_length=64, help_text='What consumed it, e.g. "job 42 attempt 2"')
    gpu_model = models.CharField(max_length=64, blank=True)
    gpus = models.PositiveIntegerField(default=0)
    cpu_cores = models.FloatField(default=0)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    gpu_seconds = models.FloatField(default=0)
    cpu_seconds = models.FloatField(default=0)
    # Tokens through the gateway, by model.
    model_name = models.CharField(max_length=200, blank=True)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-ended_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "source"], name="usage_record_once"),
            models.CheckConstraint(condition=models.Q(ended_at__gte=models.F("started_at")),
                                   name="usage_record_ends_after_start"),
        ]
        indexes = [models.Index(fields=["tenant", "ended_at"])]

    def __str__(self) -> str:
        return f"{self.tenant.name}: {self.source} {self.gpu_seconds / 3600:.2f} GPU-h"
