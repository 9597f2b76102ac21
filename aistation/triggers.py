"""Asking the workers for a scheduling cycle or a cancellation, after the transaction commits.

A burst of submissions asks for one cycle: the first request of a burst enqueues a cycle a
moment later, which sees every job submitted in between; a cycle asked for by another process
during the same burst finds it has nothing new to see and is skipped. Beat runs a cycle every
few seconds anyway, so a request lost with a crashed process delays work and loses nothing.
"""

import threading
import time

from django.db import transaction

BURST_S = 0.25
_lock = threading.Lock()
_next_cycle_at: dict[int, float] = {}


def request_cycle(cluster_id: int) -> None:
    now = time.monotonic()
    with _lock:
        if _next_cycle_at.get(cluster_id, 0.0) > now:
            return
        _next_cycle_at[cluster_id] = now + BURST_S

    def enqueue() -> None:
        from aistation.tasks import schedule_cycle

        schedule_cycle.apply_async(
            kwargs={"cluster_id": cluster_id, "requested_at": time.time()}, countdown=BURST_S)

    transaction.on_commit(enqueue)


def request_cancel(job_id: int) -> None:
    def enqueue() -> None:
        from aistation.tasks import cancel_job

        cancel_job.delay(job_id=job_id)

    transaction.on_commit(enqueue)


def request_cycle_after(cluster_id: int, seconds: float) -> None:
    """A cycle once a retry backoff has passed, so the job restarts on time."""

    def enqueue() -> None:
        from aistation.tasks import schedule_cycle

        schedule_cycle.apply_async(kwargs={"cluster_id": cluster_id}, countdown=seconds + 0.1)

    transaction.on_commit(enqueue)
