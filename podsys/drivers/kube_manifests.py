"""The Kubernetes objects a cluster driver creates for a workload, as plain dicts in the API's
JSON shape (camelCase), so they can be checked, diffed and dumped without a cluster.

Pure functions only: no client calls, no settings, no I/O. A cluster's settings come in as
`KubeOptions` (built from the cluster's driver options); everything else comes from the
`Workload`. Each bad input raises ValueError with a message that names it, before anything is
sent to a cluster: the API server's own errors arrive late, one at a time, and for a Job
sometimes only as an event on a pod that never starts.

A job's working folder (its archive on the artifacts claim) reaches the pods through an init
container: it sees of the claim only that one archive file (a read-only `subPath` mount) and
unpacks it with `tar` into an emptyDir that the main container then has as its working
directory. It runs the job's own image (which must hold `tar`) as the same non-root user, with
the same security context, as the main container.

A batch workload is a headless Service (stable DNS names for rendezvous), optionally a Volcano
PodGroup, and an Indexed Job (one pod per rank, rank = completion index). A service workload is
a ClusterIP Service and a Deployment. Either comes with its NetworkPolicy and, when it has
secrets, a Secret they reach the container from. Pods run as non-root in a namespace of the
`restricted` Pod Security level (see `kube_security`), and see of the artifacts claim only their
own folders (`subPath` mounts), never its root.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from podsys.drivers.base import DataMount, Resources, Volume, Workload
from podsys.drivers.common import check_workload_id
from podsys.drivers.kube_networks import (
    KIND_RDMA,
    MULTUS_ANNOTATION,
    NAMESPACE_KIND_LABEL,
    RDMA_PSA_LABELS,
    Attachment,
    check_rdma_pod,
    check_rdma_resource,
    chosen,
    multus_annotation,
    nccl_env,
    parse_networks,
    rdma_container_context,
    rdma_namespace,
)
from podsys.drivers.kube_security import (
    PSA_LABELS,
    check_cidr,
    check_id,
    check_port,
    container_security_context,
    namespace_policies,
    pod_security_context,
    workload_policy,
)

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "ogai"
WORKLOAD_LABEL = "ogai.io/workload"
TENANT_LABEL = "ogai.io/tenant"
JOB_LABEL = "ogai.io/job"
ATTEMPT_LABEL = "ogai.io/attempt"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
GPU = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO = "volcano"

# The platform's own workload labels (see aistation.services.workloads) and where they go.
TENANT_KEY = "ogai.tenant"
PLATFORM_LABELS = {"ogai.job": JOB_LABEL, "ogai.attempt": ATTEMPT_LABEL}

CONTAINER = "main"
RENDEZVOUS_PORT_NAME = "rendezvous"
# Our own volumes get a prefix a workload's volume is unlikely to use; a clash is refused.
ARTIFACTS_VOLUME = "ogai-artifacts"
SHM_VOLUME = "ogai-shm"
SHM_PATH = "/dev/shm"  # noqa: S108 - a mount point in the pod, not a temporary file
MIN_SHM_MIB = 1024
WORKDIR_CONTAINER = "ogai-workdir"
WORKDIR_VOLUME = "ogai-workdir"
WORKDIR_PATH = "/ogai/workdir"  # the unpacked working folder: the main container's cwd
WORKDIR_ARCHIVE_PATH = "/ogai/workdir.tar.gz"  # the archive, in the init container only

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Service names are stricter than other names (RFC 1035: they must start with a letter).
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# A resource quantity as people write one for a size: "8Gi", "512Mi", "1G", "1073741824".
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_MAX_DNS_LABEL = 63
_MAX_LABEL_PREFIX = 253
_OPTION_TYPES: dict[str, type] = {
    "str": str, "int": int, "bool": bool, "dict[str, str]": dict, "list[str]": list,
    "list[int]": list, "dict[str, dict]": dict,
}


@dataclass(frozen=True)
class KubeOptions:
    """A cluster's settings, from the cluster's driver options; checked when built."""

    namespace_prefix: str = "ogai-"
    default_image: str = ""  # used when the workload has no image
    # The platform's OGAI_DATA_DIR, which the artifacts claim holds: a pod sees its own
    # folders of it (subPath mounts), at the same paths as the platform does.
    data_dir: str = ""
    artifacts_claim: str = ""  # a ReadWriteMany PVC name; "" = no artifacts volume
    master_port: int = 29500
    shm_size: str = ""  # "" = half the replica's memory, at least 1Gi
    kueue_queue: str = ""  # non-empty: label the Job for Kueue and create it suspended
    scheduler: str = ""  # "volcano": PodGroup + schedulerName
    gpu_tolerations: bool = True  # tolerate the nvidia.com/gpu NoSchedule taint
    image_pull_secret: str = ""
    # Seconds after a workload ends before the driver deletes its objects, once it has kept
    # the pods' logs (not Kubernetes' own TTL, which would take the logs with it); 0 keeps them.
    ttl_after_finished_s: int = 3600
    logs_dir: str = ""  # where the driver keeps finished pods' logs (set by the platform)
    # The uid (and gid) of pods whose workload names none (the platform's own health checks);
    # a tenant's work runs as the tenant's own uid.
    run_as_user: int = 1000
    # The group the artifacts claim's folders belong to (group-writable): every pod gets it as
    # a supplemental group so it can write its own folders; 0 = none.
    artifacts_gid: int = 0
    # Where the platform (API, gateway, notebook proxy) runs, for the NetworkPolicies: its pods
    # in the cluster (a namespace, and labels that select them there; none = every pod of it)
    # and/or, when it runs outside, its addresses as pods see them (CIDRs).
    platform_namespace: str = "ogai-system"
    platform_pod_labels: dict[str, str] = field(default_factory=dict)
    platform_cidrs: list[str] = field(default_factory=list)
    platform_ports: list[int] = field(default_factory=list)  # none = any port of those
    # The cluster's DNS, which every pod may ask (UDP and TCP 53).
    dns_namespace: str = "kube-system"
    dns_pod_labels: dict[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    # Destinations every tenant pod may reach besides (a package mirror, an HTTP proxy).
    egress_cidrs: list[str] = field(default_factory=list)
    # Named environments jobs may ask for instead of an image ({name: image}), and the one a
    # job that names neither gets ("" = `default_image`).
    environments: dict[str, str] = field(default_factory=dict)
    default_environment: str = ""
    # Extra networks jobs may attach ({name: {"definition": "namespace/name", "interface":
    # "net1", "hcas": ["mlx5_0"], "tenants": [...]}}, see `kube_networks`), and the extended
    # resource the nodes advertise their RDMA devices as ("" = none).
    networks: dict[str, dict] = field(default_factory=dict)
    rdma_resource: str = ""

    def __post_init__(self) -> None:
        # Types first: options come from configuration, where "29500" or "yes" slip in easily.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            expected = _OPTION_TYPES[str(f.type)]
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise ValueError(
                    f"cluster option {f.name!r} must be a {expected.__name__}, "
                    f"not {type(value).__name__} ({value!r})"
                )
        if self.namespace_prefix and not re.match(r"^[a-z0-9][-a-z0-9]*$", self.namespace_prefix):
            raise ValueError(
                f"cluster option 'namespace_prefix' {self.namespace_prefix!r} must be lower-case "
                "letters, digits and '-', starting with a letter or digit"
            )
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"cluster option 'master_port' {self.master_port} is not a port")
        if self.ttl_after_finished_s < 0:
            raise ValueError("cluster option 'ttl_after_finished_s' must be 0 (keep) or more")
        if self.shm_size and not _QUANTITY.match(self.shm_size):
            raise ValueError(
                f"cluster option 'shm_size' {self.shm_size!r} is not a size such as '8Gi'"
            )
        if self.scheduler not in ("", VOLCANO):
            raise ValueError(
                f"cluster option 'scheduler' {self.scheduler!r} is not supported "
                f"(use '{VOLCANO}' or leave it empty for the default scheduler)"
            )
        if self.data_dir and not self.data_dir.startswith("/"):
            raise ValueError(f"cluster option 'data_dir' {self.data_dir!r} must be absolute")
        if self.artifacts_claim:
            if not self.data_dir:
                # The claim is mounted at data_dir; without it there is nowhere to mount it.
                raise ValueError("cluster option 'artifacts_claim' needs 'data_dir'")
            _check_dns_subdomain(self.artifacts_claim, "cluster option 'artifacts_claim'")
        if self.image_pull_secret:
            _check_dns_subdomain(self.image_pull_secret, "cluster option 'image_pull_secret'")
        if self.kueue_queue:
            _check_label_value(self.kueue_queue, "cluster option 'kueue_queue'")
        self._check_security()
        self._check_environments()
        parse_networks(self.networks)
        check_rdma_resource(self.rdma_resource)

    @property
    def attachments(self) -> dict[str, Attachment]:
        """The `networks` option, parsed (it was checked when these options were built)."""
        return parse_networks(self.networks)

    def _check_environments(self) -> None:
        for name, image in self.environments.items():
            if not isinstance(name, str) or not name or not isinstance(image, str) or not image:
                raise ValueError("cluster option 'environments' must map names to images")
        if self.default_environment and self.default_environment not in self.environments:
            raise ValueError(f"cluster option 'default_environment' "
                             f"{self.default_environment!r} is none of the environments "
                             f"({', '.join(self.environments) or 'none'})")

    def _check_security(self) -> None:
        check_id(self.run_as_user, "cluster option 'run_as_user'")
        if self.artifacts_gid:
            check_id(self.artifacts_gid, "cluster option 'artifacts_gid'")
        for name in ("platform_namespace", "dns_namespace"):
            value = getattr(self, name)
            if (value or name == "dns_namespace") and (
                    len(value) > _MAX_DNS_LABEL or not _DNS_LABEL.match(value)):
                raise ValueError(f"cluster option {name!r} {value!r} is not a namespace name")
        for name in ("platform_pod_labels", "dns_pod_labels"):
            for key, value in getattr(self, name).items():
                what = f"cluster option {name!r}"
                if not isinstance(key, str) or not isinstance(value, str):
                    raise ValueError(f"{what} must map label keys to string values")
                _check_label_key(key, what)
                _check_label_value(value, f"{what} {key!r} value")
        for name in ("platform_cidrs", "egress_cidrs"):
            for cidr in getattr(self, name):
                check_cidr(cidr, f"cluster option {name!r}:")
        for port in self.platform_ports:
            check_port(port, "cluster option 'platform_ports':")

    @classmethod
    def from_options(cls, options: dict | None) -> KubeOptions:
        """The settings among a cluster's driver options; other keys belong to the driver
        (credentials, context) and are ignored here."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in (options or {}).items() if key in known})


