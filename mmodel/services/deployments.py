"""Deployments: a model version answering at the gateway, each replica a service job of the
deployment's queue (so it waits for quota and holds GPUs like any job, and a killed replica is
restarted alone by AIStation). The watch task (`mmodel.services.deployment_watch`) reads each
replica's health, replaces jobs that ended for good, and scales idle deployments to zero; the
gateway wakes them (`deployment_wake`).

The platform acts on its own (replacing a job, scaling to zero, waking) as the deployment's
creator while they may still start work in its tenant, as a notebook's session is its owner's.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from aistation.choices import FINAL_STATES
from aistation.labels import OWNER_LABEL
from aistation.models import Job, Queue
from aistation.services.jobs import job_cancel, job_submit
from infra_os.access import is_platform_admin, require_role, role_in
from infra_os.choices import WRITE_ROLES
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from mmodel.choices import Runtime, VersionStatus
from mmodel.models import Deployment, DeploymentMember, DeploymentReplica, ModelVersion
from mmodel.models.registry import model_name
from mmodel.runtimes import ServeTarget, check_runtime, is_embedding_model, server_spec
from mmodel.services.adapters import (
    FAILED,
    PROMPT_SERVING,
    is_adapter,
    is_prompt_adapter,
    merge_state,
    merged_folder,
)
from mmodel.services.pools import check_pool, pool_budget_mib, pool_target, taken_names
from mmodel.storage import artifact_folder, data_mounts
from ogai.crypto import decrypt, encrypt
from podsys.drivers.base import ROLE_LABEL, ROLE_MODEL_SERVER

MAX_REPLICAS = 16
# Restarts AIStation makes of one replica's job (same job, new attempt) before it fails; and
# new jobs the watch task submits for a replica that has not been ready since, before it gives
# up.
REPLICA_MAX_RESTARTS = 3
MAX_RESUBMITS = 3
MIN_IDLE_TIMEOUT_S, MAX_IDLE_TIMEOUT_S = 60, 7 * 24 * 3600
MERGING = "merging the LoRA adapter into its base model before the first start"


class NoActor(Exception):
    """Nobody may start the deployment's jobs on its behalf now; the message says why."""


# -- checks ----------------------------------------------------------------------------------------


def _check_runtime_serves(version: ModelVersion, runtime: str) -> None:
    if runtime == Runtime.VLLM and is_prompt_adapter(version):
        raise ValidationError({"runtime": f"{version.label} is a tuned prompt: {PROMPT_SERVING}. "
                               "Deploy it with the transformers runtime."})
    if runtime == Runtime.VLLM and not is_adapter(version) and \
            is_embedding_model(artifact_folder(version)):
        raise ValidationError({"runtime": f"{version.label} is an embedding model: deploy it "
                               "with the transformers runtime, which serves /v1/embeddings."})


def _check_version(version: ModelVersion, tenant: Tenant) -> None:
    if version.model.tenant_id != tenant.pk:
        raise ValidationError({"version": f"No model version {version.pk} in {tenant.name}."})
    if version.status != VersionStatus.READY:
        raise ValidationError({"version": f"{version.label} is {version.status}: deploy it "
                               "once it is ready."})
    if is_adapter(version):
        base = version.base_version
        if base is None or base.status != VersionStatus.READY:
            raise ValidationError({"version": f"{version.label} is an adapter whose base "
                                   "model version is missing or not ready."})


def _check_replicas(replicas: int) -> None:
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValidationError({"replicas": f"Use 1 to {MAX_REPLICAS} replicas."})


def _check_capacity(queue: Queue, *, replicas: int, gpus: int) -> None:
    """All replicas together must fit the cluster (each job checks only its own replica)."""
    total = (queue.cluster.capacity or {}).get("all", {}).get("gpus")
    if gpus and total is not None and gpus * replicas > total:
        raise ValidationError({"replicas": f"{replicas} replicas of {gpus} GPUs need "
                               f"{gpus * replicas} GPUs; cluster {queue.cluster.name} has "
                               f"{total}."})


