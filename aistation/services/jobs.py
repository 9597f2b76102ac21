"""Submitting, cancelling and rerunning jobs."""

import json
import os
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from aistation.choices import FINAL_STATES, JobState
from aistation.models import Job, JobToken, Queue, Workdir
from aistation.scheduler.scaling import NodeShape, nodes_for
from aistation.scheduler.types import JobSnap
from aistation.services.fleets import job_dispatch, needed_features
from aistation.services.transitions import job_transition, log_events
from aistation.triggers import request_cancel, request_cycle
from infra_os.access import require_role
from infra_os.choices import WRITE_ROLES
from infra_os.models import Tenant
from infra_os.services.audit import audit_record
from ogai.crypto import encrypt
from podsys.drivers.base import (
    FEATURE_NETWORKS,
    FEATURE_RAY,
    FEATURE_RDMA,
    FEATURE_SANDBOX,
    FEATURE_WORKDIR,
    DataMount,
    DriverError,
)
from podsys.drivers.common import describe_environments, environment_summary
from podsys.models import Cluster, ElasticPool
from podsys.providers.base import ProviderError
from podsys.runtime import driver_for
from podsys.services.clusters import cluster_refresh_capacity
from podsys.services.pools import pool_node_type

MAX_TIME_LIMIT_S = 30 * 24 * 3600


def _check_fits(*, queue: Queue, gpus: int, gpu_model: str, cpu: float, memory_mib: int,
                replicas: int, rdma: int = 0) -> str:
    """Refuse at once what no node of the queue's cluster could ever hold, rather than let it
    wait forever. Checked against the capacity the last node sync summed up: submissions must
    stay cheap. Returns the pool that must buy nodes for it where no cluster of its fleet holds
    it, else ""."""
    if queue.fleet_id:  # a fleet queue's job must fit one cluster of the fleet, or a pool's
        errors = []
        for member in Cluster.objects.filter(fleet_id=queue.fleet_id, is_active=True):
            try:
                _check_fits_cluster(member, queue.name, gpus, gpu_model, cpu, memory_mib,
                                    replicas, rdma)
                return ""
            except ValidationError as exc:
                errors.append(exc)
        if errors:
            # Pools buy nodes of a GPU type: none of them is known to offer RDMA devices.
            pool = "" if rdma else _pool_for(queue.fleet_id, gpus, gpu_model, cpu, memory_mib,
                                             replicas)
            if pool:
                return pool
            raise errors[0]
    _check_fits_cluster(queue.cluster, queue.name, gpus, gpu_model, cpu, memory_mib, replicas,
                        rdma)
    return ""


def _pool_for(fleet_id: int, gpus: int, gpu_model: str, cpu: float, memory_mib: int,
              replicas: int) -> str:
    """An elastic pool of the fleet that could buy the whole gang (its name, else ""), as its
    autoscaler does for work that fits no cluster: every replica on nodes of the pool's type,
    at most its `max_nodes`. Asked only of a job no cluster holds, so the provider is rarely
    called."""
    snap = JobSnap(id=0, tenant="", queue="", priority=0, submitted_at=0.0,
                   gpus_per_replica=gpus, replicas=replicas, cpu_per_replica=cpu,
                   memory_mib_per_replica=memory_mib, gpu_model=gpu_model)
    for pool in ElasticPool.objects.filter(fleet_id=fleet_id, is_active=True):
        try:
            kind = pool_node_type(pool)
        except ProviderError:
            continue  # the autoscaler says so when it runs
        if not gpus or (gpu_model and gpu_model != kind.gpu_model):
            continue
        shape = NodeShape(kind.gpus, kind.gpu_model, kind.cpu_cores, kind.memory_mib)
        if 0 < nodes_for(snap, shape) <= pool.max_nodes:
            return pool.name
    return ""


