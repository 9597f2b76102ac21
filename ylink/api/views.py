from django.core.exceptions import ValidationError
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from aistation.api.authentication import HasJobToken, JobTokenAuthentication
from infra_os.api.viewsets import ScopedViewSet
from ylink import selectors, storage
from ylink.api import serializers as s
from ylink.filtersets import (
    DatasetFilterSet,
    DatasetVersionFilterSet,
    PipelineRunFilterSet,
    TrainingRunFilterSet,
)
from ylink.services.datasets import (
    check_upload_size,
    dataset_create,
    dataset_create_from_upload,
    dataset_upload,
)
from ylink.services.pipelines import pipeline_run_cancel, pipeline_run_start
from ylink.services.runner_events import runner_events_apply
from ylink.services.training import (
    multitask_prompt_tuning_start,
    training_run_cancel,
    training_run_start,
)
from ylink.steps import catalogue

MAX_SAMPLES = 100


def _int_param(request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.lstrip("-").isdigit() or not low <= int(raw) <= high:
        raise ValidationError({name: f"Use a whole number from {low} to {high}."})
    return int(raw)


class DatasetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Datasets of your tenants; upload files to add versions."""

    selector = selectors.dataset_list
    output_serializer_class = s.DatasetSerializer
    input_serializer_classes = {"create": s.DatasetCreateSerializer,
                                "upload": s.DatasetUploadSerializer,
                                "create_with_upload": s.DatasetCreateUploadSerializer}
    filterset_class = DatasetFilterSet

    @extend_schema(request=s.DatasetCreateSerializer, responses={201: s.DatasetSerializer})
    def create(self, request):
        dataset = dataset_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(dataset), http_status=status.HTTP_201_CREATED)

    @extend_schema(request={"multipart/form-data": s.DatasetUploadSerializer},
                   responses={201: s.DatasetVersionSerializer})
    @action(detail=True, methods=["post"], parser_classes=[MultiPartParser])
    def upload(self, request, pk=None):
        dataset = self.get_object()
        # Refused by its declared size before a byte of it is read.
        length = request.META.get("CONTENT_LENGTH")
        check_upload_size(int(length) if length and length.isdigit() else None)
        upload = request.FILES.get("file")
        if upload is None:
            raise ValidationError({"file": "Send the corpus as the multipart field 'file'."})
        version = dataset_upload(actor=request.user, dataset=dataset, upload=upload)
        return self.respond(version, http_status=status.HTTP_201_CREATED,
                            serializer=s.DatasetVersionSerializer)

    @extend_schema(operation_id="ylink_datasets_create_with_upload",
                   request={"multipart/form-data": s.DatasetCreateUploadSerializer},
                   responses={201: s.DatasetVersionSerializer})
    @action(detail=False, methods=["post"], url_path="upload", parser_classes=[MultiPartParser])
    def create_with_upload(self, request):
        """Create a dataset with a file as its first version; a refused file creates none."""
        length = request.META.get("CONTENT_LENGTH")
        check_upload_size(int(length) if length and length.isdigit() else None)
        data = self.validated_input()
        version = dataset_create_from_upload(actor=request.user, upload=data.pop("file"), **data)
        return self.respond(version, http_status=status.HTTP_201_CREATED,
                            serializer=s.DatasetVersionSerializer)


class DatasetVersionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Versions of datasets: statistics, lineage, sample documents."""

    selector = selectors.dataset_version_list
    output_serializer_class = s.DatasetVersionSerializer
    filterset_class = DatasetVersionFilterSet

    @extend_schema(
        parameters=[OpenApiParameter("offset", int), OpenApiParameter("limit", int,
                    description=f"At most {MAX_SAMPLES}.")],
        responses=s.SamplePageSerializer,
    )
    @action(detail=True, methods=["get"])
    def samples(self, request, pk=None):
        version = self.get_object()
        offset = _int_param(request, "offset", 0, 0, max(version.documents - 1, 0))
        limit = _int_param(request, "limit", 10, 1, MAX_SAMPLES)
        results = storage.read_samples(storage.absolute(version.path), version.format,
                                       offset=offset, limit=limit)
        return Response({"count": version.documents, "offset": offset, "limit": limit,
                         "results": results})


class PipelineRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Data pipelines: steps run as one job on a dataset version, giving a new version."""

    selector = selectors.pipeline_run_list
    output_serializer_class = s.PipelineRunSerializer
    input_serializer_classes = {"create": s.PipelineRunStartSerializer}
    filterset_class = PipelineRunFilterSet

    @extend_schema(request=s.PipelineRunStartSerializer, responses={201: s.PipelineRunSerializer})
    def create(self, request):
        run = pipeline_run_start(actor=request.user, **self.validated_input())
        return self.respond(self.reload(run), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: s.PipelineRunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = pipeline_run_cancel(actor=request.user, run=self.get_object())
        return self.respond(self.reload(run), http_status=status.HTTP_202_ACCEPTED)


class TrainingRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Tokenizer, pretraining and fine-tuning runs, their metrics and checkpoints."""

    selector = selectors.training_run_list
    output_serializer_class = s.TrainingRunSerializer
    input_serializer_classes = {"create": s.TrainingRunStartSerializer,
                                "multitask_prompt_tuning": s.MultitaskPromptTuningSerializer}
    filterset_class = TrainingRunFilterSet

    @extend_schema(request=s.TrainingRunStartSerializer, responses={201: s.TrainingRunSerializer})
    def create(self, request):
        run = training_run_start(actor=request.user, **self.validated_input())
        return self.respond(self.reload(run), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=s.MultitaskPromptTuningSerializer,
                   responses={201: s.MultitaskPromptTuningRunsSerializer})
    @action(detail=False, methods=["post"], url_path="multitask-prompt-tuning",
            filterset_class=None, pagination_class=None)
    def multitask_prompt_tuning(self, request):
        """The two-stage recipe of multi-task prompt tuning as one request: stage 1 trains a
        shared prompt on the source tasks, stage 2 starts the target task's prompt from it."""
        source, target = multitask_prompt_tuning_start(actor=request.user,
                                                       **self.validated_input())
        runs = {"source": self.reload(source), "target": self.reload(target)}
        data = s.MultitaskPromptTuningRunsSerializer(
            runs, context=self.get_serializer_context()).data
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: s.TrainingRunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = training_run_cancel(actor=request.user, run=self.get_object())
        return self.respond(self.reload(run), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        parameters=[OpenApiParameter("after_step", int, description="Only later steps.")],
        responses=s.TrainingMetricSerializer(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def metrics(self, request, pk=None):
        run = self.get_object()
        after = _int_param(request, "after_step", -1, -1, 10**12)
        rows = selectors.training_metrics(run=run, after_step=after)
        return Response(s.TrainingMetricSerializer(rows, many=True).data)

    @extend_schema(responses=s.CheckpointSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def checkpoints(self, request, pk=None):
        rows = selectors.training_checkpoints(run=self.get_object())
        return Response(s.CheckpointSerializer(rows, many=True).data)


class PipelineStepsView(APIView):
    """The pipeline steps there are, with their parameters, defaults and ranges."""

    @extend_schema(responses=s.StepTypeSerializer(many=True))
    def get(self, request):
        return Response(catalogue())


class RunnerEventsView(APIView):
    """Where a runner inside a job reports (with the job token from OGAI_RUN_TOKEN)."""

    authentication_classes = [JobTokenAuthentication]
    permission_classes = [HasJobToken]

    @extend_schema(request=s.RunnerEventBatchSerializer, responses=s.RunnerEventReplySerializer)
    def post(self, request):
        batch = s.RunnerEventBatchSerializer(data=request.data)
        batch.is_valid(raise_exception=True)
        accepted = runner_events_apply(job=request.auth, events=batch.validated_data["events"])
        return Response({"accepted": accepted})
