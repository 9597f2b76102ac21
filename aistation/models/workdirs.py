from django.conf import settings
from django.db import models

from infra_os.models import Tenant


class Workdir(models.Model):
    """A user's working folder shipped with jobs: a content-addressed archive (gzip tar, the
    same bytes for the same files) kept once per tenant and reused by every job, rerun and
    retry that names it. `files` lists what it holds ([{"path": ..., "size": ...}])."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="workdirs")
    sha256 = models.CharField(max_length=64)
    size_bytes = models.PositiveBigIntegerField()
    # What the files add up to once unpacked (the size limit also bounds this).
    unpacked_bytes = models.PositiveBigIntegerField(default=0)
    file_count = models.PositiveIntegerField(default=0)
    files = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "sha256"], name="workdir_unique_sha"),
        ]

    def __str__(self) -> str:
        return f"workdir {self.sha256[:12]} of {self.tenant_id}"