# Names and labels ---------------------------------------------------------------------------


def _check_dns_subdomain(name: str, what: str) -> None:
    parts = name.split(".")
    if len(name) > _MAX_LABEL_PREFIX or not all(_DNS_LABEL.match(p) for p in parts):
        raise ValueError(f"{what} {name!r} is not a valid Kubernetes name (a DNS-1123 subdomain)")


def _check_label_value(value: str, what: str) -> None:
    if len(value) > _MAX_DNS_LABEL or not _LABEL_VALUE.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid Kubernetes label value (at most 63 letters, "
            "digits, '-', '_' or '.', starting and ending with a letter or digit)"
        )


def _check_label_key(key: str, what: str = "") -> None:
    prefix = key.rpartition("/")[0]
    if not _LABEL_KEY.match(key) or len(prefix) > _MAX_LABEL_PREFIX:
        raise ValueError(
            f"{what + ': ' if what else ''}label {key!r} is not a valid Kubernetes label key "
            "(an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or '.')"
        )


def tenant_of(workload: Workload) -> str:
    tenant = workload.labels.get(TENANT_KEY, "")
    if not tenant:
        raise ValueError(f"workload {workload.id!r} has no {TENANT_KEY!r} label")
    return tenant


def namespace_for(tenant: str, opts: KubeOptions) -> str:
    """The tenant's namespace: one per tenant, so quotas and access follow the tenant."""
    name = opts.namespace_prefix + tenant
    if len(name) > _MAX_DNS_LABEL or not _DNS_LABEL.match(name):
        raise ValueError(
            f"namespace {name!r} for tenant {tenant!r} is not a DNS-1123 label (lower-case "
            "letters, digits and '-', at most 63 characters)"
        )
    return name


