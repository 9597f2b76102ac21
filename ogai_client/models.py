"""What the API answers, as small dataclasses.

Each is built by `from_api(dict)`, which reads the fields it knows, tolerates missing ones and
ignores new ones, so a newer server does not break an older client; `raw` keeps the whole answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
ACTIVE_STATES = frozenset({"admitted", "running"})

T = TypeVar("T")


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class Membership:
    tenant: str
    role: str


@dataclass(frozen=True)
class User:
    id: int
    username: str
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    is_platform_admin: bool = False
    memberships: list[Membership] = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> User:
        return cls(
            id=data.get("id", 0), username=data.get("username", ""),
            email=data.get("email") or "", first_name=data.get("first_name") or "",
            last_name=data.get("last_name") or "",
            is_platform_admin=bool(data.get("is_platform_admin")),
            memberships=[Membership(m.get("tenant", ""), m.get("role", ""))
                         for m in data.get("memberships") or []],
            raw=data,
        )


@dataclass(frozen=True)
class Resources:
    gpus: int = 0
    gpu_model: str = ""
    cpu: float = 1.0
    memory_mib: int = 1024

    @classmethod
    def from_api(cls, data: dict | None) -> Resources:
        data = data or {}
        return cls(gpus=data.get("gpus", 0), gpu_model=data.get("gpu_model") or "",
                   cpu=data.get("cpu", 1.0), memory_mib=data.get("memory_mib", 1024))


@dataclass(frozen=True)
class Network:
    """A job's network: the cluster's extra networks each replica attaches, in order, and the
    RDMA devices each replica holds."""

    attachments: tuple[str, ...] = ()
    rdma: int = 0

    @classmethod
    def from_api(cls, data: dict | None) -> Network:
        data = data or {}
        return cls(attachments=tuple(data.get("attachments") or ()), rdma=data.get("rdma") or 0)

    def __str__(self) -> str:
        parts = []
        if self.attachments:
            parts.append(f"attachments {', '.join(self.attachments)}")
        if self.rdma:
            parts.append(f"{self.rdma} RDMA device{'' if self.rdma == 1 else 's'} per replica")
        return "; ".join(parts) or "the cluster's default network"


@dataclass(frozen=True)
class Attempt:
    number: int
    state: str
    workload_id: str = ""
    placement: list[str] = field(default_factory=list)
    borrowed: bool = False
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    reason: str = ""

    @classmethod
    def from_api(cls, data: dict) -> Attempt:
        return cls(
            number=data.get("number", 0), state=data.get("state", ""),
            workload_id=data.get("workload_id") or "", placement=list(data.get("placement") or []),
            borrowed=bool(data.get("borrowed")), created_at=parse_time(data.get("created_at")),
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")), exit_code=data.get("exit_code"),
            reason=data.get("reason") or "",
        )


@dataclass(frozen=True)
class JobEvent:
    created_at: datetime | None
    from_state: str
    to_state: str
    reason: str = ""
    attempt: int | None = None

    @classmethod
    def from_api(cls, data: dict) -> JobEvent:
        return cls(created_at=parse_time(data.get("created_at")),
                   from_state=data.get("from_state") or "", to_state=data.get("to_state") or "",
                   reason=data.get("reason") or "", attempt=data.get("attempt"))


@dataclass(frozen=True)
class Workdir:
    """A working folder shipped with jobs: an archive of a tenant's, named by its sha256.

    A job's `workdir` carries only id, sha256, size_bytes and file_count; `OgaiClient.workdir(id)`
    adds the file list. `reused` (the platform already had it, nothing was uploaded) and
    `left_out` (what the archive could not hold, e.g. "data -> /mnt/x (a link out of the
    folder)") are set by `OgaiClient.upload_workdir()` only."""

    id: int
    sha256: str
    tenant: str = ""
    size_bytes: int = 0
    unpacked_bytes: int = 0
    file_count: int = 0
    files: list[dict] = field(default_factory=list)  # [{"path", "size"}]
    created_at: datetime | None = None
    reused: bool = field(default=False, compare=False)
    left_out: list[str] = field(default_factory=list, compare=False)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> Workdir:
        return cls(
            id=data["id"], sha256=data.get("sha256") or "", tenant=data.get("tenant") or "",
            size_bytes=_int(data.get("size_bytes")),
            unpacked_bytes=_int(data.get("unpacked_bytes")),
            file_count=_int(data.get("file_count")),
            files=[item for item in data.get("files") or [] if isinstance(item, dict)],
            created_at=parse_time(data.get("created_at")), raw=data,
        )


@dataclass(frozen=True)
class Job:
    """A job as listed; `attempts` and `events` are filled only by `OgaiClient.job(id)` and by
    submit (the detail view)."""

    id: int
    name: str
    state: str
    tenant: str = ""
    queue: str = ""
    cluster: str = ""
    owner: str = ""
    reason: str = ""
    dispatch: str = ""  # a fleet queue's job: where it was sent and why
    position: int | None = None
    priority: int = 0
    image: str = ""
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    network: Network = field(default_factory=Network)
    replicas: int = 1
    max_restarts: int = 0
    time_limit_s: int | None = None
    restarts: int = 0
    exit_code: int | None = None
    placement: list[str] = field(default_factory=list)
    borrowed: bool = False
    created_at: datetime | None = None
    queued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    rerun_of: int | None = None
    environment: str = ""  # "" is the cluster's default
    workdir: Workdir | None = None
    attempts: list[Attempt] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)
    kind: str = "job"  # "ray": a Ray cluster running `command` as its entrypoint
    ray: dict | None = None  # {workers, head, worker, dashboard} of a Ray job
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def gpus(self) -> int:
        """GPUs of the whole job (per replica times replicas)."""
        return self.resources.gpus * self.replicas

    @classmethod
    def from_api(cls, data: dict) -> Job:
        return cls(
            id=data["id"], name=data.get("name", ""), state=data.get("state", ""),
            tenant=data.get("tenant") or "", queue=data.get("queue") or "",
            cluster=data.get("cluster") or "", owner=data.get("owner") or "",
            reason=data.get("reason") or "", dispatch=data.get("dispatch") or "",
            position=data.get("position"),
            priority=data.get("priority", 0), image=data.get("image") or "",
            command=list(data.get("command") or []), env=dict(data.get("env") or {}),
            resources=Resources.from_api(data.get("resources")),
            network=Network.from_api(data.get("network")),
            replicas=data.get("replicas", 1), max_restarts=data.get("max_restarts", 0),
            time_limit_s=data.get("time_limit_s"), restarts=data.get("restarts", 0),
            exit_code=data.get("exit_code"), placement=list(data.get("placement") or []),
            borrowed=bool(data.get("borrowed")), created_at=parse_time(data.get("created_at")),
            queued_at=parse_time(data.get("queued_at")),
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")), rerun_of=data.get("rerun_of"),
            environment=data.get("environment") or "",
            workdir=Workdir.from_api(data["workdir"]) if isinstance(data.get("workdir"), dict)
            else None,
            attempts=[Attempt.from_api(a) for a in data.get("attempts") or []],
            events=[JobEvent.from_api(e) for e in data.get("events") or []],
            kind=data.get("kind") or "job",
            ray=dict(data["ray"]) if isinstance(data.get("ray"), dict) else None,
            raw=data,
        )


