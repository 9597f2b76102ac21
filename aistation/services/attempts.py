"""Attempts meet the driver: launch, stop, and the end of an attempt (success, failure with
retries and backoff, time limit), with the usage it cost."""

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from aistation.choices import FINAL_STATES, AttemptState, JobState
from aistation.models import Attempt, Job, JobEvent
from aistation.services.transitions import job_transition, log_events
from aistation.services.workloads import attempt_workload
from aistation.triggers import request_cycle_after
from infra_os.services.usage import usage_record_create
from ogai.bulk import bulk_set
from podsys.drivers.base import DriverError, WorkloadUsage
from podsys.models import Cluster, Node
from podsys.runtime import driver_for

logger = logging.getLogger(__name__)
MAX_BACKOFF_S = 600


def attempt_record_usage(attempt: Attempt, ended_at: datetime,
                         measured: WorkloadUsage | None = None) -> None:
    """Bill the attempt: by the cluster's own accounting where it has it (`measured`: what
    Slurm's sacct says ran), else by the platform's start and end times."""
    job = attempt.job
    if measured is not None:
        usage_record_create(
            tenant=job.tenant, kind="job", source=f"job {job.pk} attempt {attempt.number}",
            gpus=measured.gpus, cpu_cores=measured.cpu_cores, gpu_model=_gpu_model(attempt),
            started_at=datetime.fromtimestamp(measured.started_at, tz=UTC),
            ended_at=datetime.fromtimestamp(measured.ended_at, tz=UTC),
        )
        return
    if attempt.started_at is None:
        return
    usage_record_create(
        tenant=job.tenant, kind="job", source=f"job {job.pk} attempt {attempt.number}",
        gpus=job.gpus, cpu_cores=job.cpu_per_replica * job.replicas,
        gpu_model=_gpu_model(attempt), started_at=attempt.started_at, ended_at=ended_at,
    )


def _gpu_model(attempt: Attempt) -> str:
    job = attempt.job
    model = job.gpu_model
    if job.gpus_per_replica and not model and attempt.placement:
        model = Node.objects.filter(cluster_id=attempt.cluster_id, name=attempt.placement[0]) \
            .values_list("gpu_model", flat=True).first() or ""
    return model


def attempt_requeue(attempt: Attempt, *, now: datetime, why: str, queued_reason: str) -> bool:
    """End a live attempt as PREEMPTED (`why`), as the platform's own doing rather than a
    failure, and queue its job again with `queued_reason`, keeping its restarts. The caller holds
    both rows locked (the attempt's `job` the locked one). False when the job was cancelled
    meanwhile: nothing to queue again."""
    job = attempt.job
    attempt.state, attempt.finished_at, attempt.reason = AttemptState.PREEMPTED, now, why
    attempt.save(update_fields=["state", "finished_at", "reason"])
    attempt_record_usage(attempt, now)
    if job.state not in (JobState.ADMITTED, JobState.RUNNING):
        return False
    if attempt.started_at:
        job.attained_gpu_s += job.gpus * (now - attempt.started_at).total_seconds()
    job.placement, job.borrowed, job.queued_at = [], False, now
    job_transition(job, JobState.PREEMPTED, why, attempt=attempt)
    job_transition(job, JobState.QUEUED, queued_reason)
    return True


def attempts_launch(cluster: Cluster, attempts: list[Attempt]) -> None:
    """Launch through the driver, then record who runs. Launch is idempotent, so calling this
    again for the same attempts (reconcile after a crash) starts nothing twice."""
    if not attempts:
        return
    driver = driver_for(cluster)
    launched, refused = [], []
    for attempt in attempts:
        try:
            driver.launch(attempt_workload(attempt))
        except DriverError as exc:
            refused.append((attempt, str(exc)))
        else:
            launched.append(attempt.pk)
    now = timezone.now()
    with transaction.atomic():
        # Lock the attempts still launching, and read their jobs' states as of now.
        live = (Attempt.objects.select_for_update(of=("self",))
                .filter(pk__in=launched, state=AttemptState.LAUNCHING)
                .values_list("pk", "job__state"))
        by_pk = {attempt.pk: attempt for attempt in attempts}
        events, cancelled, running = [], [], []
        where: dict[int, str] = {}  # job -> "running on <nodes>"
        for pk, job_state in live:
            attempt = by_pk[pk]
            if job_state in FINAL_STATES:  # cancelled while launching
                cancelled.append(attempt)
                continue
            nodes = ", ".join(sorted(set(attempt.placement))) or cluster.name
            where[attempt.job_id] = f"running on {nodes}"
            events.append(JobEvent(job_id=attempt.job_id, attempt=attempt, from_state=job_state,
                                   to_state=JobState.RUNNING,
                                   reason=f"running on {nodes} (attempt {attempt.number})"))
            running.append(attempt)
        Attempt.objects.filter(pk__in=[a.pk for a in running]).update(
            launched=True, state=AttemptState.RUNNING, started_at=now)
        jobs = Job.objects.filter(pk__in=[a.job_id for a in running])
        jobs.update(state=JobState.RUNNING, updated_at=now)
        jobs.filter(started_at__isnull=True).update(started_at=now)
        bulk_set(Job, "reason", where)
        JobEvent.objects.bulk_create(events, batch_size=1000)
        log_events(events)
    for attempt in cancelled:
        attempt_stop(attempt, AttemptState.CANCELLED, "the job was cancelled")
    for attempt, message in refused:
        attempt_end(attempt, failed=True, exit_code=None, reason=f"launch failed: {message}")