def _check_fits_cluster(member: Cluster, queue_name: str, gpus: int, gpu_model: str, cpu: float,
                        memory_mib: int, replicas: int, rdma: int = 0) -> None:
    cluster = member.name
    # A cluster never summed up yet (made before capacities were kept, or before they counted
    # RDMA devices) is summed up now.
    capacity = member.capacity or cluster_refresh_capacity(cluster=member)
    if rdma and "largest_rdma" not in capacity.get("all", {}):
        capacity = cluster_refresh_capacity(cluster=member)
    if gpus and gpu_model:
        shape = capacity.get("gpu_models", {}).get(gpu_model)
        if not shape:
            raise ValidationError({"resources.gpu_model": f"No node of cluster {cluster} has "
                                   f"GPU model {gpu_model!r}."})
    else:
        shape = capacity.get("all")
        if not shape or not shape["nodes"]:
            raise ValidationError({"queue": f"Cluster {cluster} of queue {queue_name} has no "
                                   "nodes."})
    if gpus > shape["largest_gpus"]:
        raise ValidationError({"resources.gpus": f"{gpus} GPUs per replica, but the largest "
                               f"node of cluster {cluster} has {shape['largest_gpus']}."})
    if gpus * replicas > shape["gpus"]:
        raise ValidationError({"replicas": f"{replicas} replicas of {gpus} GPUs need "
                               f"{gpus * replicas} GPUs; cluster {cluster} has "
                               f"{shape['gpus']}."})
    if cpu > shape["cpu_cores"]:
        raise ValidationError({"resources.cpu": f"{cpu:g} CPU cores per replica is more than "
                               f"any node of cluster {cluster} has."})
    if memory_mib > shape["memory_mib"]:
        raise ValidationError({"resources.memory_mib": f"{memory_mib} MiB per replica is more "
                               f"than any node of cluster {cluster} has."})
    if rdma:
        _check_rdma_fits(member, shape, rdma, replicas)


def _check_rdma_fits(member: Cluster, shape: dict, rdma: int, replicas: int) -> None:
    """RDMA devices per replica, like GPUs: some node must offer that many, and all of them
    the gang's."""
    cluster = member.name
    if not capacity_rdma(member):
        raise ValidationError({"network.rdma": no_rdma_reason(member)})
    largest = shape.get("largest_rdma", 0)
    if rdma > largest:
        raise ValidationError({"network.rdma": f"{rdma} RDMA devices per replica, but the "
                               f"largest node of cluster {cluster} that could hold it offers "
                               f"{largest}."})
    if rdma * replicas > shape.get("rdma", 0):
        raise ValidationError({"replicas": f"{replicas} replicas of {rdma} RDMA devices need "
                               f"{rdma * replicas}; cluster {cluster} has "
                               f"{shape.get('rdma', 0)}."})


def capacity_rdma(member: Cluster) -> int:
    return int(((member.capacity or {}).get("all") or {}).get("rdma") or 0)


def no_rdma_reason(member: Cluster) -> str:
    """Why the cluster holds no job asking for RDMA devices, in words that say what to do."""
    why = ""
    try:
        driver = driver_for(member)
    except DriverError:
        driver = None
    if driver is not None and not driver.supports(FEATURE_RDMA):
        why = driver.unsupported[FEATURE_RDMA]
    else:
        resource = driver.network_offer().rdma_resource if driver is not None else ""
        why = (f"no node advertises {resource}" if resource else
               "it names no RDMA resource (its driver option rdma_resource)")
    return (f"Cluster {member.name} offers no RDMA devices: {why}; ask for rdma: 0 or submit "
            "to a cluster that has them.")


