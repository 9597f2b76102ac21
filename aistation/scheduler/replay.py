"""Replaying a job trace through the scheduler core on a simulated clock.

The replay is a discrete-event simulation of a cluster of identical nodes. Jobs arrive at their
submission times; whenever something changes (an arrival, a completion, a wake-up the policy asked
for), it builds a `Snapshot` and calls the same `schedule` the platform's cycle calls, then applies
the decisions: starts take GPUs on the chosen nodes, preemptions give them back. Nothing about the
policies lives here.

The model of work, as the trace replay benchmark defines it:

- a job of up to one node's GPUs runs on one node; a larger one takes ceil(g / node GPUs) whole
  nodes (a gang);
- a preempted job keeps its progress (a checkpoint) and pays `restart_overhead_s` on its GPUs each
  time it starts again; a preemption during that overhead loses the overhead only;
- a job's attained service is the GPU-seconds it has held, overheads included: what the platform
  knows of a job while it runs.

Conservation is checked as the replay goes (a node never holds more GPUs than it has, a job ends
exactly once) and at the end (GPU-seconds run = the trace's GPU-seconds + restart overheads).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .core import schedule
from .policies import (
    BACKFILL,
    DEFAULT_LEVELS_GPU_S,
    DEFAULT_MIN_RUN_S,
    DEFAULT_PROMOTE_AFTER_S,
    DEFAULT_PROMOTE_BACKLOG,
    DEFAULT_PROMOTE_MAX_S,
    DEFAULT_PROMOTE_STRETCH,
    DEFAULT_STARVATION_S,
    FAIR,
    promotion_bounds,
)
from .types import JobSnap, NodeSnap, QueueSnap, Reservation, Snapshot, TenantSnap

TENANT = "trace"
QUEUE = "trace/main"
ARRIVE, END, WAKE = 0, 1, 2


class Reference(Protocol):
    """A reference policy (`aistation.scheduler.references`): the replay runs it as a backfill
    queue whose jobs' priorities it sets. A waiting job's rank must not change while it waits
    (its snapshot is kept); a running job's is asked again at every cycle."""

    def rank(self, job: ReplayJob, now: float) -> int:
        """The job's priority now: higher goes first and preempts lower at once."""
        ...

    def since(self, job: ReplayJob, now: float) -> float:
        """Its place within its rank: earlier goes first."""
        ...

    def changes_at(self, job: ReplayJob, now: float) -> float:
        """When, with nothing arriving or ending, the running job's rank next changes."""
        ...


