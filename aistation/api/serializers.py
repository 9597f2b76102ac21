import re

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from aistation.choices import QueuePolicy
from aistation.models import Attempt, Job, JobEvent, Notebook, Queue, Workdir
from aistation.services.jobs import MAX_TIME_LIMIT_S
from aistation.services.notebooks import idle_timeout_s, notebook_gpu_hours, notebook_state
from infra_os.access import role_in
from infra_os.api.serializers import CallerTenantField
from infra_os.choices import WRITE_ROLES
from infra_os.models import Tenant
from infra_os.models.tenancy import slug_validator
from ogai.api.input import RejectUnknownFields
from podsys.models import Fleet
from podsys.selectors import cluster_list

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_ATTACHMENTS = 16
MAX_RDMA_PER_REPLICA = 1024


class StrictStringField(serializers.CharField):
    """A string and nothing else: DRF's CharField would turn 5 into "5"."""

    default_error_messages = {"not_a_string": "Give a string, not {kind}."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string", kind=type(data).__name__)
        return super().to_internal_value(data)


def caller_tenant(user, tenant: Tenant | None, doing: str) -> Tenant:
    """`tenant` when given, else the caller's only writable tenant."""
    if tenant is None:
        writable = [t for t in CallerTenantField().get_queryset_for(user)
                    if user.is_staff or role_in(user, t) in WRITE_ROLES]
        if len(writable) != 1:
            raise serializers.ValidationError(
                {"tenant": f"Name the tenant: you can {doing} {len(writable)} tenants."})
        tenant = writable[0]
    return tenant


def tenant_and_queue(user, attrs: dict, doing: str) -> tuple[Tenant, Queue]:
    """The tenant named in `attrs` (or the caller's only writable one) and its queue named
    `attrs["queue"]`."""
    tenant = caller_tenant(user, attrs.get("tenant"), doing)
    queue = Queue.objects.filter(tenant=tenant, name=attrs["queue"]).select_related(
        "cluster").first()
    if queue is None:
        raise serializers.ValidationError(
            {"queue": f"No queue {attrs['queue']!r} in tenant {tenant.name}."})
    return tenant, queue


class ResourcesSerializer(RejectUnknownFields, serializers.Serializer):
    gpus = serializers.IntegerField(min_value=0, max_value=1024, default=0,
                                    help_text="GPUs per replica.")
    gpu_model = serializers.CharField(max_length=64, allow_blank=True, default="")
    cpu = serializers.FloatField(min_value=0.01, max_value=4096, default=1.0,
                                 help_text="CPU cores per replica.")
    memory_mib = serializers.IntegerField(min_value=1, max_value=16 * 1024 * 1024, default=1024,
                                          help_text="Memory per replica, MiB.")


class StrictIntegerField(serializers.IntegerField):
    """A whole number and nothing else: DRF's IntegerField would take "2", 2.0 and true."""

    default_error_messages = {"not_an_integer": "Give a whole number, not {kind}."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("not_an_integer", kind=type(data).__name__)
        return super().to_internal_value(data)


class NetworkSerializer(RejectUnknownFields, serializers.Serializer):
    attachments = serializers.ListField(
        child=StrictStringField(max_length=63), max_length=MAX_ATTACHMENTS, default=list,
        help_text="The cluster's extra networks each replica attaches (names the cluster "
        "offers, DNS-1123 labels), in order: their interfaces are net1, net2, … unless the "
        "cluster names them.")
    rdma = StrictIntegerField(
        min_value=0, max_value=MAX_RDMA_PER_REPLICA, default=0,
        help_text="RDMA devices per replica (the cluster's RDMA resource), placed and counted "
        "against quota like GPUs.")

    def validate_attachments(self, names: list[str]) -> list[str]:
        for name in names:
            if not DNS_LABEL.match(name):
                raise serializers.ValidationError(
                    f"{name!r} is not a network name (a DNS-1123 label: lower-case letters, "
                    "digits and '-', starting and ending with a letter or digit).")
        if len(set(names)) != len(names):
            raise serializers.ValidationError("A network is named twice.")
        return names


class RayNodeSerializer(RejectUnknownFields, serializers.Serializer):
    gpus = StrictIntegerField(min_value=0, max_value=1024, default=0,
                              help_text="GPUs of this node (its replica).")
    gpu_model = serializers.CharField(max_length=64, allow_blank=True, default="")
    cpu = serializers.FloatField(min_value=1, max_value=4096, default=1.0,
                                 help_text="CPU cores of this node; Ray counts whole ones.")
    memory_mib = StrictIntegerField(min_value=256, max_value=16 * 1024 * 1024, default=2048,
                                    help_text="Memory of this node, MiB (its object store "
                                    "included).")


RAY_NODE_DEFAULTS = {"gpus": 0, "gpu_model": "", "cpu": 1.0, "memory_mib": 2048}


class RaySerializer(RejectUnknownFields, serializers.Serializer):
    """A Ray cluster, shaped like KubeRay's RayCluster: one head and a group of workers."""

    workers = StrictIntegerField(min_value=0, max_value=1023, default=1,
                                 help_text="Worker nodes besides the head.")
    worker = RayNodeSerializer(default=dict, help_text="Each worker node's resources.")
    head = RayNodeSerializer(required=False, help_text="The head node's resources; "
                             "omitted: a worker's.")
    dashboard = serializers.BooleanField(
        default=False, help_text="Serve Ray's dashboard (and its job-submission API) on the "
        "head, reached through the platform's proxy.")


class JobSubmitSerializer(RejectUnknownFields, serializers.Serializer):
    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    queue = serializers.CharField(max_length=63, default="default")
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(
        choices=["job", "ray"], default="job",
        help_text="`ray`: a Ray cluster (`ray`) whose head runs `command` as its entrypoint "
        "once every node is up; its replicas are the head and the workers.")
    ray = RaySerializer(required=False, help_text="The Ray cluster of a job of kind ray.")
    command = serializers.ListField(
        child=StrictStringField(allow_blank=True, trim_whitespace=False, max_length=10000),
        min_length=1, max_length=1000, help_text="The program and its arguments, as a list.",
    )
    env = serializers.DictField(child=StrictStringField(allow_blank=True, trim_whitespace=False),
                                default=dict)
    image = serializers.CharField(max_length=500, allow_blank=True, default="")
    resources = ResourcesSerializer(default=dict)
    network = NetworkSerializer(
        default=dict, help_text="Extra networks and RDMA devices for its replicas; omitted: "
        "the cluster's default network only.")
    replicas = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    priority = serializers.IntegerField(min_value=-1000, max_value=1000, required=False,
                                        allow_null=True, default=None)
    max_restarts = serializers.IntegerField(min_value=0, max_value=100, default=0)
    time_limit_s = serializers.IntegerField(min_value=1, max_value=MAX_TIME_LIMIT_S,
                                            required=False, allow_null=True, default=None)
    workdir = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, allow_null=True, default=None,
        help_text="The id of a working folder of the tenant (`/workdirs/`), unpacked as the "
        "job's working directory; null: an empty one.")
    environment = serializers.CharField(
        max_length=100, allow_blank=True, default="",
        help_text="The named environment the command runs in; empty: the cluster's default.")

    def validate_env(self, env: dict) -> dict:
        bad = [name for name in env if not ENV_NAME.match(name)]
        if bad:
            raise serializers.ValidationError(f"Not an environment variable name: {bad[0]!r}.")
        return env

    def validate(self, attrs):
        tenant, queue = tenant_and_queue(self.context["request"].user, attrs, "submit to")
        # An omitted `resources` arrives as its bare default ({}), not through its fields.
        resources = {name: field.default for name, field in ResourcesSerializer().fields.items()}
        resources.update(attrs.pop("resources"))
        network = {"attachments": [], "rdma": 0, **attrs.pop("network")}
        ray = self._ray(attrs, resources)
        workdir = None
        if attrs.get("workdir") is not None:
            # Another tenant's folder is as unknown as a missing one.
            workdir = Workdir.objects.filter(pk=attrs["workdir"], tenant=tenant).first()
            if workdir is None:
                raise serializers.ValidationError(
                    {"workdir": f"No such working folder in tenant {tenant.name}."})
        return {
            **attrs, "tenant": tenant, "queue": queue, "workdir": workdir,
            "gpus_per_replica": resources["gpus"], "gpu_model": resources["gpu_model"],
            "cpu_per_replica": resources["cpu"], "memory_mib_per_replica":
            resources["memory_mib"], "networks": list(network["attachments"]),
            "rdma_per_replica": network["rdma"], **ray,
        }

    def _ray(self, attrs: dict, resources: dict) -> dict:
        """A Ray job's replicas and resources, from its `ray` (the head and its workers):
        every replica holds the larger of the head's and a worker's."""
        kind, ray = attrs.pop("kind"), attrs.pop("ray", None)
        given = self.initial_data if isinstance(self.initial_data, dict) else {}
        if kind != "ray":
            if ray is not None:
                raise serializers.ValidationError(
                    {"ray": "Only a job of kind: ray takes a Ray cluster; add kind: ray."})
            return {}
        errors = {name: f"A Ray job's {what} come from `ray` ({instead}); leave {name} out."
                  for name, what, instead in (
                      ("replicas", "replicas", "its head and ray.workers"),
                      ("resources", "resources", "ray.head and ray.worker"))
                  if name in given}
        if errors:
            raise serializers.ValidationError(errors)
        ray = ray or {}
        worker = {**RAY_NODE_DEFAULTS, **ray.get("worker", {})}
        head = {**RAY_NODE_DEFAULTS, **ray["head"]} if ray.get("head") else dict(worker)
        models = {node["gpu_model"] for node in (head, worker) if node["gpus"]}
        if len(models) > 1:
            raise serializers.ValidationError(
                {"ray.head.gpu_model": "The head and the workers must ask for the same GPU "
                 "model."})
        workers = ray.get("workers", 1)
        return {
            "replicas": workers + 1,
            "gpus_per_replica": max(head["gpus"], worker["gpus"]),
            "gpu_model": next(iter(models), ""),
            "cpu_per_replica": max(head["cpu"], worker["cpu"]),
            "memory_mib_per_replica": max(head["memory_mib"], worker["memory_mib"]),
            "ray": {"workers": workers, "head": head, "worker": worker,
                    "dashboard": bool(ray.get("dashboard", False))},
        }


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["number", "workload_id", "state", "placement", "borrowed", "created_at",
                  "started_at", "finished_at", "exit_code", "reason"]


class JobEventSerializer(serializers.ModelSerializer):
    attempt = serializers.IntegerField(source="attempt.number", allow_null=True, default=None)

    class Meta:
        model = JobEvent
        fields = ["created_at", "from_state", "to_state", "reason", "attempt"]


class WorkdirFileSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="Relative to the folder, with `/` between names.")
    size = serializers.IntegerField(help_text="Bytes.")


