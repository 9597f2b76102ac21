"""One scheduling cycle: a snapshot in, decisions out. Pure: no Django, no I/O, no wall clock.

The cycle, in order:

1. Capacity: every node's totals minus the replicas of the running jobs placed on it. Only
   schedulable nodes take new work; a job with a GPU model only goes on nodes of that model.
2. Starving jobs first (see `policies` for the bound and why it is an age bound): by priority,
   then by how long they have waited, they start if they can; in each queue the first one that
   cannot gets the nodes that would hold it soonest reserved.
3. Pass one, jobs within their quotas: queues interleave by priority and the tenants' shares
   (`policies`); each job is admitted against its queue's limit (hard), its tenant's quota and
   model limits, counting the starts made earlier in this cycle, then placed by best fit, all
   replicas of a gang or none. A job that cannot be admitted or placed may preempt lower-ranked
   work of its own tenant (lower priority, or in a fair queue a lower level that has run its
   minimum run: `policies`), and a job within its quota that finds no room may reclaim other
   tenants' borrowed work, in both cases only if that lets it start now. Jobs over their quota
   wait for pass two.
4. Pass two, borrowers: jobs over their tenant's quota (or a model limit) start on whatever is
   still idle, marked borrowed, after every job within its quota had its chance.
5. Every pending job not started gets a wait with the first constraint that binds, in words with
   numbers, and its position in its queue (among the jobs still waiting there).

Speed: every pending job is looked at a few times per cycle, so the per-job path is short and
everything that depends only on a job's class (shape, tenant, queue, rank) or shape is worked
out once per class or shape. Nodes sit in buckets by free GPUs (`placement`), so best fit is a
short walk. What is known to fail stays known while capacity only shrinks and usage only grows:
placements by shape, whole admission attempts by class (until anything starts, is preempted or
reserved), preemption searches; they are forgotten when a preemption leaves more room or quota
than there was. Sums of preemptible GPUs per priority reject most hopeless preemption searches
before they start, and reasons about room are worded once per shape at the end.
"""

from __future__ import annotations

import gc
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from heapq import heapify, heappop, heappush
from itertools import islice

from . import reasons
from .admission import Usage
from .placement import EPS, Cluster, Picked, Shape
from .policies import (
    DEFAULT_LEVELS_GPU_S,
    DEFAULT_MIN_RUN_S,
    DEFAULT_PROMOTE_AFTER_S,
    DEFAULT_PROMOTE_BACKLOG,
    DEFAULT_PROMOTE_MAX_S,
    DEFAULT_PROMOTE_STRETCH,
    DEFAULT_STARVATION_S,
    FAIR,
    FIFO,
    OUTRANKED_DRAIN_SHARE,
    Ranks,
    SortKey,
    order_pending,
    policy_of,
    promotion_bounds,
    share,
    waiting_since,
)
from .preemption import NO_NEEDS, Needs, RunningJob, fewest_victims
from .types import (
    Decisions,
    JobSnap,
    Preempt,
    QueueSnap,
    Reservation,
    Snapshot,
    Start,
    TenantSnap,
    Wait,
)

UNDECIDED, STARTED, WAITING, DEFERRED = 0, 1, 2, 3
_NEVER_TRIED = -(2**62)  # below any priority
OPEN, BLOCKED, DEFERRING = 0, 1, 2  # a fifo queue's state within a pass

Allowed = frozenset[str] | None
# A placement known to fail: the shape id, or (shape id, allowed models) when those are limited.
CapKey = int | tuple[int, frozenset[str]]
NO_SHAPE = -1


def schedule(
    snapshot: Snapshot,
    *,
    starvation_s: float = DEFAULT_STARVATION_S,
    levels_gpu_s: Sequence[float] = DEFAULT_LEVELS_GPU_S,
    min_run_s: float = DEFAULT_MIN_RUN_S,
    promote_after_s: float = DEFAULT_PROMOTE_AFTER_S,
    promote_backlog: float = DEFAULT_PROMOTE_BACKLOG,
    promote_stretch: float = DEFAULT_PROMOTE_STRETCH,
    promote_max_s: float = DEFAULT_PROMOTE_MAX_S,
    explain: bool = True,
) -> Decisions:
    """Decide one cycle: which pending jobs start where, what is preempted, and why the rest
    wait. `starvation_s` is how long a job that could start within its quotas waits before it
    goes first and gets nodes reserved for it; `levels_gpu_s` are the attained services at which
    a job of a fair queue drops a level, `min_run_s` how long an attempt runs before a job of a
    higher level may preempt it, and `promote_after_s` how long a job waits in all before it is
    promoted to the top level, stretched by `promote_stretch` times it for each quota's worth of
    its tenant's backlog past `promote_backlog`, up to `promote_max_s` (see
    `aistation.scheduler.policies`). Without `explain` the waits are left out (the trace replay
    has no one to tell them to); the starts and preemptions are the same."""
    # A cycle allocates tens of thousands of short-lived objects and keeps no reference
    # cycles: the collector's passes during it only add pauses (they set the p99).
    collecting = gc.isenabled()
    gc.disable()
    try:
        promotion = (promote_after_s, promote_backlog, promote_stretch, promote_max_s)
        return _Cycle(snapshot, starvation_s, levels_gpu_s, promotion, min_run_s).run(explain)
    finally:
        if collecting:
            gc.enable()


class _Queue:
    __slots__ = ("blocker", "fair", "fifo", "key", "limit", "policy", "position", "state")

    def __init__(self, snap: QueueSnap) -> None:
        self.key = snap.key
        self.limit = snap.gpu_limit
        self.policy = policy_of(snap)
        self.fifo = self.policy == FIFO
        self.fair = self.policy == FAIR
        self.state = OPEN
        self.blocker = ""  # the wait reason of the jobs behind a blocked fifo head
        self.position = 0  # counts the queue's waiting jobs as the waits are written


class _TenantRun:
    """A tenant's pending jobs, all its queues merged in their policies' order."""

    __slots__ = ("deferred", "name", "order")

    def __init__(self, name: str) -> None:
        self.name = name
        self.order: list[SortKey] = []
        self.deferred: list[SortKey] = []


def _started_at(running: RunningJob) -> float:
    started = running.job.started_at
    return started if started is not None else float("-inf")


