"""API of MModel's evaluation: routes registered by mmodel/api/urls.py.

/benchmarks/ (list: your tenants' and the shared ones; create: multipart JSONL upload;
retrieve with the first documents rendered as prompts), /evaluation-runs/ (list, create,
retrieve with results; POST {id}/cancel/; GET {id}/samples/ and {id}/compare/),
/leaderboard/ (GET ?tenant=), /runner/events/ (POST, the runner's job token)."""

import django_filters
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from aistation.api.authentication import HasJobToken, JobTokenAuthentication
from aistation.api.serializers import RejectUnknownFields, caller_tenant, tenant_and_queue
from aistation.selectors import job_waiting_reason
from infra_os.access import is_platform_admin
from infra_os.api.serializers import CallerTenantField
from infra_os.api.viewsets import ScopedViewSet
from mmodel.benchmarks import MAX_BENCHMARK_BYTES
from mmodel.choices import BenchmarkKind, EvaluationTarget
from mmodel.models import Benchmark, EvaluationResult, EvaluationRun, EvaluationSample
from mmodel.selectors.deployments import deployments_for
from mmodel.selectors.evaluation import (
    benchmarks_for,
    evaluation_runs_for,
    evaluation_samples,
    leaderboard,
    paired_samples,
)
from mmodel.selectors.registry import versions_for
from mmodel.services.evaluation import (
    benchmark_create,
    benchmark_preview,
    evaluation_cancel,
    evaluation_start,
)
from mmodel.services.evaluation_events import EVENT_KINDS, evaluation_events_apply
from ogai.filters import FilterSet

MAX_PAIRS = 200

# Filters ---------------------------------------------------------------------------------------