def namespace_labels(tenant: str, rdma: bool = False) -> dict[str, str]:
    """Ours, and the Pod Security level: a namespace that lacks one of them gets it patched.
    The tenant's RDMA namespace (`rdma`) enforces `privileged`, warns and audits `restricted`
    and says what it is (see `kube_networks`)."""
    _check_label_value(tenant, "tenant")
    if rdma:
        return {MANAGED_BY: MANAGED_BY_VALUE, TENANT_LABEL: tenant,
                NAMESPACE_KIND_LABEL: KIND_RDMA, **RDMA_PSA_LABELS}
    return {MANAGED_BY: MANAGED_BY_VALUE, TENANT_LABEL: tenant, **PSA_LABELS}


def rdma_namespace_for(tenant: str, opts: KubeOptions) -> str:
    """The tenant's second namespace, for its pods that hold RDMA devices."""
    return rdma_namespace(namespace_for(tenant, opts))


def wants_rdma_namespace(workload: Workload) -> bool:
    return workload.resources.rdma > 0


def workload_namespace(workload: Workload, opts: KubeOptions) -> str:
    """Where the workload's objects go: its tenant's namespace, or the tenant's RDMA namespace
    for a workload that holds RDMA devices."""
    tenant = tenant_of(workload)
    if wants_rdma_namespace(workload):
        return rdma_namespace_for(tenant, opts)
    return namespace_for(tenant, opts)


def namespace_object(tenant: str, opts: KubeOptions, rdma: bool = False) -> dict:
    name = rdma_namespace_for(tenant, opts) if rdma else namespace_for(tenant, opts)
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": namespace_labels(tenant, rdma)},
    }


