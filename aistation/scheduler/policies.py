"""Queue policies: the order in which pending jobs are considered, how tenants take turns, and
the starvation bound.

Every policy puts higher priority first. Then:

- ``fifo``: submission order, strictly: the first job that cannot start blocks the rest of its
  queue (a job that can never fit does not block, or the queue would stop for good).
- ``backfill``: submission order, and later jobs start wherever they fit.
- ``fair`` (the default): duration-agnostic, using only what is known at submission and while
  running, never a runtime estimate: the tenant furthest below its fair share first (its running
  GPUs over its quota, lowest first), then the least attained service (GPU-seconds so far), then
  the oldest. Backfill is allowed.

A tenant's queues are merged by (priority, attained service in fair queues, age); tenants take
turns by (priority, share, attained service, age) of their next job, the share recomputed as the
cycle starts work, so equal-priority tenants interleave towards their fair shares.

Starvation bound. Backfill lets small jobs overtake a big one, and a steady stream of small jobs
could keep it waiting for ever. Classic backfill (EASY, conservative) prevents that with a time
reservation: it computes when the big job's nodes will be free from the running jobs' durations.
This scheduler never knows a duration (users' estimates are famously wrong, and the fair policy
promises not to use them), so no start time can be computed. What a duration-agnostic scheduler
can honour is an age bound: once a job that could start within its quotas has waited longer than
``starvation_s`` (counted from submission, or from the end of its retry backoff), it goes first,
before younger work; if it still cannot be placed, the nodes that would hold it soonest (the most
free GPUs of its model, then the smallest running jobs) are reserved for it: nothing else starts
there, so their running work drains and it starts, while other jobs keep backfilling on the
nodes that are not reserved. Starving jobs go by priority, then by how long they have waited
(not by attained service, or a stream of newer jobs with less service could keep an old one
behind them); each queue gets one reservation at a time, for its first starving job that cannot
start. So that job starts at most ``starvation_s`` plus the time its reserved nodes take to drain
(about the longest run of the jobs on them) after it was submitted, whatever arrives behind it;
the queue's next starving job gets its reservation in the cycle after, and so on. Only higher
priority, its tenant's quota, its queue's limit and reclaims of borrowed work come first. A fifo
queue's head is covered too: strict order inside the queue does not stop other queues'
jobs from taking the capacity it waits for.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from .types import JobSnap, QueueSnap

FIFO = "fifo"
BACKFILL = "backfill"
FAIR = "fair"
POLICIES = (FIFO, BACKFILL, FAIR)


def policy_of(queue: QueueSnap) -> str:
    return queue.policy if queue.policy in POLICIES else FAIR


# A pending job's place in the order: (tenant rank, -priority, attained service in a fair queue
# else 0, submitted at, id), then, never compared: its index in Snapshot.pending, not_before.
SortKey = tuple[int, int, float, float, int, int, float]


def order_pending(
    pending: Sequence[JobSnap],
    class_of: Sequence[int],
    tenant_rank: Sequence[int],
    negative_priority: Sequence[int],
    fair: Sequence[bool],
) -> list[SortKey]:
    """Every pending job's sort key, in order: grouped by tenant, then each tenant's queues
    merged by priority (higher first), then, in a fair queue, attained service (least first),
    then age, then id. Restricted to one queue this is that queue's policy order (the tenant's
    share, the fair policy's first criterion, is the same for all of a tenant's jobs; it decides
    how tenants take turns, in the passes). `tenant_rank`, `negative_priority` and `fair` are
    by job class (`class_of`)."""
    keys = [
        (
            tenant_rank[c],
            negative_priority[c],
            job.attained_gpu_s if fair[c] else 0.0,
            job.submitted_at,
            job.id,
            i,
            job.not_before,
        )
        for i, (job, c) in enumerate(zip(pending, class_of, strict=True))
    ]
    # Stable sorts on one plain field each, least significant first: the order of the tuples,
    # for a fraction of the cost of comparing tuples.
    for field in (4, 3, 2, 1, 0):
        keys.sort(key=itemgetter(field))
    return keys


def share(running_gpus: int, quota: int) -> float:
    """How much of its fair share a tenant uses; lower goes first."""
    if quota > 0:
        return running_gpus / quota
    return float("inf") if running_gpus else 1e18


def waiting_since(job: JobSnap) -> float:
    """Since when the job has been startable: submission, or the end of its retry backoff."""
    return max(job.submitted_at, job.not_before)

