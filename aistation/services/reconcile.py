"""Compare what the database says runs with what the driver reports, and repair the
difference, like a Kubernetes controller: a lost message or a crashed worker loses nothing."""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from aistation.choices import FINAL_STATES, LIVE_ATTEMPT_STATES, AttemptState
from aistation.models import Attempt
from aistation.services.attempts import (
    attempt_end,
    attempt_measured,
    attempt_stop,
    attempts_launch,
    attempts_stop,
)
from podsys.drivers.base import Phase
from podsys.models import Cluster
from podsys.runtime import driver_for


@dataclass
class ReconcileResult:
    ended: int = 0
    relaunched: int = 0
    stopped: int = 0


# Stopped attempts younger than this are checked for workloads still running under them.
STOPPED_LOOKBACK = timedelta(hours=1)


def _stop_leftovers(cluster: Cluster, result: ReconcileResult) -> None:
    """A preempted or cancelled attempt whose stop message was lost keeps running on the
    cluster, holding GPUs the scheduler believes free: stop it again."""
    since = timezone.now() - STOPPED_LOOKBACK
    stopped = list(Attempt.objects.filter(
        cluster=cluster, launched=True, finished_at__gte=since,
        state__in=[AttemptState.PREEMPTED, AttemptState.CANCELLED]))
    if not stopped:
        return
    statuses = driver_for(cluster).status([attempt.workload_id for attempt in stopped])
    alive = [a for a in stopped if statuses[a.workload_id].phase in (Phase.RUNNING,
                                                                   Phase.PENDING)]
    attempts_stop(cluster, alive)
    result.stopped += len(alive)


def reconcile_cluster(*, cluster: Cluster) -> ReconcileResult:
    result = ReconcileResult()
    _stop_leftovers(cluster, result)
    attempts = list(Attempt.objects.filter(cluster=cluster, state__in=LIVE_ATTEMPT_STATES)
                    .select_related("job", "job__tenant", "cluster"))
    if not attempts:
        return result
    driver = driver_for(cluster)
    statuses = driver.status([attempt.workload_id for attempt in attempts])
    now = timezone.now()
    grace = timedelta(seconds=settings.OGAI_LAUNCH_GRACE_S)
    to_launch = []
    for attempt in attempts:
        job = attempt.job
        status = statuses[attempt.workload_id]
        if job.state in FINAL_STATES:
            attempt_stop(attempt, AttemptState.CANCELLED, f"the job is {job.state}")
            result.stopped += 1
        elif status.phase == Phase.MISSING and not attempt.launched:
            # Decided but never launched: the worker died in between. Launch it now, unless
            # the cycle that decided it may still be launching it.
            if now - attempt.created_at > grace:
                to_launch.append(attempt)
        elif status.phase == Phase.MISSING:
            attempt_end(attempt, failed=True, exit_code=None,
                        reason="the cluster no longer knows this workload")
            result.ended += 1
        elif status.phase in (Phase.SUCCEEDED, Phase.FAILED):
            failed = status.phase == Phase.FAILED
            attempt_end(attempt, failed=failed, exit_code=status.exit_code,
                        reason=status.reason or ("failed" if failed else "succeeded"),
                        node_lost=status.node_lost, measured=attempt_measured(driver, attempt))
            result.ended += 1
        elif status.phase == Phase.RUNNING and attempt.state == AttemptState.LAUNCHING:
            to_launch.append(attempt)  # running, but its launch was never recorded
        elif _past_time_limit(attempt, now):
            attempts_stop(cluster, [attempt])
            attempt_end(attempt, failed=True, exit_code=None, retry=False,
                        reason=f"stopped: its time limit of {job.time_limit_s} s was reached")
            result.ended += 1
    attempts_launch(cluster, to_launch)
    result.relaunched = len(to_launch)
    return result


def _past_time_limit(attempt: Attempt, now) -> bool:
    limit = attempt.job.time_limit_s
    return bool(limit and attempt.started_at and now - attempt.started_at
                > timedelta(seconds=limit))