def tenant_policies(tenant: str, opts: KubeOptions, rdma: bool = False) -> list[dict]:
    """The NetworkPolicies of the tenant's namespace (or its RDMA namespace) as a whole
    (default deny, DNS, the platform), made when the namespace is ensured."""
    _check_label_value(tenant, "tenant")
    labels = {MANAGED_BY: MANAGED_BY_VALUE, TENANT_LABEL: tenant}
    name = rdma_namespace_for(tenant, opts) if rdma else namespace_for(tenant, opts)
    return namespace_policies(name, labels, opts)


def workload_labels(workload: Workload) -> dict[str, str]:
    """The labels on every object and pod: ours, the platform's (renamed into our prefix, since
    `ogai.job` is not a prefix of its own), then the workload's others, each checked."""
    tenant = tenant_of(workload)
    _check_label_value(tenant, "tenant")
    labels = {MANAGED_BY: MANAGED_BY_VALUE, WORKLOAD_LABEL: workload.id, TENANT_LABEL: tenant}
    for key, value in workload.labels.items():
        if key == TENANT_KEY:
            continue
        target = PLATFORM_LABELS.get(key, key)
        _check_label_key(target)
        if target in labels:
            # A workload may not pass itself off as another workload or tenant.
            raise ValueError(f"label {key!r} is reserved for the platform")
        if not isinstance(value, str):
            raise ValueError(f"label {key!r} must have a string value, not {value!r}")
        _check_label_value(value, f"label {key!r} value")
        labels[target] = value
    return labels


# Quantities ---------------------------------------------------------------------------------


def cpu_quantity(cores: float) -> str:
    """Whole cores as "4", fractions in millicores ("500m"): a float such as "0.5" is valid
    too, but the API server would normalise it and every later diff would show a change."""
    millis = round(cores * 1000)
    if millis <= 0:
        raise ValueError(f"cpu_cores must be positive, not {cores}")
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def memory_quantity(mib: int) -> str:
    if mib <= 0:
        raise ValueError(f"memory_mib must be positive, not {mib}")
    return f"{mib}Mi"


def shm_size(resources: Resources, opts: KubeOptions) -> str:
    # A memory-backed /dev/shm counts against the pod's memory; half leaves room for the rest.
    # NCCL and DataLoader workers need more than the runtime's 64Mi default, hence the floor.
    return opts.shm_size or f"{max(resources.memory_mib // 2, MIN_SHM_MIB)}Mi"


def _resources(resources: Resources, opts: KubeOptions) -> dict:
    amounts = {
        "cpu": cpu_quantity(resources.cpu_cores),
        "memory": memory_quantity(resources.memory_mib),
    }
    if resources.gpus < 0:
        raise ValueError(f"gpus must not be negative, not {resources.gpus}")
    if resources.gpus:
        # Extended resources cannot be overcommitted: requests must equal limits.
        amounts[GPU] = str(resources.gpus)
    if resources.rdma:
        amounts[_rdma_resource(resources, opts)] = str(resources.rdma)
    # Requests equal limits: the pod is Guaranteed, so it is the last to be evicted.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _rdma_resource(resources: Resources, opts: KubeOptions) -> str:
    """The cluster's RDMA resource, for a replica that asks for RDMA devices."""
    if isinstance(resources.rdma, bool) or not isinstance(resources.rdma, int) \
            or resources.rdma < 0:
        raise ValueError(f"rdma must be a whole number of devices >= 0, not {resources.rdma!r}")
    if not opts.rdma_resource:
        raise ValueError("the cluster offers no RDMA devices: set its 'rdma_resource' option "
                         "(e.g. 'rdma/rdma_shared_device_a') or ask for rdma: 0")
    return opts.rdma_resource


def _gang_resources(workload: Workload, opts: KubeOptions) -> dict[str, str]:
    """What the whole gang needs at once, for Volcano to admit all replicas or none."""
    res = workload.resources
    total = {
        "cpu": cpu_quantity(res.cpu_cores * workload.replicas),
        "memory": memory_quantity(res.memory_mib * workload.replicas),
    }
    if res.gpus:
        total[GPU] = str(res.gpus * workload.replicas)
    if res.rdma:
        total[_rdma_resource(res, opts)] = str(res.rdma * workload.replicas)
    return total


# The pod ------------------------------------------------------------------------------------


def master_addr(workload: Workload, namespace: str) -> str:
    """Replica 0's stable DNS name: an Indexed Job's pods are named `{job}-{index}` and, with
    `subdomain` set to the headless Service, resolve as `{job}-{index}.{service}.{ns}.svc`."""
    return f"{workload.id}-0.{workload.id}.{namespace}.svc"


