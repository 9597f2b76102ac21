from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued", "Queued"
    ADMITTED = "admitted", "Admitted"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"
    RESTARTING = "restarting", "Restarting"


# Holding resources on a cluster: the scheduler counts these as running.
ACTIVE_STATES = frozenset({JobState.ADMITTED, JobState.RUNNING})
FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class AttemptState(models.TextChoices):
    LAUNCHING = "launching", "Launching"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"


LIVE_ATTEMPT_STATES = frozenset({AttemptState.LAUNCHING, AttemptState.RUNNING})


class QueuePolicy(models.TextChoices):
    FAIR = "fair", "Fair share (default)"
    BACKFILL = "backfill", "Backfill"
    FIFO = "fifo", "Strict FIFO"