def _check_resources(*, gpus: int, cpu: float, memory_mib: int, idle_timeout_s: int) -> None:
    if gpus < 0:
        raise ValidationError({"gpus_per_replica": "Use 0 or more GPUs."})
    if not cpu > 0:
        raise ValidationError({"cpu_per_replica": "Use more than 0 CPU cores."})
    if memory_mib < 1:
        raise ValidationError({"memory_mib_per_replica": "Use at least 1 MiB."})
    if idle_timeout_s and not MIN_IDLE_TIMEOUT_S <= idle_timeout_s <= MAX_IDLE_TIMEOUT_S:
        raise ValidationError({"idle_timeout_s": f"Use 0 (never scale to zero) or "
                               f"{MIN_IDLE_TIMEOUT_S} s to a week."})


# -- replicas and their jobs -----------------------------------------------------------------------


def serve_target(deployment: Deployment) -> tuple[ServeTarget | None, str]:
    """What the replicas serve, or (None, why not yet) while an adapter is being merged (or
    its merge failed)."""
    version = deployment.version
    pool = pool_target(deployment)
    if pool is not None:
        return pool, ""
    if not is_adapter(version):
        return ServeTarget(artifact_folder(version)), ""
    assert version.base_version is not None  # checked when deployed
    if is_prompt_adapter(version):  # never merged: the transformers runtime attaches it
        return ServeTarget(artifact_folder(version.base_version),
                           adapter=artifact_folder(version), attach=True), ""
    if deployment.runtime == Runtime.VLLM:
        return ServeTarget(artifact_folder(version.base_version),
                           adapter=artifact_folder(version)), ""
    done, failure = merge_state(version)
    if done:
        return ServeTarget(merged_folder(version)), ""
    return None, failure or MERGING


def _request_merge(version: ModelVersion) -> None:
    """Merge in a task, after commit; a failed merge is tried again."""
    failed = merged_folder(version)
    failed.with_name(failed.name + FAILED).unlink(missing_ok=True)

    def enqueue() -> None:
        from mmodel.tasks.deployments import merge_adapter

        merge_adapter.delay(version_id=version.pk)

    transaction.on_commit(enqueue)


def _needs_merge(deployment: Deployment) -> bool:
    return (is_adapter(deployment.version) and deployment.runtime == Runtime.TRANSFORMERS
            and not is_prompt_adapter(deployment.version)
            and not merge_state(deployment.version)[0])


def _may_act(user, tenant_id: int) -> bool:
    return user is not None and user.is_active and (
        is_platform_admin(user) or role_in(user, tenant_id) in WRITE_ROLES)


def platform_actor(deployment: Deployment):
    """Who the platform acts as for this deployment: its creator, else whoever last started
    one of its replicas, while they may still start work in its tenant."""
    creator = deployment.created_by
    if _may_act(creator, deployment.tenant_id):
        return creator
    starters = Job.objects.filter(deployment_replica__deployment=deployment) \
        .exclude(owner=None).select_related("owner").order_by("-pk")
    for job in starters:
        if _may_act(job.owner, deployment.tenant_id):
            return job.owner
    who = creator.get_username() if creator is not None else "its creator"
    raise NoActor(f"{who} can no longer start work in {deployment.tenant.name}: a member "
                  "must start the deployment again")


def deployment_api_key(deployment: Deployment) -> str:
    """The key its replicas require, made (and stored encrypted) the first time it is needed:
    at creation, or at the next start of a deployment made before deployments had keys."""
    if not deployment.api_key:
        deployment.api_key = encrypt(secrets.token_urlsafe(32))
        Deployment.objects.filter(pk=deployment.pk, api_key="").update(
            api_key=deployment.api_key)
        # Another start may have stored one meanwhile: theirs is the key.
        deployment.api_key = Deployment.objects.values_list("api_key", flat=True) \
            .get(pk=deployment.pk)
    return decrypt(deployment.api_key)