class BenchmarkFilterSet(FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    kind = django_filters.ChoiceFilter(choices=BenchmarkKind.choices)
    tenant = django_filters.CharFilter(method="of_tenant",
                                       label="Tenant (its own and the shared ones)")
    shared = django_filters.BooleanFilter(field_name="tenant", lookup_expr="isnull",
                                          label="Shared with every tenant")

    class Meta:
        model = Benchmark
        fields = ["q", "kind", "tenant", "shared"]

    def search(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(description__icontains=value))

    def of_tenant(self, queryset, name, value):
        return queryset.filter(Q(tenant__name=value) | Q(tenant__isnull=True))


class EvaluationRunFilterSet(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name", label="Tenant")
    version = django_filters.NumberFilter(field_name="version_id", label="Model version id")
    model = django_filters.NumberFilter(field_name="version__model_id", label="Model id")
    benchmark = django_filters.NumberFilter(field_name="benchmarks", label="Benchmark id")
    target = django_filters.ChoiceFilter(choices=EvaluationTarget.choices)
    succeeded = django_filters.BooleanFilter(label="Finished with results")

    class Meta:
        model = EvaluationRun
        fields = ["tenant", "version", "model", "benchmark", "target", "succeeded"]


# Input -----------------------------------------------------------------------------------------


class BenchmarkCreateSerializer(RejectUnknownFields, serializers.Serializer):
    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    shared = serializers.BooleanField(default=False, help_text="Platform admins: share it "
                                      "with every tenant instead.")
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=BenchmarkKind.choices)
    description = serializers.CharField(allow_blank=True, default="", max_length=10000)
    file = serializers.FileField(help_text="JSONL: one JSON object (a document) per line. "
                                 'retrieval: passages {"id", "text"} and queries {"query", '
                                 '"relevant": [passage ids]}.')
    prompt_template = serializers.CharField(
        allow_blank=True, default="", trim_whitespace=False, max_length=10000,
        help_text="Jinja over a document's fields (or a field's name); multiple_choice and "
        "generation. Default: 'Question: {{question}}\\nAnswer:'.")
    target_template = serializers.CharField(
        allow_blank=True, default="", trim_whitespace=False, max_length=10000,
        help_text="The expected answer: for multiple_choice the index of the right choice "
        "(or its text). Default: '{{answer}}'.")
    choices_template = serializers.CharField(
        allow_blank=True, default="", trim_whitespace=False, max_length=10000,
        help_text="multiple_choice: a list of strings. Default: '{{choices}}'.")
    text_field = serializers.CharField(allow_blank=True, default="", max_length=100,
                                       help_text="perplexity: the field holding the text. "
                                       "Default: 'text'.")
    few_shot = serializers.IntegerField(min_value=0, max_value=32, default=0,
                                        help_text="Examples shown before each question, "
                                        "drawn from the other documents.")
    metrics = serializers.ListField(child=serializers.CharField(max_length=64), required=False,
                                    help_text="Default: every metric of the kind.")
    generation_kwargs = serializers.JSONField(
        required=False, help_text='generation: {"until": ["\\n"], "max_gen_toks": 32}.')

    def validate_file(self, value):
        if value.size > MAX_BENCHMARK_BYTES:
            raise serializers.ValidationError(
                f"Benchmarks are limited to {MAX_BENCHMARK_BYTES // 2**20} MiB.")
        return value

    def validate(self, attrs):
        user = self.context["request"].user
        if attrs.pop("shared"):
            if not is_platform_admin(user):
                raise serializers.ValidationError(
                    {"shared": "Only a platform admin can share a benchmark."})
            attrs["tenant"] = None
        else:
            attrs["tenant"] = caller_tenant(user, attrs.get("tenant"), "create benchmarks in")
        if "generation_kwargs" in attrs and not isinstance(attrs["generation_kwargs"], dict):
            raise serializers.ValidationError({"generation_kwargs": "A JSON object."})
        attrs["data"] = attrs.pop("file")
        return attrs


class EvaluationRunStartSerializer(RejectUnknownFields, serializers.Serializer):
    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    queue = serializers.CharField(max_length=63, default="default")
    name = serializers.CharField(max_length=100, allow_blank=True, default="")
    version = serializers.IntegerField(help_text="The model version's id.")
    benchmarks = serializers.ListField(
        child=serializers.CharField(max_length=100), min_length=1, max_length=50,
        help_text="Benchmarks by id or name (yours or shared).")
    deployment = serializers.IntegerField(
        required=False, allow_null=True, default=None,
        help_text="Score this deployment's endpoint (a deployment of the version) instead "
        "of the weights.")
    limit = serializers.IntegerField(required=False, allow_null=True, default=None,
                                     min_value=1, help_text="At most this many documents "
                                     "per benchmark.")
    gpus = serializers.IntegerField(min_value=0, max_value=8, default=0)

    def validate(self, attrs):
        user = self.context["request"].user
        tenant, queue = tenant_and_queue(user, attrs, "evaluate in")
        version = versions_for(user, tenant).select_related("model").filter(
            pk=attrs["version"]).first()
        if version is None:
            raise serializers.ValidationError({"version": f"No version {attrs['version']} in "
                                               f"{tenant.name}."})
        visible = benchmarks_for(user, tenant)
        chosen = []
        for ref in attrs["benchmarks"]:
            found = visible.filter(pk=int(ref)) if ref.isdecimal() else visible.filter(name=ref)
            benchmark = found.order_by("tenant").first()
            if benchmark is None:
                raise serializers.ValidationError({"benchmarks": f"No benchmark {ref!r}."})
            chosen.append(benchmark)
        deployment = None
        if attrs["deployment"] is not None:
            deployment = deployments_for(user, tenant).filter(pk=attrs["deployment"]).first()
            if deployment is None:
                raise serializers.ValidationError({"deployment": "No such deployment."})
        return {"tenant": tenant, "queue": queue, "version": version, "benchmarks": chosen,
                "deployment": deployment, "limit": attrs["limit"], "gpus": attrs["gpus"],
                "name": attrs["name"]}


# Output ----------------------------------------------------------------------------------------


class BenchmarkSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    shared = serializers.SerializerMethodField()
    # Null on the shared ones the platform ships.
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                              allow_null=True)

    class Meta:
        model = Benchmark
        fields = ["id", "name", "tenant", "shared", "kind", "description", "documents",
                  "content_hash", "prompt_template", "target_template", "choices_template",
                  "text_field", "few_shot", "metrics", "generation_kwargs", "created_by",
                  "created_at"]

    def get_shared(self, benchmark) -> bool:
        return benchmark.tenant_id is None


class BenchmarkPreviewSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    document = serializers.DictField()
    prompt = serializers.CharField()
    target = serializers.CharField()
    choices = serializers.ListField(child=serializers.CharField(), required=False)
    answer = serializers.IntegerField(required=False)


class BenchmarkDetailSerializer(BenchmarkSerializer):
    preview = serializers.SerializerMethodField(help_text="The first documents as the model "
                                                "is asked them.")

    class Meta(BenchmarkSerializer.Meta):
        fields = [*BenchmarkSerializer.Meta.fields, "preview"]

    @extend_schema_field(BenchmarkPreviewSerializer(many=True))
    def get_preview(self, benchmark) -> list[dict]:
        return BenchmarkPreviewSerializer(benchmark_preview(benchmark), many=True).data


class EvaluationResultSerializer(serializers.ModelSerializer):
    benchmark = serializers.CharField(source="benchmark.name", read_only=True)
    benchmark_id = serializers.IntegerField(read_only=True)

    class Meta:
        model = EvaluationResult
        fields = ["benchmark", "benchmark_id", "metric", "value", "stderr", "samples"]


class BenchmarkBriefSerializer(serializers.ModelSerializer):
    class Meta:
        model = Benchmark
        fields = ["id", "name", "kind"]


class EvaluationRunSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state = serializers.CharField(read_only=True)
    reason = serializers.SerializerMethodField(help_text="What its job is waiting for or why "
                                               "it ended.")
    waiting_reason = serializers.SerializerMethodField(
        help_text="Why its job waits for the scheduler, naming what is scarce and who holds "
                  "it; empty unless it waits.")
    job = serializers.PrimaryKeyRelatedField(read_only=True)
    version = serializers.PrimaryKeyRelatedField(read_only=True)
    version_label = serializers.CharField(source="version.label", read_only=True)
    deployment = serializers.PrimaryKeyRelatedField(read_only=True)
    benchmarks = BenchmarkBriefSerializer(many=True, read_only=True)
    results = EvaluationResultSerializer(many=True, read_only=True)

    class Meta:
        model = EvaluationRun
        fields = ["id", "name", "tenant", "state", "reason", "waiting_reason", "message",
                  "version", "version_label", "target", "deployment", "benchmarks", "limit",
                  "cached_requests", "total_requests", "results", "job", "created_by",
                  "created_at", "progress_at", "finished_at"]

    def get_reason(self, run) -> str:
        return run.job.reason if run.job and not run.succeeded else ""

    def get_waiting_reason(self, run) -> str:
        return job_waiting_reason(run.job)


class EvaluationSampleSerializer(serializers.ModelSerializer):
    benchmark = serializers.CharField(source="benchmark.name", read_only=True)

    class Meta:
        model = EvaluationSample
        fields = ["benchmark", "index", "prompt", "target", "output", "correct", "scores"]


class SampleAnswerSerializer(serializers.Serializer):
    output = serializers.CharField()
    correct = serializers.BooleanField(allow_null=True)
    scores = serializers.DictField()


class SamplePairSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    prompt = serializers.CharField()
    target = serializers.CharField()
    a = SampleAnswerSerializer()
    b = SampleAnswerSerializer()


class LeaderboardRunSerializer(serializers.Serializer):
    run = serializers.IntegerField(help_text="The evaluation run the scores come from.")
    documents = serializers.IntegerField(help_text="How many documents it scored.")
    limit = serializers.IntegerField(allow_null=True,
                                     help_text="Its limit of documents per benchmark, if any.")
    benchmark_documents = serializers.IntegerField(help_text="How many the benchmark holds.")
    benchmark_version = serializers.CharField(help_text="The benchmark data's content hash "
                                              "(its first 12 characters).")


