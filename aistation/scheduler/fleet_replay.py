"""Replaying a trace on a fleet: several clusters behind the dispatcher, and an elastic pool.

Each cluster is a `Replay` (the same core and model of work as `replay`), all on one event heap.
Arrivals are dispatched (`dispatch.Dispatcher`) to a cluster, whose own cycle places them. After
every change the jobs that wait, taken in the order the policy would start them
(`dispatch.move_order`), move to another cluster that would start them now: where its gang
fits in the free capacity, or, for a job the default policy puts first (attained service below
its first level), where the work it would preempt is while nothing here is (the first to admit
wins: a job is on one cluster's queue at any time, so it never runs twice). With
`move_preempted` (the default) a preempted job may move too: it resumes from its checkpoint
wherever it restarts, as MultiKueue re-dispatches an evicted workload; the platform keeps a job
that failed and is retrying on its cluster.

With a pool, jobs that fit nowhere get nodes bought for them (`scaling.plan_scale_up`): the nodes
boot for `boot_s`, then join the pool's cluster claimed by those jobs; empty nodes go back after
the cool-down (`scaling.scale_down`). GPU-seconds paid count every node from its
request until it is returned, boot and idle time included.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .dispatch import ClusterView, Dispatcher, move_order
from .placement import Cluster, shape_of
from .policies import DEFAULT_LEVELS_GPU_S, DEFAULT_MIN_RUN_S, FAIR
from .replay import (
    ARRIVE,
    END,
    QUEUE,
    TENANT,
    ConservationError,
    Replay,
    ReplayJob,
    TraceJob,
    job_shape,
)
from .scaling import (
    DEFAULT_COOL_DOWN_S,
    NodeShape,
    OpenRoom,
    PoolNode,
    plan_scale_up,
    scale_down,
)
from .types import JobSnap, NodeSnap, Snapshot

READY, CHECK = 3, 4  # event kinds after replay's ARRIVE, END and WAKE


@dataclass(frozen=True)
class Pool:
    """An elastic pool of up to `max_nodes` nodes that join `cluster`."""

    cluster: str
    max_nodes: int
    boot_s: float = 300.0
    cool_down_s: float = DEFAULT_COOL_DOWN_S


@dataclass
class _Bought:
    name: str
    requested_at: float
    ready_at: float | None = None
    returned_at: float | None = None
    empty_since: float | None = None
    claims: set[int] = field(default_factory=set)


@dataclass
class FleetResult:
    jobs: int
    jct_s: list[float]
    queue_s: list[float]
    preemptions: int
    makespan_s: float
    gpu_s_paid: float
    dispatch_s: list[float]
    double_starts: int
    moves: int
    scale_ups: int = 0
    nodes_bought: int = 0
    scale_downs: int = 0
    returned_within_cool_down: int = 0
    peak_pool_nodes: int = 0


class _Member(Replay):
    """One cluster of the fleet: tells the fleet of every start, so it can check for twice, and
    of its starvation reservations, which another cluster's cycle does not repeat."""

    fleet: FleetReplay
    name: str

    def _snapshot(self, now: float) -> Snapshot:
        snapshot = super()._snapshot(now)
        held = {queue: f"job {job} on {where}"
                for queue, (where, job) in self.fleet.reserver.items() if where != self.name}
        return replace(snapshot, reserved_elsewhere=held) if held else snapshot

    def cycle(self, now: float) -> None:
        super().cycle(now)
        reserver = self.fleet.reserver
        for queue in [q for q, (where, _) in reserver.items() if where == self.name]:
            del reserver[queue]
        for reservation in self.reservations:
            reserver[reservation.queue] = (self.name, reservation.job_id)

    def _start(self, job: ReplayJob, placement: tuple[str, ...], now: float) -> None:
        self.fleet.started(self, job)
        super()._start(job, placement, now)


