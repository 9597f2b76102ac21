from django.db import models

from aistation.models.jobs import Job


class JobToken(models.Model):
    """The secret a job's runner reports with: it opens only the runner endpoints, for this one
    job, while the job is not finished. Only a SHA-256 of it is stored."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="token")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"token of job {self.job_id}"
