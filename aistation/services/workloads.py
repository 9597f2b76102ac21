"""Turning a job attempt into the driver's Workload."""

import json
from pathlib import Path

from django.conf import settings

from aistation.labels import PLATFORM_ONLY_LABELS
from aistation.models import Attempt, Job
from ogai.crypto import decrypt
from podsys.drivers.base import DataMount, RaySpec, Resources, Workload


def job_checkpoint_dir(job: Job) -> Path:
    """Survives across attempts, so a restarted job resumes from its newest checkpoint. Named by
    the job's id and creation time: a database started afresh beside an old data directory
    never hands a new job an old job's checkpoints."""
    folder = f"{job.pk}-{job.created_at:%Y%m%dT%H%M%S%f}"
    return Path(settings.DATA_DIR) / "jobs" / folder / "checkpoints"


def workdir_archive_path(tenant_id: int, sha256: str) -> Path:
    """Where a tenant's working-folder archive is kept: under the data directory (the
    artifacts volume on Kubernetes), named by its content."""
    return Path(settings.DATA_DIR) / "workdirs" / str(tenant_id) / f"{sha256}.tar.gz"


def workload_id(job_id: int, attempt: int) -> str:
    """The attempt's name on its cluster: a DNS-1123 label derived from ids only."""
    return f"job-{job_id}-a{attempt}"


def tenant_uid(tenant_id: int) -> int:
    """The unprivileged uid (and gid) a tenant's processes run as on hosts the platform runs them
    on itself: one per tenant, from a range the platform owns."""
    return int(settings.OGAI_SANDBOX_UID_BASE) + tenant_id


SECRET_PLACEHOLDER = "(secret: set at launch)"


def _ray_node(node: dict) -> Resources:
    return Resources(gpus=int(node.get("gpus", 0)), cpu_cores=float(node.get("cpu", 1.0)),
                     memory_mib=int(node.get("memory_mib", 2048)),
                     gpu_model=str(node.get("gpu_model", "")))


def ray_spec(ray: dict | None) -> RaySpec | None:
    """A job's `ray` (its serializer's shape) as the driver's RaySpec."""
    if not ray:
        return None
    return RaySpec(head=_ray_node(ray.get("head") or ray.get("worker") or {}),
                   worker=_ray_node(ray.get("worker") or {}),
                   dashboard=bool(ray.get("dashboard", False)))


def attempt_workload(attempt: Attempt, *, reveal_secrets: bool = True) -> Workload:
    """The attempt as the driver runs it. With `reveal_secrets` False (a workload rendered for
    people to read) the job's secret environment shows only its names."""
    job = attempt.job
    checkpoint_dir = job_checkpoint_dir(job)
    secrets = json.loads(decrypt(job.secret_env)) if job.secret_env else {}
    if not reveal_secrets:
        secrets = dict.fromkeys(secrets, SECRET_PLACEHOLDER)
    env = {
        **{name: value for name, value in job.env.items() if name not in secrets},
        "OGAI_JOB_ID": str(job.pk),
        "OGAI_ATTEMPT": str(attempt.number),
        "OGAI_CHECKPOINT_DIR": str(checkpoint_dir),
    }
    return Workload(
        id=attempt.workload_id,
        command=tuple(job.command),
        resources=Resources(
            gpus=job.gpus_per_replica, cpu_cores=job.cpu_per_replica,
            memory_mib=job.memory_mib_per_replica, gpu_model=job.gpu_model,
            rdma=job.rdma_per_replica,
        ),
        replicas=job.replicas,
        placement=tuple(attempt.placement),
        env=env,
        image=job.image,
        environment=job.environment,
        workdir_archive=str(workdir_archive_path(job.tenant_id, job.workdir.sha256))
        if job.workdir is not None else "",
        checkpoint_dir=str(checkpoint_dir),
        labels={**{key: value for key, value in job.labels.items()
                   if key not in PLATFORM_ONLY_LABELS},
                "ogai.job": str(job.pk), "ogai.attempt": str(attempt.number),
                "ogai.tenant": job.tenant.name},
        service=job.service,
        ports=tuple(job.ports),
        tenant=job.tenant.name,
        run_as=tenant_uid(job.tenant_id),
        data_mounts=tuple(DataMount(path=m["path"], read_only=bool(m["read_only"]))
                          for m in job.mounts),
        secret_env=secrets,
        time_limit_s=job.time_limit_s,
        networks=tuple(job.networks),
        ray=ray_spec(job.ray),
    )
