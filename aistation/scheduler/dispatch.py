"""Choosing the cluster of a fleet a job goes to: the dispatcher's rule, pure like the core.

A fleet's queue spans several clusters. Each job is dispatched to one of them, and that cluster's
own cycle then places it on nodes (`schedule`). The rule, in order:

1. only clusters that can run it (their drivers' features), answer, have the job's GPU model and
   could ever hold its gang;
2. where the gang fits in the free capacity now: a cluster holding the job's data first, then the
   best fit (the fewest GPUs left free after it, as nodes are chosen within a cluster), so the
   emptiest cluster keeps its room for the next large gang;
3. else where it would start soonest: the least GPU demand ahead of it for each GPU of the
   cluster, `(GPUs waiting there before it + its GPUs - GPUs free there - GPUs it could take
   by preemption there) / GPUs there` (the caller counts what its queue's policy puts before a
   new job and below it), with `MOVE_COST` added where its data is not (a tenth of the
   cluster's worth of work ahead).

Which jobs may move at all is the caller's to say (`aistation.services.fleets`: a job retrying
after a failure stays where it ran). Waiting jobs are offered other clusters in the order their
queue's policy would start them (`move_order`), so GPUs freed anywhere in the fleet go to the job
one cluster's cycle would have started there: under the default policy a new short job before a
long one that was preempted, not whichever has waited longest.

Every choice says where it went and why in words ("dispatched to gpu-east: 16 H100 free; gpu-west
has 4"). Jobs dispatched in one pass see each other: a job that fits takes its GPUs from that
cluster's free capacity, one that waits adds to its line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .placement import Cluster, shape_of
from .types import JobSnap, NodeSnap

# A cluster without the job's data counts as this much more work queued ahead per GPU there.
MOVE_COST = 0.1


@dataclass(frozen=True)
class ClusterView:
    """A cluster as the dispatcher sees it: its nodes, what work holds on them, its line."""

    name: str
    nodes: tuple[NodeSnap, ...]
    # (node name, GPUs, CPU cores, MiB[, RDMA devices]) held by each admitted or running
    # replica there.
    held: tuple[tuple[str, int, float, int] | tuple[str, int, float, int, int], ...] = ()
    queued_gpus: int = 0  # GPUs asked by the jobs waiting there that go before a new one
    # GPUs a new job could take there by preemption (work its queue's policy puts below it).
    preemptible_gpus: int = 0
    alive: bool = True  # answers its driver (lost clusters take no work)
    # What its driver cannot do ({feature: why}, as the driver says): jobs needing it go
    # elsewhere.
    unsupported: dict[str, str] = field(default_factory=dict, compare=False)


class Choice(NamedTuple):
    job_id: int
    cluster: str | None  # None: no cluster of the fleet can take it
    fits_now: bool
    reason: str
    # Where it does not fit now: GPU demand ahead of it per GPU of the cluster chosen (below 0:
    # it could start there now by preemption).
    ahead: float = 0.0


class _Member:
    __slots__ = ("capacity", "free", "gpus", "models", "name", "never", "queued", "taken",
                 "view")

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.name = view.name
        self.capacity = Cluster(view.nodes)
        for entry in view.held:
            index = self.capacity.index_of.get(entry[0])
            if index is not None:
                rdma = entry[4] if len(entry) > 4 else 0  # type: ignore[misc]
                self.capacity.take(index, entry[1], entry[2], entry[3], rdma)
        self.capacity.build_index()
        # An empty copy answers "could it ever hold this gang here?".
        self.never = Cluster(view.nodes)
        self.never.build_index()
        self.gpus = sum(n.gpus for n in view.nodes if n.schedulable) or 1
        self.queued = view.queued_gpus
        self.taken = -view.preemptible_gpus
        self.models = {n.gpu_model for n in view.nodes if n.schedulable}
        # Free GPUs of its schedulable nodes by model ("" for all), kept as jobs are placed.
        cap = self.capacity
        self.free: dict[str, int] = {"": 0}
        for i, model in enumerate(cap.node_model):
            if cap.in_index[i]:
                free = max(0, cap.free_gpus[i])
                self.free[""] += free
                self.free[model] = self.free.get(model, 0) + free

    def free_gpus(self, model: str) -> int:
        return self.free.get(model, 0)

    def commit(self, picked, shape) -> None:
        self.capacity.commit(picked, shape)
        for node, count in picked:
            gpus = shape[1] * count
            self.free[""] -= gpus
            model = self.capacity.node_model[node]
            self.free[model] = self.free.get(model, 0) - gpus


class Dispatcher:
    """The fleet's clusters for one pass of dispatching (a batch of jobs, one after another)."""

    def __init__(self, clusters: Iterable[ClusterView]) -> None:
        self.members = {view.name: _Member(view) for view in clusters}

    def choose(self, job: JobSnap, *, data_at: frozenset[str] = frozenset(),
               exclude: frozenset[str] = frozenset(),
               needs: dict[str, str] | None = None) -> Choice:
        """Where `job` goes (see the module's rule). `data_at`: clusters holding its datasets
        and checkpoints; `exclude`: clusters not to
        consider (the one it waits on, when asking whether another would start it now);
        `needs`: features a cluster must have ({feature: what of the job needs it})."""
        shape = shape_of(job)
        needs = needs or {}
        eligible, refused = [], []
        for member in self.members.values():
            if member.name in exclude:
                continue
            lacking = [f for f in needs if f in member.view.unsupported]
            if lacking:
                refused.append(f"{member.name} cannot run {needs[lacking[0]]} "
                               f"({member.view.unsupported[lacking[0]]})")
            elif not member.view.alive:
                refused.append(f"{member.name} is not answering")
            elif job.gpu_model and job.gpu_model not in member.models:
                refused.append(f"{member.name} has no {job.gpu_model}")
            elif member.never.place(shape, None) is None:
                refused.append(f"{member.name} is too small for {_gang(job)}")
            else:
                eligible.append(member)
        if not eligible:
            why = "; ".join(refused) or "the fleet has no cluster"
            return Choice(job.id, None, False, f"no cluster can take it: {why}")
        fitting = []
        for member in eligible:
            picked = member.capacity.place(shape, None)
            if picked is not None:
                left = member.free_gpus(job.gpu_model) - job.gpus
                fitting.append((member.name not in data_at, left, member.name, member, picked))
        if fitting:
            fitting.sort(key=lambda f: f[:3])
            _, _, name, member, picked = fitting[0]
            free = member.free_gpus(job.gpu_model)
            others = [f"{m.name} has {m.free_gpus(job.gpu_model)}" for m in eligible
                      if m is not member] + refused
            reason = f"dispatched to {name}: {free} {_model(job, member)} free" + "".join(
                f"; {other}" for other in others) + (
                "; its data is there" if name in data_at and len(data_at) < len(eligible)
                else "")
            member.commit(picked, shape)
            return Choice(job.id, name, True, reason)
        scored = sorted((self._ahead(m, job) + (0.0 if m.name in data_at else MOVE_COST),
                         m.name, m) for m in eligible)
        ahead, name, member = scored[0]
        member.queued += job.gpus
        lines = ", ".join(f"{m.name} {m.free_gpus(job.gpu_model)} free of {m.gpus}"
                          for _, _, m in scored)
        return Choice(job.id, name, False,
                      f"queued on {name}: {_gang(job)} fit nowhere now ({lines}); {name} "
                      f"would start it soonest", ahead)

    @staticmethod
    def _ahead(member: _Member, job: JobSnap) -> float:
        return (member.queued + member.taken + job.gpus - member.free_gpus(job.gpu_model)) \
            / member.gpus

    def ahead(self, job: JobSnap, cluster: str) -> float:
        """GPU demand ahead of `job` per GPU of `cluster` (below 0: it starts there now)."""
        return self._ahead(self.members[cluster], job)

    def fits_now(self, job: JobSnap, cluster: str) -> bool:
        member = self.members.get(cluster)
        return member is not None and member.view.alive and \
            member.capacity.place(shape_of(job), None) is not None


