from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import FileResponse, Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings

from aistation import selectors
from aistation.api import serializers as s
from aistation.api.authentication import HasJobToken, JobTokenAuthentication
from aistation.choices import JobState
from aistation.filtersets import JobFilterSet, QueueFilterSet, WorkdirFilterSet
from aistation.models import Job, Notebook, Workdir
from aistation.services.jobs import job_cancel, job_rerun, job_submit
from aistation.services.manifests import job_manifests
from aistation.services.notebooks import (
    idle_timeouts,
    notebook_delete,
    notebook_resume,
    notebook_start,
    notebook_stop,
    notebooks_gpu_hours,
)
from aistation.services.queues import queue_create, queue_update
from aistation.services.ray_clusters import ray_cluster_of
from aistation.services.workdirs import check_workdir_size, workdir_max_bytes, workdir_upload
from aistation.services.workloads import workdir_archive_path
from infra_os.api.permissions import TenantRolePermission
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

    @extend_schema(responses=s.RayClusterSerializer)
    @action(detail=True, methods=["get"], url_path="ray")
    def ray(self, request, pk=None):
        """Where a Ray job's cluster is reached: its GCS address and its dashboard (through
        the platform's proxy). Not ready (with the reason) until the job runs; 400 for a job
        that is not of kind ray."""
        job = self.get_object()
        if not job.ray:
            raise ValidationError({"kind": f"Job {job.pk} is not a Ray job (kind: ray)."})
        cluster = ray_cluster_of(job)
        url = request.build_absolute_uri(cluster.dashboard_path) if cluster.dashboard_path \
            else ""
        return self.respond({"ready": cluster.ready, "address": cluster.address,
                             "gcs_address": cluster.gcs_address, "dashboard_url": url,
                             "reason": cluster.reason},
                            serializer=s.RayClusterSerializer)

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


class GzipRenderer(BaseRenderer):
    """Lets a client ask for the archive's media type; errors still come as the JSON envelope."""

    media_type = "application/gzip"
    format = "gz"
    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return JSONRenderer().render(data, renderer_context=renderer_context)


class WorkdirViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Working folders shipped with jobs: content-addressed archives, kept once per tenant.
    A client asks for its folder's SHA-256 first (`?sha256=`) and uploads it only when it is
    not there; a job names it by id."""

    selector = selectors.workdir_list
    output_serializer_class = s.WorkdirSerializer
    input_serializer_classes = {"create": s.WorkdirUploadSerializer}
    filterset_class = WorkdirFilterSet

    @extend_schema(request={"multipart/form-data": s.WorkdirUploadSerializer},
                   responses={201: s.WorkdirSerializer,
                              200: OpenApiResponse(s.WorkdirSerializer,
                                                   description="The tenant already had it.")})
    def create(self, request):
        # Refused by its declared size before a byte of it is read.
        length = request.META.get("CONTENT_LENGTH")
        check_workdir_size(int(length) if length and length.isdigit() else None)
        data = self.validated_input()
        workdir, created = workdir_upload(actor=request.user, tenant=data["tenant"],
                                          archive=data["archive"], sha256=data["sha256"])
        return self.respond(workdir, http_status=status.HTTP_201_CREATED if created
                            else status.HTTP_200_OK)

    @extend_schema(responses=s.WorkdirSerializer)
    def retrieve(self, request, pk=None):
        return self.respond(self.get_object())

    @extend_schema(request=None, responses={(200, "application/gzip"): OpenApiResponse(
        response=OpenApiTypes.BINARY, description="The archive: a gzip-compressed tar.")})
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, GzipRenderer],
            authentication_classes=[JobTokenAuthentication,
                                    *api_settings.DEFAULT_AUTHENTICATION_CLASSES],
            permission_classes=[HasJobToken | TenantRolePermission])
    def archive(self, request, pk=None):
        """The archive's bytes, for the tenant's members and for the job token of a job that
        ships it (a job's init container fetches it so), and for no other job."""
        if isinstance(request.auth, Job):
            job = request.auth
            if not (pk or "").isdigit() or job.workdir_id != int(pk):
                raise Http404("No such working folder.")
            workdir = Workdir.objects.get(pk=job.workdir_id)
        else:
            workdir = self.get_object()
        path = workdir_archive_path(workdir.tenant_id, workdir.sha256)
        try:
            stream = path.open("rb")
        except FileNotFoundError:
            raise Http404("The working folder's archive is gone from the platform's disk; "
                          "upload the folder again.") from None
        return FileResponse(stream, content_type="application/gzip", as_attachment=True,
                            filename=f"workdir-{workdir.sha256[:12]}.tar.gz")

    @extend_schema(responses=s.WorkdirLimitsSerializer)
    @action(detail=False, methods=["get"])
    def limits(self, request):
        """What an archive may be, to check before sending it."""
        return Response({"max_bytes": workdir_max_bytes()})


# What `notebook_state` answers, as a condition on the session's job (for ?state=).
_WAITING = (JobState.QUEUED, JobState.RESTARTING, JobState.PREEMPTED)
_NOTEBOOK_STATE_FILTERS = {
    "waiting": Q(job__state__in=_WAITING),
    "starting": Q(job__state=JobState.ADMITTED),
    "running": Q(job__state=JobState.RUNNING),
    "failed": Q(job__state=JobState.FAILED),
    "stopped": Q(job=None) | Q(job__state__in=(JobState.SUCCEEDED, JobState.CANCELLED)),
}


class NotebookViewSet(ScopedViewSet):
    """Notebooks: JupyterLab environments run as jobs of a queue, opened through the platform
    at their `url`. Start one, stop it (its GPUs are freed, its home folder stays), resume it,
    delete it. The owner and the tenant's admins see and manage a notebook; nobody else."""

    selector = selectors.notebook_list
    output_serializer_class = s.NotebookSerializer
    input_serializer_classes = {"create": s.NotebookStartSerializer}

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no user
            return Notebook.objects.none()
        return super().get_queryset()

    def filter_queryset(self, queryset):
        tenant = self.request.query_params.get("tenant")
        if tenant:
            queryset = queryset.filter(tenant__name=tenant)
        states = [value for raw in self.request.query_params.getlist("state")
                  for value in raw.split(",") if value]
        if states:
            unknown = sorted(set(states) - set(_NOTEBOOK_STATE_FILTERS))
            if unknown:
                raise ValidationError({"state": f"Unknown state {unknown[0]!r}; use one of "
                                       f"{', '.join(s.NOTEBOOK_STATES)}."})
            condition = Q()
            for state in states:
                condition |= _NOTEBOOK_STATE_FILTERS[state]
            queryset = queryset.filter(condition)
        return queryset

    @extend_schema(
        parameters=[
            OpenApiParameter("tenant", str, description="Only this tenant's notebooks."),
            OpenApiParameter("state", str, many=True, enum=s.NOTEBOOK_STATES,
                             description="Only notebooks in this state (repeat for several)."),
        ],
        responses=s.NotebookSerializer(many=True),
    )
    def list(self, request):
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        notebooks = list(page if page is not None else queryset)
        data = s.NotebookSerializer(notebooks, many=True,
                                    context={**self.get_serializer_context(),
                                             **_page_extras(notebooks)}).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    @extend_schema(responses=s.NotebookSerializer)
    def retrieve(self, request, pk=None):
        return self.respond(self.get_object())

    @extend_schema(request=s.NotebookStartSerializer, responses={201: s.NotebookSerializer})
    def create(self, request):
        notebook = notebook_start(actor=request.user, **self.validated_input())
        return self.respond(self.reload(notebook), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: s.NotebookSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        notebook = notebook_stop(actor=request.user, notebook=self.get_object())
        return self.respond(self.reload(notebook), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: s.NotebookSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        notebook = notebook_resume(actor=request.user, notebook=self.get_object())
        return self.respond(self.reload(notebook), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, pk=None):
        notebook_delete(actor=request.user, notebook=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


def _page_extras(notebooks) -> dict:
    """The GPU-hours and idle limits of a page of notebooks, in a few queries for all."""
    return {"gpu_hours": notebooks_gpu_hours(notebooks),
            "idle_timeouts": idle_timeouts({notebook.tenant_id for notebook in notebooks})}


def _int_param(request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ValidationError({name: f"Use a whole number from {low} to {high}."})
    return int(raw)
