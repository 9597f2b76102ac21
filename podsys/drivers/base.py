"""The cluster driver contract: the one door to compute.

Only the plain dataclasses below cross it, never ORM objects. A driver is configured per
cluster (a dotted path, like Django's cache backends) and looked up by cluster name.

Launch is idempotent: the workload id is the name/label on the cluster, and launching an id
that exists returns the same handle without starting anything. A driver declares what it
cannot do in `unsupported` ({feature: reason}); callers check before launching.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

# Features a caller may need; a driver lists the ones it lacks in `unsupported`.
FEATURE_MULTI_NODE = "multi_node"
FEATURE_IMAGES = "images"
FEATURE_SERVICES = "services"
FEATURE_GPU_MODEL = "gpu_model"
# Tenants' work runs confined (own namespaces, only its own folders, an unprivileged user); a
# driver that cannot confine it here lists the reason, and the platform refuses tenants' work.
FEATURE_SANDBOX = "sandbox"
# A job's working folder (`Workload.workdir_archive`) reaches its processes.
FEATURE_WORKDIR = "workdir"
# RDMA devices (`Resources.rdma`) and extra networks (`Workload.networks`) for a job's replicas.
FEATURE_RDMA = "rdma"
FEATURE_NETWORKS = "networks"
# A workload that is a Ray cluster (`Workload.ray`): replica 0 its head, the others its workers.
FEATURE_RAY = "ray"

# What a workload is to others, as a label the platform sets (never a request): a model
# server's pods admit its model clients (an evaluation scoring its endpoint), where a cluster
# confines pods' traffic.
ROLE_LABEL = "ogai.io/role"
ROLE_MODEL_SERVER = "model-server"
ROLE_MODEL_CLIENT = "model-client"

# On a node the platform cordoned on the cluster itself (`set_schedulable`), set to "true".
CORDONED_BY_PLATFORM = "ogai.io/cordoned"

# Where a driver's services share the network of the node they start on
# (`ClusterDriver.assigns_ports`), the node picks the port: a service's command carries this in
# its arguments, replaced there by that port (also in the environment as SERVICE_PORT_ENV), and
# asks for it with a port of 0 in `Workload.ports`.
SERVICE_PORT_ARG = "{ogai_service_port}"
SERVICE_PORT_ENV = "OGAI_SERVICE_PORT"


@dataclass(frozen=True)
class NodeInfo:
    """One machine as the driver sees it."""

    name: str
    gpus: int
    gpu_model: str = ""
    gpu_memory_mib: int = 0
    cpu_cores: float = 0
    memory_mib: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    ready: bool = True
    schedulable: bool = True
    reason: str = ""
    taints: tuple[str, ...] = ()  # "key=value:Effect"
    # GPUs held on it by anything, the platform's work or not, where the cluster says (None:
    # only the platform uses the node).
    gpus_allocated: int | None = None
    # Of those, the GPUs held by work the platform did not start (a user's own `sbatch`),
    # where the driver can tell them apart: the scheduler places around them.
    gpus_foreign: int | None = None
    # Where it is reached (Ansible, metrics scrapes), where the cluster says: an IP or a name.
    address: str = ""
    # RDMA devices it offers jobs (`Resources.rdma` counts against them like GPUs), and those
    # held by anything where the cluster says (None: only the platform uses them).
    rdma: int = 0
    rdma_allocated: int | None = None


@dataclass(frozen=True)
class Resources:
    """What one replica needs."""

    gpus: int = 0
    cpu_cores: float = 1.0
    memory_mib: int = 1024
    gpu_model: str = ""
    # RDMA devices per replica (the cluster's RDMA resource), on its node like GPUs.
    rdma: int = 0


@dataclass(frozen=True)
class Volume:
    name: str
    mount_path: str
    host_path: str = ""
    claim_name: str = ""
    read_only: bool = False


@dataclass(frozen=True)
class DataMount:
    """A folder under the platform's data directory (the artifacts volume on Kubernetes) that a
    workload reads, or writes when not `read_only`, seen at the same path inside it. Nothing
    else of the data directory is visible to the workload."""

    path: str
    read_only: bool = True


@dataclass(frozen=True)
class RaySpec:
    """A workload that is a Ray cluster (a job of `kind: ray`): replica 0 is its head, replicas
    1.. its workers, and `Workload.command` is its entrypoint, run beside the head once every
    node is alive (RAY_ADDRESS set); the workload ends with the entrypoint. `head` and `worker`
    are what each node offers Ray (its pod's resources on Kubernetes); every replica holds
    `Workload.resources`, at least the larger of the two. `dashboard`: the head serves Ray's
    dashboard (and its job-submission API)."""

    head: Resources
    worker: Resources
    dashboard: bool = False
    # How long the head waits for every node to be alive before it gives up (the log says).
    ready_timeout_s: int = 300


@dataclass(frozen=True)
class Workload:
    """What to run. `id` is the platform's workload id (one per job attempt), a DNS-1123 label
    such as `job-42-a3`; `placement` is the node chosen for each replica, in replica order."""

    id: str
    command: tuple[str, ...]
    resources: Resources
    replicas: int = 1
    placement: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    image: str = ""
    # The named environment the command runs in (`environments()`); "" for the default.
    environment: str = ""
    # The working folder shipped with the job: the path of its archive (a gzip tar) on the
    # platform's disk, the artifacts volume on Kubernetes; unpacked into the run folder before
    # the command starts. "" for none.
    workdir_archive: str = ""
    run_dir: str = ""
    checkpoint_dir: str = ""
    ports: tuple[int, ...] = ()
    volumes: tuple[Volume, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    service: bool = False
    # Whose work it is: a tenant's name, or "" for the platform's own (health checks).
    tenant: str = ""
    # The unprivileged uid (and gid) the tenant's processes run as, where the driver runs them
    # on the host itself; None for the platform's own work.
    run_as: int | None = None
    # Folders of the data directory the workload may see besides `run_dir` and `checkpoint_dir`
    # (its own, read-write).
    data_mounts: tuple[DataMount, ...] = ()
    # Environment the processes get that no file, object or page may show in clear text
    # (tokens); drivers keep only the names.
    secret_env: dict[str, str] = field(default_factory=dict)
    # The job's wall-clock limit, for drivers whose cluster enforces one itself (Slurm's
    # `--time`); the platform enforces it everywhere else. None: no limit.
    time_limit_s: int | None = None
    # The cluster's extra networks each replica attaches to (names from the cluster's
    # `networks` option), in order; RDMA devices are in `resources.rdma`.
    networks: tuple[str, ...] = ()
    # A Ray cluster rather than plain replicas; None for any other workload.
    ray: RaySpec | None = None


@dataclass(frozen=True)
class EnvironmentInfo:
    """A named environment a cluster offers jobs: a Python environment on the local machine
    (`where`: its prefix), an image on Kubernetes (`where`: the image), with the Python and
    torch versions it holds where known ("" when not, or torch absent)."""

    name: str
    where: str = ""
    python: str = ""
    torch: str = ""
    default: bool = False


class Phase(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # The driver does not know the workload (never launched, or cleaned up).
    MISSING = "missing"


@dataclass(frozen=True)
class ReplicaStatus:
    index: int
    phase: Phase
    node: str = ""
    exit_code: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class WorkloadStatus:
    """The whole workload: RUNNING while every replica runs, FAILED as soon as one fails (with
    that replica's exit code and reason), SUCCEEDED when all succeeded. `node_lost` names a node
    that disappeared under it, so the caller can avoid it on the next attempt."""

    workload_id: str
    phase: Phase
    exit_code: int | None = None
    reason: str = ""
    replicas: tuple[ReplicaStatus, ...] = ()
    node_lost: str = ""


@dataclass(frozen=True)
class WorkloadUsage:
    """What the cluster's own accounting says a finished workload held (Slurm's `sacct`):
    when it started and ended (epoch seconds) and the GPUs and CPU cores allocated to it."""

    started_at: float
    ended_at: float
    gpus: int
    cpu_cores: float


class DriverError(Exception):
    """The cluster refused or failed; the message is for people."""


@dataclass(frozen=True)
class NetworkOffer:
    """What a cluster offers jobs besides compute: the extra networks they may attach (their
    names; `tenants` keeps some to the tenants it names) and, in words, how its nodes advertise
    RDMA devices ("rdma/rdma_shared_device_a"; "" where it offers none). How many devices each
    node has is `NodeInfo.rdma`."""

    attachments: tuple[str, ...] = ()
    rdma_resource: str = ""
    tenants: dict[str, tuple[str, ...]] = field(default_factory=dict)


def network_names(options: dict) -> list[str]:
    """The names of the networks a cluster's `networks` option offers: the keys of an object
    (Kubernetes: each with its NetworkAttachmentDefinition) or the items of a list."""
    networks = options.get("networks") or {}
    if isinstance(networks, dict | list):
        return [str(name) for name in networks]
    return []


@dataclass(frozen=True)
class ConnectionReport:
    """What a connection check found: `message` in plain words for the operator, `details` as
    plain values (a server version, what is installed)."""

    ok: bool
    message: str
    details: dict = field(default_factory=dict)


MAX_LOG_CHUNK_BYTES = 4 * 2**20


@dataclass(frozen=True)
class LogChunk:
    """New lines of one replica's log from an offset on, for the log store's shipper: complete
    lines only (a line still being written waits, unless the read is final), the offset to
    read from next, and whether more was there than one chunk holds."""

    lines: tuple[str, ...] = ()
    offset: int = 0
    more: bool = False


def chunk_of_text(text: str, offset: int, final: bool) -> LogChunk:
    """A chunk cut from a whole log, the offset counting lines (drivers that can read from
    a byte offset do better)."""
    lines = text.splitlines(keepends=True)[offset:]
    if lines and not lines[-1].endswith("\n") and not final:
        lines.pop()
    return LogChunk(lines=tuple(line.rstrip("\r\n") for line in lines),
                    offset=offset + len(lines))


class ClusterDriver(ABC):
    unsupported: dict[str, str] = {}
    # Services share their node's network, and the node picks their port (SERVICE_PORT_ARG);
    # False where the platform picks it (a free port of this machine, a pod's own).
    assigns_ports = False

    def __init__(self, *, cluster: str, options: dict | None = None) -> None:
        self.cluster = cluster
        self.options = options or {}

    @abstractmethod
    def nodes(self) -> list[NodeInfo]: ...

    @abstractmethod
    def launch(self, workload: Workload) -> str:
        """Start the workload (all replicas or none) and return its handle."""

    @abstractmethod
    def status(self, handles: list[str]) -> dict[str, WorkloadStatus]:
        """The status of each handle; an unknown handle is Phase.MISSING, never an error."""

    @abstractmethod
    def cancel(self, handle: str) -> None:
        """Stop every replica; cancelling a finished or unknown workload does nothing."""

    @abstractmethod
    def logs(self, handle: str, *, tail: int | None = None, replica: int = 0) -> str: ...

    def read_log(self, handle: str, *, replica: int, offset: int,
                 final: bool = False) -> LogChunk:
        """A replica's log from `offset` (this driver's own unit) on, as the shipper that feeds
        the log store reads it. This default reads the whole log and counts lines; drivers
        that keep logs in files read from a byte offset instead."""
        return chunk_of_text(self.logs(handle, replica=replica), offset, final)

    def check_connection(self) -> ConnectionReport:
        """Can the platform reach the cluster, and what does it offer? Never raises."""
        try:
            nodes = self.nodes()
        except DriverError as exc:
            return ConnectionReport(ok=False, message=str(exc))
        gpus = sum(node.gpus for node in nodes)
        return ConnectionReport(ok=True, message=f"{len(nodes)} nodes, {gpus} GPUs.",
                                details={"nodes": len(nodes), "gpus": gpus})

    def cleanup(self) -> int:
        """Delete what finished workloads left on the cluster once their logs are kept, past
        the cluster's retention; return how many. Drivers whose workloads leave nothing behind
        do nothing."""
        return 0

    def network_offer(self) -> NetworkOffer:
        """The networks jobs may attach and the RDMA resource, from the cluster's `networks`
        and `rdma_resource` options (the Kubernetes driver's, see `kube_networks`); drivers
        that offer them otherwise say so here."""
        networks = self.options.get("networks") or {}
        tenants = {}
        if isinstance(networks, dict):
            for name, spec in networks.items():
                listed = spec.get("tenants") if isinstance(spec, dict) else None
                if isinstance(listed, list) and listed:
                    tenants[str(name)] = tuple(str(t) for t in listed)
        resource = self.options.get("rdma_resource")
        return NetworkOffer(attachments=tuple(network_names(self.options)),
                            rdma_resource=resource if isinstance(resource, str) else "",
                            tenants=tenants)

    def environments(self) -> list[EnvironmentInfo]:
        """The named environments a job may ask for (`Workload.environment`), the default
        first; none where the driver offers no choice."""
        return []

    def render(self, workload: Workload) -> str:
        """What launching the workload would run, as text a person reads (YAML), sending
        nothing to the cluster. DriverError when it could not be launched as it is."""
        raise DriverError(f"cluster {self.cluster} cannot show what a workload would run")

    def endpoint(self, handle: str) -> str | None:
        """Where a service workload answers (`http://host:port`), or None (not yet)."""
        return None

    def ray_addresses(self, handle: str) -> dict[str, str] | None:
        """Where a Ray workload's cluster is reached from beside it (a notebook of the same
        tenant): `gcs` (host:port, what `ray start --address` takes, and `ray.init` on a node
        of the cluster), `client` (`ray://host:port`, the head's Ray Client server, what
        `ray.init(address=…)` takes from elsewhere; absent where the driver gives none) and
        `dashboard` (`http://host:port`, "" without one); None where unknown (not yet)."""
        return None

    def node_metrics(self, node: str) -> str | None:
        """The node's metrics as Prometheus exposition text (DCGM and node-exporter names,
        see `podsys.metric_names`), where the driver can read them itself; None where it
        cannot, and the platform scrapes the nodes (the cluster's `metrics_url` option) or
        queries Prometheus instead."""
        return None

    def usage(self, handle: str) -> WorkloadUsage | None:
        """The finished workload's usage as the cluster accounts it, so the platform bills
        what the cluster says ran; None where the cluster keeps no accounting (the platform
        then bills from its own times)."""
        return None

    def set_schedulable(self, node: str, schedulable: bool, reason: str = "") -> None:
        """Cordon (False) or uncordon the node on the cluster itself, where the cluster keeps
        its own (Slurm's drain): work submitted there by others then keeps off it too. A node
        the platform cordoned this way reports `labels[CORDONED_BY_PLATFORM]`. Drivers
        without such a notion do nothing: the platform's scheduler keeps its work off."""
        return None

    def supports(self, feature: str) -> bool:
        return feature not in self.unsupported