def _model(job: JobSnap, member: _Member) -> str:
    if job.gpu_model:
        return job.gpu_model
    return next(iter(member.models)) if len(member.models) == 1 else "GPUs"


def _gang(job: JobSnap) -> str:
    model = f" {job.gpu_model}" if job.gpu_model else ""
    if job.replicas == 1:
        return f"its {job.gpus}{model} GPU{'s' if job.gpus != 1 else ''}"
    return f"its gang of {job.replicas} x {job.gpus_per_replica}{model} GPUs"


def move_order(*, priority: int, attained_gpu_s: float, queued_at: float, ident: int,
               first_level: float | None) -> tuple[int, bool, float, float, int]:
    """The sort key of a waiting job offered other clusters: higher priority first; in a fair
    queue (`first_level`: the policy's first level, in GPU-seconds) work below the first level
    before the rest, then the least attained service; then the oldest (`queued_at`, the time its
    wait began, in seconds). The policy's promotion and starvation bounds are left out: each
    cluster's own cycle applies them, and ordering moves by them made fleets slower in the
    replay (bench/fleet_replay.py)."""
    if first_level is None:  # fifo and backfill: priority, then submission order
        return (-priority, False, 0.0, queued_at, ident)
    return (-priority, attained_gpu_s >= first_level, attained_gpu_s, queued_at, ident)


def dispatch(jobs: Sequence[JobSnap], clusters: Iterable[ClusterView], *,
             data_at: dict[int, frozenset[str]] | None = None) -> list[Choice]:
    """Dispatch `jobs` in order (the queue's order) over `clusters`: one choice per job."""
    dispatcher = Dispatcher(clusters)
    data_at = data_at or {}
    return [dispatcher.choose(job, data_at=data_at.get(job.id, frozenset())) for job in jobs]
