"""Queue policies: the order in which pending jobs are considered, how tenants take turns, whom
a job may preempt, and the bounds against starvation.

Every policy puts higher priority first. Then:

- ``fifo``: submission order, strictly: the first job that cannot start blocks the rest of its
  queue (a job that can never fit does not block, or the queue would stop for good).
- ``backfill``: submission order, and later jobs start wherever they fit.
- ``fair`` (the default): duration-agnostic, using only what is known at submission and while
  running (GPUs requested, attained service, waits, priority), never a runtime estimate. It is
  a discretised least-attained-service policy, as in Tiresias (NSDI'19): a job's *level* drops
  at each threshold of ``levels_gpu_s`` its attained service (GPU-seconds held, all attempts,
  the running one included) passes, and at equal priority a job of a higher level goes first
  and may preempt its tenant's work of a lower level once that attempt has run ``min_run_s``.
  Short jobs finish early instead of queueing behind long ones; long jobs lose only time, not
  work (a preempted job keeps its checkpoint and resumes). Within a level: the tenant furthest
  below its fair share first (its running GPUs over its quota), then the least attained service,
  then the oldest. Backfill is allowed. Preemption stays within a tenant: other tenants'
  work inside their quotas is never touched (borrowed capacity is reclaimed as before).

A job's rank (``Ranks``) is its priority, then its level; jobs of fifo and backfill queues rank at
the top level of their priority. A tenant's queues are merged by (rank, attained service in fair
queues, age); tenants take turns by (rank, share, attained service, age) of their next job, the
share recomputed as the cycle starts work, so equal tenants interleave towards their fair shares.

Two bounds keep the long jobs moving. Promotion: a job of a fair queue whose total wait (its
waits since submission added up, whatever preempted it) has passed its tenant's *promotion bound*
ranks at the top level: it preempts lower levels to start and is not preempted by level. No job
waits much longer than that in all, whatever keeps arriving, at the price of running some long
jobs uninterrupted. The bound is ``promote_after_s`` while the tenant's backlog is shallow, and
stretches with it once it is deep (`promotion_bound`): the backlog is the GPUs its waiting jobs
ask for, in quotas' worth (the cluster's GPUs for a tenant without a quota); past
``promote_backlog`` quotas' worth, each further quota's worth adds ``promote_stretch`` times
``promote_after_s``, up to ``promote_max_s`` (never below ``promote_after_s``). A deep backlog
means long waits under any order (first come, first served would make the newest job wait until
all of it has run): with a fixed bound most of the queue would be promoted, least-attained
service would turn into first come, first served, and the short jobs would queue behind days of
promoted work. Stretched, the bound promotes only the oldest of a deep backlog. It is recomputed
at every cycle from the backlog of that moment, so a job promoted while the backlog was shallow
falls back to its level while the backlog is deep enough to put the bound past its wait; a job
that has waited ``promote_max_s`` in all is promoted for good (waits only grow).

Starvation bound. Backfill lets small jobs overtake a big one, and a steady stream of small jobs
could keep it waiting for ever. Classic backfill (EASY, conservative) prevents that with a time
reservation: it computes when the big job's nodes will be free from the running jobs' durations.
This scheduler never knows a duration (users' estimates are famously wrong, and the fair policy
promises not to use them), so no start time can be computed. What a duration-agnostic scheduler
can honour is an age bound: once a job that could start within its quotas has waited longer than
``starvation_s`` in its current wait (from submission, the preemption that put it back, or the
end of its retry backoff), it goes first, before younger work; if it still cannot be placed, the
nodes that would hold it soonest (the most free GPUs of its model, then the smallest running jobs)
are reserved for it: nothing else starts there, so their running work drains and it starts,
while other jobs keep backfilling on the nodes that are not reserved. Starving jobs go by
priority, then by how long they have waited in all (not by level or attained service, or a stream
of newer jobs with less service could keep an old one behind them); each queue gets one
reservation at a time, for its first starving job that cannot start. So that job starts at most
``starvation_s`` plus the time its reserved nodes take to drain (about the longest run of the
jobs on them) after its wait began, whatever arrives behind it; the queue's next starving job gets
its reservation in the cycle after, and so on. Only higher priority, its tenant's quota, its
queue's limit and reclaims of borrowed work come first. A fifo queue's head is covered too: strict
order inside the queue does not stop other queues' jobs from taking the capacity it waits for.

One exception: a starving job that work waiting in its queue outranks (a lower level of a fair
queue, or a higher priority) gets no reservation that drains more than ``OUTRANKED_DRAIN_SHARE``
(an eighth) of the cluster's nodes. That work would preempt it as soon as it had run
``min_run_s``, and it would starve again: each drain idles those nodes until their longest job
ends to buy minutes of its work. On the Microsoft traces a 64-GPU job of 146 hours drained an
8-node cluster four times, for 12 minutes of work each time, while a fleet's other clusters held
everything else (`bench/fleet_replay.py`). Such a job still goes first where it fits, its queue's
next starving job may get the reservation, and the promotion bound bounds its wait: once
promoted it ranks at the top, gets its reservation and keeps its nodes. A small share still
drains for it, so long single-node jobs take turns on a large cluster. The share was chosen
among one node, an eighth and a quarter on the small fleets of four ITP traces, then checked on
data it was not chosen on (each trace's halves, other loads): it did best there too. On single
clusters (`bench/trace_replay.py --sweep`, 20 cases) three cases' average JCT fell by 2.2-4.6%,
one rose by 3.3% (cluster02 at 95% load) and the other sixteen moved by less than 0.5%.

The defaults below were chosen on the Microsoft ITP traces (`bench/trace_replay.py`, report in
`bench/results/trace_replay.md`); the platform's settings override them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from operator import itemgetter

from .types import JobSnap, QueueSnap, Snapshot

# A job that could start within its quotas and has waited this long goes first (see above).
DEFAULT_STARVATION_S = 900.0
# A starving job that work waiting in its queue outranks gets no reservation that drains more
# than this share of the cluster's nodes (see above).
OUTRANKED_DRAIN_SHARE = 1 / 8
# The fair policy's level thresholds: 1 and 8 GPU-hours of attained service.
DEFAULT_LEVELS_GPU_S = (3600.0, 28800.0)
# An attempt runs 10 minutes before a job of a higher level (same priority) may preempt it.
DEFAULT_MIN_RUN_S = 600.0
# A job that has waited 36 hours in all is promoted to the top level...
DEFAULT_PROMOTE_AFTER_S = 129600.0
# ... or longer while its tenant's backlog is deep: past 1.5 quotas' worth of GPUs asked for by
# waiting jobs, each further quota's worth adds 1.25 x 36 hours.
DEFAULT_PROMOTE_BACKLOG = 1.5
DEFAULT_PROMOTE_STRETCH = 1.25
# ... and never later than after 14 days in all.
DEFAULT_PROMOTE_MAX_S = 1209600.0

FIFO = "fifo"
BACKFILL = "backfill"
FAIR = "fair"
POLICIES = (FIFO, BACKFILL, FAIR)


def promotion_bound(
    promote_after_s: float,
    waiting_gpus: int,
    capacity_gpus: int,
    backlog: float = DEFAULT_PROMOTE_BACKLOG,
    stretch: float = DEFAULT_PROMOTE_STRETCH,
    longest_s: float = DEFAULT_PROMOTE_MAX_S,
) -> float:
    """The total wait that promotes a job whose tenant's waiting jobs ask for `waiting_gpus`,
    against `capacity_gpus` (its quota, or the cluster's GPUs): `promote_after_s`, stretched by
    `stretch` times it for each capacity's worth past `backlog`, never past `longest_s`."""
    depth = waiting_gpus / capacity_gpus if capacity_gpus > 0 else 0.0
    stretched = promote_after_s * (1.0 + stretch * (depth - backlog))
    return max(promote_after_s, min(stretched, longest_s))  # promote_after_s if longest_s is less


def promotion_bounds(
    snapshot: Snapshot, promote_after_s: float, backlog: float, stretch: float, longest_s: float
) -> dict[str, float]:
    """`promotion_bound` of every tenant with waiting jobs in the snapshot: the GPUs its pending
    jobs ask for (all its queues and priorities; not those in retry backoff) against its quota,
    within the schedulable nodes' GPUs, or against those GPUs for a tenant with no quota (left)
    on this cluster, which can only borrow idle ones."""
    now = snapshot.now
    cluster_gpus = sum(node.gpus for node in snapshot.nodes if node.schedulable)
    waiting: dict[str, int] = {}
    for job in snapshot.pending:
        if job.not_before <= now:
            waiting[job.tenant] = waiting.get(job.tenant, 0) + job.gpus_per_replica * job.replicas
    quotas = {tenant.name: tenant.gpu_quota for tenant in snapshot.tenants}
    bounds = {}
    for tenant, gpus in waiting.items():
        quota = quotas.get(tenant, 0)
        capacity = min(quota, cluster_gpus) if quota > 0 else cluster_gpus
        bounds[tenant] = promotion_bound(
            promote_after_s, gpus, capacity, backlog, stretch, longest_s)
    return bounds


class Ranks:
    """A job's rank: its priority first, then, in a fair queue, its level (fewer GPU-seconds of
    service so far, higher level; the top level once its total wait passes its tenant's
    promotion bound). Jobs of other queues rank at the top level of their priority. Ranks order
    pending jobs and say whom a job may preempt. `bounds` are the tenants' promotion bounds
    (`promotion_bounds`); `promote_after_s` stands for a tenant not in them."""

    def __init__(
        self,
        levels_gpu_s: Sequence[float],
        promote_after_s: float,
        bounds: Mapping[str, float] | None = None,
    ) -> None:
        self.thresholds = sorted(float(level) for level in levels_gpu_s)
        self.span = len(self.thresholds) + 1
        self.promote_after_s = promote_after_s
        self.bounds = dict(bounds or {})

    def level(self, attained_gpu_s: float, waited_s: float = 0.0, tenant: str = "") -> int:
        """0 for a job with less service than the first threshold, then 1, 2...; 0 again while
        it has waited its tenant's promotion bound in all."""
        if waited_s >= self.bounds.get(tenant, self.promote_after_s):
            return 0
        return bisect_right(self.thresholds, attained_gpu_s)

    def rank(
        self, priority: int, attained_gpu_s: float, waited_s: float = 0.0, tenant: str = ""
    ) -> int:
        return priority * self.span + (
            self.span - 1 - self.level(attained_gpu_s, waited_s, tenant)
        )

    def of_pending(
        self, pending: Sequence[JobSnap], fair_queues: set[str], now: float
    ) -> list[int]:
        """`rank` of every pending job (waiting since `submitted_at`), written out as one loop:
        a cycle ranks thousands of jobs."""
        span, thresholds, bounds, default = (
            self.span, self.thresholds, self.bounds, self.promote_after_s)
        top, first = span - 1, thresholds[0] if thresholds else float("inf")
        ranked = []
        for job in pending:
            level = 0
            if (job.attained_gpu_s >= first and job.queue in fair_queues
                    and job.waited_s + now - job.submitted_at < bounds.get(job.tenant, default)):
                level = bisect_right(thresholds, job.attained_gpu_s)
            ranked.append(job.priority * span + top - level)
        return ranked


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

