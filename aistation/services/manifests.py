"""What OGAI would run for a job, as YAML a person can read: the Kubernetes objects on a
Kubernetes cluster, the environment, command and sandbox on the local one."""

from django.core.exceptions import ValidationError

from aistation.models import Attempt, Job
from aistation.services.workloads import attempt_workload, workload_id
from podsys.drivers import get_driver
from podsys.drivers.base import DriverError


def job_next_attempt(job: Job) -> Attempt:
    """The job's newest attempt (its workload id and placement), or, for a job that has not
    started, an unsaved one shaped as the scheduler's next attempt would be."""
    attempt = job.attempts.order_by("-number").first()
    if attempt is not None:
        return attempt
    number = job.attempt_count + 1
    return Attempt(job=job, number=number, workload_id=workload_id(job.pk, number),
                   cluster=job.cluster, placement=[])


def job_manifests(*, job: Job) -> str:
    """The cluster driver's rendering of the job's attempt (`ClusterDriver.render`), with the
    cluster's public options only (never its stored credentials: nothing is sent to any
    cluster, and no process is started). Whatever cannot be rendered is a ValidationError
    naming it."""
    attempt = job_next_attempt(job)
    cluster = job.cluster
    try:
        driver = get_driver(cluster=cluster.name, driver=cluster.driver,
                            options=dict(cluster.options))
        return driver.render(attempt_workload(attempt, reveal_secrets=False))
    except DriverError as exc:
        raise ValidationError(str(exc)) from None