def _env(workload: Workload, namespace: str, opts: KubeOptions) -> list[dict]:
    for name in [*workload.env, *workload.secret_env]:
        if not _ENV_NAME.match(name):
            raise ValueError(
                f"environment variable name {name!r} is not valid (letters, digits and '_', "
                "not starting with a digit)"
            )
    # The platform's variables win over the workload's own: rendezvous depends on them, and
    # duplicate names in a pod spec are resolved silently (the last wins) with a warning only.
    platform: dict[str, Any] = {
        "WORLD_SIZE": str(workload.replicas),
        "MASTER_ADDR": master_addr(workload, namespace),
        "MASTER_PORT": str(opts.master_port),
        "OGAI_WORKLOAD_ID": workload.id,
    }
    if not workload.service:
        platform["RANK"] = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_LABEL}']"}}
    if workload.checkpoint_dir and "OGAI_CHECKPOINT_DIR" not in workload.env:
        platform["OGAI_CHECKPOINT_DIR"] = workload.checkpoint_dir
    # NCCL's interfaces and HCAs from the attachments, unless the job tunes them itself.
    for name, value in nccl_env(_attachments(workload, opts), workload.resources.rdma).items():
        if name not in workload.env and name not in workload.secret_env:
            platform[name] = value
    env: list[dict] = []
    if "PYTHONUNBUFFERED" not in workload.env:
        env.append({"name": "PYTHONUNBUFFERED", "value": "1"})  # logs stream as the job runs
    env += [
        {"name": name, "value": str(value)}
        for name, value in workload.env.items()
        if name not in platform and name not in workload.secret_env
    ]
    # Secrets by reference only: the pod spec, which anyone who may read pods sees, names them.
    env += [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": workload.id, "key": name}}}
        for name in workload.secret_env
        if name not in platform
    ]
    for name, value in platform.items():
        if isinstance(value, dict):
            env.append({"name": name, "valueFrom": value})
        else:
            env.append({"name": name, "value": value})
    return env


def _attachments(workload: Workload, opts: KubeOptions) -> list[Attachment]:
    """The networks the workload attaches, as the cluster's options define them."""
    if not workload.networks:
        return []
    return chosen(tuple(workload.networks), opts.attachments, tenant_of(workload))


def _claim_path(path: str, opts: KubeOptions) -> str:
    """The folder's path inside the artifacts claim (its `subPath`): only a folder strictly
    inside `data_dir`, named plainly (no `..`, `.` or `//`, which could climb out or name the
    root). Its form is checked always, its place wherever the cluster names its data_dir."""
    if not path.startswith("/") or os.path.normpath(path) != path:
        raise ValueError(f"folder {path!r} must be an absolute path without '..', '.' or '//'")
    if not opts.data_dir:
        return ""
    root = opts.data_dir.rstrip("/")
    if not path.startswith(root + "/"):
        raise ValueError(
            f"folder {path!r} is not inside the cluster's data_dir {opts.data_dir!r}: only the "
            "data directory's folders can be mounted"
        )
    inside = path[len(root) + 1:]
    if not inside:
        raise ValueError(f"folder {path!r} is the data directory itself: it is never mounted")
    return inside


def _folders(workload: Workload) -> list[DataMount]:
    """The data directory's folders the workload sees: its own (read-write) and those its spec
    names, each once, parents before what they hold (mounts are made in order)."""
    folders = [DataMount(path, read_only=False)
               for path in (workload.checkpoint_dir, workload.run_dir) if path]
    folders += workload.data_mounts
    unique = list(dict.fromkeys(folders))
    return sorted(unique, key=lambda mount: mount.path)


def _artifact_mounts(workload: Workload, opts: KubeOptions) -> list[dict]:
    """Each folder as a subPath mount of the claim, at its own path. Without a claim the pod
    sees none of the data directory (its checkpoints stay in the container)."""
    mounts = [
        {"name": ARTIFACTS_VOLUME, "mountPath": folder.path,
         "subPath": _claim_path(folder.path, opts), "readOnly": folder.read_only}
        for folder in _folders(workload)
    ]
    return mounts if opts.artifacts_claim else []


def _workdir_archive(workload: Workload, opts: KubeOptions) -> str:
    """The archive's path inside the artifacts claim; "" when the workload ships none."""
    if not workload.workdir_archive:
        return ""
    if not opts.artifacts_claim:
        raise ValueError("the job ships a working folder, which reaches the pods from the "
                         "artifacts volume: set the cluster's 'artifacts_claim' and 'data_dir'")
    return _claim_path(workload.workdir_archive, opts)


