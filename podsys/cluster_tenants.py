"""Whether tenants run work on a cluster: those with a queue on it. Queues live in a higher
layer (aistation), so it registers the function that knows; podsys only asks."""

from collections.abc import Callable
from typing import Any

# (cluster id, tenant ids: a list or a subquery) -> does one of them run work there?
RunsThereProvider = Callable[[int, Any], bool]
_providers: list[RunsThereProvider] = []


def register_runs_there_provider(provider: RunsThereProvider) -> None:
    if provider not in _providers:
        _providers.append(provider)


def tenants_run_there(cluster_id: int, tenant_ids: Any) -> bool:
    """Whether one of the tenants runs work on the cluster, by any registered provider."""
    return any(provider(cluster_id, tenant_ids) for provider in _providers)
