"""Reads of MModel's deployments, scoped to the caller's tenants."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Prefetch, QuerySet

from aistation.selectors import job_waiting_reason
from infra_os.access import scope_to_user
from infra_os.models import Tenant
from mmodel.choices import DeploymentState, Runtime
from mmodel.gateway.stats import percentile
from mmodel.models import Deployment, DeploymentMember, DeploymentReplica, DeploymentStat
from mmodel.runtimes import is_embedding_model
from mmodel.services.adapters import adapter_serving, is_adapter
from mmodel.storage import absolute


def deployments_for(user, tenant: Tenant | None = None) -> QuerySet[Deployment]:
    """With their replicas and the replicas' jobs (for `deployment_state`) in one query more."""
    queryset = scope_to_user(
        Deployment.objects.select_related("tenant", "version__model", "queue", "created_by")
        .prefetch_related(Prefetch("replica_set", queryset=DeploymentReplica.objects
                                   .select_related("job").order_by("index")),
                          Prefetch("members", queryset=DeploymentMember.objects
                                   .select_related("version__model").order_by("name"))),
        user)
    return queryset.filter(tenant=tenant) if tenant is not None else queryset


def deployment_state(deployment: Deployment) -> DeploymentState:
    """stopped (by a user), scaled_to_zero (idle), failed (a replica the platform gave up on),
    ready (every replica), degraded (some), starting (none yet)."""
    if not deployment.active:
        return DeploymentState.STOPPED
    if deployment.scaled_to_zero:
        return DeploymentState.SCALED_TO_ZERO
    replicas = list(deployment.replica_set.all())
    if any(replica.failed for replica in replicas):
        return DeploymentState.FAILED
    ready = sum(1 for replica in replicas if replica.ready)
    if replicas and ready == len(replicas):
        return DeploymentState.READY
    return DeploymentState.DEGRADED if ready else DeploymentState.STARTING


def deployment_waiting_reason(deployment: Deployment) -> str:
    """Why its first replica still waiting for the scheduler waits ("" if none does), from the
    replicas and jobs `deployments_for` prefetched."""
    if not deployment.active or deployment.scaled_to_zero:
        return ""
    for replica in deployment.replica_set.all():
        reason = "" if replica.ready else job_waiting_reason(replica.job)
        if reason:
            return reason
    return ""


def deployment_stats(deployment: Deployment, since: datetime) -> list[dict]:
    """Per-minute rows since `since`, oldest first: requests, errors, tokens, mean latency and
    its p50/p99 read off the gateway's histogram, and the requests that waited for a replica
    to start with the longest wait."""
    rows = DeploymentStat.objects.filter(deployment=deployment, minute__gte=since) \
        .order_by("minute")
    return [{
        "minute": row.minute, "requests": row.requests, "errors": row.errors,
        "prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens,
        "latency_ms_mean": row.latency_ms_sum / row.requests if row.requests else None,
        "latency_ms_p50": percentile(row.latency_buckets, 0.5) if row.requests else None,
        "latency_ms_p99": percentile(row.latency_buckets, 0.99) if row.requests else None,
        "cold_starts": row.cold_starts,
        "cold_start_ms_max": row.cold_start_ms_max if row.cold_starts else None,
    } for row in rows]


def deployment_last_cold_start(deployment: Deployment) -> DeploymentStat | None:
    """The newest minute in which a request waited for one of its replicas to start."""
    return DeploymentStat.objects.filter(deployment=deployment, cold_starts__gt=0) \
        .order_by("-minute").first()


def deployment_embeds(deployment: Deployment) -> bool:
    """Whether it serves embeddings (/v1/embeddings) rather than completions."""
    version = deployment.version
    return bool(version.artifact_path) and not is_adapter(version) and \
        is_embedding_model(absolute(version.artifact_path))


def deployment_pool(deployment: Deployment) -> list[dict]:
    """A pool's members: name, version, kind, and the replicas (by index) that held each at
    their last health check (the base's entry first); [] for a deployment that is no pool."""
    members = list(deployment.members.all())
    if not members:
        return []
    replicas = list(deployment.replica_set.all())

    def held_by(name: str) -> list[int]:
        # vLLM holds every adapter of its pool (in host memory, max_loras on the GPU).
        return [r.index for r in replicas if r.ready and (
            deployment.runtime == Runtime.VLLM or name in (r.holds or []))]

    rows = [{"name": deployment.name, "version": deployment.version_id,
             "version_label": deployment.version.label, "kind": "base",
             "held_by": held_by(deployment.name)}]
    rows += [{"name": m.name, "version": m.version_id, "version_label": m.version.label,
              "kind": "adapter" if is_adapter(m.version) else "model",
              "held_by": held_by(m.name)} for m in members]
    return rows


def deployment_serving(deployment: Deployment) -> str:
    """How its runtime serves the version, in words: an adapter merged or attached ("" for a
    plain model)."""
    return adapter_serving(deployment.version, deployment.runtime)