def _cores(job: JobSnap) -> tuple[float, int, int]:
    """CPU cores, MiB of memory and RDMA devices of all the job's replicas."""
    replicas = job.replicas
    return (job.cpu_per_replica * replicas, job.memory_mib_per_replica * replicas,
            job.rdma_per_replica * replicas)


def _over_cores_quota(tenant: TenantSnap, cpu: float, mem: int, rdma: int) -> str | None:
    """Why a job of `cpu` cores, `mem` MiB and `rdma` RDMA devices in all can never run within
    its tenant's CPU, memory or RDMA quota (it asks for more than the whole quota), or None."""
    if tenant.cpu_quota is not None and cpu > tenant.cpu_quota + EPS:
        return reasons.over_cpu_quota(cpu, tenant.cpu_quota)
    if tenant.memory_quota_mib is not None and mem > tenant.memory_quota_mib:
        return reasons.over_memory_quota(mem, tenant.memory_quota_mib)
    if tenant.rdma_quota is not None and rdma > tenant.rdma_quota:
        return reasons.over_rdma_quota(rdma, tenant.rdma_quota)
    return None


def _below(by_priority: dict[int, int] | None, priority: int) -> int:
    """GPUs held at priorities strictly below `priority`."""
    if not by_priority:
        return 0
    return sum(gpus for p, gpus in by_priority.items() if p < priority)


