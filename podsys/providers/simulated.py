"""The simulated cloud: nodes bought from nowhere, for tests, demos and benchmarks.

Each cloud name has one `SimulatedCloud` (so every provider instance of that name sees the same
nodes): in a file every process shares, on the wall clock (`podsys.drivers.fake_state`, the
platform's default), or in this process's memory, with a clock the tests move (`advance`), a
stock they limit (`set_stock`) and boot failures they inject (`fail_next`). A node boots for its
type's `boot_s` on that clock; with `joins`, a node that turns READY registers with that fake
cluster, as a real node's kubelet or slurmd does, and leaves it when deleted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, cast

from podsys.drivers.fake import fake_cluster
from podsys.drivers.fake_state import SharedFake, shared_state_dir, state_file
from podsys.providers.base import (
    CapacityProvider,
    NodeState,
    NodeType,
    ProviderError,
    ProviderNode,
    StockOut,
)

DEFAULT_TYPES: list[dict[str, Any]] = [
    {"name": "h100x8", "gpu_model": "H100", "gpus": 8, "cpu_cores": 64, "memory_mib": 524288,
     "price_per_hour": 20.0, "boot_s": 300},
]


@dataclass
class _Node:
    id: str
    type: NodeType
    request_id: str
    requested_at: float
    fail_reason: str | None  # injected: fails at its ready time instead of turning READY
    state: NodeState = NodeState.BOOTING
    joined: bool = False

    @property
    def holds_stock(self) -> bool:
        return self.state in (NodeState.REQUESTED, NodeState.BOOTING, NodeState.READY)

    def public(self) -> ProviderNode:
        ready_at = self.requested_at + self.type.boot_s
        failed = self.state == NodeState.FAILED
        return ProviderNode(
            id=self.id, node_type=self.type.name, request_id=self.request_id, state=self.state,
            requested_at=self.requested_at,
            ready_at=ready_at if self.state == NodeState.READY else None,
            reason=(self.fail_reason or "") if failed else "",
        )


def _node_types(raw: list[dict[str, Any]]) -> dict[str, NodeType]:
    types = {}
    for fields in raw:
        try:
            found = NodeType(**fields)
        except TypeError as exc:
            raise ProviderError(f"node type {fields!r} is not valid: {exc}") from None
        types[found.name] = found
    return types


class SimulatedCloud:
    """The simulated state of one cloud. Every public method takes the lock."""

    def __init__(self, name: str, options: dict | None = None) -> None:
        options = options or {}
        self.name = name
        self.now = 0.0
        self.joins: str | None = options.get("joins")
        self._types = _node_types(options.get("types") or DEFAULT_TYPES)
        self._stock: dict[str, int | None] = dict.fromkeys(self._types)
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node] = {}
        self._requests: dict[str, list[str]] = {}
        self._failures: list[str] = []  # reasons for the next nodes requested to fail
        self._count = 0
        for type_name, stock in (options.get("stock") or {}).items():
            self.set_stock(type_name, stock)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled by a shared fake (`podsys.drivers.fake_state`): everything but the lock.
        return {key: value for key, value in self.__dict__.items() if key != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def advance(self, seconds: float) -> float:
        """Move the clock forward; nodes whose boot time is up turn READY (or FAILED)."""
        if seconds < 0:
            raise ValueError("the simulated cloud's clock only moves forward")
        with self._lock:
            self.now += seconds
            self._settle()
            return self.now

    def _settle(self) -> None:
        for node in self._nodes.values():
            if node.state != NodeState.BOOTING or node.requested_at + node.type.boot_s > self.now:
                continue
            if node.fail_reason is not None:
                node.state = NodeState.FAILED
                continue
            node.state = NodeState.READY
            if self.joins:
                fake_cluster(self.joins).add_nodes(
                    1, names=[node.id], gpus=node.type.gpus, gpu_model=node.type.gpu_model,
                    cpu_cores=node.type.cpu_cores, memory_mib=node.type.memory_mib)
                node.joined = True

    def _type(self, name: str) -> NodeType:
        found = self._types.get(name)
        if found is None:
            known = ", ".join(self._types) or "none"
            raise ProviderError(
                f"simulated cloud {self.name} has no node type {name!r}; known types: {known}")
        return found

    def set_stock(self, node_type: str, count: int | None) -> None:
        """At most `count` nodes of the type held at once (None: unlimited)."""
        if count is not None and count < 0:
            raise ValueError("stock cannot be negative")
        with self._lock:
            self._type(node_type)
            self._stock[node_type] = count

    def fail_next(self, count: int = 1, reason: str = "simulated boot failure") -> None:
        """The next `count` nodes requested fail at their ready time instead of joining."""
        if count < 0:
            raise ValueError("count cannot be negative")
        with self._lock:
            self._failures.extend([reason] * count)

    def types(self) -> list[NodeType]:
        return list(self._types.values())

    def request(self, *, request_id: str, node_type: str, count: int) -> list[ProviderNode]:
        with self._lock:
            self._settle()
            if request_id in self._requests:
                first = [self._nodes[node_id] for node_id in self._requests[request_id]]
                if (len(first), first[0].type.name) != (count, node_type):
                    raise ProviderError(
                        f"request {request_id} was for {len(first)} {first[0].type.name} "
                        f"nodes, not {count} {node_type}")
                return [node.public() for node in first]
            wanted = self._type(node_type)
            if count < 1:
                raise ProviderError(f"a request needs at least one node, not {count}")
            stock = self._stock[node_type]
            held = sum(1 for n in self._nodes.values() if n.type == wanted and n.holds_stock)
            if stock is not None and held + count > stock:
                raise StockOut(f"simulated cloud {self.name} has {max(stock - held, 0)} "
                               f"{node_type} nodes available, not {count}")
            bought = []
            for _ in range(count):
                node_id = f"{self.name}-{node_type}-{self._count:04d}"
                self._count += 1
                reason = self._failures.pop(0) if self._failures else None
                self._nodes[node_id] = _Node(node_id, wanted, request_id, self.now, reason)
                bought.append(node_id)
            self._requests[request_id] = bought
            self._settle()  # a type that boots in no time is ready at once
            return [self._nodes[node_id].public() for node_id in bought]

    def nodes(self) -> list[ProviderNode]:
        with self._lock:
            self._settle()
            return [n.public() for n in self._nodes.values() if n.state != NodeState.DELETED]

    def delete(self, node_id: str) -> None:
        with self._lock:
            self._settle()
            node = self._nodes.get(node_id)
            if node is None or node.state == NodeState.DELETED:
                return
            node.state = NodeState.DELETED
            if node.joined and self.joins:
                fake_cluster(self.joins).remove_node(node.id)
                node.joined = False


_clouds: dict[str, SimulatedCloud] = {}
_clouds_lock = threading.Lock()


def simulated_cloud(name: str, options: dict | None = None) -> SimulatedCloud:
    """The simulated cloud of this name, created with `options` if it does not exist yet (the
    first creator sets its shape). With `OGAI_FAKE_STATE_DIR` set, its state is in a file there
    that every process shares, on the wall clock (`podsys.drivers.fake_state`)."""
    folder = shared_state_dir()
    if folder is not None:
        shared = SharedFake(state_file(folder, "cloud", name), SimulatedCloud,
                            lambda: SimulatedCloud(name, options))
        return cast(SimulatedCloud, shared)
    with _clouds_lock:
        cloud = _clouds.get(name)
        if cloud is None:
            cloud = _clouds[name] = SimulatedCloud(name, options)
        return cloud


def reset_simulated_clouds() -> None:
    """Forget every simulated cloud (for tests)."""
    with _clouds_lock:
        _clouds.clear()


class SimulatedProvider(CapacityProvider):
    """Options (used when the cloud is first created): `types` (NodeType fields, one dict a
    type), `stock` ({type: nodes held at once}, unlimited by default) and `joins` (the fake
    cluster its READY nodes join)."""

    def __init__(self, *, name: str, options: dict | None = None) -> None:
        super().__init__(name=name, options=options)
        simulated_cloud(name, self.options)  # created now, so its options apply from the start

    @property
    def cloud(self) -> SimulatedCloud:
        # Looked up on each call, so reset_simulated_clouds() also resets live instances.
        return simulated_cloud(self.name, self.options)

    def types(self) -> list[NodeType]:
        return self.cloud.types()

    def request(self, *, request_id: str, node_type: str, count: int) -> list[ProviderNode]:
        return self.cloud.request(request_id=request_id, node_type=node_type, count=count)

    def nodes(self) -> list[ProviderNode]:
        return self.cloud.nodes()

    def delete(self, node_id: str) -> None:
        self.cloud.delete(node_id)

    def now(self) -> float:
        return self.cloud.now