class FleetReplay:
    def __init__(self, jobs: Sequence[TraceJob], *, clusters: dict[str, int], node_gpus: int = 8,
                 policy: str = FAIR, restart_overhead_s: float = 60.0, pool: Pool | None = None,
                 redispatch: bool = True, move_preempted: bool = True) -> None:
        self.node_gpus = node_gpus
        self.pool = pool
        self.redispatch = redispatch
        self.move_preempted = move_preempted
        # What the default policy puts a new job before (see `_views`).
        self.first_level = DEFAULT_LEVELS_GPU_S[0] if policy == FAIR else 0.0
        self.min_run_s = DEFAULT_MIN_RUN_S
        extra = pool.max_nodes if pool else 0
        quota = (sum(clusters.values()) + extra) * node_gpus  # per fleet, never the binding limit
        self.events: list = []
        self.members: dict[str, _Member] = {}
        self.by_tag: dict[int, _Member] = {}
        for i, (name, nodes) in enumerate(clusters.items()):
            member = _Member([], nodes=nodes, node_gpus=node_gpus, policy=policy,
                             restart_overhead_s=restart_overhead_s, node_prefix=f"{name}-",
                             gpu_quota=quota, tag=-(i + 1))
            member.fleet, member.name = self, name
            member.events = self.events  # one heap: every member pushes its ends and wake-ups
            self.members[name] = member
            self.by_tag[member.tag] = member
        if pool is not None and pool.cluster not in self.members:
            raise ValueError(f"the pool joins {pool.cluster!r}, which is not in the fleet")
        self.jobs: dict[int, ReplayJob] = {}
        for trace in jobs:
            g, r = job_shape(trace.gpus, node_gpus)
            self.jobs[trace.id] = ReplayJob(trace, g, r)
        self.where: dict[int, str] = {}
        self.reserver: dict[str, tuple[str, int]] = {}  # queue -> (cluster, job) reserved for
        self.base_nodes = sum(clusters.values())
        self.bought: dict[str, _Bought] = {}
        self.requests: list[list[str]] = []
        self.claimed: dict[int, set[str]] = {}  # job id -> pool nodes it claims
        self.dispatch_s: list[float] = []
        self.double_starts = 0
        self.moves = 0
        self.scale_ups = 0
        self.scale_downs = 0
        self.early_returns = 0
        self.peak = 0
        self._seq = 0

    def _push(self, at: float, kind: int, ident: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, kind, -self._seq, ident))

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> FleetResult:
        for job in self.jobs.values():
            self._push(job.trace.submitted_at, ARRIVE, job.trace.id)
        while self.events:
            now = self.events[0][0]
            changed: dict[int, _Member] = {}
            arrivals: list[ReplayJob] = []
            while self.events and self.events[0][0] == now:
                _, kind, _, ident = heapq.heappop(self.events)
                if kind == ARRIVE:
                    arrivals.append(self.jobs[ident])
                elif kind == END:
                    member = self.members[self.where[ident]]
                    if member._maybe_end(ident, now):
                        changed[member.tag] = member
                elif kind == READY:
                    member = self._ready(ident, now)
                    changed[member.tag] = member
                elif kind == CHECK:
                    self._scale_down(now)
                else:
                    member = self.by_tag[ident]
                    if member.woken(now):
                        changed[member.tag] = member
            if arrivals:
                for member in self._dispatch(arrivals, now):
                    changed[member.tag] = member
            for member in changed.values():
                if member.pending:
                    member.cycle(now)
            self._settle(now)
        return self._result()

    def started(self, member: _Member, job: ReplayJob) -> None:
        """Every start passes here: a job starting where it is not dispatched, or while it
        runs elsewhere, is a double start."""
        ident = job.trace.id
        if self.where.get(ident) != member.name or any(
                ident in other.running for other in self.members.values() if other is not member):
            self.double_starts += 1

    # -- dispatch -----------------------------------------------------------------------------

    def _views(self, now: float) -> list[ClusterView]:
        views = []
        for name, member in self.members.items():
            views.append(ClusterView(
                name=name,
                nodes=tuple(NodeSnap(n.name, n.gpus, schedulable=n.name not in member.claims)
                            for n in member.node_snaps),
                held=tuple((node, job.gpus_per_replica, 0.0, 0)
                           for job in member.running.values() for node in job.placement),
                queued_gpus=sum(j.gpus_per_replica * j.replicas for j in member.pending.values()
                                if j.attained_gpu_s < self.first_level),
                preemptible_gpus=sum(
                    j.gpus_per_replica * j.replicas for j in member.running.values()
                    if now - (j.started_at or now) >= self.min_run_s and j.attained_gpu_s
                    + j.gpus_per_replica * j.replicas * (now - (j.started_at or now))
                    >= self.first_level) if self.first_level else 0,
            ))
        return views

    def _dispatch(self, arrivals: list[ReplayJob], now: float) -> list[_Member]:
        started = time.perf_counter()
        choices: list[tuple[ReplayJob, str | None]]
        if len(self.members) == 1:
            (only,) = self.members
            choices = [(job, only) for job in arrivals]
        else:
            dispatcher = Dispatcher(self._views(now))
            choices = [(job, dispatcher.choose(self._snap(job)).cluster) for job in arrivals]
        self.dispatch_s.append((time.perf_counter() - started) / len(arrivals))
        touched = []
        for job, name in choices:
            if name is None:
                raise ConservationError(f"job {job.trace.id} fits no cluster of the fleet")
            member = self.members[name]
            member.arrive(job, now)
            self.where[job.trace.id] = name
            touched.append(member)
        return touched

    @staticmethod
    def _snap(job: ReplayJob) -> JobSnap:
        """The job as the dispatcher and the pool see it: its shape, no claims."""
        return JobSnap(id=job.trace.id, tenant=TENANT, queue=QUEUE, priority=0,
                       submitted_at=job.trace.submitted_at,
                       gpus_per_replica=job.gpus_per_replica, replicas=job.replicas,
                       cpu_per_replica=0, memory_mib_per_replica=0)

    def _settle(self, now: float) -> None:
        """After the cycles: drop the claims of jobs that started, move waiting jobs to where
        they start now, buy nodes for the rest, and note the pool's empty nodes."""
        for ident in [i for i in self.claimed if self.jobs[i].started_at is not None
                      or self.jobs[i].finished_at is not None]:
            self._unclaim(ident)
        if self.redispatch and len(self.members) > 1:
            self._move_waiting(now)
        if self.pool is not None:
            self._scale_up(now)
            self._note_empty(now)

    def _move_waiting(self, now: float) -> None:
        free = {name: len(m.node_snaps) * self.node_gpus - m.allocated
                for name, m in self.members.items()}
        if not any(free.values()) or not any(m.pending for m in self.members.values()):
            return
        dispatcher: Dispatcher | None = None
        moved: dict[int, _Member] = {}
        first = self.first_level or None  # None: not a fair queue
        waiting = sorted(((job, name, member) for name, member in self.members.items()
                          for job in member.pending.values()
                          if (job.starts == 0 or self.move_preempted)
                          and job.trace.id not in self.claimed),
                         key=lambda w: move_order(priority=0, attained_gpu_s=w[0].attained_gpu_s,
                                                  queued_at=w[0].queued_at, ident=w[0].trace.id,
                                                  first_level=first))
        for job, name, member in waiting:
            need = job.gpus_per_replica * job.replicas
            if not any(f >= need for other, f in free.items() if other != name):
                continue
            dispatcher = dispatcher or Dispatcher(self._views(now))
            started = time.perf_counter()
            choice = dispatcher.choose(self._snap(job), exclude=frozenset({name}))
            self.dispatch_s.append(time.perf_counter() - started)
            if choice.cluster is None or not (choice.fits_now or (
                    choice.ahead < 0 <= dispatcher.ahead(self._snap(job), name))):
                continue
            target = self.members[choice.cluster]
            del member.pending[job.trace.id]
            if self.reserver.get(QUEUE) == (name, job.trace.id):
                del self.reserver[QUEUE]
            job.queue_s += now - job.queued_at
            target.arrive(job, now)
            self.where[job.trace.id] = choice.cluster
            free[choice.cluster] -= need
            self.moves += 1
            moved[target.tag] = target
        for target in moved.values():
            target.cycle(now)

    # -- the elastic pool ---------------------------------------------------------------------

    def _scale_up(self, now: float) -> None:
        assert self.pool is not None
        member = self.members[self.pool.cluster]
        candidates = [j for j in member.pending.values() if j.trace.id not in self.claimed]
        if not candidates:
            return
        capacity = Cluster(tuple(NodeSnap(n.name, n.gpus, schedulable=n.name not in member.claims)
                                 for n in member.node_snaps))
        for job in member.running.values():
            for node in job.placement:
                capacity.take(capacity.index_of[node], job.gpus_per_replica, 0.0, 0)
        capacity.build_index()
        snaps = [self._snap(j) for j in sorted(candidates, key=lambda j: (j.queued_at,
                                                                          j.trace.id))]
        waiting = [s for s in snaps if capacity.place(shape_of(s), None) is None]
        if not waiting:
            return
        live = [b for b in self.bought.values() if b.returned_at is None]
        room = [OpenRoom(b.name, self.node_gpus - sum(
            self.jobs[i].gpus_per_replica for i in b.claims), claims=sorted(b.claims))
            for b in live if b.ready_at is None]
        plan = plan_scale_up(waiting, NodeShape(self.node_gpus),
                             max_new_nodes=self.pool.max_nodes - len(live), open_room=room)
        for ident, (name,) in plan.rides.items():
            self._claim(ident, [name])
        for request in plan.requests:
            names = []
            for _ in range(request.nodes):
                name = f"{self.pool.cluster}-p{len(self.bought):05d}"
                self.bought[name] = _Bought(name, requested_at=now)
                names.append(name)
            self.requests.append(names)
            for ident in request.jobs:
                self._claim(ident, names if len(request.jobs) == 1 else names[:1])
            self._push(now + self.pool.boot_s, READY, len(self.requests) - 1)
            self.scale_ups += 1
        self.peak = max(self.peak, sum(b.returned_at is None for b in self.bought.values()))

    def _claim(self, ident: int, names: list[str]) -> None:
        self.claimed.setdefault(ident, set()).update(names)
        for name in names:
            self.bought[name].claims.add(ident)

    def _unclaim(self, ident: int) -> None:
        assert self.pool is not None
        member = self.members[self.pool.cluster]
        for name in self.claimed.pop(ident):
            bought = self.bought[name]
            bought.claims.discard(ident)
            if bought.ready_at is not None and bought.returned_at is None:
                member.set_claims(name, frozenset(bought.claims))

    def _ready(self, request: int, now: float) -> _Member:
        assert self.pool is not None
        member = self.members[self.pool.cluster]
        for name in self.requests[request]:
            bought = self.bought[name]
            bought.ready_at = now
            member.add_node(name, frozenset(bought.claims))
        return member

    def _note_empty(self, now: float) -> None:
        assert self.pool is not None
        member = self.members[self.pool.cluster]
        for bought in self.bought.values():
            if bought.ready_at is None or bought.returned_at is not None:
                continue
            empty = member.used[bought.name] == 0 and not bought.claims
            if not empty:
                bought.empty_since = None
            elif bought.empty_since is None:
                bought.empty_since = now
                self._push(max(now, bought.requested_at) + self.pool.cool_down_s + 1e-6,
                           CHECK, -1)

    def _scale_down(self, now: float) -> None:
        assert self.pool is not None
        member = self.members[self.pool.cluster]
        nodes = [PoolNode(b.name, b.requested_at, b.empty_since) for b in self.bought.values()
                 if b.ready_at is not None and b.returned_at is None]
        for name in scale_down(nodes, now, self.pool.cool_down_s):
            bought = self.bought[name]
            if now - (bought.empty_since or now) < self.pool.cool_down_s - 1e-6:
                self.early_returns += 1
            member.remove_node(name)
            bought.returned_at = now
            self.scale_downs += 1

    # -- the figures --------------------------------------------------------------------------

    def _result(self) -> FleetResult:
        jobs = list(self.jobs.values())
        unfinished = [job.trace.id for job in jobs if job.finished_at is None]
        if unfinished:
            raise ConservationError(f"{len(unfinished)} jobs never finished: {unfinished[:5]}")
        first = min((job.trace.submitted_at for job in jobs), default=0.0)
        end = max((job.finished_at or 0.0 for job in jobs), default=first)
        trace_gpu_s = sum(job.trace.gpus * job.trace.duration_s for job in jobs)
        overhead = sum(job.overhead_gpu_s for job in jobs)
        run_gpu_s = sum(job.trace.gpus * job.attained_gpu_s / (job.gpus_per_replica * job.replicas)
                        for job in jobs)
        if not math.isclose(run_gpu_s, trace_gpu_s + overhead, rel_tol=1e-6, abs_tol=1e-3):
            raise ConservationError(f"GPU-seconds run {run_gpu_s:.1f} != trace {trace_gpu_s:.1f}"
                                    f" + restart overheads {overhead:.1f}")
        paid = self.base_nodes * self.node_gpus * (end - first) + self.node_gpus * sum(
            (b.returned_at if b.returned_at is not None else end) - b.requested_at
            for b in self.bought.values())
        return FleetResult(
            jobs=len(jobs),
            jct_s=[(job.finished_at or 0.0) - job.trace.submitted_at for job in jobs],
            queue_s=[job.queue_s for job in jobs],
            preemptions=sum(job.preemptions for job in jobs),
            makespan_s=end - first, gpu_s_paid=paid, dispatch_s=self.dispatch_s,
            double_starts=self.double_starts, moves=self.moves, scale_ups=self.scale_ups,
            nodes_bought=len(self.bought), scale_downs=self.scale_downs,
            returned_within_cool_down=self.early_returns, peak_pool_nodes=self.peak,
        )
