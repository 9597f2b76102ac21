"""What the cluster and node pages draw for each node: GPUs, CPU cores and memory allocated
against what the node has.

GPUs come from `podsys.allocations` (every registered provider: jobs, and whatever else holds
GPUs); CPU and memory from the admitted and running jobs placed on the node, as the scheduler
counts them (one replica per entry of a job's placement, each holding its per-replica share).
On small machines CPU and memory are what run out, so they are drawn beside the GPUs."""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from aistation.choices import ACTIVE_STATES
from aistation.models import Job
from podsys.allocations import gpu_allocations
from podsys.models import Node

NodeKey = tuple[int, str]  # (cluster id, node name)


@dataclass(frozen=True)
class Held:
    gpus: int = 0
    cpu_cores: float = 0.0
    memory_mib: int = 0
    rdma: int = 0


def node_allocations(cluster_ids: Iterable[int]) -> dict[NodeKey, Held]:
    """{(cluster id, node name): what is held there}; nodes holding nothing are absent."""
    ids = list(cluster_ids)
    cpu: dict[NodeKey, float] = defaultdict(float)
    memory: dict[NodeKey, int] = defaultdict(int)
    rdma: dict[NodeKey, int] = defaultdict(int)
    jobs = Job.objects.filter(cluster_id__in=ids, state__in=ACTIVE_STATES).values_list(
        "cluster_id", "placement", "cpu_per_replica", "memory_mib_per_replica",
        "rdma_per_replica")
    for cluster_id, placement, cores, mib, devices in jobs:
        for node in placement:
            cpu[(cluster_id, node)] += cores
            memory[(cluster_id, node)] += mib
            if devices:
                rdma[(cluster_id, node)] += devices
    gpus = gpu_allocations(ids)
    return {key: Held(gpus=gpus.get(key, 0), cpu_cores=cpu.get(key, 0.0),
                      memory_mib=memory.get(key, 0), rdma=rdma.get(key, 0))
            for key in set(gpus) | set(cpu) | set(memory)}


def _percent(part: float, whole: float) -> int:
    return min(round(100 * part / whole), 100) if whole > 0 else 0


@dataclass(frozen=True)
class Usage:
    """One resource of a node (or a cluster): allocated of total."""

    allocated: float
    total: float

    @property
    def free(self) -> float:
        return max(self.total - self.allocated, 0)

    @property
    def percent(self) -> int:
        return _percent(self.allocated, self.total)


def cpu_usage(node: Node, held: Held) -> Usage:
    return Usage(held.cpu_cores, float(node.cpu_cores or 0))


def memory_usage(node: Node, held: Held) -> Usage:
    return Usage(held.memory_mib, node.memory_mib or 0)


def rdma_usage(node: Node, held: Held) -> Usage:
    """RDMA devices: the platform's jobs' allocations, or more where the cluster reports other
    users' too."""
    return Usage(max(held.rdma, node.rdma_in_use or 0), node.rdma_devices or 0)