class WorkdirSerializer(serializers.ModelSerializer):
    """A working folder: its archive's SHA-256 (its id for clients), size and files."""

    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    files = WorkdirFileSerializer(many=True, read_only=True)

    class Meta:
        model = Workdir
        fields = ["id", "tenant", "sha256", "size_bytes", "unpacked_bytes", "file_count",
                  "files", "created_at"]


class WorkdirBriefSerializer(serializers.ModelSerializer):
    class Meta:
        model = Workdir
        fields = ["id", "sha256", "size_bytes", "file_count"]


class WorkdirUploadSerializer(RejectUnknownFields, serializers.Serializer):
    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    archive = serializers.FileField(
        allow_empty_file=True, help_text="The folder as a gzip-compressed tar of files and "
        "folders only (no links), e.g. `tar czf folder.tar.gz -C folder .`; a zip is made "
        "into one.")
    sha256 = serializers.RegexField(
        r"^[0-9a-fA-F]{64}$", required=False, allow_blank=True, default="",
        help_text="The SHA-256 of the bytes sent, as hex: a different one is refused.")

    def validate(self, attrs):
        tenant = caller_tenant(self.context["request"].user, attrs.get("tenant"), "upload to")
        return {**attrs, "tenant": tenant}


class WorkdirLimitsSerializer(serializers.Serializer):
    max_bytes = serializers.IntegerField(
        help_text="The largest archive, and the most its files may unpack to (bytes; the "
        "setting OGAI_WORKDIR_MAX_MB).")


