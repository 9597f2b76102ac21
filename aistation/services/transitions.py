"""Job state changes: the one place that moves a job and writes its event."""

from aistation.models import Attempt, Job, JobEvent


def job_transition(
    job: Job, to_state: str, reason: str, *, attempt: Attempt | None = None, save: bool = True
) -> JobEvent | None:
    """Move `job` to `to_state` with a reason a person can read. With save=False the caller
    saves the job and bulk-creates the returned (unsaved) event."""
    event = JobEvent(job=job, attempt=attempt, from_state=job.state, to_state=to_state,
                     reason=reason)
    job.state = to_state
    job.reason = reason
    if save:
        job.save()
        event.save()
    return event