@dataclass(frozen=True)
class JobLogs:
    """The last lines of one replica of one attempt; `attempt` is None before the first."""

    attempt: int | None
    replica: int
    text: str

    @classmethod
    def from_api(cls, data: dict) -> JobLogs:
        return cls(attempt=data.get("attempt"), replica=data.get("replica", 0),
                   text=data.get("text") or "")


@dataclass(frozen=True)
class RayAddresses:
    """Where a Ray job's cluster is reached (GET /jobs/{id}/ray/): `address` is its GCS
    address (host:port) for `ray.init(address=...)`; `dashboard_url` its dashboard through
    the platform's proxy ("" without one); both "" until `ready`, and `reason` says why.
    `address` is the Ray Client address (ray://host:port) where the cluster's driver gives
    one, else the GCS; `gcs_address` is always the GCS (host:port)."""

    ready: bool
    address: str = ""
    gcs_address: str = ""
    dashboard_url: str = ""
    reason: str = ""

    @classmethod
    def from_api(cls, data: dict) -> RayAddresses:
        return cls(ready=bool(data.get("ready")), address=data.get("address") or "",
                   gcs_address=data.get("gcs_address") or data.get("address") or "",
                   dashboard_url=data.get("dashboard_url") or "",
                   reason=data.get("reason") or "")


@dataclass(frozen=True)
class Notebook:
    """A JupyterLab environment. `state`: stopped, waiting, starting, running or failed;
    `url` (a path on the platform, e.g. /notebooks/3/lab) only while it runs; `job` is the
    current (or last) session's job id."""

    id: int
    name: str
    state: str
    tenant: str = ""
    owner: str = ""
    queue: str = ""
    image: str = ""
    resources: Resources = field(default_factory=lambda: Resources(cpu=1.0, memory_mib=4096))
    reason: str = ""
    job: int | None = None
    url: str | None = None
    gpu_hours: float = 0.0
    idle_timeout_s: int | None = None
    last_activity_at: datetime | None = None
    created_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_api(cls, data: dict) -> Notebook:
        return cls(
            id=data["id"], name=data.get("name", ""), state=data.get("state", ""),
            tenant=data.get("tenant") or "", owner=data.get("owner") or "",
            queue=data.get("queue") or "", image=data.get("image") or "",
            resources=Resources.from_api(data.get("resources")),
            reason=data.get("reason") or "", job=data.get("job"), url=data.get("url") or None,
            gpu_hours=float(data.get("gpu_hours") or 0.0),
            idle_timeout_s=data.get("idle_timeout_s"),
            last_activity_at=parse_time(data.get("last_activity_at")),
            created_at=parse_time(data.get("created_at")), raw=data,
        )


@dataclass(frozen=True)
class Queue:
    id: int
    name: str
    tenant: str
    cluster: str
    policy: str = ""
    description: str = ""
    default_priority: int = 0
    gpu_limit: int | None = None
    is_active: bool = True
    pending: int = 0
    running: int = 0
    gpus_in_use: int = 0
    created_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> Queue:
        return cls(
            id=data.get("id", 0), name=data.get("name", ""), tenant=data.get("tenant") or "",
            cluster=data.get("cluster") or "", policy=data.get("policy") or "",
            description=data.get("description") or "",
            default_priority=data.get("default_priority", 0), gpu_limit=data.get("gpu_limit"),
            is_active=data.get("is_active", True), pending=data.get("pending") or 0,
            running=data.get("running") or 0, gpus_in_use=data.get("gpus_in_use") or 0,
            created_at=parse_time(data.get("created_at")), raw=data,
        )