def _check_network(cluster: Cluster, tenant: Tenant, networks: list[str], rdma: int) -> None:
    """Refuse at once networks the job's cluster does not offer (naming those it does), and
    RDMA devices on a driver that cannot hand them out."""
    if not networks and not rdma:
        return
    try:
        driver = driver_for(cluster)
    except DriverError:
        return  # a broken cluster says so when the job is launched
    if rdma and not driver.supports(FEATURE_RDMA):
        raise ValidationError({"network.rdma": no_rdma_reason(cluster)})
    if not networks:
        return
    if not driver.supports(FEATURE_NETWORKS):
        raise ValidationError({"network.attachments": (
            f"Cluster {cluster.name} attaches no extra networks "
            f"({driver.unsupported[FEATURE_NETWORKS]}); leave network.attachments empty.")})
    offer = driver.network_offer()
    offered = [name for name in offer.attachments
               if tenant.name in offer.tenants.get(name, (tenant.name,))]
    unknown = [name for name in networks if name not in offered]
    if unknown:
        listed = ", ".join(offered) if offered else "none"
        raise ValidationError({"network.attachments": (
            f"Cluster {cluster.name} offers no network {unknown[0]!r} to tenant {tenant.name}; "
            f"it offers {listed}.")})


def _check_cluster_can(cluster: Cluster, *, workdir: Workdir | None) -> None:
    """Refuse at once what the queue's cluster would refuse to run: a tenant's work where it
    cannot be sandboxed (and the platform serves more than one tenant), and a working folder it
    cannot hand its pods (rather than fail every attempt at launch: `ogai job submit` ships the
    spec's folder by default)."""
    if settings.OGAI_SINGLE_TENANT and workdir is None:
        return
    try:
        driver = driver_for(cluster)
    except DriverError:
        return  # a broken cluster says so when the job is launched
    if not settings.OGAI_SINGLE_TENANT and not driver.supports(FEATURE_SANDBOX):
        raise ValidationError({"queue": (
            f"Cluster {cluster.name} runs no tenant's work: it cannot sandbox it "
            f"({driver.unsupported[FEATURE_SANDBOX]}).")})
    if workdir is not None and not driver.supports(FEATURE_WORKDIR):
        raise ValidationError({"workdir": (
            f"Cluster {cluster.name} cannot ship a working folder with a job "
            f"({driver.unsupported[FEATURE_WORKDIR]}); submit without one "
            "(`--no-workdir`, `workdir: false`) and put the code in the image.")})


def _check_ray(cluster: Cluster, ray: dict | None) -> None:
    """Refuse at once a Ray cluster where the job's cluster cannot run one, saying why."""
    if not ray:
        return
    try:
        driver = driver_for(cluster)
    except DriverError:
        return  # a broken cluster says so when the job is launched
    if not driver.supports(FEATURE_RAY):
        raise ValidationError({"kind": f"Cluster {cluster.name} runs no Ray clusters: "
                               f"{driver.unsupported[FEATURE_RAY]}."})


def _check_environment(cluster: Cluster, environment: str) -> None:
    """Refuse at once an environment the job's cluster does not offer (or cannot run jobs
    in), saying which it offers."""
    if not environment:
        return
    try:
        offered = driver_for(cluster).environments()
    except DriverError:
        return  # a broken cluster says so when the job is launched
    if not offered:
        instead = "name an image (`image`) instead" if cluster.driver == "kubernetes" \
            else "leave `environment` empty"
        raise ValidationError({"environment": f"Cluster {cluster.name} offers no named "
                               f"environments; {instead}."})
    chosen = next((env for env in offered if env.name == environment), None)
    if chosen is None:
        raise ValidationError({"environment": f"Cluster {cluster.name} offers no environment "
                               f"{environment!r}; it offers "
                               f"{describe_environments(offered)}."})
    if getattr(chosen, "problem", ""):
        raise ValidationError({"environment": f"Environment {environment!r} of cluster "
                               f"{cluster.name} cannot run jobs "
                               f"({environment_summary(chosen)})."})


def _links_are_ours(path: Path, root: Path) -> bool:
    """Every symbolic link on the way from the data directory to `path` is the platform's own
    (a Slurm run's folder moved to its cluster's shared path, `podsys.drivers.slurm_data`);
    a link anyone else made could lead the job out of what it was handed."""
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        if current.is_symlink() and current.lstat().st_uid != os.geteuid():
            return False
    return True


