"""Moving jobs off a node taken out of service (a fatal health check failed there): like a
preemption, not a failure, so the job keeps its restarts and queues again. The node is not
excluded from the job: its cordon keeps new work off it and lifts when it passes again, so a
job that only fits there (a one-node cluster) runs there again once it is back."""

import logging

from django.db import transaction
from django.utils import timezone

from aistation.choices import LIVE_ATTEMPT_STATES
from aistation.models import Attempt, Job
from aistation.services.attempts import attempt_requeue, attempts_stop
from aistation.triggers import request_cycle
from podsys.drivers.base import DriverError, Phase
from podsys.models import Cluster, Node
from podsys.runtime import driver_for

logger = logging.getLogger(__name__)


def jobs_move_off_node(*, node_id: int, reason: str) -> list[int]:
    """Stop every live attempt placed on the node (a gang with one replica there stops whole),
    end it PREEMPTED with the reason, queue its job again, and ask for a scheduling cycle.
    `reason` completes "moved off <node>: …". Returns the jobs moved.

    Idempotent: PODsys sends again while the node still holds work. An attempt whose workload
    already ended on the cluster is left to reconcile, which records how it ended (a job that
    succeeded must not run again); when the cluster cannot be asked, nothing moves this time."""
    node = Node.objects.select_related("cluster").filter(pk=node_id).first()
    if node is None:
        return []
    live = [attempt for attempt in Attempt.objects.filter(
        cluster_id=node.cluster_id, state__in=LIVE_ATTEMPT_STATES).order_by("pk")
        if node.name in (attempt.placement or [])]
    if not live:
        return []
    try:
        statuses = driver_for(node.cluster).status([attempt.workload_id for attempt in live])
    except DriverError as exc:
        logger.warning("Could not ask cluster %s about the work on node %s, not moved yet: %s",
                       node.cluster.name, node.name, exc)
        return []
    going = [attempt.pk for attempt in live if (status := statuses.get(attempt.workload_id))
             and status.phase in (Phase.RUNNING, Phase.PENDING)]
    if not going:
        return []
    why = f"moved off {node.name}: {reason}"
    now = timezone.now()
    moved, stopped = [], []
    with transaction.atomic():
        # The cluster row first, as a scheduling cycle locks it: a cycle deciding from an
        # older look cannot preempt the same attempts too. Those it ended meanwhile are skipped.
        Cluster.objects.select_for_update(no_key=True).filter(pk=node.cluster_id).first()
        candidates = (Attempt.objects.select_for_update(of=("self",))
                      .filter(pk__in=going, state__in=LIVE_ATTEMPT_STATES).order_by("pk"))
        for attempt in candidates:
            job = Job.objects.select_for_update().select_related("tenant").get(pk=attempt.job_id)
            attempt.job = job
            stopped.append(attempt)
            if attempt_requeue(attempt, now=now, why=why,
                               queued_reason="back in its queue while the node is out of service"):
                moved.append(job.pk)
        if moved:
            request_cycle(node.cluster_id)
    # After the commit, as a preemption does: if a stop is lost, reconcile stops it again.
    attempts_stop(node.cluster, stopped)
    if moved:
        logger.info("Moved %d jobs off node %s: %s", len(moved), node.name, reason)
    return moved


def on_node_out_of_service(sender, *, node_id: int, reason: str, **kwargs) -> None:
    """The receiver of `podsys.signals.node_out_of_service`."""
    jobs_move_off_node(node_id=node_id, reason=reason)