@dataclass(frozen=True)
class Quota:
    id: int
    tenant: str
    gpus: int = 0
    cpu_cores: int = 0
    memory_gib: int = 0
    storage_gib: int = 0
    gpu_model_limits: dict[str, int] = field(default_factory=dict)
    rdma_devices: int = 0  # 0: no limit
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> Quota:
        return cls(
            id=data.get("id", 0), tenant=data.get("tenant") or "", gpus=data.get("gpus", 0),
            cpu_cores=data.get("cpu_cores", 0), memory_gib=data.get("memory_gib", 0),
            storage_gib=data.get("storage_gib", 0), rdma_devices=data.get("rdma_devices") or 0,
            gpu_model_limits=dict(data.get("gpu_model_limits") or {}), raw=data,
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: `count` is the total over every page."""

    count: int
    results: list[T]
    offset: int = 0

    @property
    def has_more(self) -> bool:
        return self.offset + len(self.results) < self.count


# -- YLink: datasets, pipelines, training -------------------------------------------------------

RUN_FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


def _int(value: Any, default: int = 0) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else default


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


@dataclass(frozen=True)
class Dataset:
    """A named corpus of a tenant; `versions` counts its versions, `latest_version` is the
    newest one's number (None before the first upload)."""

    id: int
    name: str
    tenant: str = ""
    kind: str = "text"
    description: str = ""
    versions: int = 0
    latest_version: int | None = None
    created_by: str = ""
    created_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> Dataset:
        return cls(
            id=data["id"], name=data.get("name", ""), tenant=data.get("tenant") or "",
            kind=data.get("kind") or "text", description=data.get("description") or "",
            versions=_int(data.get("versions")), latest_version=data.get("latest_version"),
            created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")), raw=data,
        )


@dataclass(frozen=True)
class DatasetVersion:
    """One immutable state of a dataset. `format`: "jsonl" (documents) or "tokens" (token
    shards); `parent` and `pipeline_run` are its lineage (None for an upload)."""

    id: int
    dataset: str
    number: int
    format: str = "jsonl"
    dataset_id: int | None = None
    tenant: str = ""
    content_hash: str = ""
    documents: int = 0
    bytes: int = 0
    tokens: int | None = None
    stats: dict = field(default_factory=dict)
    parent: int | None = None
    pipeline_run: int | None = None
    source: str = ""
    created_by: str = ""
    created_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def label(self) -> str:
        """"corpus v2"."""
        return f"{self.dataset} v{self.number}"

    @property
    def length_histogram(self) -> list[dict]:
        """[{"from", "to", "documents"}] of document lengths in characters."""
        return list(self.stats.get("length_histogram") or [])

    @classmethod
    def from_api(cls, data: dict) -> DatasetVersion:
        return cls(
            id=data["id"], dataset=data.get("dataset") or "", number=_int(data.get("number")),
            format=data.get("format") or "jsonl", dataset_id=data.get("dataset_id"),
            tenant=data.get("tenant") or "", content_hash=data.get("content_hash") or "",
            documents=_int(data.get("documents")), bytes=_int(data.get("bytes")),
            tokens=data.get("tokens"), stats=dict(data.get("stats") or {}),
            parent=data.get("parent"), pipeline_run=data.get("pipeline_run"),
            source=data.get("source") or "", created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")), raw=data,
        )


@dataclass(frozen=True)
class Sample:
    """One document of a version: `text` is cut at the server's limit when `truncated`."""

    index: int
    id: str
    text: str
    chars: int = 0
    truncated: bool = False
    metadata: dict = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict) -> Sample:
        text = data.get("text") or ""
        return cls(index=_int(data.get("index")), id=str(data.get("id", "")), text=text,
                   chars=_int(data.get("chars"), len(text)),
                   truncated=bool(data.get("truncated")),
                   metadata=dict(data.get("metadata") or {}))


@dataclass(frozen=True)
class StepResult:
    """One pipeline step's figures, merged over the replicas: documents and bytes in and out,
    drops by reason, a few samples of what it dropped or changed."""

    index: int
    type: str
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)
    seconds: float | None = None

    @classmethod
    def from_api(cls, data: dict) -> StepResult:
        return cls(
            index=_int(data.get("index")), type=data.get("type") or "",
            docs_in=_int(data.get("docs_in")), docs_out=_int(data.get("docs_out")),
            bytes_in=_int(data.get("bytes_in")), bytes_out=_int(data.get("bytes_out")),
            dropped={str(k): _int(v) for k, v in (data.get("dropped") or {}).items()},
            samples=list(data.get("samples") or []), seconds=_float(data.get("seconds")),
        )


@dataclass(frozen=True)
class PipelineRun:
    """A data pipeline run. `state`: queued, running, restarting, finishing, succeeded,
    failed or cancelled; `reason`: what its job waits for or why it ended; `message`: why it
    failed, in the runner's words."""

    id: int
    name: str
    state: str
    tenant: str = ""
    reason: str = ""
    message: str = ""
    input_version: DatasetVersion | None = None
    output_version: DatasetVersion | None = None
    steps: list[dict] = field(default_factory=list)
    replicas: int = 1
    tokenizer_run: int | None = None
    step_results: list[StepResult] = field(default_factory=list)
    job: int | None = None
    created_by: str = ""
    created_at: datetime | None = None
    finished_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_final(self) -> bool:
        return self.state in RUN_FINAL_STATES

    @classmethod
    def from_api(cls, data: dict) -> PipelineRun:
        def version(value: Any) -> DatasetVersion | None:
            return DatasetVersion.from_api(value) if isinstance(value, dict) else None

        return cls(
            id=data["id"], name=data.get("name", ""), state=data.get("state", ""),
            tenant=data.get("tenant") or "", reason=data.get("reason") or "",
            message=data.get("message") or "",
            input_version=version(data.get("input_version")),
            output_version=version(data.get("output_version")),
            steps=list(data.get("steps") or []), replicas=_int(data.get("replicas"), 1),
            tokenizer_run=data.get("tokenizer_run"),
            step_results=[StepResult.from_api(r) for r in data.get("step_results") or []],
            job=data.get("job"), created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")),
            finished_at=parse_time(data.get("finished_at")), raw=data,
        )