class LeaderboardRowSerializer(serializers.Serializer):
    version = serializers.IntegerField(source="version.pk")
    label = serializers.CharField(source="version.label")
    model = serializers.CharField(source="version.model.name")
    number = serializers.IntegerField(source="version.number")
    scores = serializers.DictField(child=serializers.DictField(child=serializers.FloatField()),
                                   help_text="{benchmark: {metric: value}}")
    runs = serializers.DictField(child=LeaderboardRunSerializer(),
                                 help_text="{benchmark: the run its scores come from and how "
                                 "many documents it scored}: scores on different documents "
                                 "are not comparable.")


class EvaluationEventSerializer(serializers.Serializer):
    # Checked by hand rather than as a choice: one more enum named "kind" in the schema
    # would collide with the other layers' event kinds.
    kind = serializers.CharField(max_length=32, help_text=f"One of {', '.join(EVENT_KINDS)}.")
    at = serializers.CharField(required=False, allow_blank=True, max_length=64)
    data = serializers.DictField(default=dict)

    def validate_kind(self, value):
        if value not in EVENT_KINDS:
            raise serializers.ValidationError(f"Use one of {', '.join(EVENT_KINDS)}.")
        return value


class EvaluationEventBatchSerializer(serializers.Serializer):
    events = EvaluationEventSerializer(many=True, allow_empty=True, max_length=1000)


class EvaluationEventReplySerializer(serializers.Serializer):
    accepted = serializers.IntegerField()


# Views -----------------------------------------------------------------------------------------


