"""The `fake` driver: simulated GPU nodes, for tests, demos and benchmarks.

Each cluster name has one `FakeCluster` (so every driver instance of a cluster sees the same
nodes): in a file every process shares, on the wall clock (`fake_state`, the platform's
default), or in this process's memory, with a clock the tests move (`advance`) and failures they
inject (`crash`, `lose_node`, and hardware faults health checks find: `inject_fault`). A
workload runs from
launch until `OGAI_FAKE_DURATION_S` (from its env, else the cluster's `default_duration_s`;
none = until cancelled) has passed on that clock, then exits with `OGAI_FAKE_EXIT_CODE`
(default 0); a health check's workload ends at once. The fake refuses what a real cluster
could not do (unknown, lost or cordoned nodes, more GPUs than free), so scheduler bugs fail
loudly in tests.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import signal
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import yaml

from podsys.drivers.base import (
    ClusterDriver,
    DriverError,
    EnvironmentInfo,
    NetworkOffer,
    NodeInfo,
    Phase,
    ReplicaStatus,
    Workload,
    WorkloadStatus,
    network_names,
)
from podsys.drivers.common import (
    check_workload_id,
    exit_reason,
    missing,
    network_summary,
    summarize,
    tail_lines,
)
from podsys.drivers.fake_health import Fault, probe_line
from podsys.drivers.fake_metrics import check_override, synthetic_families
from podsys.drivers.fake_state import SharedFake, shared_state_dir, state_file
from podsys.exporter import render
from podsys.health import CHECK_LABEL

DURATION_ENV = "OGAI_FAKE_DURATION_S"
EXIT_CODE_ENV = "OGAI_FAKE_EXIT_CODE"
CANCEL_EXIT_CODE = -signal.SIGTERM
SERVICE_PORT = 8000

DEFAULTS: dict[str, Any] = {
    "nodes": 4,
    "gpus_per_node": 8,
    "gpu_model": "H100",
    "gpu_memory_mib": 81559,
    "cpu_cores": 64,
    "memory_mib": 524288,
    "default_duration_s": None,
    # RDMA devices each node offers (0: none), and the extra networks jobs may attach.
    "rdma_per_node": 0,
}


@dataclass
class _Node:
    name: str
    gpus: int
    gpu_model: str
    gpu_memory_mib: int
    cpu_cores: float
    memory_mib: int
    labels: dict[str, str] = field(default_factory=dict)
    ready: bool = True
    schedulable: bool = True
    allocated: int = 0
    rdma: int = 0
    rdma_allocated: int = 0
    # (workload id, replica index) of the replicas running here: what a lost node takes down.
    running: set[tuple[str, int]] = field(default_factory=set)

    def info(self) -> NodeInfo:
        reason = "node lost" if not self.ready else "" if self.schedulable else "cordoned"
        return NodeInfo(
            name=self.name,
            gpus=self.gpus,
            gpu_model=self.gpu_model,
            gpu_memory_mib=self.gpu_memory_mib,
            cpu_cores=self.cpu_cores,
            memory_mib=self.memory_mib,
            labels=dict(self.labels),
            ready=self.ready,
            schedulable=self.schedulable,
            reason=reason,
            rdma=self.rdma,
            rdma_allocated=self.rdma_allocated if self.rdma else None,
        )


@dataclass
class _Replica:
    index: int
    node: str
    gpus: int
    ended_at: float | None = None
    rdma: int = 0
    exit_code: int | None = None
    reason: str = ""
    log: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.ended_at is None

    def status(self) -> ReplicaStatus:
        if self.running:
            return ReplicaStatus(index=self.index, phase=Phase.RUNNING, node=self.node)
        phase = Phase.SUCCEEDED if self.exit_code == 0 else Phase.FAILED
        return ReplicaStatus(
            index=self.index,
            phase=phase,
            node=self.node,
            exit_code=self.exit_code,
            reason=self.reason,
        )


@dataclass
class _Workload:
    spec: Workload
    started_at: float
    ends_at: float | None
    exit_code: int
    replicas: list[_Replica]
    node_lost: str = ""


def _duration(workload: Workload, default: float | None) -> float | None:
    raw = workload.env.get(DURATION_ENV)
    if raw is None:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise DriverError(f"{DURATION_ENV}={raw!r} is not a number of seconds") from None


def _exit_code(workload: Workload) -> int:
    raw = workload.env.get(EXIT_CODE_ENV, "0")
    try:
        return int(raw)
    except ValueError:
        raise DriverError(f"{EXIT_CODE_ENV}={raw!r} is not an integer") from None


class FakeCluster:
    """The simulated state of one cluster. Every public method takes the lock."""

    def __init__(self, name: str, options: dict | None = None) -> None:
        self.name = name
        self.options = {**DEFAULTS, **(options or {})}
        self.now = 0.0
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node] = {}
        self._workloads: dict[str, _Workload] = {}
        # (ends_at, workload id) of workloads with a duration: the clock ends them in order
        # without a scan over every workload.
        self._endings: list[tuple[float, str]] = []
        # Metric values tests set, by node: {(metric name, GPU index or "*"): value}.
        self._metrics: dict[str, dict[tuple[str, str], float]] = {}
        # Hardware faults tests inject, by node and health check (`inject_fault`).
        self._faults: dict[str, dict[str, Fault]] = {}
        # The next unnamed node's number: it only grows, so a removed node's name is never
        # reused (a placement still naming it must not land on a stranger).
        self._next_number = 0
        self.add_nodes(int(self.options["nodes"]))

    def __getstate__(self) -> dict[str, Any]:
        # Pickled by a shared fake (`fake_state`): everything but the lock.
        return {key: value for key, value in self.__dict__.items() if key != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # The clock -----------------------------------------------------------------------------

    def advance(self, seconds: float) -> float:
        """Move the clock forward; workloads whose time is up finish. Returns the new time."""
        if seconds < 0:
            raise ValueError("the fake clock only moves forward")
        with self._lock:
            self.now += seconds
            self._settle()
            return self.now

    def _settle(self) -> None:
        while self._endings and self._endings[0][0] <= self.now:
            ends_at, workload_id = heapq.heappop(self._endings)
            workload = self._workloads.get(workload_id)
            if workload is None:
                continue
            for replica in workload.replicas:
                if replica.running:
                    self._end(workload_id, replica, ends_at, workload.exit_code)

    def _end(
        self, workload_id: str, replica: _Replica, at: float, code: int | None, reason: str = ""
    ) -> None:
        replica.ended_at = at
        replica.exit_code = code
        replica.reason = reason or ("" if code in (0, None) else exit_reason(code))
        node = self._nodes.get(replica.node)
        if node is not None and (workload_id, replica.index) in node.running:
            node.running.discard((workload_id, replica.index))
            node.allocated -= replica.gpus
            node.rdma_allocated -= replica.rdma

    # Nodes ---------------------------------------------------------------------------------

    def add_nodes(
        self,
        count: int,
        *,
        gpus: int | None = None,
        gpu_model: str | None = None,
        gpu_memory_mib: int | None = None,
        labels: dict[str, str] | None = None,
        names: list[str] | None = None,
        cpu_cores: float | None = None,
        memory_mib: int | None = None,
        rdma: int | None = None,
    ) -> list[str]:
        """Add `count` ready nodes, named `names` (a cloud node joins under its provider's
        name) or numbered on from the last one; returns their names."""
        if names is not None and len(names) != count:
            raise ValueError(f"{len(names)} names for {count} nodes")
        with self._lock:
            seen: set[str] = set()
            for name in names or ():
                if name in self._nodes or name in seen:
                    raise DriverError(f"fake cluster {self.name} already has a node {name!r}")
                seen.add(name)
            added = []
            for index in range(count):
                if names is not None:
                    name = names[index]
                else:
                    while f"fake-node-{self._next_number:03d}" in self._nodes:
                        self._next_number += 1
                    name = f"fake-node-{self._next_number:03d}"
                    self._next_number += 1
                self._nodes[name] = _Node(
                    name=name,
                    gpus=int(self.options["gpus_per_node"] if gpus is None else gpus),
                    gpu_model=str(self.options["gpu_model"] if gpu_model is None else gpu_model),
                    gpu_memory_mib=int(gpu_memory_mib or self.options["gpu_memory_mib"]),
                    cpu_cores=float(self.options["cpu_cores"] if cpu_cores is None else cpu_cores),
                    memory_mib=int(self.options["memory_mib"] if memory_mib is None
                                   else memory_mib),
                    labels=dict(labels or {}),
                    rdma=int(self.options.get("rdma_per_node") or 0) if rdma is None else rdma,
                )
                added.append(name)
            return added

    def remove_node(self, name: str) -> None:
        """The node leaves the cluster for good (its machine went back to the cloud): what ran
        on it fails as on a lost node, and it is no longer listed. An unknown node is a no-op,
        so returning a machine twice is harmless."""
        with self._lock:
            if name not in self._nodes:
                return
            self.lose_node(name)
            del self._nodes[name]
            self._metrics.pop(name, None)
            self._faults.pop(name, None)

    def node_infos(self) -> list[NodeInfo]:
        with self._lock:
            return [node.info() for node in self._nodes.values()]

    def _node(self, name: str) -> _Node:
        node = self._nodes.get(name)
        if node is None:
            raise DriverError(f"fake cluster {self.name} has no node {name!r}")
        return node

    def allocated_gpus(self, node: str) -> int:
        """GPUs held on `node` by replicas still running."""
        with self._lock:
            self._settle()
            return self._node(node).allocated

    def free_gpus(self, node: str) -> int:
        with self._lock:
            self._settle()
            found = self._node(node)
            return found.gpus - found.allocated if found.ready else 0

    def cordon(self, name: str) -> None:
        """No new work on the node; what runs there goes on."""
        with self._lock:
            self._node(name).schedulable = False

    def uncordon(self, name: str) -> None:
        with self._lock:
            self._node(name).schedulable = True

    def lose_node(self, name: str) -> None:
        """The node disappears: it turns not ready and every replica on it fails."""
        with self._lock:
            self._settle()
            node = self._node(name)
            node.ready = False
            for workload_id, index in sorted(node.running):
                workload = self._workloads[workload_id]
                workload.node_lost = workload.node_lost or name
                self._end(
                    workload_id, workload.replicas[index], self.now, None, f"node {name} lost"
                )

    def restore_node(self, name: str) -> None:
        """The node comes back, empty."""
        with self._lock:
            self._node(name).ready = True

    # Failures ------------------------------------------------------------------------------

    def crash(
        self, workload_id: str, replica: int = 0, exit_code: int = 1, reason: str = ""
    ) -> None:
        """Replica `replica` exits now with `exit_code` (reason: "exit code N" unless given).
        A replica that already ended stays as it ended."""
        with self._lock:
            self._settle()
            workload = self._workload(workload_id)
            if not 0 <= replica < len(workload.replicas):
                raise DriverError(f"workload {workload_id} has no replica {replica}")
            target = workload.replicas[replica]
            if target.running:
                self._end(workload_id, target, self.now, exit_code, reason)

    def append_log(self, workload_id: str, line: str, replica: int = 0) -> None:
        """Add a line to a replica's log, as if the workload printed it."""
        with self._lock:
            self._workload(workload_id).replicas[replica].log.append(line)

    def _workload(self, workload_id: str) -> _Workload:
        workload = self._workloads.get(workload_id)
        if workload is None:
            raise DriverError(f"no workload {workload_id!r} on fake cluster {self.name}")
        return workload

    # Metrics -------------------------------------------------------------------------------

    def set_metric(self, node: str, name: str, value: float, gpu: int | None = None) -> None:
        """From now on the node reports `value` for metric `name` (a name of
        `podsys.metric_names`) on GPU `gpu`, or on every GPU (for a node metric: every sample)
        when `gpu` is None."""
        with self._lock:
            found = self._node(node)
            key = check_override(name, gpu, found.gpus)
            self._metrics.setdefault(node, {})[(name, key)] = float(value)

    def clear_metrics(self, node: str | None = None) -> None:
        """Back to the simulated values, on one node or all."""
        with self._lock:
            if node is None:
                self._metrics.clear()
            else:
                self._metrics.pop(node, None)

    def node_metrics(self, name: str) -> str | None:
        """The node's exposition text; None for a lost node, which answers nothing."""
        with self._lock:
            self._settle()
            node = self._node(name)
            if not node.ready:
                return None
            return render(synthetic_families(
                hostname=node.name, gpus=node.gpus, busy_gpus=min(node.allocated, node.gpus),
                gpu_model=node.gpu_model, gpu_memory_mib=node.gpu_memory_mib,
                cpu_cores=node.cpu_cores, memory_mib=node.memory_mib, now=self.now,
                overrides=self._metrics.get(name, {})))

    # Health checks -------------------------------------------------------------------------

    def inject_fault(self, node: str, check: str, summary: str = "simulated fault",
                     details: dict | None = None, *, hang: bool = False) -> None:
        """From now on health check `check` finds this fault on the node: its workload prints
        a failing result with `summary` (or, with `hang`, never ends)."""
        with self._lock:
            self._node(node)
            self._faults.setdefault(node, {})[check] = Fault(summary, dict(details or {}), hang)

    def clear_fault(self, node: str, check: str | None = None) -> None:
        """The node is repaired: of one check's fault, or of all."""
        with self._lock:
            if check is None:
                self._faults.pop(node, None)
            else:
                self._faults.get(node, {}).pop(check, None)

    def _run_probe(self, workload: Workload) -> None:
        """A health check's workload ends at once, printing what its probe finds there."""
        check = workload.labels[CHECK_LABEL]
        for replica in self._workloads[workload.id].replicas:
            node = self._nodes[replica.node]
            fault = self._faults.get(node.name, {}).get(check)
            if fault is not None and fault.hang:
                continue
            replica.log.append(probe_line(check, workload.command, gpus=node.gpus,
                                          gpu_model=node.gpu_model, fault=fault))
            self._end(workload.id, replica, self.now, 0)

    # The driver's operations ---------------------------------------------------------------

    def launch(self, workload: Workload) -> str:
        check_workload_id(workload.id)
        with self._lock:
            if workload.id in self._workloads:
                return workload.id
            self._settle()
            self._check_launch(workload)
            duration = _duration(workload, self.options["default_duration_s"])
            exit_code = _exit_code(workload)
            gpus, rdma = workload.resources.gpus, workload.resources.rdma
            replicas = [_Replica(i, node, gpus, rdma=rdma)
                        for i, node in enumerate(workload.placement)]
            ends_at = None if duration is None else self.now + duration
            self._workloads[workload.id] = _Workload(
                workload, self.now, ends_at, exit_code, replicas
            )
            for replica in replicas:
                node = self._nodes[replica.node]
                node.allocated += gpus
                node.rdma_allocated += rdma
                node.running.add((workload.id, replica.index))
            if ends_at is not None:
                heapq.heappush(self._endings, (ends_at, workload.id))
            if CHECK_LABEL in workload.labels:
                self._run_probe(workload)
            return workload.id

    def _check_launch(self, workload: Workload) -> None:
        if workload.replicas < 1 or not workload.command:
            raise DriverError(f"workload {workload.id} needs a command and at least one replica")
        if len(workload.placement) != workload.replicas:
            raise DriverError(
                f"workload {workload.id} has {workload.replicas} replicas but "
                f"{len(workload.placement)} placements: one node per replica is required"
            )
        wanted = workload.resources.gpu_model
        offered = network_names(self.options)
        unknown = [name for name in workload.networks if name not in offered]
        if unknown:
            raise DriverError(f"fake cluster {self.name} offers no network {unknown[0]!r}; it "
                              f"offers {', '.join(offered) or 'none'}")
        for name, count in Counter(workload.placement).items():
            node = self._node(name)
            if not node.ready:
                raise DriverError(f"node {name} is not ready")
            if not node.schedulable:
                raise DriverError(f"node {name} is cordoned")
            if wanted and wanted != node.gpu_model:
                raise DriverError(f"node {name} has {node.gpu_model} GPUs, not {wanted}")
            needed = count * workload.resources.gpus
            free = node.gpus - node.allocated
            if needed > free:
                raise DriverError(
                    f"workload {workload.id} needs {needed} GPUs on {name}; "
                    f"{free} of {node.gpus} are free"
                )
            needed = count * workload.resources.rdma
            free = node.rdma - node.rdma_allocated
            if needed > free:
                raise DriverError(
                    f"workload {workload.id} needs {needed} RDMA devices on {name}; "
                    f"{free} of {node.rdma} are free"
                )

    def status(self, workload_id: str) -> WorkloadStatus:
        with self._lock:
            self._settle()
            workload = self._workloads.get(workload_id)
            if workload is None:
                return missing(workload_id)
            replicas = [replica.status() for replica in workload.replicas]
            failed_at = {
                r.index: r.ended_at
                for r in workload.replicas
                if r.ended_at is not None and r.exit_code != 0
            }
            return summarize(
                workload_id, replicas, failed_at=failed_at, node_lost=workload.node_lost
            )

    def cancel(self, workload_id: str) -> None:
        with self._lock:
            self._settle()
            workload = self._workloads.get(workload_id)
            if workload is None:
                return
            for replica in workload.replicas:
                if replica.running:
                    self._end(workload_id, replica, self.now, CANCEL_EXIT_CODE, "cancelled")

    def logs(self, workload_id: str, replica: int) -> list[str]:
        with self._lock:
            self._settle()
            workload = self._workload(workload_id)
            if not 0 <= replica < len(workload.replicas):
                raise DriverError(f"workload {workload_id} has no replica {replica}")
            found = workload.replicas[replica]
            lines = [f"replica {replica} started on {found.node} at t={workload.started_at:.1f}"]
            lines.extend(found.log)
            if not found.running:
                how = (
                    f"exited with code {found.exit_code}" if found.exit_code == 0 else found.reason
                )
                lines.append(f"replica {replica} ended at t={found.ended_at:.1f}: {how}")
            return lines

    def endpoint(self, workload_id: str) -> str | None:
        with self._lock:
            workload = self._workloads.get(workload_id)
            if workload is None or not workload.spec.service:
                return None
            port = workload.spec.ports[0] if workload.spec.ports else SERVICE_PORT
            return f"http://{workload.replicas[0].node}:{port}"