@dataclass(frozen=True)
class TrainingRun:
    """A tokenizer, pretraining or fine-tuning run (`kind`: tokenizer, pretrain, sft, lora,
    prompt_tuning, multitask_prompt_tuning; `after_run`: the run it waits for).
    Progress (`step` of `total_steps`, `tokens`, `tokens_per_s`, `eta_s`, `loss`, `lr`) is
    what the runner last reported; `artifact` ("tokenizer", "model" or "adapter") and
    `output_path` are set once it succeeded."""

    id: int
    name: str
    kind: str
    state: str
    tenant: str = ""
    reason: str = ""
    message: str = ""
    dataset_version: DatasetVersion | None = None
    base_run: int | None = None
    after_run: int | None = None
    spec: dict = field(default_factory=dict)
    gpus: int = 0
    replicas: int = 1
    step: int = 0
    total_steps: int = 0
    tokens: int = 0
    tokens_per_s: float | None = None
    eta_s: float | None = None
    loss: float | None = None
    lr: float | None = None
    resumed_from_step: int | None = None
    progress_at: datetime | None = None
    artifact: str = ""
    output_path: str = ""
    parameters: int | None = None
    job: int | None = None
    created_by: str = ""
    created_at: datetime | None = None
    finished_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_final(self) -> bool:
        return self.state in RUN_FINAL_STATES

    @classmethod
    def from_api(cls, data: dict) -> TrainingRun:
        version = data.get("dataset_version")
        return cls(
            id=data["id"], name=data.get("name", ""), kind=data.get("kind") or "",
            state=data.get("state", ""), tenant=data.get("tenant") or "",
            reason=data.get("reason") or "", message=data.get("message") or "",
            dataset_version=DatasetVersion.from_api(version) if isinstance(version, dict)
            else None,
            base_run=data.get("base_run"), after_run=data.get("after_run"),
            spec=dict(data.get("spec") or {}),
            gpus=_int(data.get("gpus")), replicas=_int(data.get("replicas"), 1),
            step=_int(data.get("step")), total_steps=_int(data.get("total_steps")),
            tokens=_int(data.get("tokens")), tokens_per_s=_float(data.get("tokens_per_s")),
            eta_s=_float(data.get("eta_s")), loss=_float(data.get("loss")),
            lr=_float(data.get("lr")), resumed_from_step=data.get("resumed_from_step"),
            progress_at=parse_time(data.get("progress_at")),
            artifact=data.get("artifact") or "", output_path=data.get("output_path") or "",
            parameters=data.get("parameters"), job=data.get("job"),
            created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")),
            finished_at=parse_time(data.get("finished_at")), raw=data,
        )


@dataclass(frozen=True)
class TrainingMetric:
    step: int
    loss: float | None = None
    lr: float | None = None
    tokens: int = 0
    tokens_per_s: float | None = None
    grad_norm: float | None = None
    reported_at: datetime | None = None

    @classmethod
    def from_api(cls, data: dict) -> TrainingMetric:
        return cls(step=_int(data.get("step")), loss=_float(data.get("loss")),
                   lr=_float(data.get("lr")), tokens=_int(data.get("tokens")),
                   tokens_per_s=_float(data.get("tokens_per_s")),
                   grad_norm=_float(data.get("grad_norm")),
                   reported_at=parse_time(data.get("reported_at")))


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str = ""
    bytes: int = 0
    created_at: datetime | None = None

    @classmethod
    def from_api(cls, data: dict) -> Checkpoint:
        return cls(step=_int(data.get("step")), path=data.get("path") or "",
                   bytes=_int(data.get("bytes")), created_at=parse_time(data.get("created_at")))


# -- MModel: registry, evaluation, deployments -------------------------------------------------

@dataclass(frozen=True)
class Model:
    """A named model of a tenant. `latest_version`: its newest version's number, with
    `latest_version_id` and `latest_status` (None before the first)."""

    id: int
    name: str
    tenant: str = ""
    description: str = ""
    versions: int = 0
    latest_version: int | None = None
    latest_version_id: int | None = None
    latest_status: str = ""
    created_by: str = ""
    created_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> Model:
        latest = data.get("latest_version") if isinstance(data.get("latest_version"),
                                                          dict) else {}
        return cls(
            id=data["id"], name=data.get("name", ""), tenant=data.get("tenant") or "",
            description=data.get("description") or "", versions=_int(data.get("versions")),
            latest_version=latest.get("number"), latest_version_id=latest.get("id"),
            latest_status=latest.get("status") or "", created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")), raw=data,
        )


@dataclass(frozen=True)
class ModelVersion:
    """One immutable set of weights. `status`: importing, ready or failed; `source`: import or
    training; lineage: `training_run`, `base_version`, `dataset_versions` (ids). `files` and
    `lineage` ({"nodes": [{"id", "kind", "label", "pk"}], "edges": [[from, to]]}) are filled
    only by `OgaiClient.model_version(id)` and by register."""

    id: int
    model: str
    number: int
    status: str = ""
    model_id: int | None = None
    tenant: str = ""
    message: str = ""
    source: str = ""
    format: str = ""
    architecture: str = ""
    model_type: str = ""
    parameters: int | None = None
    context_length: int | None = None
    dtype: str = ""
    tokenizer: str = ""
    bytes: int = 0
    content_hash: str = ""
    training_run: int | None = None
    base_version: int | None = None
    dataset_versions: list[int] = field(default_factory=list)
    source_path: str = ""
    artifact_path: str = ""
    files: list[dict] = field(default_factory=list)
    lineage: dict = field(default_factory=dict)
    created_by: str = ""
    created_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def label(self) -> str:
        """"tiny:v2"."""
        return f"{self.model}:v{self.number}"

    @classmethod
    def from_api(cls, data: dict) -> ModelVersion:
        return cls(
            id=data["id"], model=data.get("model") or "", number=_int(data.get("number")),
            status=data.get("status") or "", model_id=data.get("model_id"),
            tenant=data.get("tenant") or "", message=data.get("message") or "",
            source=data.get("source") or "", format=data.get("format") or "",
            architecture=data.get("architecture") or "",
            model_type=data.get("model_type") or "", parameters=data.get("parameters"),
            context_length=data.get("context_length"), dtype=data.get("dtype") or "",
            tokenizer=data.get("tokenizer") or "", bytes=_int(data.get("bytes")),
            content_hash=data.get("content_hash") or "",
            training_run=data.get("training_run"), base_version=data.get("base_version"),
            dataset_versions=[v for v in data.get("dataset_versions") or []
                              if isinstance(v, int)],
            source_path=data.get("source_path") or "",
            artifact_path=data.get("artifact_path") or "",
            files=[f for f in data.get("files") or [] if isinstance(f, dict)],
            lineage=dict(data.get("lineage") or {}), created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")), raw=data,
        )