def replica_submit(actor, deployment: Deployment, replica: DeploymentReplica,
                   reason: str) -> Job | None:
    """A new service job for the replica (none while its adapter is merging: the message says
    so, and the watch task submits it once merged)."""
    target, why = serve_target(deployment)
    replica.ready, replica.ready_since, replica.upstream, replica.workload_id = False, None, "", ""
    replica.unhealthy_since, replica.answered = None, False
    if target is None:
        replica.message = why
        replica.save()
        return None
    spec = server_spec(runtime=deployment.runtime, cluster_driver=deployment.queue.cluster.driver,
                       target=target, name=deployment.name,
                       gpus=deployment.gpus_per_replica, cpu=deployment.cpu_per_replica,
                       memory_mib=deployment.memory_mib_per_replica)
    job = job_submit(
        actor=actor, tenant=deployment.tenant, queue=deployment.queue,
        name=f"deployment {deployment.name[:70]} replica {replica.index}",
        command=spec.command, env=spec.env, image=spec.image,
        gpus_per_replica=deployment.gpus_per_replica, gpu_model=deployment.gpu_model,
        cpu_per_replica=deployment.cpu_per_replica,
        memory_mib_per_replica=deployment.memory_mib_per_replica,
        max_restarts=REPLICA_MAX_RESTARTS, service=True, ports=[spec.port],
        # Only to its processes' environment: never in its command, env or any page.
        secret_env={spec.key_env: deployment_api_key(deployment)},
        # Where work is sandboxed, the weights it serves are all it sees of the data directory.
        mounts=data_mounts(target.folders()),
        labels={ROLE_LABEL: ROLE_MODEL_SERVER, OWNER_LABEL: f"the deployment {deployment.name}"},
    )
    replica.job, replica.served_model, replica.message = job, spec.served_model, reason
    replica.save()
    return job


def replica_stop(actor, replica: DeploymentReplica, message: str) -> None:
    """Cancel the replica's job if it still runs or waits; it is no longer ready."""
    job = replica.job
    if job is not None and job.state not in FINAL_STATES:
        job_cancel(actor=actor, job=job)
    replica.ready, replica.ready_since, replica.upstream, replica.workload_id = False, None, "", ""
    replica.unhealthy_since, replica.answered = None, False
    replica.message = message
    replica.save()


def deployment_locked(deployment: Deployment) -> Deployment:
    return Deployment.objects.select_for_update(of=("self",)).select_related(
        "tenant", "queue__cluster", "version__model", "version__base_version", "created_by",
    ).get(pk=deployment.pk)


def deployment_replicas(deployment: Deployment) -> list[DeploymentReplica]:
    return list(deployment.replica_set.select_related("job").order_by("index"))


# -- what users do -----------------------------------------------------------------------------