_clusters: dict[str, FakeCluster] = {}
_clusters_lock = threading.Lock()


def fake_cluster(name: str, options: dict | None = None) -> FakeCluster:
    """The fake cluster of this name, created with `options` if it does not exist yet (options
    of a cluster that exists are ignored: the first creator sets its shape). With
    `OGAI_FAKE_STATE_DIR` set, its state is in a file there that every process shares, on the
    wall clock (`fake_state`)."""
    folder = shared_state_dir()
    if folder is not None:
        shared = SharedFake(state_file(folder, "cluster", name), FakeCluster,
                            lambda: FakeCluster(name, options))
        return cast(FakeCluster, shared)
    with _clusters_lock:
        cluster = _clusters.get(name)
        if cluster is None:
            cluster = _clusters[name] = FakeCluster(name, options)
        return cluster


def reset_fake_clusters() -> None:
    """Forget every fake cluster (for tests)."""
    with _clusters_lock:
        _clusters.clear()


class FakeDriver(ClusterDriver):
    """Options (used when the cluster is first created): `nodes`, `gpus_per_node`, `gpu_model`,
    `gpu_memory_mib`, `cpu_cores`, `memory_mib`, `rdma_per_node` (RDMA devices each node
    offers), `default_duration_s`; and, read each time, `environments` ({name: where}: the named
    environments jobs may ask for, none by default) and `networks` (the names of the extra
    networks jobs may attach, a list or the keys of an object; none by default)."""

    unsupported: dict[str, str] = {}

    def __init__(self, *, cluster: str, options: dict | None = None) -> None:
        super().__init__(cluster=cluster, options=options)
        fake_cluster(cluster, self.options)  # created now, so its options apply from the start

    @property
    def fake(self) -> FakeCluster:
        # Looked up on each call, so reset_fake_clusters() also resets cached driver instances.
        return fake_cluster(self.cluster, self.options)

    def nodes(self) -> list[NodeInfo]:
        return self.fake.node_infos()

    def launch(self, workload: Workload) -> str:
        return self.fake.launch(workload)

    def status(self, handles: list[str]) -> dict[str, WorkloadStatus]:
        fake = self.fake
        return {handle: fake.status(handle) for handle in handles}

    def cancel(self, handle: str) -> None:
        self.fake.cancel(handle)

    def logs(self, handle: str, *, tail: int | None = None, replica: int = 0) -> str:
        lines = self.fake.logs(handle, replica)
        return tail_lines("".join(f"{line}\n" for line in lines), tail)

    def environments(self) -> list[EnvironmentInfo]:
        offered = self.options.get("environments") or {}
        return [EnvironmentInfo(name=str(name), where=str(where))
                for name, where in offered.items()]

    def network_offer(self) -> NetworkOffer:
        return NetworkOffer(attachments=tuple(network_names(self.options)),
                            rdma_resource="fake RDMA devices (option rdma_per_node)")

    def render(self, workload: Workload) -> str:
        """The workload as the driver gets it, as YAML (secrets by name only), with the
        network it asks for."""
        shown = dataclasses.asdict(workload)
        shown["network"] = network_summary(workload)
        shown["secret_env"] = dict.fromkeys(workload.secret_env, "(secret: set at launch)")
        # Through JSON, so tuples read as lists and YAML needs no Python tags.
        return yaml.safe_dump(json.loads(json.dumps(shown)), sort_keys=False)

    def endpoint(self, handle: str) -> str | None:
        return self.fake.endpoint(handle)

    def node_metrics(self, node: str) -> str | None:
        return self.fake.node_metrics(node)
