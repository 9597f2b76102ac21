"""Choosing what to preempt: the fewest running jobs, taken in the caller's order, whose removal
lets one pending job start this cycle. It simulates before anything is decided, so nothing is ever
preempted for nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .placement import EPS, Cluster, Shape
from .types import JobSnap

# What the pending job's admission needs given back, and what removing a running job gives back
# to it: GPUs of its queue's limit, of its tenant's quota, of its tenant's limit for its GPU
# model; CPU cores, MiB and RDMA devices of its tenant's CPU, memory and RDMA quotas.
Needs = tuple[int, int, int, float, int, int]
Gains = Callable[["RunningJob"], Needs]
NO_NEEDS: Needs = (0, 0, 0, 0.0, 0, 0)


@dataclass(eq=False, slots=True)
class RunningJob:
    job: JobSnap
    nodes: tuple[int | None, ...]  # node number per replica; None for a node not in the snapshot
    model_gpus: dict[str, int] = field(default_factory=dict)  # GPUs held per node GPU model
    rank: int = 0  # its priority and level (`policies.Ranks`): lower ranks are preempted first
    young: bool = False  # within its minimum run: preempted only for a higher priority
    preempted: bool = False


class _Simulation:
    """The pending job's room (replicas it could place) and admission headroom, with a set of
    running jobs taken away; jobs are added and removed one at a time."""

    def __init__(
        self, cluster: Cluster, shape: Shape, allowed: frozenset[str] | None, needs: Needs
    ) -> None:
        self.cluster = cluster
        self.shape = shape
        self.allowed = allowed
        self.needs = needs
        self.got = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        self.slots = cluster.slots_now(shape, allowed)
        self.freed: dict[int, list[float]] = {}  # node -> [gpus, cpu, mem, rdma] given back
        self.counted: dict[int, int] = {}  # node -> replicas it adds to self.slots
        self._eligible: dict[int, bool] = {}

    def nodes_of(self, running: RunningJob) -> list[int]:
        """The nodes of the running job that the pending job could use (one per replica)."""
        eligible = self._eligible
        found = []
        for node in running.nodes:
            if node is None:
                continue
            ok = eligible.get(node)
            if ok is None:
                ok = eligible[node] = self.cluster.eligible(
                    node, self.shape[0], self.shape[5], self.allowed
                )
            if ok:
                found.append(node)
        return found

    def change(
        self, running: RunningJob, gains: Needs, nodes: list[int], sign: int
    ) -> None:
        got = self.got
        got[0] += sign * gains[0]
        got[1] += sign * gains[1]
        got[2] += sign * gains[2]
        got[3] += sign * gains[3]
        got[4] += sign * gains[4]
        got[5] += sign * gains[5]
        if not nodes:
            return
        job = running.job
        dg = sign * job.gpus_per_replica
        dc = sign * job.cpu_per_replica
        dm = sign * job.memory_mib_per_replica
        dd = sign * job.rdma_per_replica
        freed, counted = self.freed, self.counted
        for node in nodes:
            back = freed.get(node)
            if back is None:
                back = freed[node] = [0.0, 0.0, 0.0, 0.0]
            back[0] += dg
            back[1] += dc
            back[2] += dm
            back[3] += dd
        for node in set(nodes) if len(nodes) > 1 else nodes:
            back = freed[node]
            before = counted.get(node)
            if before is None:
                before = self._fitting(node, 0.0, 0.0, 0.0, 0.0)
            after = self._fitting(node, back[0], back[1], back[2], back[3])
            counted[node] = after
            self.slots += after - before

    def _fitting(self, node: int, dg: float, dc: float, dm: float, dd: float) -> int:
        cluster = self.cluster
        _, g, r, c, m, _, d = self.shape
        k = (cluster.free_gpus[node] + int(dg)) // g if g > 0 else r
        if c > 0:
            k = min(k, int((cluster.free_cpu[node] + dc + EPS) // c))
        if m > 0:
            k = min(k, int((cluster.free_mem[node] + dm) // m))
        if d > 0:
            k = min(k, (cluster.free_rdma[node] + int(dd)) // d)
        return k if k > 0 else 0

    def fits(self) -> bool:
        got, needs = self.got, self.needs
        return (
            self.slots >= self.shape[2]
            and got[0] >= needs[0]
            and got[1] >= needs[1]
            and got[2] >= needs[2]
            and got[3] + EPS >= needs[3]
            and got[4] >= needs[4]
            and got[5] >= needs[5]
        )


def fewest_victims(
    cluster: Cluster,
    shape: Shape,
    allowed: frozenset[str] | None,
    needs: Needs,
    candidates: Iterable[RunningJob],
    gains: Gains | None = None,
) -> list[RunningJob] | None:
    """The victims, or None when even all the candidates together would not let the job start.

    `needs` are what must come back to the job's queue limit, tenant quota, model limit, CPU,
    memory and RDMA quotas (0 or less: none), and `gains` says what each candidate gives back
    to them (None: it only makes room). Candidates already preempted are skipped; the others
    are taken in order until the job fits, then each earlier one is dropped again if the job
    still fits without it, so every victim kept is needed. Candidates that give back nothing
    the job needs are passed over."""
    need_queue, need_quota, need_model = needs[0] > 0, needs[1] > 0, needs[2] > 0
    need_cores = needs[3] > 0 or needs[4] > 0 or needs[5] > 0
    if shape[2] == 1 and not (need_queue or need_quota or need_model or need_cores):
        return _room_on_one_node(cluster, shape, allowed, candidates)
    sim = _Simulation(cluster, shape, allowed, needs)
    chosen: list[tuple[RunningJob, Needs, list[int]]] = []
    for running in candidates:
        if running.preempted:
            continue
        nodes = sim.nodes_of(running)
        gained = gains(running) if gains is not None else NO_NEEDS
        if not (
            nodes
            or (need_queue and gained[0])
            or (need_quota and gained[1])
            or (need_model and gained[2])
            or (need_cores and (gained[3] or gained[4] or gained[5]))
        ):
            continue
        sim.change(running, gained, nodes, +1)
        chosen.append((running, gained, nodes))
        if sim.fits():
            break
    else:
        return None
    kept = [chosen[-1][0]]
    # Drop the more valuable ones first (later in the caller's order) so the least valuable stay.
    for running, gained, nodes in reversed(chosen[:-1]):
        sim.change(running, gained, nodes, -1)
        if sim.fits():
            continue
        sim.change(running, gained, nodes, +1)
        kept.append(running)
    kept.reverse()
    return kept


def _room_on_one_node(
    cluster: Cluster,
    shape: Shape,
    allowed: frozenset[str] | None,
    candidates: Iterable[RunningJob],
) -> list[RunningJob] | None:
    """`fewest_victims` for the common case, one replica that only needs room: the same answer
    (the first node to have enough freed, in the candidates' order, then only the victims there
    that are needed), with sums instead of the general simulation."""
    model, g, _, c, m, excluded, d = shape
    free_gpus, free_cpu, free_mem = cluster.free_gpus, cluster.free_cpu, cluster.free_mem
    free_rdma = cluster.free_rdma
    freed: dict[int, list[float]] = {}  # node -> [gpus, cpu, mem, rdma] given back
    victims: dict[int, list[RunningJob]] = {}
    eligible: dict[int, bool] = {}

    def fits(node: int, gpus: float, cpu: float, mem: float, rdma: float) -> bool:
        return (
            free_gpus[node] + gpus >= g
            and (c <= 0 or free_cpu[node] + cpu + EPS >= c)
            and (m <= 0 or free_mem[node] + mem >= m)
            and (d <= 0 or free_rdma[node] + rdma >= d)
        )

    for running in candidates:
        if running.preempted:
            continue
        job = running.job
        touched = None
        for node in running.nodes:
            if node is None:
                continue
            ok = eligible.get(node)
            if ok is None:
                ok = eligible[node] = cluster.eligible(node, model, excluded, allowed)
            if not ok:
                continue
            back = freed.get(node)
            if back is None:
                back = freed[node] = [0.0, 0.0, 0.0, 0.0]
                victims[node] = []
            back[0] += job.gpus_per_replica
            back[1] += job.cpu_per_replica
            back[2] += job.memory_mib_per_replica
            back[3] += job.rdma_per_replica
            if not victims[node] or victims[node][-1] is not running:
                victims[node].append(running)
            if fits(node, back[0], back[1], back[2], back[3]):
                touched = node
        if touched is None:
            continue
        chosen = victims[touched]
        back = freed[touched]
        kept = [chosen[-1]]
        for victim in reversed(chosen[:-1]):
            job = victim.job
            share = victim.nodes.count(touched)
            without = [
                back[0] - share * job.gpus_per_replica,
                back[1] - share * job.cpu_per_replica,
                back[2] - share * job.memory_mib_per_replica,
                back[3] - share * job.rdma_per_replica,
            ]
            if fits(touched, without[0], without[1], without[2], without[3]):
                back = without
            else:
                kept.append(victim)
        kept.reverse()
        return kept
    return None