@transaction.atomic
def deployment_create(*, actor, tenant: Tenant, name: str, version: ModelVersion, queue: Queue,
                      runtime: str = Runtime.TRANSFORMERS, replicas: int = 1,
                      gpus_per_replica: int = 0, gpu_model: str = "",
                      cpu_per_replica: float = 2.0, memory_mib_per_replica: int = 4096,
                      idle_timeout_s: int = 0, pool: Sequence[tuple[str, ModelVersion]] = (),
                      pool_memory_mib: int = 0, max_loras: int = 8) -> Deployment:
    """Deploy `version` under the model name `name`: one service job per replica. With `pool`
    ((name, version) pairs) each replica also serves those versions under their names: see
    `mmodel.services.pools`."""
    require_role(actor, tenant, WRITE_ROLES)
    try:
        model_name(name)
    except ValidationError as exc:
        raise ValidationError({"name": exc.messages}) from None
    if Deployment.objects.filter(tenant=tenant, name=name).exists():
        raise ValidationError({"name": f"{tenant.name} already has a deployment {name!r}."})
    if name in taken_names(tenant):
        raise ValidationError({"name": f"{tenant.name} already serves a model {name!r} in a "
                               "pool."})
    _check_version(version, tenant)
    if queue.tenant_id != tenant.pk or not queue.is_active:
        raise ValidationError({"queue": f"No active queue {queue.name!r} in {tenant.name}."})
    _check_replicas(replicas)
    _check_resources(gpus=gpus_per_replica, cpu=cpu_per_replica,
                     memory_mib=memory_mib_per_replica, idle_timeout_s=idle_timeout_s)
    _check_runtime_serves(version, runtime)
    check_runtime(runtime, queue.cluster.driver)
    _check_capacity(queue, replicas=replicas, gpus=gpus_per_replica)
    if pool:
        check_pool(tenant=tenant, name=name, version=version, runtime=runtime, members=pool,
                   budget_mib=pool_budget_mib(pool_memory_mib=pool_memory_mib,
                                              memory_mib_per_replica=memory_mib_per_replica),
                   max_loras=max_loras)
    deployment = Deployment.objects.create(
        tenant=tenant, name=name, version=version, queue=queue, runtime=runtime,
        replicas=replicas, gpus_per_replica=gpus_per_replica,
        gpu_model=gpu_model if gpus_per_replica else "", cpu_per_replica=cpu_per_replica,
        memory_mib_per_replica=memory_mib_per_replica, idle_timeout_s=idle_timeout_s,
        created_by=actor, api_key=encrypt(secrets.token_urlsafe(32)),
        pool_memory_mib=pool_memory_mib, max_loras=max_loras)
    DeploymentMember.objects.bulk_create(
        DeploymentMember(deployment=deployment, name=member_name, version=member)
        for member_name, member in pool)
    if _needs_merge(deployment):
        _request_merge(version)
    for index in range(replicas):
        replica = DeploymentReplica.objects.create(deployment=deployment, index=index)
        replica_submit(actor, deployment, replica, f"started by {actor.get_username()}")
    audit_record(actor=actor, action="deployment.create", obj=deployment, tenant=tenant,
                 changes={"version": version.label, "runtime": runtime, "replicas": replicas,
                          "gpus_per_replica": gpus_per_replica, "queue": queue.name,
                          **({"pool": {n: m.label for n, m in pool}} if pool else {})})
    return deployment


@transaction.atomic
def deployment_scale(*, actor, deployment: Deployment, replicas: int) -> Deployment:
    """Add replicas (started now, unless the deployment is stopped or scaled to zero) or remove
    the highest-numbered ones (their jobs cancelled)."""
    require_role(actor, deployment.tenant, WRITE_ROLES)
    deployment = deployment_locked(deployment)
    _check_replicas(replicas)
    _check_capacity(deployment.queue, replicas=replicas, gpus=deployment.gpus_per_replica)
    before = deployment.replicas
    running = deployment.active and not deployment.scaled_to_zero
    current = deployment_replicas(deployment)
    for replica in current[replicas:]:
        replica_stop(actor, replica, "removed")
        replica.delete()
    for index in range(len(current), replicas):
        replica = DeploymentReplica.objects.create(deployment=deployment, index=index)
        if running:
            replica_submit(actor, deployment, replica, f"added by {actor.get_username()}")
    deployment.replicas = replicas
    deployment.save(update_fields=["replicas", "updated_at"])
    audit_record(actor=actor, action="deployment.scale", obj=deployment,
                 tenant=deployment.tenant, changes={"replicas": [before, replicas]})
    return deployment


@transaction.atomic
def deployment_stop(*, actor, deployment: Deployment) -> Deployment:
    """Cancel every replica's job (their GPUs are freed); the deployment stays, stopped."""
    require_role(actor, deployment.tenant, WRITE_ROLES)
    deployment = deployment_locked(deployment)
    if not deployment.active:
        raise ValidationError({"state": f"Deployment {deployment.name} is already stopped."})
    for replica in deployment_replicas(deployment):
        replica_stop(actor, replica, f"stopped by {actor.get_username()}")
    deployment.active, deployment.scaled_to_zero = False, False
    deployment.save(update_fields=["active", "scaled_to_zero", "updated_at"])
    audit_record(actor=actor, action="deployment.stop", obj=deployment, tenant=deployment.tenant)
    return deployment