def _int_param(request, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdecimal() or not low <= int(raw) <= high:
        raise ValidationError({name: f"Use a whole number from {low} to {high}."})
    return int(raw)


class BenchmarkViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Benchmarks of your tenants and those shared with every tenant."""

    selector = staticmethod(benchmarks_for)
    output_serializer_class = BenchmarkSerializer
    input_serializer_classes = {"create": BenchmarkCreateSerializer}
    filterset_class = BenchmarkFilterSet
    parser_classes = [MultiPartParser, FormParser]

    def get_serializer_class(self):
        if self.action == "retrieve":
            return BenchmarkDetailSerializer
        return super().get_serializer_class()

    @extend_schema(request={"multipart/form-data": BenchmarkCreateSerializer},
                   responses={201: BenchmarkDetailSerializer})
    def create(self, request):
        benchmark = benchmark_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(benchmark), http_status=status.HTTP_201_CREATED,
                            serializer=BenchmarkDetailSerializer)


class EvaluationRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Versions scored on benchmarks by lm-eval in a job; results and per-document samples."""

    selector = staticmethod(evaluation_runs_for)
    output_serializer_class = EvaluationRunSerializer
    input_serializer_classes = {"create": EvaluationRunStartSerializer}
    filterset_class = EvaluationRunFilterSet

    @extend_schema(request=EvaluationRunStartSerializer,
                   responses={201: EvaluationRunSerializer})
    def create(self, request):
        run = evaluation_start(actor=request.user, **self.validated_input())
        return self.respond(self.reload(run), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: EvaluationRunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = evaluation_cancel(actor=request.user, run=self.get_object())
        return self.respond(self.reload(run), http_status=status.HTTP_202_ACCEPTED)

    def _benchmark(self, run: EvaluationRun, required: bool):
        """The run's benchmark named by `?benchmark=`: its name, as the CLI takes it, or its
        id."""
        raw = self.request.query_params.get("benchmark", "").strip()
        if not raw:
            if required:
                raise ValidationError({"benchmark": "Name the benchmark (its name or id)."})
            return None
        chosen = run.benchmarks.all()  # prefetched by the selector
        found = next((b for b in chosen if b.name == raw), None) \
            or next((b for b in chosen if raw.isdecimal() and b.pk == int(raw)), None)
        if found is None:
            evaluated = ", ".join(sorted(b.name for b in chosen)) or "none"
            raise ValidationError({"benchmark": f"Run {run.pk} did not evaluate benchmark "
                                   f"{raw!r} (it evaluated {evaluated})."})
        return found

    @extend_schema(
        parameters=[OpenApiParameter("benchmark", str, description="Only this benchmark: its "
                                     "name or id."),
                    OpenApiParameter("offset", int), OpenApiParameter("limit", int)],
        responses=EvaluationSampleSerializer(many=True),
    )
    @action(detail=True, methods=["get"], filterset_class=None)
    def samples(self, request, pk=None):
        run = self.get_object()
        rows = evaluation_samples(run=run, benchmark=self._benchmark(run, required=False))
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(EvaluationSampleSerializer(page, many=True).data)

    @extend_schema(
        parameters=[OpenApiParameter("other", int, required=True,
                                     description="The run to compare with."),
                    OpenApiParameter("benchmark", str, required=True,
                                     description="The benchmark: its name or id."),
                    OpenApiParameter("offset", int),
                    OpenApiParameter("limit", int, description=f"At most {MAX_PAIRS}.")],
        responses=SamplePairSerializer(many=True),
    )
    @action(detail=True, methods=["get"], filterset_class=None, pagination_class=None)
    def compare(self, request, pk=None):
        """The same documents answered by this run and another, side by side."""
        run = self.get_object()
        other_id = _int_param(request, "other", None, 1, 2**62)
        other = self.get_queryset().filter(pk=other_id).first() if other_id else None
        if other is None:
            raise ValidationError({"other": "Name another evaluation run you can see."})
        benchmark = self._benchmark(run, required=True)
        if not other.benchmarks.filter(pk=benchmark.pk).exists():
            raise ValidationError({"benchmark": f"Run {other.pk} did not evaluate "
                                   f"{benchmark.name}."})
        pairs = paired_samples(run_a=run, run_b=other, benchmark=benchmark,
                               offset=_int_param(request, "offset", 0, 0, 10**9) or 0,
                               limit=_int_param(request, "limit", 50, 1, MAX_PAIRS))
        return Response(SamplePairSerializer(pairs, many=True).data)


class LeaderboardView(APIView):
    """Per version of a tenant, the newest succeeded score on each benchmark and metric."""

    @extend_schema(
        parameters=[OpenApiParameter("tenant", str, description="Needed when you are in "
                                     "several.")],
        responses=LeaderboardRowSerializer(many=True),
    )
    def get(self, request):
        field = CallerTenantField()
        tenants = field.get_queryset_for(request.user)
        name = request.query_params.get("tenant")
        if name:
            tenant = tenants.filter(name=name).first()
            if tenant is None:
                raise ValidationError({"tenant": f"No tenant {name!r}."})
        else:
            mine = list(tenants[:2])
            if len(mine) != 1:
                raise ValidationError({"tenant": f"Name the tenant: you see {tenants.count()} "
                                       "tenants."})
            tenant = mine[0]
        rows = leaderboard(user=request.user, tenant=tenant)
        return Response(LeaderboardRowSerializer(rows, many=True).data)


class EvaluationEventsView(APIView):
    """Where an evaluation runner inside a job reports (with the job token from
    OGAI_RUN_TOKEN)."""

    authentication_classes = [JobTokenAuthentication]
    permission_classes = [HasJobToken]

    @extend_schema(request=EvaluationEventBatchSerializer,
                   responses=EvaluationEventReplySerializer)
    def post(self, request):
        batch = EvaluationEventBatchSerializer(data=request.data)
        batch.is_valid(raise_exception=True)
        accepted = evaluation_events_apply(job=request.auth,
                                           events=batch.validated_data["events"])
        return Response({"accepted": accepted})


ROUTES: list = [
    ("benchmarks", BenchmarkViewSet, "benchmark"),
    ("evaluation-runs", EvaluationRunViewSet, "evaluation-run"),
]
PATHS: list = [
    path("leaderboard/", LeaderboardView.as_view(), name="leaderboard"),
    path("runner/events/", EvaluationEventsView.as_view(), name="runner-events"),
]
