"""How many GPUs of each node are held. Jobs live in a higher layer (aistation), so it
registers the function that knows; podsys only asks."""

from collections.abc import Callable, Iterable

AllocationProvider = Callable[[Iterable[int]], dict[tuple[int, str], int]]
_providers: list[AllocationProvider] = []


def register_allocation_provider(provider: AllocationProvider) -> None:
    if provider not in _providers:
        _providers.append(provider)


def gpu_allocations(cluster_ids: Iterable[int]) -> dict[tuple[int, str], int]:
    """{(cluster id, node name): GPUs held} summed over every registered provider."""
    ids = list(cluster_ids)
    held: dict[tuple[int, str], int] = {}
    for provider in _providers:
        for key, gpus in provider(ids).items():
            held[key] = held.get(key, 0) + gpus
    return held