@dataclass(frozen=True)
class ModelImport:
    """Importing a folder as a new version. `state`: queued, running, succeeded or failed;
    `message`: why it failed."""

    id: int
    model: str
    state: str
    tenant: str = ""
    model_id: int | None = None
    version: int | None = None
    version_number: int | None = None
    source_path: str = ""
    allow_pickle: bool = False
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    created_by: str = ""
    created_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_final(self) -> bool:
        return self.state in {"succeeded", "failed"}

    @property
    def label(self) -> str:
        return f"{self.model}:v{self.version_number}" if self.version_number else self.model

    @classmethod
    def from_api(cls, data: dict) -> ModelImport:
        return cls(
            id=data["id"], model=data.get("model") or "", state=data.get("state") or "",
            tenant=data.get("tenant") or "", model_id=data.get("model_id"),
            version=data.get("version"), version_number=data.get("version_number"),
            source_path=data.get("source_path") or "",
            allow_pickle=bool(data.get("allow_pickle")), message=data.get("message") or "",
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")),
            created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")), raw=data,
        )


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: JSONL documents and how to prompt and score them (`kind`: multiple_choice,
    generation, perplexity or retrieval). `shared`: shipped with the platform for every tenant.
    `preview` (the first documents as the model is asked them) is filled by `benchmark(id)` and
    upload."""

    id: int
    name: str
    kind: str
    tenant: str = ""
    shared: bool = False
    description: str = ""
    documents: int = 0
    content_hash: str = ""
    prompt_template: str = ""
    target_template: str = ""
    choices_template: str = ""
    text_field: str = ""
    few_shot: int = 0
    metrics: list[str] = field(default_factory=list)
    generation_kwargs: dict = field(default_factory=dict)
    preview: list[dict] = field(default_factory=list)
    created_by: str = ""
    created_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> Benchmark:
        return cls(
            id=data["id"], name=data.get("name", ""), kind=data.get("kind") or "",
            tenant=data.get("tenant") or "", shared=bool(data.get("shared")),
            description=data.get("description") or "", documents=_int(data.get("documents")),
            content_hash=data.get("content_hash") or "",
            prompt_template=data.get("prompt_template") or "",
            target_template=data.get("target_template") or "",
            choices_template=data.get("choices_template") or "",
            text_field=data.get("text_field") or "", few_shot=_int(data.get("few_shot")),
            metrics=[str(m) for m in data.get("metrics") or []],
            generation_kwargs=dict(data.get("generation_kwargs") or {}),
            preview=[p for p in data.get("preview") or [] if isinstance(p, dict)],
            created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")), raw=data,
        )


@dataclass(frozen=True)
class EvaluationResult:
    benchmark: str
    metric: str
    value: float
    benchmark_id: int | None = None
    stderr: float | None = None
    samples: int = 0

    @classmethod
    def from_api(cls, data: dict) -> EvaluationResult:
        return cls(benchmark=data.get("benchmark") or "", metric=data.get("metric") or "",
                   value=_float(data.get("value")) or 0.0,
                   benchmark_id=data.get("benchmark_id"), stderr=_float(data.get("stderr")),
                   samples=_int(data.get("samples")))


@dataclass(frozen=True)
class EvaluationRun:
    """A version (its weights, or a deployment's endpoint: `target`) scored on benchmarks in a
    job. `state` like a training run's; `benchmarks`: [{"id", "name", "kind"}]; `results` once
    it succeeded; `cached_requests` of `total_requests` came from earlier runs' cache."""

    id: int
    state: str
    name: str = ""
    tenant: str = ""
    reason: str = ""
    message: str = ""
    version: int | None = None
    version_label: str = ""
    target: str = "weights"
    deployment: int | None = None
    benchmarks: list[dict] = field(default_factory=list)
    limit: int | None = None
    cached_requests: int = 0
    total_requests: int = 0
    results: list[EvaluationResult] = field(default_factory=list)
    job: int | None = None
    created_by: str = ""
    created_at: datetime | None = None
    progress_at: datetime | None = None
    finished_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_final(self) -> bool:
        return self.state in RUN_FINAL_STATES

    @property
    def benchmark_names(self) -> list[str]:
        return [str(b.get("name", "")) for b in self.benchmarks]

    @classmethod
    def from_api(cls, data: dict) -> EvaluationRun:
        return cls(
            id=data["id"], state=data.get("state") or "", name=data.get("name") or "",
            tenant=data.get("tenant") or "", reason=data.get("reason") or "",
            message=data.get("message") or "", version=data.get("version"),
            version_label=data.get("version_label") or "",
            target=data.get("target") or "weights", deployment=data.get("deployment"),
            benchmarks=[b for b in data.get("benchmarks") or [] if isinstance(b, dict)],
            limit=data.get("limit"), cached_requests=_int(data.get("cached_requests")),
            total_requests=_int(data.get("total_requests")),
            results=[EvaluationResult.from_api(r) for r in data.get("results") or []],
            job=data.get("job"), created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")),
            progress_at=parse_time(data.get("progress_at")),
            finished_at=parse_time(data.get("finished_at")), raw=data,
        )


@dataclass(frozen=True)
class EvaluationSample:
    """What the model did on one document of a benchmark; `correct` is None where the kind
    has no right answer (perplexity)."""

    benchmark: str
    index: int
    prompt: str = ""
    target: str = ""
    output: str = ""
    correct: bool | None = None
    scores: dict = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict) -> EvaluationSample:
        correct = data.get("correct")
        return cls(benchmark=data.get("benchmark") or "", index=_int(data.get("index")),
                   prompt=data.get("prompt") or "", target=data.get("target") or "",
                   output=data.get("output") or "",
                   correct=correct if isinstance(correct, bool) else None,
                   scores=dict(data.get("scores") or {}))


