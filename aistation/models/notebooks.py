from django.conf import settings
from django.db import models

from aistation.models.jobs import Job
from aistation.models.queues import Queue
from infra_os.models import ApiToken, Tenant
from ogai.models import TimeStampedModel

DEFAULT_IDLE_TIMEOUT_S = 3600


class Notebook(TimeStampedModel):
    """A JupyterLab environment: each session runs as a service job of its queue, reached only
    through the platform's proxy at /notebooks/<id>/. The home folder outlives the sessions."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="notebooks")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="notebooks")
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="notebooks")
    name = models.CharField(max_length=100)
    image = models.CharField(max_length=500, blank=True)
    gpus = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=64, blank=True)
    cpu = models.FloatField(default=1.0)
    memory_mib = models.PositiveIntegerField(default=4096)
    # The current (or last) session's job; None before the first start.
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="+")
    # The Jupyter server's token, encrypted (`ogai.crypto`): the proxy sends it in a header.
    server_token = models.TextField(blank=True, editable=False)
    # The SDK's API token inside the session, revoked when the session ends.
    sdk_token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL,
                                  related_name="+", editable=False)
    last_activity_at = models.DateTimeField(null=True, blank=True)
    # The home folder's size when its last session ended: what it holds of the tenant's
    # storage quota.
    home_bytes = models.PositiveBigIntegerField(default=0, editable=False)
    deleted = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"notebook {self.pk} {self.name}"


class NotebookEvent(models.Model):
    """What happened to a notebook and why: started, stopped, culled, resumed, deleted."""

    notebook = models.ForeignKey(Notebook, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16)
    reason = models.TextField(blank=True)
    # The session's job, on the events that start one (started, resumed).
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


class NotebookPolicy(models.Model):
    """A tenant's rules for its notebooks, set by its admins: how long an environment may sit
    idle (no kernel activity, no open browser) before it is stopped to free its GPUs."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE,
                                  related_name="notebook_policy")
    idle_timeout_s = models.PositiveIntegerField(default=DEFAULT_IDLE_TIMEOUT_S)

    def __str__(self) -> str:
        return f"notebooks of {self.tenant}: idle limit {self.idle_timeout_s} s"
