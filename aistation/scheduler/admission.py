"""GPU usage per tenant, queue and (tenant, GPU model), counted once from the running jobs and kept
up to date as the cycle starts and preempts work.

Borrowed work runs above its tenant's quota, so it counts towards neither the quota nor the model
limits (that is what makes it borrowed); it does count towards its queue's limit, which is hard,
and towards the tenant's share of the cluster.

CPU cores, memory and RDMA devices are counted only for tenants with a CPU, memory or RDMA quota
("capped"), and for all their work, borrowed too: those quotas are hard, nothing borrows above
them. Work held on other clusters is counted from the start (`TenantSnap.cpu_held_elsewhere`,
…)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from . import reasons
from .placement import EPS
from .types import TenantSnap

NO_TENANT = TenantSnap(name="", gpu_quota=0)


class Usage:
    def __init__(self) -> None:
        self.quota_used: dict[str, int] = {}  # non-borrowed GPUs per tenant
        self.running: dict[str, int] = {}  # all GPUs per tenant, borrowed too
        self.queue_used: dict[str, int] = {}  # all GPUs per queue
        self.model_used: dict[tuple[str, str], int] = {}  # non-borrowed GPUs per (tenant, model)
        self.cpu_used: dict[str, float] = {}  # CPU cores per capped tenant, all its work
        self.mem_used: dict[str, int] = {}  # MiB per capped tenant, all its work
        self.rdma_used: dict[str, int] = {}  # RDMA devices per capped tenant, all its work

    def count_held_elsewhere(self, tenants: Iterable[TenantSnap]) -> set[str]:
        """Start the CPU, memory and RDMA counts of the capped tenants; returns their names."""
        capped = set()
        for tenant in tenants:
            if (tenant.cpu_quota is not None or tenant.memory_quota_mib is not None
                    or tenant.rdma_quota is not None):
                capped.add(tenant.name)
                self.cpu_used[tenant.name] = tenant.cpu_held_elsewhere
                self.mem_used[tenant.name] = tenant.memory_mib_held_elsewhere
                self.rdma_used[tenant.name] = tenant.rdma_held_elsewhere
        return capped

    def change_cores(self, tenant: str, cpu: float, mem: int, rdma: int, sign: int) -> None:
        """A capped tenant's work of `cpu` cores, `mem` MiB and `rdma` RDMA devices in all
        starts (+1) or stops."""
        self.cpu_used[tenant] = self.cpu_used.get(tenant, 0.0) + sign * cpu
        self.mem_used[tenant] = self.mem_used.get(tenant, 0) + sign * mem
        if rdma:
            self.rdma_used[tenant] = self.rdma_used.get(tenant, 0) + sign * rdma

    def cores_short(
        self, tenant: TenantSnap, cpu: float, mem: int, rdma: int
    ) -> tuple[float, int, int]:
        """How many CPU cores, MiB and RDMA devices must be given back before work of `cpu`
        cores, `mem` MiB and `rdma` devices in all fits the tenant's CPU, memory and RDMA
        quotas (0: none)."""
        short_cpu, short_mem, short_rdma = 0.0, 0, 0
        if tenant.cpu_quota is not None:
            short_cpu = self.cpu_used.get(tenant.name, 0.0) + cpu - tenant.cpu_quota
        if tenant.memory_quota_mib is not None:
            short_mem = self.mem_used.get(tenant.name, 0) + mem - tenant.memory_quota_mib
        if tenant.rdma_quota is not None and rdma > 0:
            short_rdma = self.rdma_used.get(tenant.name, 0) + rdma - tenant.rdma_quota
        return ((short_cpu if short_cpu > EPS else 0.0), (short_mem if short_mem > 0 else 0),
                (short_rdma if short_rdma > 0 else 0))

    def cores_reason(self, tenant: TenantSnap, cpu: float, mem: int, rdma: int) -> str | None:
        """The wait reason when work of `cpu` cores, `mem` MiB and `rdma` RDMA devices would
        pass the tenant's CPU, memory or RDMA quota, or None when it fits."""
        short_cpu, short_mem, short_rdma = self.cores_short(tenant, cpu, mem, rdma)
        if short_cpu > 0 and tenant.cpu_quota is not None:
            used = self.cpu_used.get(tenant.name, 0.0)
            return reasons.cpu_quota_full(used, tenant.cpu_quota, cpu)
        if short_mem > 0 and tenant.memory_quota_mib is not None:
            used_mem = self.mem_used.get(tenant.name, 0)
            return reasons.memory_quota_full(used_mem, tenant.memory_quota_mib, mem)
        if short_rdma > 0 and tenant.rdma_quota is not None:
            used_rdma = self.rdma_used.get(tenant.name, 0)
            return reasons.rdma_quota_full(used_rdma, tenant.rdma_quota, rdma)
        return None

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