def _check_mounts(mounts: list[DataMount]) -> list[dict]:
    """Only folders inside the data directory, named without `..` and through no symbolic
    link but the platform's own: a job sees what the platform hands it and nothing around
    it."""
    root = Path(settings.DATA_DIR).resolve()
    checked = []
    for mount in mounts:
        path = Path(mount.path)
        inside = path.is_absolute() and os.path.normpath(path) == str(path)
        if not inside or root not in path.parents or not _links_are_ours(path, root):
            raise ValueError(f"{mount.path!r} is not a folder inside the data directory")
        checked.append({"path": str(path), "read_only": mount.read_only})
    return checked


@transaction.atomic
def job_submit(
    *,
    actor,
    tenant: Tenant,
    queue: Queue,
    name: str,
    command: list[str],
    env: dict[str, str] | None = None,
    image: str = "",
    gpus_per_replica: int = 0,
    gpu_model: str = "",
    cpu_per_replica: float = 1.0,
    memory_mib_per_replica: int = 1024,
    replicas: int = 1,
    priority: int | None = None,
    max_restarts: int = 0,
    time_limit_s: int | None = None,
    rerun_of: Job | None = None,
    service: bool = False,
    ports: list[int] | None = None,
    secret_env: dict[str, str] | None = None,
    mounts: list[DataMount] | None = None,
    labels: dict[str, str] | None = None,
    workdir: Workdir | None = None,
    environment: str = "",
    rdma_per_replica: int = 0,
    networks: list[str] | None = None,
    ray: dict | None = None,
) -> Job:
    """Queue a job. `secret_env` reaches its processes but is stored encrypted and shown
    nowhere (a notebook's tokens); a `service` runs until stopped, answering on `ports`;
    `mounts` are the data directory's folders its processes may see (the platform's services
    name them; a request never does), and so are `labels`, its workloads' labels. `workdir`
    is the tenant's working folder unpacked as its processes' working directory, and
    `environment` the cluster's named environment they run in ("": its default). Its network:
    `rdma_per_replica` RDMA devices per replica (placed and counted like GPUs) and the extra
    `networks` its replicas attach, refused at once where the cluster offers none. `ray`
    makes it a Ray cluster (`{"workers", "head", "worker", "dashboard"}`, its replicas the
    head and the workers, `command` its entrypoint), refused where the cluster runs none."""
    require_role(actor, tenant, WRITE_ROLES)
    if queue.tenant_id != tenant.pk or not queue.is_active:
        raise ValidationError({"queue": f"No active queue {queue.name!r} in {tenant.name}."})
    if not command or not all(isinstance(part, str) for part in command):
        raise ValidationError({"command": "Give the command as a list of strings."})
    if time_limit_s is not None and not 1 <= time_limit_s <= MAX_TIME_LIMIT_S:
        raise ValidationError({"time_limit_s": "Use 1 second to 30 days."})
    if workdir is not None and workdir.tenant_id != tenant.pk:
        # Another tenant's folder is as unknown as a missing one.
        raise ValidationError({"workdir": f"No such working folder in tenant {tenant.name}."})
    networks = list(networks or [])
    if isinstance(rdma_per_replica, bool) or not isinstance(rdma_per_replica, int) \
            or rdma_per_replica < 0:
        raise ValidationError({"network.rdma": "Give a whole number of RDMA devices >= 0."})
    pool = _check_fits(queue=queue, gpus=gpus_per_replica, gpu_model=gpu_model,
                       cpu=cpu_per_replica, memory_mib=memory_mib_per_replica, replicas=replicas,
                       rdma=rdma_per_replica)
    now = timezone.now()
    job = Job(
        tenant=tenant, queue=queue, cluster=queue.cluster, owner=actor, name=name,
        priority=queue.default_priority if priority is None else priority, image=image,
        command=list(command), env=dict(env or {}), gpus_per_replica=gpus_per_replica,
        gpu_model=gpu_model if gpus_per_replica else "", cpu_per_replica=cpu_per_replica,
        memory_mib_per_replica=memory_mib_per_replica, replicas=replicas,
        max_restarts=max_restarts, time_limit_s=time_limit_s, queued_at=now,
        rerun_of=rerun_of, state=JobState.QUEUED, reason="submitted; waiting for the scheduler",
        service=service, ports=list(ports or []),
        secret_env=encrypt(json.dumps(secret_env)) if secret_env else "",
        mounts=_check_mounts(mounts or []), labels=dict(labels or {}),
        workdir=workdir, environment=environment, rdma_per_replica=rdma_per_replica,
        networks=networks, ray=dict(ray) if ray else None,
    )
    if ray and replicas != int(ray.get("workers", 0)) + 1:
        raise ValidationError({"ray.workers": "A Ray job's replicas are its head and its "
                               "workers."})
    if queue.fleet_id:
        job_dispatch(job, queue.fleet_id, now, needs=needed_features(job))
        if pool:  # its autoscaler moves it where the nodes join, and says what it buys
            job.dispatch = (f"waiting for pool {pool} to buy nodes: "
                            f"{job.dispatch.removeprefix('no cluster can take it: ')}")
    _check_cluster_can(job.cluster, workdir=workdir)
    _check_environment(job.cluster, environment)
    _check_network(job.cluster, tenant, networks, rdma_per_replica)
    _check_ray(job.cluster, job.ray)
    # The foreign keys were resolved above and the database enforces the constraints:
    # checking them again here would cost a query each on every submission.
    job.full_clean(exclude=["tenant", "queue", "cluster", "owner", "rerun_of", "workdir"],
                   validate_constraints=False)
    job.save()
    log_events([job.events.create(from_state="", to_state=JobState.QUEUED,
                                  reason=job.dispatch if queue.fleet_id else job.reason)])
    audit_record(actor=actor, action="job.submit", obj=job, tenant=tenant,
                 changes={"queue": queue.name, "gpus": job.gpus, "replicas": replicas,
                          **({"workdir": workdir.sha256} if workdir else {}),
                          **({"network": job.network} if networks or rdma_per_replica
                             else {}), **({"kind": "ray"} if ray else {})})
    request_cycle(job.cluster_id)
    return job


