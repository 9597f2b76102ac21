"""The Kubernetes objects OGAI would create for a job, as YAML a person can read."""

from django.core.exceptions import ValidationError

from aistation.models import Attempt, Job
from aistation.services.workloads import attempt_workload, workload_id
from podsys.drivers.kube_manifests import KubeOptions, render_yaml, workload_objects


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
    """The job's objects (NetworkPolicy, Secret when it has secrets, Service, optional PodGroup,
    Job) as multi-document YAML, rendered with the cluster's public options only (never its
    stored credentials) and sending nothing to any cluster. Whatever cannot be rendered is a
    ValidationError naming it."""
    attempt = job_next_attempt(job)
    try:
        opts = KubeOptions.from_options(job.cluster.options)
        return render_yaml(workload_objects(attempt_workload(attempt, reveal_secrets=False),
                                            opts))
    except ValueError as exc:
        raise ValidationError(str(exc)) from None
