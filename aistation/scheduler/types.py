"""What the scheduler core takes and returns. Plain data: no ORM, no I/O, so the same core runs
inside a scheduling cycle and inside the trace replay in bench/."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class NodeSnap:
    name: str
    gpus: int  # installed GPUs
    gpu_model: str = ""
    cpu_cores: float = 0
    memory_mib: int = 0
    schedulable: bool = True  # ready, not cordoned, healthy
    rdma: int = 0  # RDMA devices it offers (the cluster's RDMA resource), like GPUs


@dataclass(frozen=True)
class TenantSnap:
    name: str
    gpu_quota: int
    # GPUs allowed per GPU model, within gpu_quota ({"H100": 8}).
    gpu_model_limits: dict[str, int] = field(default_factory=dict)
    # CPU cores and MiB of memory its work may hold at once; None = no limit. Hard limits,
    # never borrowed above: all its running work counts, borrowed GPUs' work too.
    cpu_quota: float | None = None
    memory_quota_mib: int | None = None
    # What its work already holds outside the snapshot (other clusters), against those limits.
    cpu_held_elsewhere: float = 0.0
    memory_mib_held_elsewhere: int = 0
    # RDMA devices its work may hold at once (None = no limit), hard like CPU and memory, and
    # what its work holds on other clusters.
    rdma_quota: int | None = None
    rdma_held_elsewhere: int = 0


@dataclass(frozen=True)
class QueueSnap:
    key: str  # unique: "<tenant>/<queue>"
    tenant: str
    gpu_limit: int | None = None  # below the tenant's quota; None = the quota alone
    policy: str = "fair"  # "fifo", "backfill" or the default duration-agnostic policy


@dataclass(frozen=True)
class JobSnap:
    """A job, pending or running. `placement` (one node per replica) is set when running."""

    id: int
    tenant: str
    queue: str  # QueueSnap.key
    priority: int
    submitted_at: float  # seconds, the snapshot's clock
    gpus_per_replica: int
    replicas: int = 1
    cpu_per_replica: float = 1.0
    memory_mib_per_replica: int = 1024
    gpu_model: str = ""  # "" = any model
    placement: tuple[str, ...] = ()
    started_at: float | None = None
    borrowed: bool = False  # running above its tenant's quota on idle capacity
    attained_gpu_s: float = 0.0  # GPU-seconds of service received so far, all attempts
    excluded_nodes: frozenset[str] = frozenset()  # nodes an earlier attempt failed on
    not_before: float = 0.0  # retry backoff: not started before this time
    waited_s: float = 0.0  # time spent waiting before its current wait (or run) began
    # How a person knows it where a wait names what holds the resources ("the deployment
    # demo-tiny-gpt", "job 12 train-gpt"); "" = "job <id>".
    display: str = ""
    rdma_per_replica: int = 0  # RDMA devices each replica needs on its node, like GPUs

    @property
    def gpus(self) -> int:
        return self.gpus_per_replica * self.replicas


@dataclass(frozen=True)
class Snapshot:
    now: float
    nodes: tuple[NodeSnap, ...]
    tenants: tuple[TenantSnap, ...]
    queues: tuple[QueueSnap, ...]
    running: tuple[JobSnap, ...]
    pending: tuple[JobSnap, ...]
    # Nodes elastic pools could still add here (their type, up to their size): work they would
    # hold never fails as too big for the cluster; it waits while the pool buys its nodes.
    elastic: tuple[NodeSnap, ...] = ()
    # Queues that hold their starvation reservation on another cluster of their fleet, and
    # for what ("job 12 on east"): one reservation per queue, fleet-wide, so none is made here.
    reserved_elsewhere: dict[str, str] = field(default_factory=dict)


# A cycle's decisions come by the thousand: plain named tuples, several times cheaper to make
# than frozen dataclasses (whose every field is set through object.__setattr__).
class Start(NamedTuple):
    job_id: int
    placement: tuple[str, ...]  # node per replica
    borrowed: bool = False
    reason: str = ""  # e.g. "admitted: tenant quota 6/8 GPUs"


class Preempt(NamedTuple):
    job_id: int
    reason: str  # "preempted by job 42 (priority 10)", "reclaimed for tenant a's quota"


class Wait(NamedTuple):
    job_id: int
    reason: str  # always for people: "waiting: tenant quota 8/8 GPUs in use"
    position: int  # 1-based position in its queue
    never_fits: bool = False  # no cluster shape can ever hold it


class Reservation(NamedTuple):
    job_id: int
    queue: str  # QueueSnap.key
    nodes: tuple[str, ...]  # drained for it: nothing else starts there


@dataclass(frozen=True)
class Decisions:
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    waits: tuple[Wait, ...] = ()
    reservations: tuple[Reservation, ...] = ()
