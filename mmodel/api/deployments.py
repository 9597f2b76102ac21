"""API of MModel's deployments (routes registered by mmodel/api/urls.py): deploy a model
version, scale, stop, start and delete it, read its replicas' state and its per-minute request
statistics. Clients call the model at the gateway (/v1/) by the deployment's name.

Where a replica answers (its upstream address) is internal: only platform admins see it."""

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from aistation.api.serializers import RejectUnknownFields, tenant_and_queue
from aistation.selectors import job_waiting_reason
from infra_os.access import is_platform_admin
from infra_os.api.serializers import CallerTenantField
from infra_os.api.viewsets import ScopedViewSet
from mmodel.choices import DeploymentState, Runtime
from mmodel.models import Deployment, DeploymentReplica, ModelVersion
from mmodel.selectors.deployments import (
    deployment_pool,
    deployment_serving,
    deployment_state,
    deployment_stats,
    deployment_waiting_reason,
    deployments_for,
)
from mmodel.services.deployments import (
    MAX_REPLICAS,
    deployment_create,
    deployment_delete,
    deployment_scale,
    deployment_start,
    deployment_stop,
)
from mmodel.services.pool_members import pool_member_add, pool_member_remove

MAX_STATS_MINUTES = 7 * 24 * 60


class PoolMemberInputSerializer(RejectUnknownFields, serializers.Serializer):
    name = serializers.CharField(max_length=100,
                                 help_text="The model name clients send to /v1/ for it.")
    version = serializers.IntegerField(help_text="The model version's id: a LoRA adapter of "
                                       "the deployment's version, or a whole model.")


class DeploymentCreateSerializer(RejectUnknownFields, serializers.Serializer):
    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    name = serializers.CharField(max_length=100,
                                 help_text="The model name clients send to /v1/.")
    version = serializers.IntegerField(help_text="The model version's id.")
    queue = serializers.CharField(max_length=63, default="default")
    runtime = serializers.ChoiceField(choices=Runtime.choices, default=Runtime.TRANSFORMERS)
    replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, default=1)
    gpus_per_replica = serializers.IntegerField(min_value=0, max_value=1024, default=0)
    gpu_model = serializers.CharField(max_length=64, allow_blank=True, default="")
    cpu_per_replica = serializers.FloatField(min_value=0.01, max_value=4096, default=2.0)
    memory_mib_per_replica = serializers.IntegerField(min_value=1, max_value=16 * 1024 * 1024,
                                                      default=4096)
    idle_timeout_s = serializers.IntegerField(
        min_value=0, default=0,
        help_text="Scale to zero after this long without requests (0: never); the next "
                  "request starts it again.")
    pool = PoolMemberInputSerializer(
        many=True, required=False, default=list,
        help_text="Make it a pool: each replica also serves these versions, each under its "
                  "own name (LoRA adapters on the one copy of the base; whole models loaded by "
                  "demand within pool_memory_mib).")
    pool_memory_mib = serializers.IntegerField(
        min_value=0, max_value=16 * 1024 * 1024, default=0,
        help_text="A pool's budget for whole models' weights per replica; the least recently "
                  "used is evicted for another (0: half the replica's memory).")
    max_loras = serializers.IntegerField(min_value=1, max_value=64, default=8,
                                         help_text="LoRA adapters a pool's replica holds at "
                                                   "once.")

    def validate(self, attrs):
        tenant, queue = tenant_and_queue(self.context["request"].user, attrs, "deploy models in")
        wanted = [attrs["version"], *(member["version"] for member in attrs["pool"])]
        found = {version.pk: version for version in ModelVersion.objects.select_related(
            "model", "base_version").filter(pk__in=wanted, model__tenant=tenant)}
        missing = next((pk for pk in wanted if pk not in found), None)
        if missing is not None:
            field = "version" if missing == attrs["version"] else "pool"
            raise serializers.ValidationError(
                {field: f"No model version {missing} in {tenant.name}."})
        pool = [(member["name"], found[member["version"]]) for member in attrs["pool"]]
        return {**attrs, "tenant": tenant, "queue": queue, "version": found[attrs["version"]],
                "pool": pool}


class DeploymentScaleSerializer(RejectUnknownFields, serializers.Serializer):
    replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS)


class ReplicaSerializer(serializers.ModelSerializer):
    job_state = serializers.CharField(source="job.state", read_only=True, allow_null=True,
                                      default=None)
    waiting_reason = serializers.SerializerMethodField(
        help_text="Why its job waits for the scheduler; empty unless it waits.")
    upstream = serializers.SerializerMethodField(
        help_text="Where the server answers: platform admins only (null for others).")

    class Meta:
        model = DeploymentReplica
        fields = ["index", "job", "job_state", "waiting_reason", "ready", "ready_since",
                  "checked_at", "message", "failed", "upstream", "holds"]
        extra_kwargs = {"holds": {"help_text": "A pool's replica: the model names it held at "
                                               "its last health check."}}

    def get_waiting_reason(self, replica) -> str:
        return job_waiting_reason(replica.job)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_upstream(self, replica) -> str | None:
        request = self.context.get("request")
        if request is not None and is_platform_admin(request.user):
            return replica.upstream or None
        return None


class PoolMemberSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField()
    version_label = serializers.CharField()
    kind = serializers.ChoiceField(choices=["base", "adapter", "model"])
    held_by = serializers.ListField(child=serializers.IntegerField(),
                                    help_text="Indexes of the replicas that hold it.")


class DeploymentSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    model = serializers.CharField(source="version.model.name", read_only=True)
    version_label = serializers.CharField(source="version.label", read_only=True)
    queue = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state = serializers.SerializerMethodField()
    waiting_reason = serializers.SerializerMethodField(
        help_text="Why a replica's job still waits for the scheduler, naming what is scarce and "
                  "who holds it; empty when none waits.")
    replica_set = ReplicaSerializer(many=True, read_only=True)
    serving = serializers.SerializerMethodField(
        help_text="How an adapter version is served by the runtime (merged or attached), in "
                  "words; empty for a plain model.")
    pool = serializers.SerializerMethodField(
        help_text="A pool's models (its base first) and which replicas hold each; empty for "
                  "a deployment that is not a pool.")

    class Meta:
        model = Deployment
        fields = ["id", "name", "tenant", "model", "version", "version_label", "queue",
                  "runtime", "serving", "state", "waiting_reason", "replicas",
                  "gpus_per_replica", "gpu_model",
                  "cpu_per_replica", "memory_mib_per_replica", "idle_timeout_s", "active",
                  "scaled_to_zero", "last_request_at", "pool", "pool_memory_mib", "max_loras",
                  "replica_set", "created_by", "created_at", "updated_at"]

    @extend_schema_field(serializers.ChoiceField(choices=DeploymentState.choices))
    def get_state(self, deployment) -> str:
        return deployment_state(deployment).value

    def get_waiting_reason(self, deployment) -> str:
        return deployment_waiting_reason(deployment)

    def get_serving(self, deployment) -> str:
        return deployment_serving(deployment)

    @extend_schema_field(PoolMemberSerializer(many=True))
    def get_pool(self, deployment) -> list[dict]:
        return deployment_pool(deployment)


class DeploymentStatSerializer(serializers.Serializer):
    minute = serializers.DateTimeField()
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    latency_ms_mean = serializers.FloatField(allow_null=True)
    latency_ms_p50 = serializers.FloatField(allow_null=True)
    latency_ms_p99 = serializers.FloatField(allow_null=True)
    cold_starts = serializers.IntegerField(help_text=(
        "Requests that waited for a replica to start (scaled to zero, or starting)."))
    cold_start_ms_max = serializers.FloatField(allow_null=True,
                                               help_text="The longest of those waits.")


class DeploymentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Model versions deployed as OpenAI-compatible servers: each replica a service job of a
    queue (quota and GPUs like any job). Call them at /v1/ with the deployment's name."""

    selector = deployments_for
    output_serializer_class = DeploymentSerializer
    input_serializer_classes = {"create": DeploymentCreateSerializer,
                                "scale": DeploymentScaleSerializer,
                                "pool_add": PoolMemberInputSerializer}

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no user
            return Deployment.objects.none()
        return deployments_for(self.request.user)

    def filter_queryset(self, queryset):
        tenant = self.request.query_params.get("tenant")
        return queryset.filter(tenant__name=tenant) if tenant else queryset

    @extend_schema(parameters=[OpenApiParameter("tenant", str,
                                                description="Only this tenant's deployments.")],
                   responses=DeploymentSerializer(many=True))
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=DeploymentCreateSerializer, responses={201: DeploymentSerializer})
    def create(self, request):
        deployment = deployment_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(deployment), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, pk=None):
        deployment_delete(actor=request.user, deployment=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=DeploymentScaleSerializer, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def scale(self, request, pk=None):
        deployment = self.get_object()
        deployment_scale(actor=request.user, deployment=deployment,
                         replicas=self.validated_input()["replicas"])
        return self.respond(self.reload(deployment), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=PoolMemberInputSerializer, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"], url_path="pool")
    def pool_add(self, request, pk=None):
        """Serve another version in this pool under its own name; running replicas start
        again to load it."""
        deployment = self.get_object()
        wanted = self.validated_input()
        version = ModelVersion.objects.select_related("model", "base_version").filter(
            pk=wanted["version"], model__tenant=deployment.tenant).first()
        if version is None:
            raise ValidationError({"version": f"No model version {wanted['version']} in "
                                   f"{deployment.tenant.name}."})
        pool_member_add(actor=request.user, deployment=deployment, name=wanted["name"],
                        version=version)
        return self.respond(self.reload(deployment), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["delete"], url_path=r"pool/(?P<member>[^/]+)")
    def pool_remove(self, request, pk=None, member=None):
        """Stop serving a model of this pool; running replicas start again without it."""
        deployment = self.get_object()
        pool_member_remove(actor=request.user, deployment=deployment, name=member)
        return self.respond(self.reload(deployment), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        deployment = deployment_stop(actor=request.user, deployment=self.get_object())
        return self.respond(self.reload(deployment), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        deployment = deployment_start(actor=request.user, deployment=self.get_object())
        return self.respond(self.reload(deployment), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        parameters=[OpenApiParameter("minutes", int, description=(
            f"The last this many minutes (1 to {MAX_STATS_MINUTES}; default 60)."))],
        responses=DeploymentStatSerializer(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def stats(self, request, pk=None):
        deployment = self.get_object()
        raw = request.query_params.get("minutes", "60")
        if not raw.isdecimal() or not 1 <= int(raw) <= MAX_STATS_MINUTES:
            raise ValidationError({"minutes": f"Use a whole number from 1 to "
                                   f"{MAX_STATS_MINUTES}."})
        since = timezone.now() - timedelta(minutes=int(raw))
        rows = deployment_stats(deployment, since)
        return Response(DeploymentStatSerializer(rows, many=True).data)


ROUTES: list = [("deployments", DeploymentViewSet, "deployment")]  # (prefix, viewset, basename)
PATHS: list = []  # django.urls.path(...) entries
