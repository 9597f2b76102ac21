"""Capacity providers: clouds the platform buys whole gangs of nodes from when work fits
nowhere, and returns empty nodes to. The contract is in `base`; `simulated` is the in-memory
cloud for tests, demos and benchmarks."""

from __future__ import annotations

from podsys.providers.base import (
    CapacityProvider,
    NodeState,
    NodeType,
    ProviderError,
    ProviderNode,
    StockOut,
    provider_for,
)

__all__ = [
    "CapacityProvider",
    "NodeState",
    "NodeType",
    "ProviderError",
    "ProviderNode",
    "StockOut",
    "provider_for",
]
