"""Which tenants run work on a cluster: those with a queue on it. Queues live in a higher layer
(aistation), so it registers the function that knows; podsys only asks."""

from collections.abc import Callable

TenantsProvider = Callable[[int], set[int]]
_providers: list[TenantsProvider] = []


def register_cluster_tenants_provider(provider: TenantsProvider) -> None:
    if provider not in _providers:
        _providers.append(provider)


def cluster_tenant_ids(cluster_id: int) -> set[int]:
    """The ids of the tenants that run work on the cluster, by every registered provider."""
    found: set[int] = set()
    for provider in _providers:
        found |= provider(cluster_id)
    return found
