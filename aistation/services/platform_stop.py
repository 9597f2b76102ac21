"""The platform stops (Ctrl-C on `make run`): the work it runs on this machine stops with it.

A local cluster's processes are children of nothing that outlives the platform, so leaving them
would leave orphans holding cores, memory and GPUs. Each live attempt ends like a preemption,
not a failure: its job keeps its restarts and queues again, and runs when the platform starts
again (a training run from its checkpoint; a deployment's replica is its job, so it is back by
the same road). Clusters elsewhere (Kubernetes, Slurm) run on without the platform."""

import logging
from concurrent.futures import ThreadPoolExecutor

from django.db import transaction
from django.utils import timezone

from aistation.choices import LIVE_ATTEMPT_STATES
from aistation.models import Attempt, Job
from aistation.services.attempts import attempt_requeue, attempts_stop
from infra_os.services.audit import audit_record
from podsys.models import Cluster
from podsys.runtime import local_clusters

logger = logging.getLogger(__name__)

PLATFORM_STOPPED = "the platform stopped; it starts again when the platform does"
# Stops run side by side: each may wait out its driver's grace.
MAX_PARALLEL_STOPS = 16


def local_work_stop(*, reason: str = PLATFORM_STOPPED) -> list[int]:
    """End every live attempt on the local clusters as stopped by the platform (PREEMPTED with
    `reason`), queue its job again with `reason`, then stop its workload through the driver
    (SIGTERM, SIGKILL after the driver's grace), all workloads at once. Returns the jobs
    queued again. Recorded first, as a preemption is: a workload whose stop is lost is stopped
    again by the next start's reconcile, which finds it running under a finished attempt."""
    clusters = local_clusters()
    now = timezone.now()
    queued: list[int] = []
    stopped: list[tuple[Cluster, Attempt]] = []
    with transaction.atomic():
        for cluster in clusters:
            # The cluster row first, as a scheduling cycle locks it.
            Cluster.objects.select_for_update(no_key=True).filter(pk=cluster.pk).first()
            attempts = (Attempt.objects.select_for_update(of=("self",))
                        .filter(cluster=cluster, state__in=LIVE_ATTEMPT_STATES).order_by("pk"))
            for attempt in attempts:
                job = Job.objects.select_for_update().select_related("tenant") \
                    .get(pk=attempt.job_id)
                attempt.job = job
                stopped.append((cluster, attempt))
                if not attempt_requeue(attempt, now=now, why=reason, queued_reason=reason):
                    continue
                audit_record(actor=None, action="job.requeue", obj=job, tenant=job.tenant,
                             changes={"reason": reason, "attempt": attempt.number})
                queued.append(job.pk)
    if stopped:
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_STOPS, len(stopped))) as pool:
            list(pool.map(lambda item: attempts_stop(item[0], [item[1]]), stopped))
        logger.info("Stopped %d workloads on local clusters: %s", len(stopped), reason)
    return queued
