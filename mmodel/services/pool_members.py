"""A pool's members added and removed while it serves. A replica learns its models when it
starts (its command names them, and where work is sandboxed only their folders are mounted), so
its running replicas are started again, one new job each, and take requests once ready; the
gateway holds requests meanwhile (`OGAI_GATEWAY_COLD_START_WAIT_S`)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from aistation.choices import FINAL_STATES
from infra_os.access import require_role
from infra_os.choices import WRITE_ROLES
from infra_os.services.audit import audit_record
from mmodel.models import Deployment, DeploymentMember, ModelVersion
from mmodel.services.deployments import (
    deployment_locked,
    deployment_replicas,
    replica_stop,
    replica_submit,
)
from mmodel.services.pools import check_pool, pool_budget_mib


def _restart(actor, deployment: Deployment, why: str) -> None:
    if not deployment.active or deployment.scaled_to_zero:
        return  # the next start runs the new command
    for replica in deployment_replicas(deployment):
        if replica.job is not None and replica.job.state not in FINAL_STATES:
            replica_stop(actor, replica, why)
            replica_submit(actor, deployment, replica, why)


@transaction.atomic
def pool_member_add(*, actor, deployment: Deployment, name: str,
                    version: ModelVersion) -> DeploymentMember:
    """Serve `version` as `name` in the pool (a deployment without members becomes one)."""
    require_role(actor, deployment.tenant, WRITE_ROLES)
    deployment = deployment_locked(deployment)
    members = [(m.name, m.version) for m in deployment.members.select_related(
        "version__model", "version__base_version")]
    check_pool(tenant=deployment.tenant, name=deployment.name, version=deployment.version,
               runtime=deployment.runtime, members=[*members, (name, version)],
               budget_mib=pool_budget_mib(
                   pool_memory_mib=deployment.pool_memory_mib,
                   memory_mib_per_replica=deployment.memory_mib_per_replica),
               max_loras=deployment.max_loras, deployment=deployment)
    member = DeploymentMember.objects.create(deployment=deployment, name=name, version=version)
    _restart(actor, deployment, f"started again by {actor.get_username()} to serve {name}")
    audit_record(actor=actor, action="deployment.pool_add", obj=deployment,
                 tenant=deployment.tenant, changes={"name": name, "version": version.label})
    return member


@transaction.atomic
def pool_member_remove(*, actor, deployment: Deployment, name: str) -> None:
    """Stop serving `name` in the pool."""
    require_role(actor, deployment.tenant, WRITE_ROLES)
    deployment = deployment_locked(deployment)
    member = deployment.members.select_related("version__model").filter(name=name).first()
    if member is None:
        raise ValidationError({"name": f"The pool {deployment.name} serves no model {name!r}."})
    member.delete()
    _restart(actor, deployment, f"started again by {actor.get_username()} without {name}")
    audit_record(actor=actor, action="deployment.pool_remove", obj=deployment,
                 tenant=deployment.tenant, changes={"name": name,
                                                    "version": member.version.label})