def attempts_stop(cluster: Cluster, attempts: list[Attempt]) -> None:
    driver = driver_for(cluster)
    for attempt in attempts:
        try:
            driver.cancel(attempt.workload_id)
        except DriverError:
            # Reconcile sees it still running under a finished attempt and stops it again.
            logger.warning("Could not stop %s on %s", attempt.workload_id, cluster.name)


def attempt_measured(driver, attempt: Attempt) -> WorkloadUsage | None:
    """What the cluster's accounting says the attempt used, read before its end is recorded
    (outside that transaction); the platform's own times where it keeps none."""
    try:
        return driver.usage(attempt.workload_id)
    except DriverError:
        return None


def attempt_stop(attempt: Attempt, state: str, reason: str) -> None:
    """Stop a live attempt whose job no longer wants it (cancelled), billed as the cluster
    accounts it where it does (cancel waits for the workload to stop)."""
    attempts_stop(attempt.cluster, [attempt])
    measured = attempt_measured(driver_for(attempt.cluster), attempt)
    now = timezone.now()
    with transaction.atomic():
        attempt = Attempt.objects.select_for_update().select_related("job", "job__tenant") \
            .get(pk=attempt.pk)
        if attempt.state not in (AttemptState.LAUNCHING, AttemptState.RUNNING):
            return
        attempt.state, attempt.finished_at, attempt.reason = state, now, reason
        attempt.save(update_fields=["state", "finished_at", "reason"])
        attempt_record_usage(attempt, now, measured)


def _nodes_to_avoid(job: Job, attempt: Attempt, node_lost: str) -> list[str]:
    """A failed attempt's nodes are avoided by the next attempt, as long as other nodes of the
    cluster could hold the job (on a one-machine cluster the retry runs where it can). A lost
    node is always avoided."""
    avoid = set(job.excluded_nodes) | ({node_lost} if node_lost else set())
    candidates = avoid | set(attempt.placement)
    others = Node.objects.filter(cluster_id=attempt.cluster_id,
                                 gpus__gte=job.gpus_per_replica).exclude(name__in=candidates)
    if others.exists():
        avoid = candidates
    return sorted(avoid)


def retry_delay(restarts: int) -> timedelta:
    """Exponential backoff: base, 2*base, 4*base … capped."""
    base = settings.OGAI_RETRY_BACKOFF_S
    return timedelta(seconds=min(MAX_BACKOFF_S, base * 2 ** max(0, restarts - 1)))


@transaction.atomic
def attempt_end(attempt: Attempt, *, failed: bool, exit_code: int | None, reason: str,
                node_lost: str = "", retry: bool = True,
                measured: WorkloadUsage | None = None) -> Job:
    """The attempt ended on its own (or the cluster lost it). A failure is retried while the
    job has restarts left, after a backoff and away from a node that was lost under it."""
    now = timezone.now()
    attempt = Attempt.objects.select_for_update().get(pk=attempt.pk)
    job = Job.objects.select_for_update().select_related("tenant").get(pk=attempt.job_id)
    attempt.job = job
    if attempt.state not in (AttemptState.LAUNCHING, AttemptState.RUNNING):
        return job
    attempt.state = AttemptState.FAILED if failed else AttemptState.SUCCEEDED
    attempt.finished_at, attempt.exit_code, attempt.reason = now, exit_code, reason
    attempt.save(update_fields=["state", "finished_at", "exit_code", "reason"])
    attempt_record_usage(attempt, now, measured)
    if attempt.started_at:
        job.attained_gpu_s += job.gpus * (now - attempt.started_at).total_seconds()
    job.placement, job.borrowed, job.exit_code = [], False, exit_code
    if job.state in FINAL_STATES:
        job.save()
        return job
    if not failed:
        job.finished_at = now
        job_transition(job, JobState.SUCCEEDED, reason or "succeeded", attempt=attempt)
        return job
    job.excluded_nodes = _nodes_to_avoid(job, attempt, node_lost)
    if retry and job.restarts < job.max_restarts:
        job.restarts += 1
        delay = retry_delay(job.restarts)
        job.not_before = now + delay
        job.queued_at = now
        job_transition(
            job, JobState.RESTARTING,
            f"attempt {attempt.number} failed: {reason}; restart {job.restarts} of "
            f"{job.max_restarts} in {delay.total_seconds():g} s", attempt=attempt,
        )
        job_transition(job, JobState.QUEUED, "waiting to restart after a failure")
        request_cycle_after(job.cluster_id, delay.total_seconds())
        return job
    job.finished_at = now
    suffix = f" (after {job.restarts} restarts)" if job.restarts else ""
    job_transition(job, JobState.FAILED, f"{reason}{suffix}", attempt=attempt)
    return job