def _volumes(workload: Workload, opts: KubeOptions) -> tuple[list[dict], list[dict]]:
    """The pod's volumes and the container's mounts. The artifacts claim is mounted only as
    the workload's own folders (and its working folder's archive, in the init container):
    another tenant's data lies in the same claim."""
    volumes: list[dict] = []
    mounts = _artifact_mounts(workload, opts)
    if mounts or _workdir_archive(workload, opts):
        volumes.append(
            {"name": ARTIFACTS_VOLUME, "persistentVolumeClaim": {"claimName": opts.artifacts_claim}}
        )
    if workload.workdir_archive:
        volumes.append({"name": WORKDIR_VOLUME, "emptyDir": {}})
        mounts.append({"name": WORKDIR_VOLUME, "mountPath": WORKDIR_PATH})
    volumes.append(
        {
            "name": SHM_VOLUME,
            "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(workload.resources, opts)},
        }
    )
    mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    for volume in workload.volumes:
        if opts.artifacts_claim and volume.claim_name == opts.artifacts_claim:
            raise ValueError(
                f"volume {volume.name!r} mounts the artifacts claim whole; name the folders "
                "the workload needs as its data mounts instead"
            )
        volumes.append(_workload_volume(volume))
        mounts.append(
            {"name": volume.name, "mountPath": volume.mount_path, "readOnly": volume.read_only}
        )
    # The API server refuses duplicates, but only after the driver has created the Service.
    names = [v["name"] for v in volumes]
    paths = [m["mountPath"] for m in mounts]
    for seen, what in ((names, "volume name"), (paths, "mount path")):
        duplicates = sorted({item for item in seen if seen.count(item) > 1})
        if duplicates:
            raise ValueError(f"{what} {duplicates[0]!r} is used twice")
    return volumes, mounts


def _workload_volume(volume: Volume) -> dict:
    if len(volume.name) > _MAX_DNS_LABEL or not _DNS_LABEL.match(volume.name):
        raise ValueError(f"volume name {volume.name!r} is not a DNS-1123 label")
    if not volume.mount_path.startswith("/"):
        raise ValueError(f"volume {volume.name!r}: mount path {volume.mount_path!r} is relative")
    if bool(volume.host_path) == bool(volume.claim_name):
        raise ValueError(f"volume {volume.name!r} needs exactly one of host_path and claim_name")
    if volume.host_path:
        # The restricted Pod Security level refuses the pod (for a Job, only as an event on a
        # pod that never comes): a node's folder would be shared by every tenant on that node.
        raise ValueError(
            f"volume {volume.name!r}: a host_path volume ({volume.host_path!r}) cannot be "
            "mounted in a tenant's namespace (Pod Security 'restricted'); use a claim"
        )
    return {
        "name": volume.name,
        "persistentVolumeClaim": {"claimName": volume.claim_name, "readOnly": volume.read_only},
    }


def _placement(workload: Workload) -> dict:
    """nodeSelector/affinity for the nodes the platform chose (it did the bin-packing, so the
    scheduler must not place replicas elsewhere), else for the GPU model asked for."""
    nodes = sorted(set(workload.placement))
    for node in nodes:
        _check_label_value(node, "placement node")
    if len(nodes) == 1:
        return {"nodeSelector": {HOSTNAME_LABEL: nodes[0]}}
    if nodes:
        affinity: dict[str, Any] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": HOSTNAME_LABEL, "operator": "In", "values": nodes}
                            ]
                        }
                    ]
                }
            }
        }
        if len(nodes) == workload.replicas:
            # One replica per node, as placed: without this two could share one node's GPUs.
            affinity["podAntiAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {WORKLOAD_LABEL: workload.id}},
                        "topologyKey": HOSTNAME_LABEL,
                    }
                ]
            }
        return {"affinity": affinity}
    if workload.resources.gpu_model:
        _check_label_value(workload.resources.gpu_model, "GPU model")
        return {"nodeSelector": {GPU_PRODUCT_LABEL: workload.resources.gpu_model}}
    return {}


def image_of(workload: Workload, opts: KubeOptions) -> str:
    """The job's image, else its environment's, else the cluster's default."""
    if workload.image:
        return workload.image
    if workload.environment:
        image = opts.environments.get(workload.environment)
        if not image:
            offered = ", ".join(opts.environments) or "none (name an image instead)"
            raise ValueError(f"the cluster offers no environment {workload.environment!r}; it "
                             f"offers {offered}")
        return image
    if opts.default_environment:
        return opts.environments[opts.default_environment]
    if not opts.default_image:
        raise ValueError("no image: set the job's image or the cluster's default_image")
    return opts.default_image


def _workdir_container(workload: Workload, image: str, opts: KubeOptions) -> dict:
    """The init container that unpacks the working folder into the pod's working directory:
    it sees of the claim only the archive, read-only."""
    amounts = {"cpu": cpu_quantity(workload.resources.cpu_cores),
               "memory": memory_quantity(workload.resources.memory_mib)}
    return {
        "name": WORKDIR_CONTAINER,
        "image": image,
        "command": ["tar", "-xzf", WORKDIR_ARCHIVE_PATH, "-C", WORKDIR_PATH],
        # As much as the main container, no GPU: a pod's requests are the larger of the two.
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "volumeMounts": [
            {"name": ARTIFACTS_VOLUME, "mountPath": WORKDIR_ARCHIVE_PATH,
             "subPath": _workdir_archive(workload, opts), "readOnly": True},
            {"name": WORKDIR_VOLUME, "mountPath": WORKDIR_PATH},
        ],
        "securityContext": container_security_context(),
    }


