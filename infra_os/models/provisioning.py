from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from infra_os.choices import ACTIVE_RUN_STATES, BatchState, BootMethod, RunState
from infra_os.models.servers import Server
from infra_os.models.tenancy import slug_validator
from ogai.models import TimeStampedModel


class ProvisioningProfile(TimeStampedModel):
    """How a batch installs its servers: how they boot, and what their first boot is told."""

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator],
                            error_messages={"unique": "A profile with this name already exists."})
    description = models.CharField(max_length=200, blank=True)
    boot_method = models.CharField(max_length=16, choices=BootMethod.choices,
                                   default=BootMethod.PXE)
    user_data = models.TextField(blank=True, help_text="cloud-init user data for the first boot")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ProvisioningBatch(TimeStampedModel):
    """Servers installed together with one image and profile, `concurrency` at a time."""

    name = models.CharField(max_length=100)
    profile = models.ForeignKey(ProvisioningProfile, on_delete=models.PROTECT,
                                related_name="batches")
    image_url = models.URLField(max_length=500)
    boot_method = models.CharField(max_length=16, choices=BootMethod.choices)
    concurrency = models.PositiveIntegerField(
        default=20, validators=[MinValueValidator(1), MaxValueValidator(1000)])
    max_attempts = models.PositiveIntegerField(
        default=3, validators=[MinValueValidator(1), MaxValueValidator(10)])
    power_timeout_s = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(1)],
        help_text="How long a power change may take before the attempt fails")
    callback_timeout_s = models.PositiveIntegerField(
        default=3600, validators=[MinValueValidator(1)],
        help_text="How long after power-on the first-boot agent has to call back")
    state = models.CharField(max_length=16, choices=BatchState.choices,
                             default=BatchState.RUNNING)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL,
                                   null=True, related_name="+")
    finished_at = models.DateTimeField(null=True, blank=True)
    summary = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name


class ProvisioningRun(models.Model):
    """One server's way through a batch. A task advances it one step at a time; `claimed_until`
    keeps two workers from driving it at once, `next_check_at` lets a sweep find a run whose
    task was lost. The one-time token is kept encrypted until it is used, then dropped."""

    batch = models.ForeignKey(ProvisioningBatch, on_delete=models.CASCADE, related_name="runs")
    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="provisioning_runs")
    state = models.CharField(max_length=24, choices=RunState.choices, default=RunState.WAITING)
    attempt = models.PositiveIntegerField(default=0)
    token_digest = models.CharField(max_length=64, blank=True, db_index=True)
    token_encrypted = models.TextField(blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    next_check_at = models.DateTimeField(null=True, blank=True, db_index=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Where the time went: in OGAI's own code, and waiting on the BMC's answers.
    ogai_seconds = models.FloatField(default=0)
    bmc_seconds = models.FloatField(default=0)

    class Meta:
        ordering = ["batch_id", "server__name"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "server"], name="provisioning_run_once"),
            models.UniqueConstraint(fields=["server"], name="provisioning_one_active_run",
                                    condition=models.Q(state__in=ACTIVE_RUN_STATES)),
        ]

    def __str__(self) -> str:
        return f"{self.server.name} in batch {self.batch_id}"


class ProvisioningStep(models.Model):
    """One line of a run's history, in words: what OGAI did or what the BMC answered."""

    class Outcome(models.TextChoices):
        OK = "ok", "OK"
        ERROR = "error", "Error"

    run = models.ForeignKey(ProvisioningRun, on_delete=models.CASCADE, related_name="steps")
    at = models.DateTimeField(auto_now_add=True)
    attempt = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=32)
    outcome = models.CharField(max_length=8, choices=Outcome.choices, default=Outcome.OK)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"
