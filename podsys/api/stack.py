"""Stack profiles (read by everyone signed in, written by platform admins) and deployment runs
(platform admins only: everyone else sees none)."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from infra_os.api.viewsets import ScopedViewSet
from podsys import selectors
from podsys.api import serializers_stack as s
from podsys.filtersets_stack import DeploymentRunFilterSet, StackProfileFilterSet
from podsys.services.deployments import (
    deployment_cancel,
    deployment_rerun_failed,
    deployment_start,
)
from podsys.services.stack import (
    stack_profile_create,
    stack_profile_delete,
    stack_profile_update,
)


class StackProfileViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """The software stacks nodes run: driver, CUDA, cuDNN, NCCL, OFED, container runtime,
    DCGM, Kubernetes or Slurm, checked against OGAI's compatibility matrix."""

    selector = selectors.stack_profile_list
    output_serializer_class = s.StackProfileSerializer
    input_serializer_classes = {"create": s.StackProfileCreateSerializer,
                                "partial_update": s.StackProfileUpdateSerializer}
    filterset_class = StackProfileFilterSet
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"
    tenant_field = None
    platform_admin_actions = ("create", "partial_update", "destroy")

    @extend_schema(request=s.StackProfileCreateSerializer,
                   responses={201: s.StackProfileSerializer})
    def create(self, request):
        profile = stack_profile_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(profile), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=s.StackProfileUpdateSerializer, responses=s.StackProfileSerializer)
    def partial_update(self, request, name=None):
        profile = stack_profile_update(actor=request.user, profile=self.get_object(),
                                       **self.validated_input(partial=True))
        return self.respond(self.reload(profile))

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, name=None):
        """Delete a profile no deployment used."""
        stack_profile_delete(actor=request.user, profile=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeploymentRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Ansible runs of a stack profile (or of an accounts push) against nodes, with each
    node's progress task by task."""

    selector = selectors.deployment_run_list
    output_serializer_class = s.DeploymentRunSerializer
    input_serializer_classes = {"create": s.DeploymentRunCreateSerializer}
    filterset_class = DeploymentRunFilterSet
    tenant_field = None
    platform_admin_actions = ("create", "rerun_failed", "cancel")

    @extend_schema(request=s.DeploymentRunCreateSerializer,
                   responses={202: OpenApiResponse(s.DeploymentRunSerializer,
                                                   description="The queued run.")})
    def create(self, request):
        """Deploy a stack profile to nodes of a cluster. The run is queued; follow it at
        {id}/results/."""
        run = deployment_start(actor=request.user, **self.validated_input())
        return self.respond(self.reload(run), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None,
                   responses={202: OpenApiResponse(s.DeploymentRunSerializer,
                                                   description="The new run.")})
    @action(detail=True, methods=["post"], url_path="rerun-failed")
    def rerun_failed(self, request, pk=None):
        """Run the same deployment again on only the nodes that failed or were unreachable."""
        run = deployment_rerun_failed(actor=request.user, run=self.get_object())
        return self.respond(self.reload(run), http_status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses=s.DeploymentRunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the run: a queued run never starts, a running one stops within seconds."""
        run = deployment_cancel(actor=request.user, run=self.get_object())
        return self.respond(self.reload(run))

    @extend_schema(request=None, responses=s.DeploymentGridSerializer)
    @action(detail=True, methods=["get"])
    def results(self, request, pk=None):
        """The run's task results as a grid: a column per task, a row per node, each node's
        state and the output of the task it failed at."""
        return self.respond(selectors.deployment_grid(run=self.get_object()),
                            serializer=s.DeploymentGridSerializer)