@dataclass(frozen=True)
class LeaderboardRow:
    """A version's newest succeeded scores: {benchmark: {metric: value}}, and per benchmark
    the run they come from: {benchmark: {"run", "documents", "limit", "benchmark_documents",
    "benchmark_version"}}."""

    version: int
    label: str
    model: str = ""
    number: int = 0
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    runs: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict) -> LeaderboardRow:
        scores = {str(name): {str(k): float(v) for k, v in (metrics or {}).items()
                              if _float(v) is not None}
                  for name, metrics in (data.get("scores") or {}).items()}
        runs = {str(name): dict(about) for name, about in (data.get("runs") or {}).items()
                if isinstance(about, dict)}
        return cls(version=_int(data.get("version")), label=data.get("label") or "",
                   model=data.get("model") or "", number=_int(data.get("number")),
                   scores=scores, runs=runs)

    def limited_documents(self, benchmark: str) -> int | None:
        """How many documents the benchmark's score is over, when a limit left some out."""
        about = self.runs.get(benchmark) or {}
        documents = _int(about.get("documents"))
        if about.get("limit") and documents < _int(about.get("benchmark_documents")):
            return documents
        return None


@dataclass(frozen=True)
class Replica:
    """One model server of a deployment: its job and whether its health endpoint answers.
    `upstream` is shown to platform admins only."""

    index: int
    job: int | None = None
    job_state: str = ""
    ready: bool = False
    ready_since: datetime | None = None
    checked_at: datetime | None = None
    message: str = ""
    failed: bool = False
    upstream: str = ""
    # Why its job waits for the scheduler ("waiting: 2 CPU cores asked, 1 free on node ...").
    waiting_reason: str = ""

    @classmethod
    def from_api(cls, data: dict) -> Replica:
        return cls(index=_int(data.get("index")), job=data.get("job"),
                   job_state=data.get("job_state") or "",
                   waiting_reason=data.get("waiting_reason") or "", ready=bool(data.get("ready")),
                   ready_since=parse_time(data.get("ready_since")),
                   checked_at=parse_time(data.get("checked_at")),
                   message=data.get("message") or "", failed=bool(data.get("failed")),
                   upstream=data.get("upstream") or "")


@dataclass(frozen=True)
class Deployment:
    """A version served at the gateway (`/v1/`) under `name`. `state`: starting, ready,
    degraded, scaled_to_zero, stopped or failed."""

    id: int
    name: str
    state: str
    tenant: str = ""
    model: str = ""
    version: int | None = None
    version_label: str = ""
    queue: str = ""
    runtime: str = ""
    replicas: int = 1
    gpus_per_replica: int = 0
    gpu_model: str = ""
    cpu_per_replica: float = 0.0
    memory_mib_per_replica: int = 0
    idle_timeout_s: int = 0
    active: bool = True
    scaled_to_zero: bool = False
    last_request_at: datetime | None = None
    replica_set: list[Replica] = field(default_factory=list)
    created_by: str = ""
    created_at: datetime | None = None
    # Why a replica's job still waits for the scheduler; "" when none waits.
    waiting_reason: str = ""
    # A pool's models (its base first): {name, version, version_label, kind, held_by}.
    pool: list[dict] = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def ready_replicas(self) -> int:
        return sum(1 for replica in self.replica_set if replica.ready)

    @classmethod
    def from_api(cls, data: dict) -> Deployment:
        return cls(
            id=data["id"], name=data.get("name", ""), state=data.get("state") or "",
            waiting_reason=data.get("waiting_reason") or "", tenant=data.get("tenant") or "",
            model=data.get("model") or "",
            version=data.get("version"), version_label=data.get("version_label") or "",
            queue=data.get("queue") or "", runtime=data.get("runtime") or "",
            replicas=_int(data.get("replicas"), 1),
            gpus_per_replica=_int(data.get("gpus_per_replica")),
            gpu_model=data.get("gpu_model") or "",
            cpu_per_replica=_float(data.get("cpu_per_replica")) or 0.0,
            memory_mib_per_replica=_int(data.get("memory_mib_per_replica")),
            idle_timeout_s=_int(data.get("idle_timeout_s")), active=bool(data.get("active")),
            scaled_to_zero=bool(data.get("scaled_to_zero")),
            last_request_at=parse_time(data.get("last_request_at")),
            replica_set=[Replica.from_api(r) for r in data.get("replica_set") or []],
            created_by=data.get("created_by") or "",
            created_at=parse_time(data.get("created_at")), pool=list(data.get("pool") or []),
            raw=data,
        )


@dataclass(frozen=True)
class DeploymentStat:
    """Requests to a deployment through the gateway in one minute."""

    minute: datetime | None
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms_mean: float | None = None
    latency_ms_p50: float | None = None
    latency_ms_p99: float | None = None

    @classmethod
    def from_api(cls, data: dict) -> DeploymentStat:
        return cls(minute=parse_time(data.get("minute")), requests=_int(data.get("requests")),
                   errors=_int(data.get("errors")),
                   prompt_tokens=_int(data.get("prompt_tokens")),
                   completion_tokens=_int(data.get("completion_tokens")),
                   latency_ms_mean=_float(data.get("latency_ms_mean")),
                   latency_ms_p50=_float(data.get("latency_ms_p50")),
                   latency_ms_p99=_float(data.get("latency_ms_p99")))


# -- PODsys: nodes, health checks, stack deployments --------------------------------------------

CHECK_FINAL_STATES = frozenset({"passed", "failed", "error"})
DEPLOYMENT_FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True)
class ClusterEnvironment:
    """A named environment jobs on a cluster may ask for (`environment:` in a job spec): a
    Python environment's folder on a local cluster, an image on Kubernetes (`where`), with its
    Python and torch versions where known; `problem` says why it cannot run jobs."""

    name: str
    where: str = ""
    python: str = ""
    torch: str = ""
    default: bool = False
    problem: str = ""

    @classmethod
    def from_api(cls, data: dict) -> ClusterEnvironment:
        return cls(name=data.get("name", ""), where=data.get("where") or "",
                   python=data.get("python") or "", torch=data.get("torch") or "",
                   default=bool(data.get("default")), problem=data.get("problem") or "")


