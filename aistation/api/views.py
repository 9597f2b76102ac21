from django.core.exceptions import ValidationError
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from aistation import selectors
from aistation.api import serializers as s
from aistation.filtersets import JobFilterSet, QueueFilterSet
from aistation.services.jobs import job_cancel, job_rerun, job_submit
from aistation.services.manifests import job_manifests
from aistation.services.queues import queue_create, queue_update
from infra_os.api.viewsets import ScopedViewSet
from infra_os.choices import ADMIN_ROLES
from podsys.drivers.base import DriverError
from podsys.runtime import driver_for

MAX_LOG_LINES = 10000


class QueueViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """A tenant's queues: backlog, jobs running and GPUs in use. Tenant admins manage them."""

    selector = selectors.queue_list
    output_serializer_class = s.QueueSerializer
    input_serializer_classes = {"create": s.QueueCreateSerializer,
                                "partial_update": s.QueueUpdateSerializer,
                                "update": s.QueueUpdateSerializer}
    filterset_class = QueueFilterSet
    write_roles = ADMIN_ROLES

    @extend_schema(request=s.QueueCreateSerializer, responses={201: s.QueueSerializer})
    def create(self, request):
        queue = queue_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(queue), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=s.QueueUpdateSerializer, responses=s.QueueSerializer)
    def update(self, request, pk=None):
        queue = queue_update(actor=request.user, queue=self.get_object(),
                             **self.validated_input(partial=True))
        return self.respond(self.reload(queue))

    @extend_schema(request=s.QueueUpdateSerializer, responses=s.QueueSerializer)
    def partial_update(self, request, pk=None):
        return self.update(request, pk=pk)


class JobViewSet(mixins.ListModelMixin, ScopedViewSet):
    """Jobs: submit a spec, follow its lifecycle, read its logs, cancel and rerun it."""

    selector = selectors.job_list
    output_serializer_class = s.JobSerializer
    input_serializer_classes = {"create": s.JobSubmitSerializer}
    filterset_class = JobFilterSet

    @extend_schema(responses=s.JobDetailSerializer)
    def retrieve(self, request, pk=None):
        job = self.get_object()
        job = selectors.job_detail(user=request.user, pk=job.pk)
        return self.respond(job, serializer=s.JobDetailSerializer)

    @extend_schema(request=s.JobSubmitSerializer, responses={201: s.JobDetailSerializer})
    def create(self, request):
        job = job_submit(actor=request.user, **self.validated_input())
        return self.respond(selectors.job_detail(user=request.user, pk=job.pk),
                            http_status=status.HTTP_201_CREATED,
                            serializer=s.JobDetailSerializer)

    @extend_schema(request=None, responses={202: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = job_cancel(actor=request.user, job=self.get_object())
        return self.respond(self.reload(job), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={201: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def rerun(self, request, pk=None):
        job = job_rerun(actor=request.user, job=self.get_object())
        return self.respond(self.reload(job), http_status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[
            OpenApiParameter("tail", int, description="Last lines only (default 500)."),
            OpenApiParameter("attempt", int, description="Attempt number (default: newest)."),
            OpenApiParameter("replica", int, description="Replica index (default 0)."),
        ],
        responses=s.JobLogsSerializer,
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        job = self.get_object()
        tail = _int_param(request, "tail", 500, 1, MAX_LOG_LINES)
        replica = _int_param(request, "replica", 0, 0, job.replicas - 1)
        attempts = job.attempts.order_by("-number")
        number = request.query_params.get("attempt")
        attempt = attempts.filter(number=int(number)).first() if number and number.isdigit() \
            else attempts.first()
        text = ""
        if attempt is not None:
            try:
                text = driver_for(job.cluster).logs(attempt.workload_id, tail=tail,
                                                    replica=replica)
            except DriverError as exc:
                text = f"(logs unavailable: {exc})"
        return Response({"attempt": attempt.number if attempt else None, "replica": replica,
                         "text": text})

    @extend_schema(responses=s.JobManifestsSerializer)
    @action(detail=True, methods=["get"])
    def manifests(self, request, pk=None):
        """The Kubernetes objects OGAI would create for the job's newest attempt (or, for a job
        not started yet, its next one), as YAML: rendered from the job and its cluster's public
        options, nothing is sent to any cluster. Jobs on any cluster can be rendered, whatever
        its driver: the objects are what a Kubernetes cluster would get. What cannot be
        rendered (no image and no default_image, a bad env name...) answers 400."""
        job = self.get_object()
        return self.respond({"yaml": job_manifests(job=job)},
                            serializer=s.JobManifestsSerializer)


def _int_param(request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ValidationError({name: f"Use a whole number from {low} to {high}."})
    return int(raw)
