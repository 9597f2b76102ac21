"""Job state changes: the one place that moves a job and writes its event."""

import logging

from aistation.models import Attempt, Job, JobEvent

logger = logging.getLogger("aistation.jobs")


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
        log_events([event])
    return event


def log_events(events: list[JobEvent]) -> None:
    """Each event as a platform log line about its job, with the request or task doing it:
    how an operator follows a request through the workers to the job."""
    for event in events:
        logger.info("job %s: %s -> %s: %s", event.job_id, event.from_state or "new",
                    event.to_state, event.reason, extra={"job": event.job_id})
