"""What pipeline and training runs share: a job that runs them and a state read off it."""

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from aistation.choices import JobState
from aistation.models import Job
from infra_os.models import Tenant
from ogai.models import TimeStampedModel
from ylink.choices import RunState

_JOB_TO_RUN = {
    JobState.QUEUED: RunState.QUEUED,
    JobState.ADMITTED: RunState.QUEUED,
    JobState.RUNNING: RunState.RUNNING,
    JobState.PREEMPTED: RunState.RESTARTING,
    JobState.RESTARTING: RunState.RESTARTING,
    # The job ended well but its result is not recorded yet.
    JobState.SUCCEEDED: RunState.FINISHING,
    JobState.FAILED: RunState.FAILED,
    JobState.CANCELLED: RunState.CANCELLED,
}


# How long after its job's end a run may still report its result (a runner re-sends what the
# platform missed for up to a minute before it exits; its job ends just after).
RESULT_GRACE = timedelta(minutes=5)


class ToolchainRun(TimeStampedModel):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="%(class)ss")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    name = models.CharField(max_length=100)
    job = models.OneToOneField(Job, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="%(class)s")
    # Where the spec the runner reads, its scratch files and its result live (under DATA_DIR).
    folder = models.CharField(max_length=500, editable=False)
    succeeded = models.BooleanField(default=False)
    # Why it failed, in the runner's words, when it said.
    message = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]

    @property
    def state(self) -> str:
        if self.succeeded:
            return RunState.SUCCEEDED
        if self.job is None:
            return RunState.FAILED
        job = self.job
        if job.state == JobState.SUCCEEDED and job.finished_at and \
                timezone.now() - job.finished_at > RESULT_GRACE:
            # Its process ended well, but its result never reached the platform.
            return RunState.FAILED
        return _JOB_TO_RUN[JobState(job.state)]