@dataclass(frozen=True)
class Node:
    """A machine of a cluster as its driver last reported it. `health`: healthy, not_ready or
    lost; `schedulable` False when cordoned, `cordon_source` saying by whom (operator,
    health_check, check_running) and `health_reason` why."""

    id: int
    name: str
    cluster: str = ""
    gpus: int = 0
    gpus_allocated: int = 0
    gpus_in_use: int | None = None
    gpu_model: str = ""
    gpu_memory_mib: int = 0
    cpu_cores: float = 0.0
    memory_mib: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    health: str = ""
    health_reason: str = ""
    schedulable: bool = True
    cordon_source: str = ""
    address: str = ""
    last_seen_at: datetime | None = None
    rdma_devices: int = 0  # RDMA devices it offers jobs
    rdma_in_use: int | None = None  # held by anything, where the cluster reports it
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def gpus_used(self) -> int:
        """GPUs held on it: the platform's allocations, or more where the cluster reports
        other users' work too."""
        return max(self.gpus_allocated, self.gpus_in_use or 0)

    @classmethod
    def from_api(cls, data: dict) -> Node:
        in_use = data.get("gpus_in_use")
        return cls(
            id=data["id"], name=data.get("name", ""), cluster=data.get("cluster") or "",
            gpus=_int(data.get("gpus")), gpus_allocated=_int(data.get("gpus_allocated")),
            gpus_in_use=_int(in_use) if in_use is not None else None,
            gpu_model=data.get("gpu_model") or "",
            gpu_memory_mib=_int(data.get("gpu_memory_mib")),
            cpu_cores=_float(data.get("cpu_cores")) or 0.0,
            memory_mib=_int(data.get("memory_mib")), labels=dict(data.get("labels") or {}),
            health=data.get("health") or "", health_reason=data.get("health_reason") or "",
            schedulable=bool(data.get("schedulable", True)),
            cordon_source=data.get("cordon_source") or "", address=data.get("address") or "",
            last_seen_at=parse_time(data.get("last_seen_at")),
            rdma_devices=_int(data.get("rdma_devices")),
            rdma_in_use=_int(data["rdma_in_use"]) if data.get("rdma_in_use") is not None
            else None,
            raw=data,
        )


@dataclass(frozen=True)
class HealthCheckRun:
    """One run of one check on one node. `state`: pending, running, passed, failed, or error
    (it could not be carried out, which says nothing of the node); `summary` is the verdict in
    words."""

    id: int
    check_name: str
    state: str
    node: int | None = None
    node_name: str = ""
    cluster: str = ""
    severity: str = ""
    trigger: str = ""
    summary: str = ""
    details: dict = field(default_factory=dict)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_final(self) -> bool:
        return self.state in CHECK_FINAL_STATES

    @classmethod
    def from_api(cls, data: dict) -> HealthCheckRun:
        return cls(
            id=data["id"], check_name=data.get("check_name") or "",
            state=data.get("state") or "", node=data.get("node"),
            node_name=data.get("node_name") or "", cluster=data.get("cluster") or "",
            severity=data.get("severity") or "", trigger=data.get("trigger") or "",
            summary=data.get("summary") or "", details=dict(data.get("details") or {}),
            created_at=parse_time(data.get("created_at")),
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")), raw=data,
        )


@dataclass(frozen=True)
class HealthCheckType:
    """A check the platform runs: `severity` fatal (a confirmed failure cordons the node) or
    warning; `exclusive` checks wait for the node's GPUs to be free."""

    name: str
    label: str = ""
    severity: str = ""
    interval_s: float = 0.0
    timeout_s: float = 0.0
    exclusive: bool = False
    multi_node: bool = False

    @classmethod
    def from_api(cls, data: dict) -> HealthCheckType:
        return cls(name=data.get("name") or "", label=data.get("label") or "",
                   severity=data.get("severity") or "",
                   interval_s=_float(data.get("interval_s")) or 0.0,
                   timeout_s=_float(data.get("timeout_s")) or 0.0,
                   exclusive=bool(data.get("exclusive")),
                   multi_node=bool(data.get("multi_node")))


@dataclass(frozen=True)
class StackProfile:
    """The software stack a node runs, checked against the platform's compatibility matrix."""

    id: int
    name: str
    description: str = ""
    os_family: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    cudnn_version: str = ""
    nccl_version: str = ""
    ofed_version: str = ""
    container_runtime: str = ""
    container_toolkit_version: str = ""
    dcgm_version: str = ""
    orchestrator: str = ""
    orchestrator_version: str = ""
    offline_mirror: str = ""
    deployment_count: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> StackProfile:
        text = {name: data.get(name) or "" for name in (
            "description", "os_family", "driver_version", "cuda_version", "cudnn_version",
            "nccl_version", "ofed_version", "container_runtime", "container_toolkit_version",
            "dcgm_version", "orchestrator", "orchestrator_version", "offline_mirror")}
        return cls(id=data["id"], name=data.get("name", ""), **text,
                   deployment_count=_int(data.get("deployment_count")),
                   created_at=parse_time(data.get("created_at")),
                   updated_at=parse_time(data.get("updated_at")), raw=data)


@dataclass(frozen=True)
class DeploymentRun:
    """An Ansible run of a stack profile (or of an accounts push) against nodes of a cluster.
    `state`: queued, running, succeeded, failed or cancelled; `failed_tasks` counts failed or
    unreachable task results."""

    id: int
    state: str
    cluster: str = ""
    kind: str = ""
    profile: str = ""
    playbook: str = ""
    hosts: list[str] = field(default_factory=list)
    check_mode: bool = False
    rerun_of: int | None = None
    created_by: str = ""
    message: str = ""
    rc: int | None = None
    stats: dict = field(default_factory=dict)
    failed_tasks: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_final(self) -> bool:
        return self.state in DEPLOYMENT_FINAL_STATES

    @classmethod
    def from_api(cls, data: dict) -> DeploymentRun:
        return cls(
            id=data["id"], state=data.get("state") or "", cluster=data.get("cluster") or "",
            kind=data.get("kind") or "", profile=data.get("profile") or "",
            playbook=data.get("playbook") or "", hosts=list(data.get("hosts") or []),
            check_mode=bool(data.get("check_mode")), rerun_of=data.get("rerun_of"),
            created_by=data.get("created_by") or "", message=data.get("message") or "",
            rc=data.get("rc"), stats=dict(data.get("stats") or {}),
            failed_tasks=_int(data.get("failed_tasks")),
            created_at=parse_time(data.get("created_at")),
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")), raw=data,
        )