@transaction.atomic
def job_cancel(*, actor, job: Job) -> Job:
    require_role(actor, job.tenant, WRITE_ROLES)
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state in FINAL_STATES:
        raise ValidationError({"state": f"Job {job.pk} already {job.state}; nothing to cancel."})
    job.finished_at = timezone.now()
    job.position = None
    if job.state == JobState.QUEUED and job.queued_at:
        job.waited_s += (job.finished_at - job.queued_at).total_seconds()
    job_transition(job, JobState.CANCELLED, f"cancelled by {actor.get_username()}")
    audit_record(actor=actor, action="job.cancel", obj=job, tenant=job.tenant)
    # Its processes are stopped after commit; reconcile stops them if that message is lost.
    request_cancel(job.pk)
    return job


@transaction.atomic
def job_rerun(*, actor, job: Job) -> Job:
    """Submit a finished job again, with the same spec (its working folder and environment
    too), as a new job."""
    if job.state not in FINAL_STATES:
        raise ValidationError({"state": f"Job {job.pk} is {job.state}; rerun it once it ends."})
    if JobToken.objects.filter(job=job).exists():
        # Its runner's token and its run's files belong to that run alone.
        raise ValidationError({"state": f"Job {job.pk} ran a toolchain step; start a new "
                               "pipeline or training run instead."})
    return job_submit(
        actor=actor, tenant=job.tenant, queue=job.queue, name=job.name, command=job.command,
        env=job.env, image=job.image, gpus_per_replica=job.gpus_per_replica,
        gpu_model=job.gpu_model, cpu_per_replica=job.cpu_per_replica,
        memory_mib_per_replica=job.memory_mib_per_replica, replicas=job.replicas,
        priority=job.priority, max_restarts=job.max_restarts, time_limit_s=job.time_limit_s,
        rerun_of=job, mounts=[DataMount(**mount) for mount in job.mounts], labels=job.labels,
        workdir=job.workdir, environment=job.environment,
        rdma_per_replica=job.rdma_per_replica, networks=list(job.networks), ray=job.ray,
    )