class ConservationError(AssertionError):
    """The replay broke one of its invariants: a bug in the core or in the replay."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: int
    submitted_at: float
    duration_s: float  # run time it needs, without restart overheads
    gpus: int


@dataclass(slots=True)
class ReplayJob:
    """A job as the replay tracks it."""

    trace: TraceJob
    gpus_per_replica: int
    replicas: int
    done_s: float = 0.0  # progress, seconds of its duration
    attained_gpu_s: float = 0.0  # GPU-seconds held in finished attempts
    starts: int = 0
    preemptions: int = 0
    queued_at: float = 0.0  # last time it entered the queue
    queue_s: float = 0.0  # time spent waiting, all waits
    started_at: float | None = None  # current attempt
    run_from: float = 0.0  # when the current attempt's overhead ends and progress starts
    placement: tuple[str, ...] = ()
    finished_at: float | None = None
    overhead_gpu_s: float = 0.0
    snap: JobSnap | None = None


@dataclass
class ReplayResult:
    jobs: int
    jct_s: list[float]
    queue_s: list[float]
    durations_s: list[float]
    preemptions: int
    makespan_s: float
    cycles: int
    # Allocated GPU-seconds and available GPU-seconds over the time some job waited.
    waiting_allocated_gpu_s: float
    waiting_capacity_gpu_s: float
    run_gpu_s: float
    trace_gpu_s: float
    overhead_gpu_s: float
    cycle_s: list[float] = field(default_factory=list)
    backlog: list[int] = field(default_factory=list)


def job_shape(gpus: int, node_gpus: int) -> tuple[int, int]:
    """(GPUs per replica, replicas): one node up to its size, else whole nodes."""
    if gpus <= node_gpus:
        return gpus, 1
    return node_gpus, math.ceil(gpus / node_gpus)


class Replay:
    """One run of a trace on `nodes` nodes of `node_gpus` GPUs under one queue policy, with the
    policy settings `schedule` takes, or under a `reference` policy (run as a backfill queue
    whose priorities it sets)."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        *,
        nodes: int,
        node_gpus: int = 8,
        policy: str = FAIR,
        restart_overhead_s: float = 60.0,
        starvation_s: float = DEFAULT_STARVATION_S,
        levels_gpu_s: Sequence[float] = DEFAULT_LEVELS_GPU_S,
        min_run_s: float = DEFAULT_MIN_RUN_S,
        promote_after_s: float = DEFAULT_PROMOTE_AFTER_S,
        promote_backlog: float = DEFAULT_PROMOTE_BACKLOG,
        promote_stretch: float = DEFAULT_PROMOTE_STRETCH,
        promote_max_s: float = DEFAULT_PROMOTE_MAX_S,
        reference: Reference | None = None,
        time_cycles: bool = False,
        record: bool = False,
        node_prefix: str = "n",
        gpu_quota: int | None = None,
        tag: int = -1,
    ) -> None:
        self.node_gpus = node_gpus
        self.node_snaps = tuple(
            NodeSnap(name=f"{node_prefix}{i:05d}", gpus=node_gpus) for i in range(nodes)
        )
        self.used = {node.name: 0 for node in self.node_snaps}
        # Nodes only some jobs may take (bought for them, see `fleet_replay`): name -> job ids.
        self.claims: dict[str, frozenset[int]] = {}
        if reference is not None:  # its own rule is the whole policy: no starvation bound
            policy, starvation_s = BACKFILL, math.inf
        self.policy = policy
        self.overhead = restart_overhead_s
        self.starvation_s = starvation_s
        self.levels = tuple(sorted(levels_gpu_s))
        self.min_run_s = min_run_s
        self.promote_after_s = promote_after_s
        self.promote_backlog = promote_backlog
        self.promote_stretch = promote_stretch
        self.promote_max_s = promote_max_s
        self.reference = reference
        self.time_cycles = time_cycles
        # With `record`: every cycle's (time, starts with placements, preempted job ids).
        self.record = record
        self.decisions: list[tuple[float, tuple, tuple]] = []
        quota = nodes * node_gpus if gpu_quota is None else gpu_quota
        self.tenants = (TenantSnap(name=TENANT, gpu_quota=quota),)
        self.queues = (QueueSnap(key=QUEUE, tenant=TENANT, policy=policy),)
        self.jobs: dict[int, ReplayJob] = {}
        for trace in jobs:
            if trace.id in self.jobs:
                raise ValueError(f"job {trace.id} appears twice in the trace")
            g, r = job_shape(trace.gpus, node_gpus)
            self.jobs[trace.id] = ReplayJob(trace, g, r)
        self.pending: dict[int, ReplayJob] = {}
        self.running: dict[int, ReplayJob] = {}
        self.events: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.wake_at = math.inf
        self.allocated = 0
        # The job id its wake-ups carry: replays sharing one event heap tell theirs apart.
        self.tag = tag
        self.cycles = 0
        self.reservations: tuple[Reservation, ...] = ()  # the last cycle's
        self.cycle_s: list[float] = []
        self.backlog: list[int] = []

    # -- events -------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, job_id: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, kind, self._seq, job_id))

    def wake(self, at: float) -> None:
        """Ask for a cycle at `at` (policies whose decisions change with time alone)."""
        if at < self.wake_at:
            self.wake_at = at
            self._push(at, WAKE, self.tag)

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> ReplayResult:
        for job in self.jobs.values():
            self._push(job.trace.submitted_at, ARRIVE, job.trace.id)
        waiting_alloc = waiting_cap = 0.0
        capacity = len(self.node_snaps) * self.node_gpus
        last = self.events[0][0] if self.events else 0.0
        while self.events:
            now = self.events[0][0]
            if self.pending:
                waiting_alloc += self.allocated * (now - last)
                waiting_cap += capacity * (now - last)
            last = now
            changed = False
            while self.events and self.events[0][0] == now:
                _, kind, _, job_id = heapq.heappop(self.events)
                if kind == ARRIVE:
                    self.arrive(self.jobs[job_id], now)
                    changed = True
                elif kind == END:
                    changed |= self._maybe_end(job_id, now)
                else:
                    changed |= self.woken(now)
            if changed and self.pending:
                self.cycle(now)
        return self._result(self.cycles, waiting_alloc, waiting_cap, self.cycle_s, self.backlog)

    def arrive(self, job: ReplayJob, now: float) -> None:
        job.queued_at = now
        job.snap = None
        self.pending[job.trace.id] = job

    def woken(self, now: float) -> bool:
        """A wake-up event came: True when it is the one asked for last."""
        if now >= self.wake_at:
            self.wake_at = math.inf
            return True
        return False

    def cycle(self, now: float) -> None:
        """One scheduling cycle at `now`: the core decides, the replay applies."""
        snapshot = self._snapshot(now)
        bound = self._promotion_bound(snapshot) if self.policy == FAIR else 0.0
        started = time.perf_counter() if self.time_cycles else 0.0
        decisions = schedule(snapshot, starvation_s=self.starvation_s,
                             levels_gpu_s=self.levels, min_run_s=self.min_run_s,
                             promote_after_s=self.promote_after_s,
                             promote_backlog=self.promote_backlog,
                             promote_stretch=self.promote_stretch,
                             promote_max_s=self.promote_max_s, explain=False)
        if self.time_cycles:
            self.cycle_s.append(time.perf_counter() - started)
            self.backlog.append(len(snapshot.pending))
        self.cycles += 1
        self.reservations = decisions.reservations
        if self.record:
            self.decisions.append((now, tuple(sorted(decisions.starts)),
                                   tuple(sorted(p.job_id for p in decisions.preemptions))))
        for preempt in decisions.preemptions:
            self._preempt(self.running[preempt.job_id], now)
        for start in decisions.starts:
            self._start(self.pending[start.job_id], start.placement, now)
        self._ask_wake(now, bound)

    # -- nodes coming and going (elastic capacity) ----------------------------------------------

    def add_node(self, name: str, claims: frozenset[int] = frozenset()) -> None:
        """A node joins, empty; only the `claims` jobs may take it while any of them waits."""
        if name in self.used:
            raise ConservationError(f"node {name} joined twice")
        self.node_snaps = (*self.node_snaps, NodeSnap(name=name, gpus=self.node_gpus))
        self.used[name] = 0
        if claims:
            self.set_claims(name, claims)

    def remove_node(self, name: str) -> None:
        """An empty node leaves."""
        if self.used.pop(name) != 0:
            raise ConservationError(f"node {name} left with work on it")
        self.node_snaps = tuple(node for node in self.node_snaps if node.name != name)
        self.set_claims(name, frozenset())

    def set_claims(self, name: str, claims: frozenset[int]) -> None:
        if claims:
            self.claims[name] = claims
        else:
            self.claims.pop(name, None)
        for job in self.pending.values():  # their excluded nodes change
            job.snap = None

    def _promotion_bound(self, snapshot: Snapshot) -> float:
        """The trace's tenant's promotion bound, as the core computes it from `snapshot`."""
        return promotion_bounds(
            snapshot, self.promote_after_s, self.promote_backlog, self.promote_stretch,
            self.promote_max_s,
        ).get(TENANT, self.promote_after_s)

    def _ask_wake(self, now: float, bound_before: float) -> None:
        """The next moment a decision could change with nothing arriving or ending: a running
        job's attained service crossing a level, a minimum run ending, a wait reaching the
        starvation or the promotion bound, or at once when the cycle's starts and preemptions
        moved the promotion bound across a job's total wait. Only while jobs wait: otherwise
        nothing is there to decide."""
        if not self.pending:
            return
        candidates = []
        if self.policy == FAIR and self.levels:
            for job in self.running.values():
                assert job.started_at is not None
                gpus = job.gpus_per_replica * job.replicas
                held = job.attained_gpu_s + gpus * (now - job.started_at)
                for level in self.levels:
                    if level > held:
                        candidates.append(now + (level - held) / gpus)
                        break
                if now - job.started_at < self.min_run_s:
                    candidates.append(job.started_at + self.min_run_s)
            bound = self._promotion_bound(self._snapshot(now))
            waiting = [now - job.queued_at + job.queue_s for job in self.pending.values()]
            candidates += [now + bound - waited for waited in waiting if waited < bound]
            low, high = sorted((bound, bound_before))
            if low < high and any(
                low <= waited < high
                for waited in (*waiting, *(job.queue_s for job in self.running.values()))
            ):
                candidates.append(now)
        if self.reference is not None:
            candidates += [self.reference.changes_at(job, now) for job in self.running.values()]
        oldest = min(job.queued_at for job in self.pending.values())
        if oldest + self.starvation_s > now:
            candidates.append(oldest + self.starvation_s)
        if candidates:
            self.wake(min(candidates) + 1e-6)

    def _snapshot(self, now: float) -> Snapshot:
        running = []
        for job in self.running.values():
            if job.snap is None or self.reference is not None:
                job.snap = self._snap(job, now)
            running.append(job.snap)
        pending = []
        for job in self.pending.values():
            if job.snap is None:
                job.snap = self._snap(job, now)
            pending.append(job.snap)
        return Snapshot(
            now=now, nodes=self.node_snaps, tenants=self.tenants, queues=self.queues,
            running=tuple(running), pending=tuple(pending),
        )

    def _snap(self, job: ReplayJob, now: float) -> JobSnap:
        priority, since = 0, job.queued_at
        if self.reference is not None:
            priority, since = self.reference.rank(job, now), self.reference.since(job, now)
        excluded = frozenset(
            name for name, ids in self.claims.items() if job.trace.id not in ids
        ) if self.claims and job.started_at is None else frozenset()
        return JobSnap(
            id=job.trace.id, tenant=TENANT, queue=QUEUE, priority=priority,
            submitted_at=since, gpus_per_replica=job.gpus_per_replica,
            replicas=job.replicas, cpu_per_replica=0, memory_mib_per_replica=0,
            placement=job.placement, started_at=job.started_at,
            attained_gpu_s=job.attained_gpu_s, waited_s=job.queue_s, excluded_nodes=excluded,
        )

    # -- applying decisions -------------------------------------------------------------------

    def _start(self, job: ReplayJob, placement: tuple[str, ...], now: float) -> None:
        if len(placement) != job.replicas:
            raise ConservationError(f"job {job.trace.id} placed {len(placement)} replicas")
        for name in placement:
            self.used[name] += job.gpus_per_replica
            if self.used[name] > self.node_gpus:
                raise ConservationError(f"node {name} over-allocated by job {job.trace.id}")
        del self.pending[job.trace.id]
        job.queue_s += now - job.queued_at
        overhead = self.overhead if job.starts else 0.0
        job.starts += 1
        job.started_at = now
        job.run_from = now + overhead
        job.placement = placement
        job.snap = None
        self.running[job.trace.id] = job
        self.allocated += job.gpus_per_replica * job.replicas
        end = job.run_from + (job.trace.duration_s - job.done_s)
        self._push(end, END, job.trace.id)

    def _release(self, job: ReplayJob, now: float) -> None:
        assert job.started_at is not None
        gpus = job.gpus_per_replica * job.replicas
        for name in job.placement:
            self.used[name] -= job.gpus_per_replica
        self.allocated -= gpus
        held = now - job.started_at
        job.attained_gpu_s += gpus * held
        job.overhead_gpu_s += job.trace.gpus * min(held, job.run_from - job.started_at)
        job.done_s += max(0.0, now - job.run_from)
        del self.running[job.trace.id]
        job.placement, job.started_at, job.snap = (), None, None

    def _preempt(self, job: ReplayJob, now: float) -> None:
        self._release(job, now)
        job.preemptions += 1
        job.queued_at = now
        self.pending[job.trace.id] = job

    def _maybe_end(self, job_id: int, now: float) -> bool:
        """An END event ends the job if it is still the attempt that scheduled it."""
        job = self.running.get(job_id)
        if job is None:
            return False
        if job.run_from + (job.trace.duration_s - job.done_s) > now + 1e-6:
            return False  # an earlier attempt's end: this one was preempted and restarted
        if job.finished_at is not None:
            raise ConservationError(f"job {job_id} ended twice")
        self._release(job, now)
        job.finished_at = now
        return True

    def _result(self, cycles: int, waiting_alloc: float, waiting_cap: float,
                cycle_s: list[float], backlog: list[int]) -> ReplayResult:
        jobs = list(self.jobs.values())
        ends = [job.finished_at for job in jobs if job.finished_at is not None]
        if len(ends) < len(jobs):
            unfinished = [job.trace.id for job in jobs if job.finished_at is None]
            raise ConservationError(f"{len(unfinished)} jobs never finished: {unfinished[:5]}")
        trace_gpu_s = sum(job.trace.gpus * job.trace.duration_s for job in jobs)
        overhead = sum(job.overhead_gpu_s for job in jobs)
        run_gpu_s = sum(
            job.trace.gpus * job.attained_gpu_s / (job.gpus_per_replica * job.replicas)
            for job in jobs
        )
        if not math.isclose(run_gpu_s, trace_gpu_s + overhead, rel_tol=1e-6, abs_tol=1e-3):
            raise ConservationError(
                f"GPU-seconds run {run_gpu_s:.1f} != trace {trace_gpu_s:.1f} + restart "
                f"overheads {overhead:.1f}"
            )
        first = min((job.trace.submitted_at for job in jobs), default=0.0)
        return ReplayResult(
            jobs=len(jobs),
            jct_s=[end - job.trace.submitted_at for end, job in zip(ends, jobs, strict=True)],
            queue_s=[job.queue_s for job in jobs],
            durations_s=[job.trace.duration_s for job in jobs],
            preemptions=sum(job.preemptions for job in jobs),
            makespan_s=max(ends, default=first) - first,
            cycles=cycles,
            waiting_allocated_gpu_s=waiting_alloc,
            waiting_capacity_gpu_s=waiting_cap,
            run_gpu_s=run_gpu_s,
            trace_gpu_s=trace_gpu_s,
            overhead_gpu_s=overhead,
            cycle_s=cycle_s,
            backlog=backlog,
        )


def remaining_s(job: ReplayJob, now: float, overhead_s: float) -> float:
    """Seconds the job still needs to finish, restart overhead included: what only an oracle
    knows."""
    if job.started_at is None:  # waiting
        return job.trace.duration_s - job.done_s + (overhead_s if job.starts else 0.0)
    return job.run_from + (job.trace.duration_s - job.done_s) - now
