"""When to buy nodes for an elastic pool and when to give them back: pure, like the core.

Scale up: the jobs that wait and fit nowhere in the fleet's free capacity now get nodes of the
pool's type. A gang's nodes are asked for in one request (all or none: never half a gang), and a
job of one replica that leaves room on its node lets the next small jobs ride along on that room
(one request, as cluster autoscalers batch pods) instead of each buying a node. Room already
bought and still booting is used before anything new is bought. The caller admits a job only on
its claimed nodes once all of them are ready (its claim keeps other work off them).

Scale down: a pool node goes back when it has been empty (no work, no claim) for the cool-down
and was not created within the last cool-down. A node with work on it is never returned: nothing
is evicted to scale down.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .types import JobSnap

DEFAULT_COOL_DOWN_S = 600.0


@dataclass(frozen=True)
class NodeShape:
    """What one node of the pool's type holds."""

    gpus: int
    gpu_model: str = ""
    cpu_cores: float = 0  # 0: not limited
    memory_mib: int = 0


@dataclass
class OpenRoom:
    """Room on a node bought but not yet taken: what is left after its claims."""

    name: str
    gpus: int
    cpu_cores: float = math.inf
    memory_mib: float = math.inf
    claims: list[int] = field(default_factory=list)


class Request(NamedTuple):
    """One provisioning request: `nodes` new nodes for the `jobs` (the first opened it)."""

    jobs: tuple[int, ...]
    nodes: int


@dataclass
class ScalePlan:
    requests: list[Request] = field(default_factory=list)
    # Jobs that take room on nodes already bought: job id -> node names.
    rides: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # Jobs the pool cannot serve, and why in words.
    refused: dict[int, str] = field(default_factory=dict)

    @property
    def new_nodes(self) -> int:
        return sum(r.nodes for r in self.requests)


def nodes_for(job: JobSnap, node: NodeShape) -> int:
    """Whole nodes of `node`'s shape the job's gang needs; 0 when one replica does not fit."""
    per_node = replicas_per_node(job, node)
    return math.ceil(job.replicas / per_node) if per_node else 0


def replicas_per_node(job: JobSnap, node: NodeShape) -> int:
    counts = [node.gpus // job.gpus_per_replica if job.gpus_per_replica else job.replicas]
    if node.cpu_cores and job.cpu_per_replica:
        counts.append(int(node.cpu_cores // job.cpu_per_replica))
    if node.memory_mib and job.memory_mib_per_replica:
        counts.append(node.memory_mib // job.memory_mib_per_replica)
    return max(0, min(counts))


def plan_scale_up(jobs: Sequence[JobSnap], node: NodeShape, *, max_new_nodes: int,
                  open_room: Sequence[OpenRoom] = ()) -> ScalePlan:
    """Nodes to buy for `jobs` (waiting, fitting nowhere now, in their queues' order), at most
    `max_new_nodes` in all (the pool's and the budgets' headroom). Room left on nodes already
    bought (`open_room`) is taken first, by one-replica jobs."""
    plan = ScalePlan()
    room = [OpenRoom(r.name, r.gpus, r.cpu_cores, r.memory_mib, list(r.claims))
            for r in open_room]
    new_room: list[tuple[int, OpenRoom]] = []  # (request index, room on a node it buys)
    left = max_new_nodes
    for job in jobs:
        if job.gpu_model and node.gpu_model and job.gpu_model != node.gpu_model:
            plan.refused[job.id] = f"the pool's nodes have {node.gpu_model}, not {job.gpu_model}"
            continue
        need = nodes_for(job, node)
        if need == 0:
            plan.refused[job.id] = (f"one replica ({job.gpus_per_replica} GPUs) does not fit a "
                                    f"pool node ({node.gpus} GPUs)")
            continue
        if job.replicas == 1:
            spot = _room_for(job, room)
            if spot is not None:
                _claim(spot, job)
                plan.rides[job.id] = (spot.name,)
                continue
            found = _room_for(job, [r for _, r in new_room])
            if found is not None:
                index = next(i for i, r in new_room if r is found)
                _claim(found, job)
                request = plan.requests[index]
                plan.requests[index] = Request((*request.jobs, job.id), request.nodes)
                continue
        if need > left:
            plan.refused[job.id] = (f"needs {need} new node{'s' if need > 1 else ''}; the pool "
                                    f"may add {left} more now")
            continue
        left -= need
        plan.requests.append(Request((job.id,), need))
        if job.replicas == 1:
            spot = OpenRoom(f"new-{len(plan.requests) - 1}", node.gpus,
                            node.cpu_cores or math.inf, node.memory_mib or math.inf)
            _claim(spot, job)
            new_room.append((len(plan.requests) - 1, spot))
    return plan


def _room_for(job: JobSnap, rooms: Sequence[OpenRoom]) -> OpenRoom | None:
    """Best fit: the room with the fewest GPUs that still holds the job's one replica."""
    best = None
    for spot in rooms:
        if spot.gpus >= job.gpus_per_replica and spot.cpu_cores + 1e-9 >= job.cpu_per_replica \
                and spot.memory_mib >= job.memory_mib_per_replica \
                and (best is None or spot.gpus < best.gpus):
            best = spot
    return best


def _claim(spot: OpenRoom, job: JobSnap) -> None:
    spot.gpus -= job.gpus_per_replica
    spot.cpu_cores -= job.cpu_per_replica
    spot.memory_mib -= job.memory_mib_per_replica
    spot.claims.append(job.id)


class PoolNode(NamedTuple):
    name: str
    created_at: float  # when it was requested
    empty_since: float | None  # None: work or a claim on it, or not ready yet


def scale_down(nodes: Sequence[PoolNode], now: float,
               cool_down_s: float = DEFAULT_COOL_DOWN_S) -> list[str]:
    """The pool nodes to give back now: empty for the cool-down, not created within it."""
    return [n.name for n in nodes if n.empty_since is not None
            and now - n.empty_since >= cool_down_s and now - n.created_at >= cool_down_s]