@transaction.atomic
def deployment_start(*, actor, deployment: Deployment) -> Deployment:
    """Start a stopped deployment, or restart the replicas of a failed one."""
    require_role(actor, deployment.tenant, WRITE_ROLES)
    deployment = deployment_locked(deployment)
    replicas = deployment_replicas(deployment)
    if deployment.active and not any(replica.failed for replica in replicas):
        state = "scaled to zero (the next request starts it)" if deployment.scaled_to_zero \
            else "running"
        raise ValidationError({"state": f"Deployment {deployment.name} is {state}."})
    _check_version(deployment.version, deployment.tenant)
    _check_runtime_serves(deployment.version, deployment.runtime)
    check_runtime(deployment.runtime, deployment.queue.cluster.driver)
    if _needs_merge(deployment):
        _request_merge(deployment.version)
    for replica in replicas:  # a degraded deployment's live replicas go on as they are
        if replica.failed or replica.job is None or replica.job.state in FINAL_STATES:
            # A failed replica's job may still run, its server broken: replaced too.
            replica_stop(actor, replica, "")
            replica.failed, replica.resubmits = False, 0
            replica_submit(actor, deployment, replica, f"started by {actor.get_username()}")
    deployment.active, deployment.scaled_to_zero = True, False
    deployment.save(update_fields=["active", "scaled_to_zero", "updated_at"])
    audit_record(actor=actor, action="deployment.start", obj=deployment,
                 tenant=deployment.tenant)
    return deployment


@transaction.atomic
def deployment_delete(*, actor, deployment: Deployment) -> None:
    """Stop it (its replicas' jobs cancelled) and delete it; the jobs stay in the history."""
    require_role(actor, deployment.tenant, WRITE_ROLES)
    deployment = deployment_locked(deployment)
    for replica in deployment_replicas(deployment):
        replica_stop(actor, replica, "deleted")
    audit_record(actor=actor, action="deployment.delete", obj=deployment,
                 tenant=deployment.tenant, changes={"version": deployment.version.label})
    deployment.delete()


# -- what the gateway asks -------------------------------------------------------------------


def deployment_wake(*, deployment_id: int) -> None:
    """A request came for a deployment scaled to zero: start its replicas again. Idempotent,
    and one query when it is not scaled to zero (the gateway calls it on every such request)."""
    if not Deployment.objects.filter(pk=deployment_id, active=True,
                                     scaled_to_zero=True).exists():
        return
    _wake(deployment_id)


@transaction.atomic
def _wake(deployment_id: int) -> None:
    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is None:
        return
    deployment = deployment_locked(deployment)
    if not deployment.active or not deployment.scaled_to_zero:
        return  # woken meanwhile
    replicas = deployment_replicas(deployment)
    try:
        actor = platform_actor(deployment)
    except NoActor as exc:
        DeploymentReplica.objects.filter(deployment=deployment).update(message=str(exc))
        return
    for replica in replicas:
        if replica.job is None or replica.job.state in FINAL_STATES:
            replica.failed, replica.resubmits = False, 0
            replica_submit(actor, deployment, replica, "started again by a request")
    deployment.scaled_to_zero = False
    # The waking request counts as use: the idle clock starts again now.
    deployment.last_request_at = timezone.now()
    deployment.save(update_fields=["scaled_to_zero", "last_request_at", "updated_at"])
    audit_record(actor=None, action="deployment.wake", obj=deployment, tenant=deployment.tenant)


def replica_mark_unready(*, replica_id: int, reason: str) -> None:
    """The gateway found the replica not answering: out of rotation at once, until the watch
    task sees its health endpoint answer again."""
    DeploymentReplica.objects.filter(pk=replica_id, ready=True).update(
        ready=False, ready_since=None, message=reason[:2000], checked_at=timezone.now())
