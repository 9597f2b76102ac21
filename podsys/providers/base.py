"""The capacity-provider contract: where the platform buys whole nodes and gives them back.

Like the cluster driver contract (`podsys.drivers.base`), only the plain dataclasses below
cross it, never ORM objects. A provider is configured by a dotted class path and its options.
`request` buys a gang, all nodes or none, and is idempotent by request id, so a retried cycle
never buys twice. A bought node joins its cluster under the provider's id for it, which is how
the platform matches a cluster's node to what it pays for.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeType:
    """A kind of node the provider sells, as it states it."""

    name: str  # "h100x8"
    gpu_model: str  # "H100"
    gpus: int  # per node
    cpu_cores: float
    memory_mib: int
    price_per_hour: float  # currency units per node-hour
    boot_s: float  # seconds from request to ready


class NodeState(enum.StrEnum):
    REQUESTED = "requested"  # accepted, no machine yet
    BOOTING = "booting"
    READY = "ready"
    FAILED = "failed"
    DELETED = "deleted"


@dataclass(frozen=True)
class ProviderNode:
    """One bought node. `id` is the provider's name for it, and its name in the cluster unless
    `node_name` says otherwise."""

    id: str
    node_type: str
    request_id: str  # the request it came from
    state: NodeState
    requested_at: float  # on the provider's clock (seconds)
    ready_at: float | None = None
    reason: str = ""  # why FAILED, in words
    # Its name in the cluster once it joined, where that is not `id` (a provider whose nodes
    # the cluster's own autoscaler makes learns it only then); "" means `id`.
    node_name: str = ""


class ProviderError(Exception):
    """The provider refused or failed; the message is for people."""


class StockOut(ProviderError):
    """Not enough nodes of that type now: the platform waits and asks again later."""


class CapacityProvider(ABC):
    def __init__(self, *, name: str, options: dict | None = None) -> None:
        self.name = name
        self.options = dict(options or {})

    @abstractmethod
    def types(self) -> list[NodeType]: ...

    @abstractmethod
    def request(self, *, request_id: str, node_type: str, count: int) -> list[ProviderNode]:
        """All `count` nodes or none (a gang is never half-bought): StockOut when the provider
        cannot supply all of them now, ProviderError for other refusals (unknown type,
        count < 1). Idempotent: a second request with the same `request_id` returns the
        first's nodes and buys nothing."""

    @abstractmethod
    def nodes(self) -> list[ProviderNode]:
        """Every node not deleted, with its current state."""

    @abstractmethod
    def delete(self, node_id: str) -> None:
        """Give the node back; deleting a deleted or unknown node does nothing."""

    def now(self) -> float:
        """The provider's clock in seconds, the one `requested_at` and `ready_at` are on."""
        return time.time()

    def node_type(self, name: str) -> NodeType:
        """The type called `name`; ProviderError naming the known ones otherwise."""
        types = self.types()
        for found in types:
            if found.name == name:
                return found
        known = ", ".join(t.name for t in types) or "none"
        raise ProviderError(
            f"provider {self.name} has no node type {name!r}; known types: {known}"
        )


def provider_for(path: str, *, name: str, options: dict | None = None) -> CapacityProvider:
    """A provider of class `path` (a dotted path, like a cluster driver's) called `name`."""
    from django.utils.module_loading import import_string

    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ProviderError(f"cannot import capacity provider {path!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, CapacityProvider)):
        raise ProviderError(f"{path!r} is not a CapacityProvider")
    return cls(name=name, options=dict(options or {}))
