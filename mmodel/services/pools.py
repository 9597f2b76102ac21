"""Pools: one deployment serving many versions of a model family, each under its own model
name. Its version is the base; its members are LoRA adapters of that base (applied on each
replica's one copy of it: vLLM's --enable-lora, or the transformers runtime's
`mmodel.runners.serve_pool`, which gives each row of a batch its own adapter) and, with the
transformers runtime, whole models that each replica loads by demand and evicts least recently
used within the pool's memory budget. The gateway sends a request for a member to a replica that
holds it when one does (`mmodel.gateway.routing`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from django.core.exceptions import ValidationError

from infra_os.models import Tenant
from mmodel.choices import Runtime, VersionStatus
from mmodel.models import Deployment, DeploymentMember, ModelVersion
from mmodel.models.registry import model_name
from mmodel.runners.lora_bank import unbatched
from mmodel.runners.serve_pool import weights_bytes
from mmodel.runtimes import PoolEntry, ServeTarget, is_embedding_model
from mmodel.services.adapters import is_adapter, is_prompt_adapter
from mmodel.storage import artifact_folder

MAX_MEMBERS = 64
MAX_LORAS = 64
# Without a budget of its own a pool's replica gives its whole models half of its memory: the
# rest is the server's own (torch, tokenizers), the KV cache and activations.
DEFAULT_BUDGET_SHARE = 0.5


def pool_budget_mib(*, pool_memory_mib: int, memory_mib_per_replica: int) -> int:
    return pool_memory_mib or int(memory_mib_per_replica * DEFAULT_BUDGET_SHARE)


def taken_names(tenant: Tenant, *, besides: Deployment | None = None) -> set[str]:
    """Model names the tenant's deployments and pool members answer to (but `besides`'s
    members)."""
    members = DeploymentMember.objects.filter(deployment__tenant=tenant)
    if besides is not None:
        members = members.exclude(deployment=besides)
    return {*Deployment.objects.filter(tenant=tenant).values_list("name", flat=True),
            *members.values_list("name", flat=True)}


def member_kind(version: ModelVersion) -> str:
    return "LoRA adapter" if is_adapter(version) else "whole model"


def check_pool(*, tenant: Tenant, name: str, version: ModelVersion, runtime: str,
               members: Sequence[tuple[str, ModelVersion]], budget_mib: int,
               max_loras: int, deployment: Deployment | None = None) -> None:
    """Refuse, in words and by field, a pool that could not serve as asked (`deployment`: the
    pool as it is, when its members change)."""
    if len(members) > MAX_MEMBERS:
        raise ValidationError({"pool": f"A pool serves at most {MAX_MEMBERS} models beside "
                               "its base."})
    if not 1 <= max_loras <= MAX_LORAS:
        raise ValidationError({"max_loras": f"Use 1 to {MAX_LORAS} adapters."})
    if is_adapter(version) or is_embedding_model(artifact_folder(version)):
        raise ValidationError({"version": f"{version.label} cannot be a pool's base: deploy "
                               "a whole text-generation model, and its adapters as members."})
    taken, seen = taken_names(tenant, besides=deployment), {name}
    for member_name, member in members:
        try:
            model_name(member_name)
        except ValidationError as exc:
            raise ValidationError({"pool": [f"{member_name!r}: {m}" for m in exc.messages]}) \
                from None
        if member_name in seen:
            raise ValidationError({"pool": f"The name {member_name!r} is used twice."})
        if member_name in taken:
            raise ValidationError({"pool": f"{tenant.name} already serves a model named "
                                   f"{member_name!r}."})
        seen.add(member_name)
        _check_member(tenant, version, runtime, member_name, member)
    budget = budget_mib * 2**20
    for label, folder in [(version.label, artifact_folder(version)),
                          *((m.label, artifact_folder(m)) for _, m in members
                            if not is_adapter(m))]:
        size = weights_bytes(str(folder))
        if size > budget:
            raise ValidationError({"pool_memory_mib": (
                f"{label} has {size / 2**20:.0f} MiB of weights, more than the pool's budget "
                f"of {budget_mib} MiB: raise pool_memory_mib (or the replica's memory).")})


def _check_member(tenant: Tenant, base: ModelVersion, runtime: str, name: str,
                  member: ModelVersion) -> None:
    if member.model.tenant_id != tenant.pk:
        raise ValidationError({"pool": f"No model version {member.pk} in {tenant.name}."})
    if member.status != VersionStatus.READY:
        raise ValidationError({"pool": f"{member.label} is {member.status}: add it once it is "
                               "ready."})
    if is_adapter(member):
        if is_prompt_adapter(member):
            raise ValidationError({"pool": f"{member.label} is a tuned prompt: a pool serves "
                                   "LoRA adapters; deploy the prompt on its own."})
        if member.base_version_id != base.pk:
            raise ValidationError({"pool": f"{member.label} is an adapter of another base "
                                   f"than {base.label}: a pool's adapters share its base."})
        why = unbatched(_adapter_config(member))
        if why:
            raise ValidationError({"pool": f"{member.label} uses {why}, which a pool cannot "
                                   "apply request by request: deploy it on its own, or merge "
                                   "it into its base."})
        return
    if runtime == Runtime.VLLM:
        raise ValidationError({"pool": f"{member.label} is a whole model: vLLM pools LoRA "
                               "adapters of its base only. Use the transformers runtime to "
                               "pool whole models."})
    if is_embedding_model(artifact_folder(member)):
        raise ValidationError({"pool": f"{member.label} is an embedding model: deploy it on "
                               "its own."})


def pool_target(deployment: Deployment) -> ServeTarget | None:
    """What a pool's replicas serve (None: the deployment is not a pool)."""
    members = list(deployment.members.select_related("version"))
    if not members:
        return None
    entries = tuple(PoolEntry(name=m.name, folder=artifact_folder(m.version),
                              adapter=is_adapter(m.version)) for m in members)
    return ServeTarget(artifact_folder(deployment.version), pool=entries,
                       pool_memory_mib=pool_budget_mib(
                           pool_memory_mib=deployment.pool_memory_mib,
                           memory_mib_per_replica=deployment.memory_mib_per_replica),
                       max_loras=deployment.max_loras)


def _adapter_config(adapter: ModelVersion) -> dict:
    try:
        found = json.loads((artifact_folder(adapter) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