def _container(workload: Workload, namespace: str, opts: KubeOptions) -> tuple[dict, list[dict]]:
    image = image_of(workload, opts)
    if not all(isinstance(arg, str) for arg in workload.command):
        raise ValueError("the command must be a list of strings")
    volumes, mounts = _volumes(workload, opts)
    container: dict[str, Any] = {"name": CONTAINER, "image": image}
    if workload.command:
        # An argv list, run as is: a shell would re-split and expand the job's arguments.
        container["command"] = list(workload.command)
    if workload.workdir_archive:
        container["workingDir"] = WORKDIR_PATH
    elif workload.run_dir:
        container["workingDir"] = workload.run_dir
    container["env"] = _env(workload, namespace, opts)
    container["resources"] = _resources(workload.resources, opts)
    container["volumeMounts"] = mounts
    container["securityContext"] = container_security_context()
    if workload.resources.rdma:
        # Registering memory with the HCA pins it: IPC_LOCK, and nothing else (`kube_networks`).
        container["securityContext"] = rdma_container_context(container["securityContext"])
    if workload.service:
        container["ports"] = [
            {"name": _port_name(port), "containerPort": port, "protocol": "TCP"}
            for port in _service_ports(workload)
        ]
    return container, volumes


def _run_as(workload: Workload, opts: KubeOptions) -> int:
    if workload.run_as is None:
        return opts.run_as_user
    check_id(workload.run_as, f"workload {workload.id!r}: run_as")
    return workload.run_as


def pod_spec(workload: Workload, namespace: str, opts: KubeOptions) -> dict:
    """The pod spec shared by a Job's and a Deployment's pods."""
    container, volumes = _container(workload, namespace, opts)
    spec: dict[str, Any] = {
        "restartPolicy": "Always" if workload.service else "Never",
        # Service links put every Service of the namespace in the env: noise, and with many
        # Services enough to break some programs' argument limits.
        "enableServiceLinks": False,
        # No credentials to the cluster's API inside a tenant's pod.
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(_run_as(workload, opts), opts.artifacts_gid),
        "containers": [container],
        "volumes": volumes,
    }
    if workload.workdir_archive:
        spec["initContainers"] = [_workdir_container(workload, container["image"], opts)]
    if not workload.service:
        spec["subdomain"] = workload.id
    spec.update(_placement(workload))
    if workload.resources.gpus > 0 and opts.gpu_tolerations:
        spec["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    if opts.scheduler == VOLCANO:
        spec["schedulerName"] = VOLCANO
    if opts.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": opts.image_pull_secret}]
    if workload.resources.rdma:
        check_rdma_pod(spec)
    return spec


def _pod_template(workload: Workload, namespace: str, opts: KubeOptions, labels: dict) -> dict:
    metadata: dict[str, Any] = {"labels": dict(labels)}
    annotations: dict[str, str] = {}
    if opts.scheduler == VOLCANO:
        # Volcano finds a plain Job's PodGroup through this annotation on its pods.
        annotations[VOLCANO_GROUP_ANNOTATION] = workload.id
    attachments = _attachments(workload, opts)
    if attachments:
        annotations[MULTUS_ANNOTATION] = multus_annotation(attachments)
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec(workload, namespace, opts)}


# The objects --------------------------------------------------------------------------------


def _metadata(name: str, namespace: str, labels: dict) -> dict:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def _port_name(port: int) -> str:
    return f"port-{port}"


def _service_ports(workload: Workload) -> list[int]:
    ports = list(workload.ports)
    if not ports:
        raise ValueError(f"service workload {workload.id!r} has no ports")
    for port in ports:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"port {port!r} is not a port number")
    if len(set(ports)) != len(ports):
        raise ValueError(f"service workload {workload.id!r} lists a port twice")
    return ports


def headless_service(workload: Workload, namespace: str, labels: dict, opts: KubeOptions) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(workload.id, namespace, labels),
        "spec": {
            "clusterIP": "None",
            "selector": {WORKLOAD_LABEL: workload.id},
            # Ranks resolve replica 0 before it is ready; a ready-only record would never come.
            "publishNotReadyAddresses": True,
            "ports": [{"name": RENDEZVOUS_PORT_NAME, "port": opts.master_port, "protocol": "TCP"}],
        },
    }


def pod_group(workload: Workload, namespace: str, labels: dict, opts: KubeOptions) -> dict:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": _metadata(workload.id, namespace, labels),
        "spec": {"minMember": workload.replicas,
                 "minResources": _gang_resources(workload, opts)},
    }