class JobNetworkSerializer(serializers.Serializer):
    attachments = serializers.ListField(child=serializers.CharField(), read_only=True,
                                        help_text="The extra networks each replica attaches.")
    rdma = serializers.IntegerField(read_only=True, help_text="RDMA devices per replica.")


class JobSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    queue = serializers.SlugRelatedField(slug_field="name", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    resources = serializers.SerializerMethodField()
    kind = serializers.SerializerMethodField()
    ray = RaySerializer(read_only=True, allow_null=True,
                        help_text="The Ray cluster of a job of kind ray; null otherwise.")
    network = JobNetworkSerializer(read_only=True)
    workdir = WorkdirBriefSerializer(read_only=True, allow_null=True,
                                     help_text="The working folder it ships; null: none.")
    reserved_nodes = serializers.ListField(
        child=serializers.CharField(), read_only=True,
        help_text="Nodes drained for it while it waits past the starvation bound.")

    class Meta:
        model = Job
        fields = [
            "id", "name", "kind", "tenant", "queue", "cluster", "owner", "state", "reason",
            "dispatch",
            "position", "priority", "image", "environment", "workdir", "command", "env",
            "resources", "network", "replicas", "max_restarts", "time_limit_s", "restarts",
            "exit_code",
            "placement", "reserved_nodes", "borrowed", "attained_gpu_s", "waited_s",
            "created_at", "queued_at", "started_at", "finished_at", "rerun_of", "ray",
        ]

    @extend_schema_field(serializers.ChoiceField(choices=["job", "ray"]))
    def get_kind(self, job: Job) -> str:
        return "ray" if job.ray else "job"

    @extend_schema_field(ResourcesSerializer)
    def get_resources(self, job: Job) -> dict:
        return {"gpus": job.gpus_per_replica, "gpu_model": job.gpu_model,
                "cpu": job.cpu_per_replica, "memory_mib": job.memory_mib_per_replica}


class JobDetailSerializer(JobSerializer):
    attempts = AttemptSerializer(many=True, read_only=True)
    events = JobEventSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "attempts", "events"]


class JobLogsSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(allow_null=True)
    replica = serializers.IntegerField()
    text = serializers.CharField(allow_blank=True)


class RayClusterSerializer(serializers.Serializer):
    ready = serializers.BooleanField(help_text="The job runs and its cluster says where Ray is.")
    address = serializers.CharField(
        help_text="What `ray.init(address=...)` takes from beside the cluster (a notebook or "
        "job of the same tenant on its cluster): its Ray Client address (ray://host:port) "
        "where the driver gives one, else its GCS address; \"\" until ready.")
    gcs_address = serializers.CharField(
        help_text="The cluster's GCS address (host:port): what `ray start --address` takes, "
        "and `ray.init` on one of its nodes; \"\" until ready.")
    dashboard_url = serializers.CharField(
        help_text="Ray's dashboard and job-submission API through the platform's proxy "
        "(the platform's sign-in or an API token); \"\" when the job has no dashboard.")
    reason = serializers.CharField(help_text="Why it is not ready; \"\" when it is.")


class JobManifestsSerializer(serializers.Serializer):
    yaml = serializers.CharField(help_text="The Kubernetes objects OGAI would create for the "
                                 "job, as one multi-document YAML (for `kubectl apply -f`).")


class QueueSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    fleet = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True,
                                         help_text="The fleet whose clusters its jobs are "
                                         "dispatched over; null: its cluster alone.")
    pending = serializers.IntegerField(read_only=True)
    running = serializers.IntegerField(read_only=True)
    gpus_in_use = serializers.IntegerField(read_only=True)

    class Meta:
        model = Queue
        fields = ["id", "tenant", "name", "cluster", "fleet", "description", "default_priority",
                  "gpu_limit", "policy", "is_active", "pending", "running", "gpus_in_use",
                  "created_at"]


@extend_schema_field(OpenApiTypes.STR)
class CallerClusterField(serializers.SlugRelatedField):
    def __init__(self, **kwargs):
        super().__init__(slug_field="name", **kwargs)

    def get_queryset(self):
        return cluster_list(user=self.context["request"].user)


@extend_schema_field(OpenApiTypes.STR)
class CallerFleetField(serializers.SlugRelatedField):
    """A fleet with a cluster the caller may run on."""

    def __init__(self, **kwargs):
        super().__init__(slug_field="name", **kwargs)

    def get_queryset(self):
        clusters = cluster_list(user=self.context["request"].user)
        return Fleet.objects.filter(clusters__in=clusters).distinct()


class QueueCreateSerializer(serializers.Serializer):
    tenant = CallerTenantField()
    name = serializers.CharField(max_length=63, validators=[slug_validator])
    cluster = CallerClusterField()
    fleet = CallerFleetField(required=False, allow_null=True, default=None,
                             help_text="Dispatch its jobs over this fleet's clusters "
                             "(`cluster` must be one of them).")
    description = serializers.CharField(max_length=200, allow_blank=True, default="")
    default_priority = serializers.IntegerField(min_value=-1000, max_value=1000, default=0)
    gpu_limit = serializers.IntegerField(min_value=0, required=False, allow_null=True,
                                         default=None)
    policy = serializers.ChoiceField(choices=QueuePolicy.choices, default=QueuePolicy.FAIR)


class QueueUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(max_length=200, allow_blank=True, required=False)
    default_priority = serializers.IntegerField(min_value=-1000, max_value=1000, required=False)
    gpu_limit = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    policy = serializers.ChoiceField(choices=QueuePolicy.choices, required=False)
    is_active = serializers.BooleanField(required=False)




# -- notebooks ----------------------------------------------------------------------------------

NOTEBOOK_STATES = ["stopped", "waiting", "starting", "running", "failed"]


class NotebookStartSerializer(RejectUnknownFields, serializers.Serializer):
    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    queue = serializers.CharField(max_length=63, default="default",
                                  help_text="A queue of the tenant, by name.")
    name = serializers.CharField(max_length=100)
    image = serializers.CharField(max_length=500, allow_blank=True, default="",
                                  help_text="A container image with JupyterLab; empty: the "
                                  "cluster's default.")
    gpus = serializers.IntegerField(min_value=0, max_value=1024, default=0)
    gpu_model = serializers.CharField(max_length=64, allow_blank=True, default="")
    cpu = serializers.FloatField(min_value=0.01, max_value=4096, default=1.0,
                                 help_text="CPU cores.")
    memory_mib = serializers.IntegerField(min_value=1, max_value=16 * 1024 * 1024, default=4096,
                                          help_text="Memory, MiB.")

    def validate(self, attrs):
        tenant, queue = tenant_and_queue(self.context["request"].user, attrs,
                                         "start notebooks in")
        return {**attrs, "tenant": tenant, "queue": queue}


class NotebookSerializer(serializers.ModelSerializer):
    """A notebook as its owner sees it. Its tokens (the Jupyter server's, the SDK's) are never
    part of it: the browser reaches the server through the platform's proxy at `url`."""

    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    queue = serializers.SlugRelatedField(slug_field="name", read_only=True)
    resources = serializers.SerializerMethodField()
    state = serializers.SerializerMethodField(
        help_text="stopped, waiting (queued), starting (admitted), running, or failed.")
    reason = serializers.SerializerMethodField(help_text="Why its session waits, when it does.")
    job = serializers.PrimaryKeyRelatedField(read_only=True,
                                             help_text="The current (or last) session's job.")
    url = serializers.SerializerMethodField(help_text="Where JupyterLab opens, while running.")
    gpu_hours = serializers.SerializerMethodField()
    idle_timeout_s = serializers.SerializerMethodField(
        help_text="How long it may sit idle before it is stopped (the tenant's policy).")

    class Meta:
        model = Notebook
        fields = ["id", "tenant", "owner", "name", "queue", "image", "resources", "state",
                  "reason", "job", "url", "gpu_hours", "idle_timeout_s", "last_activity_at",
                  "created_at"]

    @extend_schema_field(ResourcesSerializer)
    def get_resources(self, notebook: Notebook) -> dict:
        return {"gpus": notebook.gpus, "gpu_model": notebook.gpu_model, "cpu": notebook.cpu,
                "memory_mib": notebook.memory_mib}

    @extend_schema_field(serializers.ChoiceField(choices=NOTEBOOK_STATES))
    def get_state(self, notebook: Notebook) -> str:
        return notebook_state(notebook)

    def get_reason(self, notebook: Notebook) -> str:
        if notebook.job is not None and notebook_state(notebook) == "waiting":
            return notebook.job.reason
        return ""

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_url(self, notebook: Notebook) -> str | None:
        return f"/notebooks/{notebook.pk}/lab" if notebook_state(notebook) == "running" else None

    def get_gpu_hours(self, notebook: Notebook) -> float:
        known = self.context.get("gpu_hours")  # computed for a whole page at once by the list
        if known is not None and notebook.pk in known:
            return round(known[notebook.pk], 4)
        return round(notebook_gpu_hours(notebook), 4)

    def get_idle_timeout_s(self, notebook: Notebook) -> int:
        known = self.context.get("idle_timeouts")
        if known is not None and notebook.tenant_id in known:
            return known[notebook.tenant_id]
        return idle_timeout_s(notebook.tenant)