class _Cycle:
    def __init__(
        self,
        snapshot: Snapshot,
        starvation_s: float,
        levels_gpu_s: Sequence[float],
        promotion: tuple[float, float, float, float],
        min_run_s: float,
    ) -> None:
        """`promotion`: promote_after_s, promote_backlog, promote_stretch, promote_max_s."""
        self.now = now = snapshot.now
        self.starvation_s = starvation_s
        self.min_run_s = min_run_s
        self.cluster = cluster = Cluster(snapshot.nodes)
        self.schedulable_nodes = sum(cluster.schedulable)
        # What it could ever hold, with what its pools could buy: only `_never` asks it.
        self.ever = Cluster(snapshot.nodes + snapshot.elastic) if snapshot.elastic else cluster
        self.usage = Usage()
        pending = self.pending = snapshot.pending
        queues = {q.key: _Queue(q) for q in snapshot.queues}
        for job in pending:
            if job.queue not in queues:
                queues[job.queue] = _Queue(QueueSnap(key=job.queue, tenant=job.tenant))
        self.queues = queues
        # Jobs go by rank: their priority, then, in a fair queue, their level (`policies`).
        self.fair_queues = {key for key, queue in queues.items() if queue.fair}
        # Promotion is a fair queue's only: without one, its bounds are not worth computing.
        bounds = promotion_bounds(snapshot, *promotion) if self.fair_queues else {}
        self.ranks = ranks = Ranks(levels_gpu_s, promotion[0], bounds)
        ranked = ranks.of_pending(pending, self.fair_queues, now)
        # Pending jobs fall in a few classes (shape, tenant, queue, rank), and into fewer
        # shapes: number both once, take whatever depends on them from the class, and key every
        # cache by those numbers.
        classes: dict[
            tuple[str, int, int, float, int, frozenset[str], int, str, str, int], int
        ] = {}
        self.class_of = class_of = [
            classes.setdefault(
                (
                    job.gpu_model,
                    job.gpus_per_replica,
                    job.replicas,
                    job.cpu_per_replica,
                    job.memory_mib_per_replica,
                    job.excluded_nodes,
                    job.rdma_per_replica,
                    job.tenant,
                    job.queue,
                    job_rank,
                ),
                len(classes),
            )
            for job, job_rank in zip(pending, ranked, strict=True)
        ]
        self.rank = ranked
        self.tenants: dict[str, TenantSnap] = {t.name: t for t in snapshot.tenants}
        for name in {key[7] for key in classes} | {job.tenant for job in snapshot.running}:
            if name not in self.tenants:
                self.tenants[name] = TenantSnap(name=name, gpu_quota=0)
        # Tenants with a CPU or memory quota: only their cores and memory are counted.
        self.capped = self.usage.count_held_elsewhere(self.tenants.values())

        # Running work: capacity, usage, and who could be preempted.
        self.biggest_running = [0] * len(cluster.names)
        self.by_tenant: dict[str, list[RunningJob]] = {}
        self.borrowed_running: list[RunningJob] = []
        # GPUs that preempting work below a priority could give back: priority -> GPUs, of each
        # tenant's quota (non-borrowed work) and of each queue's limit.
        self.quota_by_priority: dict[str, dict[int, int]] = {}
        self.queue_by_priority: dict[str, dict[int, int]] = {}
        self._account_running(snapshot.running, now)
        cluster.build_index()
        # Own work to preempt: lowest rank first, then the most recently started.
        self.own_priorities: dict[str, list[int]] = {}
        for tenant_name, own in self.by_tenant.items():
            own.sort(key=lambda r: (r.rank, -_started_at(r)))
            self.own_priorities[tenant_name] = [r.rank for r in own]
        self.borrowed_running.sort(key=lambda r: -_started_at(r))

        names = sorted({key[7] for key in classes})
        tenant_rank = {name: r for r, name in enumerate(names)}
        ids: dict[Shape, int] = {}
        shape_of_class = [ids.setdefault(key[:7], len(ids)) for key in classes]
        shape_list = self.shape_list = list(ids)
        never_of_shape = [self._never(shape) for shape in shape_list]
        queue_of_class = self.queue_of_class = [queues[key[8]] for key in classes]
        self.need_of_class = [key[1] * key[2] for key in classes]
        rank_of_class = [tenant_rank[key[7]] for key in classes]
        never_of_class: list[str | None] = []
        for key, shape, queue in zip(classes, shape_of_class, queue_of_class, strict=True):
            text = never_of_shape[shape]
            need = key[1] * key[2]
            if text is None and queue.limit is not None and need > queue.limit:
                text = reasons.over_queue_limit(need, queue.limit)
            if text is None and key[7] in self.capped:
                text = _over_cores_quota(self.tenants[key[7]], key[3] * key[2], key[4] * key[2],
                                         key[6] * key[2])
            never_of_class.append(text)

        shape_id = self.shape_id = [shape_of_class[c] for c in class_of]
        self.shapes: list[Shape] = [shape_list[k] for k in shape_id]
        self.need = [shape[1] * shape[2] for shape in self.shapes]
        self.never_text = [never_of_class[c] for c in class_of]
        self.queue_of = [queue_of_class[c] for c in class_of]
        # The highest rank waiting in each queue (of the jobs that could ever fit).
        self.top_rank: dict[_Queue, int] = {}
        for key, queue, never in zip(classes, queue_of_class, never_of_class, strict=True):
            if never is None and key[9] > self.top_rank.get(queue, key[9] - 1):
                self.top_rank[queue] = key[9]

        # Pending work, in order; tenants take turns by their shares as the passes go.
        keys = order_pending(
            pending,
            class_of,
            rank_of_class,
            [-key[9] for key in classes],
            [queue.fair for queue in queue_of_class],
        )
        self.runs: list[_TenantRun] = []
        for r, name in enumerate(names):
            run = _TenantRun(name)
            run.order = keys[bisect_left(keys, (r,)) : bisect_left(keys, (r + 1,))]
            self.runs.append(run)
        self.run_by_name = {run.name: run for run in self.runs}

        n = len(pending)
        self.outcome = [UNDECIDED] * n
        self.wait_text: list[str] = [""] * n
        self.wait_cap = [NO_SHAPE] * n  # the shape id whose lack of room the wait is about
        self.never_fits = [False] * n
        self.starts: list[Start] = []
        self.preemptions: list[Preempt] = []
        self.reservations: list[tuple[int, list[int], str]] = []  # job id, nodes, queue
        self.reserved_elsewhere = snapshot.reserved_elsewhere
        # What is known to fail: placements (by shape), and, per (tenant, shape), the highest
        # priority for which placing, reclaiming and preempting all failed, and preemption
        # searches that found nothing. They stay true while capacity only shrinks and usage only
        # grows, so they are forgotten when a preemption leaves more room or quota than before.
        self._capacity_texts: dict[tuple[int, str], str] = {}
        self.version = 0  # counts starts, preemptions and reservations: changes of state
        self._full: set[CapKey] = set()
        self._hopeless: dict[tuple[str, int], int] = {}
        self._no_victims: set[tuple[object, ...]] = set()
        self._on_node: dict[int, list[tuple[JobSnap, int]]] | None = None

    # -- setting up ---------------------------------------------------------------------------

    def _account_running(self, jobs: Sequence[JobSnap], now: float) -> None:
        """Capacity, usage and the preemption candidates, from the running jobs (one loop: it
        runs for every running job in every cycle). A running job's attained service counts its
        current attempt."""
        cluster = self.cluster
        index_of, node_model = cluster.index_of, cluster.node_model
        free_gpus, free_cpu, free_mem = cluster.free_gpus, cluster.free_cpu, cluster.free_mem
        free_rdma = cluster.free_rdma
        biggest = self.biggest_running
        usage = self.usage
        running_gpus, queue_used = usage.running, usage.queue_used
        quota_used, model_used = usage.quota_used, usage.model_used
        by_queue_priority, by_quota_priority = self.queue_by_priority, self.quota_by_priority
        by_tenant, borrowed_running = self.by_tenant, self.borrowed_running
        limited = {name for name, tenant in self.tenants.items() if tenant.gpu_model_limits}
        capped, cpu_used, mem_used = self.capped, usage.cpu_used, usage.mem_used
        rdma_used = usage.rdma_used
        rank, fair_queues = self.ranks.rank, self.fair_queues
        young_since = now - self.min_run_s
        for job in jobs:
            g, c, m = job.gpus_per_replica, job.cpu_per_replica, job.memory_mib_per_replica
            d = job.rdma_per_replica
            nodes = tuple([index_of.get(name) for name in job.placement])
            for node in nodes:
                if node is not None:
                    free_gpus[node] -= g
                    free_cpu[node] -= c
                    free_mem[node] -= m
                    if d:
                        free_rdma[node] -= d
                    if g > biggest[node]:
                        biggest[node] = g
            tenant, queue, gpus = job.tenant, job.queue, job.gpus
            if tenant in capped:
                cpu_used[tenant] += c * job.replicas
                mem_used[tenant] += m * job.replicas
                rdma_used[tenant] += d * job.replicas
            if queue in fair_queues:
                attained = job.attained_gpu_s
                if job.started_at is not None and job.started_at < now:
                    attained += gpus * (now - job.started_at)
                priority = rank(job.priority, attained, job.waited_s, tenant)
            else:
                priority = rank(job.priority, 0.0)
            running_gpus[tenant] = running_gpus.get(tenant, 0) + gpus
            queue_used[queue] = queue_used.get(queue, 0) + gpus
            by_priority = by_queue_priority.get(queue)
            if by_priority is None:
                by_priority = by_queue_priority[queue] = {}
            by_priority[priority] = by_priority.get(priority, 0) + gpus
            model_gpus: dict[str, int] = {}
            if not job.borrowed:
                quota_used[tenant] = quota_used.get(tenant, 0) + gpus
                by_priority = by_quota_priority.get(tenant)
                if by_priority is None:
                    by_priority = by_quota_priority[tenant] = {}
                by_priority[priority] = by_priority.get(priority, 0) + gpus
                if tenant in limited:
                    for node in nodes:
                        model = job.gpu_model if node is None else node_model[node]
                        if model:
                            model_gpus[model] = model_gpus.get(model, 0) + g
                    if not nodes and job.gpu_model:
                        model_gpus[job.gpu_model] = gpus
                    for model, count in model_gpus.items():
                        model_used[(tenant, model)] = model_used.get((tenant, model), 0) + count
            running = RunningJob(job, nodes, model_gpus, priority,
                                 job.started_at is not None and job.started_at > young_since)
            own = by_tenant.get(tenant)
            if own is None:
                own = by_tenant[tenant] = []
            own.append(running)
            if job.borrowed:
                borrowed_running.append(running)

    def _count_preemptible(self, running: RunningJob, sign: int) -> None:
        job = running.job
        by_queue = self.queue_by_priority.setdefault(job.queue, {})
        by_queue[running.rank] = by_queue.get(running.rank, 0) + sign * job.gpus
        if not job.borrowed:
            by_quota = self.quota_by_priority.setdefault(job.tenant, {})
            by_quota[running.rank] = by_quota.get(running.rank, 0) + sign * job.gpus

    def _never(self, shape: Shape) -> str | None:
        """Why no state of the cluster (grown by its pools) could ever hold this job, or
        None."""
        model, g, r = shape[0], shape[1], shape[2]
        cluster = self.ever
        if r <= 0:
            return reasons.no_replicas()
        if g < 0 or shape[3] < 0 or shape[4] < 0 or shape[6] < 0:
            return reasons.negative_request()
        if model and model not in cluster.models:
            return reasons.no_such_model(model)
        largest = cluster.max_gpus(model)
        if g > largest:
            return reasons.replica_too_big(shape, largest)
        room = cluster.slots_ever(shape)
        if room == 0:
            return reasons.replica_resources_too_big(shape)
        if room < r:
            return reasons.cluster_too_small(shape, cluster.total_gpus_of(model), room)
        if shape[5] and cluster.slots_ever_without_excluded(shape) < r:
            return reasons.only_excluded(sorted(shape[5]))
        return None

    # -- the cycle ----------------------------------------------------------------------------

    def run(self, explain: bool = True) -> Decisions:
        self._starving_first()
        self._pass(1)
        for queue in self.queues.values():
            if queue.state == DEFERRING:
                queue.state = OPEN
        self._pass(2)
        return Decisions(
            starts=tuple(self.starts),
            preemptions=tuple(self.preemptions),
            waits=tuple(self._waits()) if explain else (),
            reservations=tuple(
                Reservation(job_id, queue, tuple(self.cluster.names[n] for n in nodes))
                for job_id, nodes, queue in self.reservations),
        )

    def _share(self, tenant: str) -> float:
        return share(self.usage.running.get(tenant, 0), self.tenants[tenant].gpu_quota)

    def _pass(self, phase: int) -> None:
        """Consider the jobs of every tenant (pass one: all; pass two: the deferred borrowers),
        tenants interleaved by (priority, share, attained service, age) of their next job. A
        tenant's share only changes when it starts something, so a tenant keeps the turn, at the
        cost of two number comparisons per job, until its next job sorts after another's."""
        runs = [run for run in self.runs if (run.order if phase == 1 else run.deferred)]
        lists = [run.order if phase == 1 else run.deferred for run in runs]
        heap = []
        for t, jobs in enumerate(lists):
            k = jobs[0]
            heap.append((k[1], self._share(runs[t].name), k[2], k[3], k[4], t))
        heapify(heap)
        position = [0] * len(lists)
        outcome, queue_of, never = self.outcome, self.queue_of, self.never_text
        wait_text, wait_cap, now = self.wait_text, self.wait_cap, self.now
        never_fits = self.never_fits
        class_of, attempt = self.class_of, self._attempt
        # What a job came to, by (shape, tenant, queue, priority): a job just like one before
        # comes to the same while nothing has started, been preempted or reserved since (the
        # state's version is unchanged): the long tail of a busy cycle costs a lookup a job.
        known: dict[int, tuple[int, int, str, int]] = {}
        while heap:
            entry = heappop(heap)
            t = entry[5]
            run = runs[t]
            own_share = self._share(run.name)
            if own_share != entry[1]:  # changed while queued (its work was reclaimed): re-sort
                heappush(heap, (entry[0], own_share, entry[2], entry[3], entry[4], t))
                continue
            jobs = lists[t]
            p, end = position[t], len(jobs)
            other = heap[0] if heap else None
            other_priority = other[0] if other is not None else _NEVER_TRIED
            while p < end:
                k = jobs[p]
                if other is not None and (
                    k[1] > other_priority
                    or (
                        k[1] == other_priority
                        and (
                            own_share > other[1]
                            or (own_share == other[1] and k[2:5] > other[2:5])
                        )
                    )
                ):
                    break
                p += 1
                i = k[5]
                queue = queue_of[i]
                decided = outcome[i]
                if decided and decided != DEFERRED:  # among the starving jobs
                    if decided == WAITING and queue.fifo and queue.state == OPEN:
                        self._block(queue, k[4])
                    continue
                text = never[i]
                if text is not None:
                    outcome[i] = WAITING
                    wait_text[i] = text
                    never_fits[i] = True
                    continue
                if queue.state:  # a fifo queue behind its head
                    if queue.state == DEFERRING:
                        outcome[i] = DEFERRED
                        run.deferred.append(k)
                    else:
                        outcome[i] = WAITING
                        wait_text[i] = queue.blocker
                    continue
                if k[6] > now:
                    outcome[i] = WAITING
                    wait_text[i] = reasons.backoff(k[6], now)
                    result = WAITING
                else:
                    alike = class_of[i]
                    before = known.get(alike)
                    if before is not None and before[0] == self.version:
                        result = before[1]
                        if result == WAITING:
                            outcome[i] = WAITING
                            wait_text[i] = before[2]
                            wait_cap[i] = before[3]
                    else:
                        result = attempt(i, queue, phase)
                        if result != STARTED:
                            known[alike] = (self.version, result, wait_text[i], wait_cap[i])
                if result == STARTED:
                    own_share = self._share(run.name)
                elif result == DEFERRED:
                    outcome[i] = DEFERRED
                    run.deferred.append(k)
                    if queue.fifo:  # the rest of a fifo queue stays behind it
                        queue.state = DEFERRING
                elif queue.fifo:
                    self._block(queue, k[4])
            position[t] = p
            if p < end:
                k = jobs[p]
                heappush(heap, (k[1], own_share, k[2], k[3], k[4], t))

    def _block(self, queue: _Queue, blocker: int) -> None:
        queue.state = BLOCKED
        queue.blocker = reasons.behind(blocker)

    def _over_quota(self, i: int, tenant: TenantSnap) -> bool:
        need = self.need[i]
        if self.usage.quota_used.get(tenant.name, 0) + need > tenant.gpu_quota:
            return True
        model = self.shapes[i][0]
        return bool(
            model
            and tenant.gpu_model_limits
            and self.usage.model_over(tenant, model, need) is not None
        )

    def _over_cores(self, i: int, tenant: TenantSnap) -> str | None:
        """Why job i would pass its tenant's CPU, memory or RDMA quota, or None."""
        if tenant.name not in self.capped:
            return None
        return self.usage.cores_reason(tenant, *_cores(self.pending[i]))

    def _quota_reason(self, i: int, tenant: TenantSnap) -> str:
        """Why the job is over its tenant's quota or model limit (it is)."""
        need = self.need[i]
        used = self.usage.quota_used.get(tenant.name, 0)
        quota = tenant.gpu_quota
        if used + need > quota:
            if need > quota:
                return reasons.over_quota(quota)
            return reasons.quota_full(used, quota, need)
        model = self.shapes[i][0]
        over = self.usage.model_over(tenant, model, need)
        assert over is not None
        if need > over[1]:
            return reasons.over_model_limit(model, over[1])
        return reasons.model_full(model, over[0], over[1], need)

    def _allowed_models(self, tenant: TenantSnap, need: int) -> tuple[Allowed, str]:
        """For a job of any GPU model: the node models its tenant's model limits leave it."""
        blocked = self.usage.blocked_models(tenant, need)
        if not blocked:
            return None, ""
        return self.cluster.models - frozenset(blocked), reasons.model_limits_full(blocked)

    def _attempt(self, i: int, queue: _Queue, phase: int) -> int:
        """Admit and place job i: STARTED, DEFERRED (to the borrowers' pass) or WAITING (its
        wait is recorded)."""
        job = self.pending[i]
        need = self.need[i]
        tenant = self.tenants[job.tenant]
        # A job of any model keeps off the models whose limits it would pass (it may borrow
        # them in pass two); whatever it does below, preempting included.
        allowed: Allowed = None
        limits_text = ""
        if tenant.gpu_model_limits and not job.gpu_model:
            allowed, limits_text = self._allowed_models(tenant, need)
        limit = queue.limit
        if limit is not None:
            used = self.usage.queue_used.get(queue.key, 0)
            if used + need > limit:
                if phase == 1 and self._preempt_own(i, queue, allowed):
                    return STARTED
                self._wait(i, reasons.queue_full(used, limit, need))
                return WAITING
        # CPU and memory quotas are hard: over them a job waits (nothing borrows above them),
        # unless its own lower-ranked work makes way.
        cores_text = self._over_cores(i, tenant)
        if cores_text is not None:
            if phase == 1 and self._preempt_own(i, queue, allowed):
                return STARTED
            self._wait(i, cores_text)
            return WAITING
        if self._over_quota(i, tenant):
            if phase == 1:
                return STARTED if self._preempt_own(i, queue, allowed) else DEFERRED
            return self._borrow(i, tenant, "")
        if allowed is None:
            hopeless = (job.tenant, self.shape_id[i])
            if self._hopeless.get(hopeless, _NEVER_TRIED) >= self.rank[i]:
                self._wait(i, "", cap=self.shape_id[i])
                return WAITING
        picked = self._place(i, allowed)
        if picked is not None:
            self._start(i, picked, borrowed=False)
            return STARTED
        if self._reclaim(i, allowed) or self._preempt_own(i, queue, allowed):
            return STARTED
        if allowed is not None:  # the limits kept it off nodes it could borrow
            return DEFERRED if phase == 1 else self._borrow(i, tenant, limits_text)
        self._hopeless[hopeless] = max(self._hopeless.get(hopeless, _NEVER_TRIED), self.rank[i])
        self._wait(i, "", cap=self.shape_id[i])
        return WAITING

    def _borrow(self, i: int, tenant: TenantSnap, binding: str) -> int:
        """Start job i on idle capacity above its quota or model limits; `binding` is why it
        needs to ("" = its quota or model limit, worded only if it waits)."""
        picked = self._place(i, None)
        if picked is not None:
            self._start(i, picked, borrowed=True)
            return STARTED
        self._wait(i, binding or self._quota_reason(i, tenant), cap=self.shape_id[i])
        return WAITING

    def _place(self, i: int, allowed: Allowed) -> Picked | None:
        key: CapKey = self.shape_id[i] if allowed is None else (self.shape_id[i], allowed)
        if key in self._full:
            return None
        picked = self.cluster.place(self.shapes[i], allowed)
        if picked is None:
            self._full.add(key)
        return picked

    def _start(
        self,
        i: int,
        picked: Picked,
        *,
        borrowed: bool,
        preempted: Sequence[int] = (),
        waited: float | None = None,
    ) -> None:
        job = self.pending[i]
        shape = self.shapes[i]
        cluster = self.cluster
        placement = cluster.commit(picked, shape)
        tenant = self.tenants[job.tenant]
        model_gpus: dict[str, int] = {}
        if tenant.gpu_model_limits:
            for node, count in picked:
                model = cluster.node_model[node]
                if model:
                    model_gpus[model] = model_gpus.get(model, 0) + count * shape[1]
        need = self.need[i]
        usage = self.usage
        usage.change(job.tenant, job.queue, need, borrowed, model_gpus, +1)
        if job.tenant in self.capped:
            usage.change_cores(job.tenant, *_cores(job), +1)
        used = usage.quota_used.get(job.tenant, 0)
        if borrowed:
            reason = reasons.borrowed(used, tenant.gpu_quota, need)
        else:
            reason = reasons.admitted(used, tenant.gpu_quota)
        if preempted:
            reason = reasons.after_preempting(reason, preempted)
        if waited is not None:
            reason = reasons.after_waiting(reason, waited)
        self.starts.append(Start(job.id, placement, borrowed, reason))
        self.outcome[i] = STARTED
        self.version += 1

    def _wait(
        self, i: int, text: str, *, cap: int = NO_SHAPE, never_fits: bool = False
    ) -> None:
        """Job i waits: `text` says why, or, with `cap`, says why before the lack of room for
        that shape (worded at the end of the cycle, once per shape)."""
        self.outcome[i] = WAITING
        self.wait_text[i] = text
        self.wait_cap[i] = cap
        if never_fits:
            self.never_fits[i] = True

    # -- preemption ---------------------------------------------------------------------------

    def _preempt_own(self, i: int, queue: _Queue, allowed: Allowed) -> bool:
        """Preempt the tenant's own lower-ranked work if, and only if, that starts job i now: work
        of a lower priority, or, at the same priority, of a lower level that has run its
        minimum run time."""
        job = self.pending[i]
        rank = self.rank[i]
        own = self.by_tenant.get(job.tenant)
        if not own or own[0].rank >= rank:
            return False
        tenant = self.tenants[job.tenant]
        usage = self.usage
        need = self.need[i]
        need_quota = usage.quota_used.get(job.tenant, 0) + need - tenant.gpu_quota
        if need_quota > 0 and _below(self.quota_by_priority.get(job.tenant), rank) < (
            need_quota
        ):
            return False
        limit = queue.limit
        need_queue = usage.queue_used.get(queue.key, 0) + need - limit if limit is not None else 0
        if need_queue > 0 and _below(self.queue_by_priority.get(queue.key), rank) < (
            need_queue
        ):
            return False
        shape = self.shapes[i]
        memo = (job.tenant, queue.key, rank, self.shape_id[i], allowed)
        if memo in self._no_victims:
            return False
        model = shape[0]
        need_model = 0
        if model and model in tenant.gpu_model_limits:
            used_model = usage.model_used.get((job.tenant, model), 0)
            need_model = used_model + need - tenant.gpu_model_limits[model]
        need_cpu, need_mem, need_rdma = 0.0, 0, 0
        if job.tenant in self.capped:
            need_cpu, need_mem, need_rdma = usage.cores_short(tenant, *_cores(job))

        def gains(running: RunningJob) -> Needs:
            victim = running.job
            # Any of its own work gives back CPU, memory and RDMA: those quotas count it all.
            cpu, mem, rdma = _cores(victim)
            if victim.borrowed:
                return (victim.gpus if victim.queue == job.queue else 0, 0, 0, cpu, mem, rdma)
            return (
                victim.gpus if victim.queue == job.queue else 0,
                victim.gpus,
                running.model_gpus.get(model, 0),
                cpu,
                mem,
                rdma,
            )

        below = bisect_left(self.own_priorities[job.tenant], rank)
        candidates: Iterable[RunningJob] = islice(own, below)
        if self.min_run_s > 0:
            # Below it by level only: not before the minimum run time, or jobs of neighbouring
            # levels would take turns at every cycle, paying restarts for nothing.
            priority = job.priority
            candidates = (r for r in candidates if not r.young or r.job.priority < priority)
        victims = fewest_victims(
            self.cluster,
            shape,
            allowed,
            (need_queue, need_quota, need_model, need_cpu, need_mem, need_rdma),
            candidates,
            gains,
        )
        if victims is None:
            self._no_victims.add(memo)
            return False

        # Above its victims by level: by less service, or, in a fair queue, promoted by its
        # total wait.
        waited = job.waited_s + self.now - job.submitted_at
        promoted = job.queue in self.fair_queues and self.ranks.level(
            job.attained_gpu_s) > self.ranks.level(job.attained_gpu_s, waited, job.tenant)

        def reason(victim: RunningJob) -> str:
            if victim.job.priority < job.priority:
                return reasons.preempted_by(job.id, job.priority)
            attained = self.attained(victim)
            was, now = self.ranks.level(victim.job.attained_gpu_s), self.ranks.level(attained)
            if promoted:
                return reasons.preempted_for_promoted(job.id, waited, attained, was, now)
            return reasons.preempted_for_less_served(job.id, attained, was, now)

        self._preempt_and_start(i, allowed, victims, reason)
        return True

    def attained(self, running: RunningJob) -> float:
        """GPU-seconds the running job has held, its current attempt included."""
        job = running.job
        started = job.started_at
        if started is None or started >= self.now:
            return job.attained_gpu_s
        return job.attained_gpu_s + job.gpus * (self.now - started)

    def _reclaim(self, i: int, allowed: Allowed) -> bool:
        """Take back other tenants' borrowed work if, and only if, that starts job i now."""
        if not self.borrowed_running:
            return False
        job = self.pending[i]
        shape = self.shapes[i]
        memo = ("reclaim", job.tenant, self.shape_id[i], allowed)
        if memo in self._no_victims:
            return False
        candidates = [r for r in self.borrowed_running if r.job.tenant != job.tenant]
        # Its tenant's CPU and memory quotas are not at stake: it is within them (checked
        # first), and other tenants' work does not count against them.
        victims = fewest_victims(self.cluster, shape, allowed, NO_NEEDS, candidates)
        if victims is None:
            self._no_victims.add(memo)
            return False
        reclaimed = reasons.reclaimed(job.tenant, job.id)
        self._preempt_and_start(i, allowed, victims, lambda victim: reclaimed)
        return True

    def _preempt_and_start(
        self, i: int, allowed: Allowed, victims: list[RunningJob],
        reason: Callable[[RunningJob], str],
    ) -> None:
        """Preempt the victims and start job i in the room they leave. What is known to fail
        stays known unless this left more room or quota somewhere than there was before."""
        cluster, usage = self.cluster, self.usage
        nodes = {n for v in victims for n in v.nodes if n is not None}
        room = [(n, cluster.free_gpus[n], cluster.free_cpu[n], cluster.free_mem[n],
                 cluster.free_rdma[n]) for n in nodes]
        jobs = [v.job for v in victims] + [self.pending[i]]
        tenants = {j.tenant for j in jobs}
        quota = [(t, usage.quota_used.get(t, 0)) for t in tenants]
        queue = [(q, usage.queue_used.get(q, 0)) for q in {j.queue for j in jobs}]
        model = [(k, used) for k, used in usage.model_used.items() if k[0] in tenants]
        cores = [(t, usage.cpu_used[t], usage.mem_used[t], usage.rdma_used.get(t, 0))
                 for t in tenants if t in self.capped]
        for victim in victims:
            self._preempt(victim, reason(victim))
        picked = cluster.place(self.shapes[i], allowed)
        # The search counted exactly the room `place` walks, so this cannot miss.
        assert picked is not None, f"job {self.pending[i].id} did not fit after preemption"
        self._start(i, picked, borrowed=False, preempted=[v.job.id for v in victims])
        if any(
            cluster.free_gpus[n] > gpus or cluster.free_cpu[n] > cpu or cluster.free_mem[n] > mem
            or cluster.free_rdma[n] > rdma
            for n, gpus, cpu, mem, rdma in room
        ):
            self._full.clear()
            self._hopeless.clear()
            self._no_victims.clear()
        elif (
            any(usage.quota_used.get(t, 0) < used for t, used in quota)
            or any(usage.queue_used.get(q, 0) < used for q, used in queue)
            or any(usage.model_used.get(k, 0) < used for k, used in model)
            or any(usage.cpu_used[t] < cpu - EPS or usage.mem_used[t] < mem
                   or usage.rdma_used.get(t, 0) < rdma
                   for t, cpu, mem, rdma in cores)
        ):
            self._no_victims.clear()

    def _preempt(self, running: RunningJob, reason: str) -> None:
        running.preempted = True
        job = running.job
        self._count_preemptible(running, -1)
        for node in running.nodes:
            if node is not None:
                self.cluster.release(
                    node, job.gpus_per_replica, job.cpu_per_replica, job.memory_mib_per_replica,
                    job.rdma_per_replica,
                )
        self.usage.change(job.tenant, job.queue, job.gpus, job.borrowed, running.model_gpus, -1)
        if job.tenant in self.capped:
            self.usage.change_cores(job.tenant, *_cores(job), -1)
        self.preemptions.append(Preempt(job.id, reason))
        self.version += 1

    # -- starvation ---------------------------------------------------------------------------

    def _starving_first(self) -> None:
        """Starving jobs (see `policies`) go first, by priority then by how long they have
        waited: each starts now if it can, and in each queue the first that cannot gets nodes
        reserved (its queue's other starving jobs then wait for the passes)."""
        threshold = self.now - self.starvation_s
        never, queue_of = self.never_text, self.queue_of
        pending = self.pending

        # By priority, then by the whole time waited (levels play no part here), then id:
        # (-priority, since, id, index), since going back by the earlier waits. A heap: the
        # queues are usually settled after a few of the starving jobs.
        starving: list[tuple[int, float, int, int]] = []
        append = starving.append
        for i, job in enumerate(pending):
            since, not_before = job.submitted_at, job.not_before
            if (since < threshold and not_before < threshold and never[i] is None
                    and not queue_of[i].fifo):
                append((-job.priority, (since if since >= not_before else not_before)
                        - job.waited_s, job.id, i))
        # In a fifo queue, only its head may go first (a job that never fits aside).
        fifo = {queue for queue in self.queue_of_class if queue.fifo}
        heads: dict[_Queue, SortKey] = {}
        for run in self.runs:
            for k in run.order if len(heads) < len(fifo) else ():
                queue = queue_of[k[5]]
                if queue.fifo and queue not in heads and never[k[5]] is None:
                    heads[queue] = k
        for k in heads.values():
            if k[3] < threshold and k[6] < threshold:
                job = pending[k[5]]
                append((-job.priority, (k[3] if k[3] >= k[6] else k[6]) - job.waited_s,
                        k[4], k[5]))
        if not starving:
            return
        heapify(starving)
        # A queue is settled once it has a reservation, or once its quota and limit leave room
        # for none of its jobs (no start in this pass gives quota back).
        smallest: dict[_Queue, int] = {}
        for c, queue in enumerate(self.queue_of_class):
            need = self.need_of_class[c]
            if need < smallest.get(queue, need + 1):
                smallest[queue] = need
        open_queues = {queue_of[item[3]] for item in starving}
        settled: set[_Queue] = set()
        needs, tenants = self.need, self.tenants
        quota_used, queue_used = self.usage.quota_used, self.usage.queue_used
        while starving:
            i = heappop(starving)[3]
            queue = queue_of[i]
            if queue in settled:
                continue
            tenant = tenants[pending[i].tenant]
            headroom = tenant.gpu_quota - quota_used.get(tenant.name, 0)
            if queue.limit is not None:
                headroom = min(headroom, queue.limit - queue_used.get(queue.key, 0))
            if headroom < smallest[queue] or (
                needs[i] <= headroom and self._start_or_reserve(i, queue)
            ):
                settled.add(queue)
                if len(settled) == len(open_queues):
                    return

    def _start_or_reserve(self, i: int, queue: _Queue) -> bool:
        """True when job i got nodes reserved (and waits); False when it started, or when the
        normal passes should handle it (it is over a quota or limit)."""
        job = self.pending[i]
        tenant = self.tenants[job.tenant]
        need = self.need[i]
        limit = queue.limit
        if limit is not None and self.usage.queue_used.get(queue.key, 0) + need > limit:
            return False
        if self._over_quota(i, tenant) or self._over_cores(i, tenant) is not None:
            return False
        allowed: Allowed = None
        if tenant.gpu_model_limits and not job.gpu_model:
            allowed = self._allowed_models(tenant, need)[0]
        waited = self.now - waiting_since(job)
        shape = self.shapes[i]
        hopeless = (job.tenant, self.shape_id[i])
        if allowed is not None or self._hopeless.get(hopeless, _NEVER_TRIED) < self.rank[i]:
            picked = self._place(i, allowed)
            if picked is not None:
                self._start(i, picked, borrowed=False, waited=waited)
                return False
            if self._reclaim(i, allowed) or self._preempt_own(i, queue, allowed):
                return False
            if allowed is None:
                self._hopeless[hopeless] = self.rank[i]
        nodes = self.cluster.pick_reservation(shape, allowed, self.biggest_running)
        if (nodes is not None and self.rank[i] < self.top_rank[queue]
                and len(nodes) > OUTRANKED_DRAIN_SHARE * self.schedulable_nodes):
            # Outranked: level preemption would take its nodes back after its minimum run, so
            # draining a large share of the cluster for it idles them for hours to buy minutes;
            # it goes first where it fits, and promotion bounds its wait (`policies`). Its
            # queue's next starving job may still get the reservation.
            self._wait(i, reasons.outranked_no_drain(waited, self.starvation_s, self.min_run_s))
            return False
        held = self.reserved_elsewhere.get(queue.key)
        if held is not None:  # one reservation per queue across its fleet: it waits its turn
            self._wait(i, reasons.queue_reserved_elsewhere(held, waited, self.starvation_s))
            return True
        if nodes is None:
            return False
        self.cluster.reserve(nodes, job.id)
        self.reservations.append((job.id, nodes, queue.key))
        self.version += 1
        names = [self.cluster.names[n] for n in nodes]
        self._wait(i, reasons.reserved_for(names, job.id, waited, self.starvation_s))
        return True

    # -- waits --------------------------------------------------------------------------------

    def _waits(self) -> list[Wait]:
        waits: list[Wait] = []
        append = waits.append
        outcome, queue_of = self.outcome, self.queue_of
        wait_text, wait_cap, never_fits = self.wait_text, self.wait_cap, self.never_fits
        # "waiting: no room…" by shape and tenant (a wait names only its own tenant's work).
        plain: dict[tuple[int, str], str] = {}
        worded: dict[tuple[str, int, str], str] = {}  # a borrower's reason and no room, by all
        for queue in self.queues.values():
            queue.position = 0
        for run in self.runs:
            for k in run.order:
                i = k[5]
                if outcome[i] == STARTED:
                    continue
                queue = queue_of[i]
                position = queue.position = queue.position + 1
                cap = wait_cap[i]
                if cap == NO_SHAPE:
                    # "" is not reached: every path decides; say so if one did not.
                    text = wait_text[i] or "waiting: not considered in this cycle"
                elif not wait_text[i]:
                    tenant = self.pending[i].tenant
                    text = plain.get((cap, tenant), "")
                    if not text:
                        text = plain[cap, tenant] = reasons.waiting(
                            self._capacity_text(cap, tenant))
                else:
                    key = (wait_text[i], cap, self.pending[i].tenant)
                    text = worded.get(key, "")
                    if not text:
                        text = worded[key] = reasons.no_borrow(
                            key[0], self._capacity_text(cap, key[2]))
                append(Wait(k[4], text, position, never_fits[i]))
        return waits

    def _capacity_text(self, shape_id: int, tenant: str) -> str:
        """Why no room for this shape, in the cycle's final state (borrowers and jobs without
        model limits see every node of their model, so no model filter applies here), as
        `tenant` reads it."""
        known = self._capacity_texts.get((shape_id, tenant))
        if known is None:
            known = self._word_capacity(self.shape_list[shape_id], tenant)
            self._capacity_texts[shape_id, tenant] = known
        return known

    def _word_capacity(self, shape: Shape, tenant: str) -> str:
        model, g, r = shape[0], shape[1], shape[2]
        cluster = self.cluster
        node, looked_at = cluster.closest(shape) if r == 1 else (-1, cluster.count_looked_at(shape))
        if not looked_at:
            body = reasons.no_node_takes_work(model)
        elif r == 1:
            short = cluster.short_on(node, shape)
            if short:
                held = self._holders([node], short[0][0], tenant)
                body = reasons.no_room_on_node(model, short, cluster.names[node], looked_at,
                                               held)
            else:  # a preemption after it was looked at left room
                body = reasons.room_came_free(cluster.names[node])
        else:
            room = cluster.gpu_slots(model, g, shape[5], None) if g > 0 else r
            if room >= r:
                nodes = cluster.looked_at(shape)
                scarce, fits = cluster.gang_short(nodes, shape)
                what = {reasons.CPU: shape[3], reasons.MEMORY: shape[4], reasons.RDMA: shape[6]}
                short = [(s, what[s], 0.0) for s in scarce]
                held = self._holders(nodes, scarce[0], tenant) if scarce else []
                body = reasons.no_room_gang_resources(r, short, fits, len(nodes), held, model)
            elif 2 * g > cluster.max_gpus(model):
                body = reasons.no_room_whole_nodes(r, g, room)
            else:
                body = reasons.no_room_gang(r, g, room)
        for job_id, reserved, _ in self.reservations:
            if any(not model or cluster.node_model[n] == model for n in reserved):
                body += reasons.reserved_elsewhere([cluster.names[n] for n in reserved], job_id)
                break
        return body

    def _holders(self, nodes: Sequence[int], what: str, tenant: str) -> list[reasons.Holder]:
        """The work holding `what` (a resource of `reasons`) on these nodes at the cycle's end,
        the biggest holder first: running jobs not preempted, and the jobs started in it.
        Only `tenant`'s own work is named; other tenants' is one holder that names none of it
        (a wait is shown to the waiting job's tenant, and clusters are shared)."""
        on_node = self._work_on_nodes()
        # By name: a deployment's replicas are one holder. Ties go to the oldest job.
        held: dict[str, list[float]] = {}
        for node in nodes:
            for job, count in on_node.get(node, ()):
                amount = count * (job.gpus_per_replica if what == reasons.GPU else
                                  job.cpu_per_replica if what == reasons.CPU else
                                  job.rdma_per_replica if what == reasons.RDMA else
                                  job.memory_mib_per_replica)
                if amount > 0:
                    name = (job.display or f"job {job.id}") if job.tenant == tenant \
                        else reasons.OTHER_TENANTS
                    entry = held.setdefault(name, [0.0, job.id])
                    entry[0] += amount
                    entry[1] = min(entry[1], job.id)
        ranked = sorted(held.items(), key=lambda item: (-item[1][0], item[1][1]))
        return [(name, entry[0]) for name, entry in ranked]

    def _work_on_nodes(self) -> dict[int, list[tuple[JobSnap, int]]]:
        """Node -> (job, its replicas there), built once, when a wait is first worded."""
        if self._on_node is None:
            on_node: dict[int, list[tuple[JobSnap, int]]] = {}
            index_of = self.cluster.index_of
            work = [(r.job, r.job.placement) for own in self.by_tenant.values() for r in own
                    if not r.preempted]
            pending = {job.id: job for job in self.pending}
            work += [(pending[start.job_id], start.placement) for start in self.starts]
            for job, placement in work:
                if len(placement) == 1:  # most work: skip the counting
                    node = index_of.get(placement[0])
                    if node is not None:
                        on_node.setdefault(node, []).append((job, 1))
                    continue
                counts: dict[int, int] = {}
                for name in placement:
                    node = index_of.get(name)
                    if node is not None:
                        counts[node] = counts.get(node, 0) + 1
                for node, count in counts.items():
                    on_node.setdefault(node, []).append((job, count))
            self._on_node = on_node
        return self._on_node


__all__ = ["schedule"]