def job_object(workload: Workload, namespace: str, labels: dict, opts: KubeOptions) -> dict:
    job_labels = dict(labels)
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": workload.replicas,
        "parallelism": workload.replicas,
        # One failed rank fails the attempt: the platform retries whole attempts, elsewhere.
        "backoffLimit": 0,
    }
    if opts.kueue_queue:
        # Kueue admits a suspended Job when its queue has quota, then unsuspends it.
        job_labels[KUEUE_QUEUE_LABEL] = opts.kueue_queue
        spec["suspend"] = True
    spec["template"] = _pod_template(workload, namespace, opts, labels)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(workload.id, namespace, job_labels),
        "spec": spec,
    }


def cluster_ip_service(workload: Workload, namespace: str, labels: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(workload.id, namespace, labels),
        "spec": {
            "type": "ClusterIP",
            "selector": {WORKLOAD_LABEL: workload.id},
            "ports": [
                {"name": _port_name(port), "port": port, "targetPort": port, "protocol": "TCP"}
                for port in _service_ports(workload)
            ],
        },
    }


def deployment_object(workload: Workload, namespace: str, labels: dict, opts: KubeOptions) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(workload.id, namespace, labels),
        "spec": {
            "replicas": workload.replicas,
            "selector": {"matchLabels": {WORKLOAD_LABEL: workload.id}},
            "template": _pod_template(workload, namespace, opts, labels),
        },
    }


def secret_object(workload: Workload, namespace: str, labels: dict) -> dict:
    """The workload's secret environment, which its container reads by reference. A workload
    rendered for people carries placeholders here, never the values."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(workload.id, namespace, labels),
        "type": "Opaque",
        "stringData": {name: str(value) for name, value in workload.secret_env.items()},
    }


def network_policy(workload: Workload, namespace: str, labels: dict, opts: KubeOptions) -> dict:
    ports = _service_ports(workload) if workload.service else []
    return workload_policy(workload.id, namespace, labels, {WORKLOAD_LABEL: workload.id}, ports,
                           opts)


def _check_shape(workload: Workload) -> None:
    check_workload_id(workload.id)
    # The id names a Service, and Service names must start with a letter (RFC 1035).
    if not _DNS_1035_LABEL.match(workload.id):
        raise ValueError(f"workload id {workload.id!r} must start with a letter on Kubernetes")
    if isinstance(workload.replicas, bool) or workload.replicas < 1:
        raise ValueError(f"replicas must be at least 1, not {workload.replicas!r}")
    if workload.placement and len(workload.placement) != workload.replicas:
        raise ValueError(
            f"placement names {len(workload.placement)} nodes for {workload.replicas} replicas"
        )
    if not workload.service:
        # Pods of an Indexed Job get the hostname `{id}-{index}`, which must stay a DNS label.
        last = f"{workload.id}-{workload.replicas - 1}"
        if len(last) > _MAX_DNS_LABEL:
            raise ValueError(f"workload id {workload.id!r} is too long for pod name {last!r}")


def workload_objects(workload: Workload, opts: KubeOptions) -> list[dict]:
    """What to create for the workload, in creation order (the namespace excluded: it is the
    tenant's, created once with `namespace_object` and `tenant_policies`). The Secret and the
    NetworkPolicy come first, so no pod ever starts without its environment or its peers."""
    _check_shape(workload)
    labels = workload_labels(workload)
    namespace = workload_namespace(workload, opts)
    objects = []
    if workload.secret_env:
        objects.append(secret_object(workload, namespace, labels))
    objects.append(network_policy(workload, namespace, labels, opts))
    if workload.ray is not None:
        # Deferred: kube_ray builds its pod templates with this module's.
        from podsys.drivers.kube_ray import ray_job_object

        return [*objects, ray_job_object(
            workload, namespace, labels, kueue_queue=opts.kueue_queue,
            pod_template=lambda node: _pod_template(node, namespace, opts, labels))]
    if workload.service:
        return [
            *objects,
            cluster_ip_service(workload, namespace, labels),
            deployment_object(workload, namespace, labels, opts),
        ]
    # The Service first, so its DNS records exist when the first pod looks replica 0 up; the
    # PodGroup before the Job, so Volcano never sees the Job's pods without their gang.
    objects.append(headless_service(workload, namespace, labels, opts))
    if opts.scheduler == VOLCANO:
        objects.append(pod_group(workload, namespace, labels, opts))
    objects.append(job_object(workload, namespace, labels, opts))
    return objects


def render_yaml(objects: list[dict]) -> str:
    """The objects as one multi-document YAML, in the given order (for `kubectl apply -f`)."""
    return yaml.safe_dump_all(objects, sort_keys=False)
