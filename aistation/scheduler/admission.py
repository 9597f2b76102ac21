"""GPU usage per tenant, queue and (tenant, GPU model), counted once from the running jobs and kept
up to date as the cycle starts and preempts work.

Borrowed work runs above its tenant's quota, so it counts towards neither the quota nor the model
limits (that is what makes it borrowed); it does count towards its queue's limit, which is hard,
and towards the tenant's share of the cluster."""

from __future__ import annotations

from collections.abc import Mapping

from .types import TenantSnap

NO_TENANT = TenantSnap(name="", gpu_quota=0)


class Usage:
    def __init__(self) -> None:
        self.quota_used: dict[str, int] = {}  # non-borrowed GPUs per tenant
        self.running: dict[str, int] = {}  # all GPUs per tenant, borrowed too
        self.queue_used: dict[str, int] = {}  # all GPUs per queue
        self.model_used: dict[tuple[str, str], int] = {}  # non-borrowed GPUs per (tenant, model)

    def change(
        self,
        tenant: str,
        queue: str,
        gpus: int,
        borrowed: bool,
        model_gpus: Mapping[str, int],
        sign: int,
    ) -> None:
        delta = sign * gpus
        running, queue_used = self.running, self.queue_used
        running[tenant] = running.get(tenant, 0) + delta
        queue_used[queue] = queue_used.get(queue, 0) + delta
        if borrowed:
            return
        self.quota_used[tenant] = self.quota_used.get(tenant, 0) + delta
        if model_gpus:
            model_used = self.model_used
            for model, count in model_gpus.items():
                key = (tenant, model)
                model_used[key] = model_used.get(key, 0) + sign * count

    def model_over(
        self, tenant: TenantSnap, model: str, gpus: int
    ) -> tuple[int, int] | None:
        """(used, limit) when `gpus` more of `model` would pass the tenant's limit for it."""
        limit = tenant.gpu_model_limits.get(model)
        if limit is None:
            return None
        used = self.model_used.get((tenant.name, model), 0)
        return (used, limit) if used + gpus > limit else None

    def blocked_models(self, tenant: TenantSnap, gpus: int) -> list[str]:
        """The models a job of any model could not use without passing a model limit."""
        name = tenant.name
        return [
            model
            for model, limit in tenant.gpu_model_limits.items()
            if self.model_used.get((name, model), 0) + gpus > limit
        ]