@dataclass(frozen=True)
class GridCell:
    """One task on one node: `status` running, ok, changed, skipped, failed or unreachable."""

    status: str
    changed: bool = False
    output: str = ""
    duration_s: float | None = None

    @classmethod
    def from_api(cls, data: dict) -> GridCell:
        return cls(status=data.get("status") or "", changed=bool(data.get("changed")),
                   output=data.get("output") or "", duration_s=_float(data.get("duration_s")))


@dataclass(frozen=True)
class GridHost:
    """A node's row: its `state` (pending, running, ok, failed, unreachable), a cell per task
    (None where it has not reached that task), and the task it failed at with its output."""

    host: str
    state: str
    cells: list[GridCell | None] = field(default_factory=list)
    failed_task: str = ""
    output: str = ""

    def count(self, status: str) -> int:
        return sum(1 for cell in self.cells if cell is not None and cell.status == status)

    @classmethod
    def from_api(cls, data: dict) -> GridHost:
        return cls(host=data.get("host") or "", state=data.get("state") or "",
                   cells=[GridCell.from_api(cell) if isinstance(cell, dict) else None
                          for cell in data.get("cells") or []],
                   failed_task=data.get("failed_task") or "", output=data.get("output") or "")


@dataclass(frozen=True)
class DeploymentGrid:
    """A deployment run's results: `tasks` ({"position", "task", "role"}) in the order they
    first started, and a row per node."""

    tasks: list[dict] = field(default_factory=list)
    hosts: list[GridHost] = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def task_name(self, index: int) -> str:
        """The name of the task in column `index`."""
        return str(self.tasks[index].get("task") or "") if 0 <= index < len(self.tasks) else ""

    @classmethod
    def from_api(cls, data: dict) -> DeploymentGrid:
        return cls(tasks=[t for t in data.get("tasks") or [] if isinstance(t, dict)],
                   hosts=[GridHost.from_api(h) for h in data.get("hosts") or []
                          if isinstance(h, dict)], raw=data)


# -- the log store: search, histogram, around ---------------------------------------------------

def _optional_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _spans(value: Any) -> list[tuple[int, int]]:
    return [(int(span[0]), int(span[1])) for span in value or []
            if isinstance(span, list | tuple) and len(span) == 2
            and all(isinstance(end, int) and not isinstance(end, bool) for end in span)]


@dataclass(frozen=True)
class LogLine:
    """One line of the log store. A job's output names its `job`, `attempt`, `replica` and its
    `line` number in that replica's log; the platform's own lines (`source` web, worker or beat,
    for platform admins) name a `request_id` and carry their `context` as JSON text.
    `highlights`: the [start, end) spans of `message` that matched the words searched for."""

    id: int
    ts: datetime | None
    message: str
    tenant: int | None = None
    job: int | None = None
    attempt: int | None = None
    replica: int | None = None
    line: int | None = None
    stream: str = ""
    level: str = ""
    source: str = ""
    request_id: str = ""
    context: str = ""
    highlights: list[tuple[int, int]] = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_job_output(self) -> bool:
        return self.job is not None

    @classmethod
    def from_api(cls, data: dict) -> LogLine:
        return cls(
            id=_int(data.get("id")), ts=parse_time(data.get("ts")),
            message=data.get("message") or "", tenant=_optional_int(data.get("tenant")),
            job=_optional_int(data.get("job")), attempt=_optional_int(data.get("attempt")),
            replica=_optional_int(data.get("replica")), line=_optional_int(data.get("line")),
            stream=data.get("stream") or "", level=data.get("level") or "",
            source=data.get("source") or "", request_id=data.get("request_id") or "",
            context=data.get("context") or "", highlights=_spans(data.get("highlights")),
            raw=data,
        )


@dataclass(frozen=True)
class LogSearchResult:
    """The lines a search found: newest first, or, when asked for the lines `after` an id,
    oldest first. `more`: the `limit` was reached, so there may be more (narrow the time, or
    page on with `until`/`after`)."""

    results: list[LogLine] = field(default_factory=list)
    limit: int = 0
    more: bool = False
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> LogSearchResult:
        return cls(results=[LogLine.from_api(line) for line in data.get("results") or []
                            if isinstance(line, dict)],
                   limit=_int(data.get("limit")), more=bool(data.get("more")), raw=data)


@dataclass(frozen=True)
class LogBucket:
    """How many lines matched from `start` for the histogram's `bucket_seconds`."""

    start: datetime | None
    count: int = 0

    @classmethod
    def from_api(cls, data: dict) -> LogBucket:
        return cls(start=parse_time(data.get("start")), count=_int(data.get("count")))


@dataclass(frozen=True)
class LogHistogram:
    """How many lines match a search, per bucket of time between `since` and `until`."""

    since: datetime | None
    until: datetime | None
    bucket_seconds: float = 0.0
    buckets: list[LogBucket] = field(default_factory=list)
    total: int = 0
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> LogHistogram:
        return cls(since=parse_time(data.get("since")), until=parse_time(data.get("until")),
                   bucket_seconds=_float(data.get("bucket_seconds")) or 0.0,
                   buckets=[LogBucket.from_api(b) for b in data.get("buckets") or []
                            if isinstance(b, dict)],
                   total=_int(data.get("total")), raw=data)


@dataclass(frozen=True)
class LogAround:
    """The lines before and after `line` of one replica's log of one attempt of a job, in
    order; `attempt` is None when the job has not started (then there are no lines)."""

    job: int
    attempt: int | None
    replica: int
    line: int
    lines: list[LogLine] = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict) -> LogAround:
        return cls(job=_int(data.get("job")), attempt=_optional_int(data.get("attempt")),
                   replica=_int(data.get("replica")), line=_int(data.get("line")),
                   lines=[LogLine.from_api(line) for line in data.get("lines") or []
                          if isinstance(line, dict)], raw=data)
