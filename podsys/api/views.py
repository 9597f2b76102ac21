from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from infra_os.api.viewsets import ScopedViewSet
from podsys import selectors
from podsys.allocations import gpu_allocations
from podsys.api import serializers as s
from podsys.api.metrics import metrics_schema, node_metrics_response
from podsys.api.serializers_health import HealthCheckRunSerializer, NodeCheckSerializer
from podsys.filtersets import ClusterFilterSet, NodeFilterSet
from podsys.services.clusters import (
    cluster_check_connection,
    cluster_create,
    cluster_sync_nodes,
    node_set_schedulable,
)
from podsys.services.health import health_check_run_now
from podsys.services.servers import server_join_cluster, server_leave_cluster


class ClusterViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Clusters you may run on: shared ones and your tenant's. Platform admins add them."""

    selector = selectors.cluster_list
    output_serializer_class = s.ClusterSerializer
    input_serializer_classes = {"create": s.ClusterCreateSerializer,
                                "join_server": s.ServerNameSerializer,
                                "leave_server": s.ServerNameSerializer}
    filterset_class = ClusterFilterSet
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"
    platform_admin_actions = ("create", "sync", "check", "join_server", "leave_server")

    @extend_schema(request=s.ClusterCreateSerializer, responses={201: s.ClusterSerializer})
    def create(self, request):
        cluster = cluster_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(cluster), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.ClusterSerializer)
    @action(detail=True, methods=["post"])
    def sync(self, request, name=None):
        cluster = self.get_object()
        cluster_sync_nodes(cluster=cluster)
        return self.respond(self.reload(cluster))

    @extend_schema(request=None, responses=s.ConnectionReportSerializer)
    @action(detail=True, methods=["post"])
    def check(self, request, name=None):
        """Reach the cluster: its version, the GPUs its device plugin advertises, and whether
        Kueue or Volcano is installed, in plain words."""
        report = cluster_check_connection(actor=request.user, cluster=self.get_object())
        return self.respond(report, serializer=s.ConnectionReportSerializer)

    @extend_schema(request=None, responses=s.EnvironmentSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def environments(self, request, name=None):
        """The named environments jobs on this cluster may ask for, the default first, with
        their Python and torch versions where known: for platform admins and the tenants with
        a queue on it (others get 404)."""
        offered = selectors.cluster_environment_list(user=request.user,
                                                     cluster=self.get_object())
        if offered is None:
            raise NotFound("No Cluster matches the given query.")
        return Response(s.EnvironmentSerializer(offered, many=True).data)

    @extend_schema(request=s.ServerNameSerializer, responses=s.ServerAllocationSerializer)
    @action(detail=True, methods=["post"], url_path="join-server")
    def join_server(self, request, name=None):
        """Make a provisioned, unleased server a node of this cluster. Its node software is
        installed by a stack deployment; the node appears at the next node sync."""
        cluster = self.get_object()
        server = server_join_cluster(actor=request.user, cluster=cluster,
                                     **self.validated_input())
        return self.respond(server, serializer=s.ServerAllocationSerializer)

    @extend_schema(request=s.ServerNameSerializer, responses=s.ServerAllocationSerializer)
    @action(detail=True, methods=["post"], url_path="leave-server")
    def leave_server(self, request, name=None):
        """Take a server out of this cluster, so it may be leased again."""
        cluster = self.get_object()
        server = server_leave_cluster(actor=request.user, cluster=cluster,
                                      **self.validated_input())
        return self.respond(server, serializer=s.ServerAllocationSerializer)


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Nodes with their GPUs, allocated and free. Platform admins cordon and uncordon them."""

    selector = selectors.node_list
    output_serializer_class = s.NodeSerializer
    input_serializer_classes = {"cordon": s.NodeCordonSerializer, "check": NodeCheckSerializer}
    filterset_class = NodeFilterSet
    tenant_field = "cluster__tenant"
    platform_admin_actions = ("cordon", "uncordon", "check")

    def get_serializer_context(self):
        context = super().get_serializer_context()
        page = getattr(self, "_page_cluster_ids", None)
        context["allocations"] = gpu_allocations(page) if page is not None else {}
        return context

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        if page is not None:
            self._page_cluster_ids = {node.cluster_id for node in page}
        return page

    def get_object(self):
        node = super().get_object()
        self._page_cluster_ids = {node.cluster_id}
        return node

    @extend_schema(request=s.NodeCordonSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def cordon(self, request, pk=None):
        node = node_set_schedulable(
            actor=request.user, node=self.get_object(), schedulable=False, **self.validated_input()
        )
        return self.respond(node)

    @extend_schema(request=None, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def uncordon(self, request, pk=None):
        node = node_set_schedulable(actor=request.user, node=self.get_object(), schedulable=True)
        return self.respond(node)

    @extend_schema(request=NodeCheckSerializer, responses={202: OpenApiResponse(
        HealthCheckRunSerializer(many=True), description="The runs, pending until they start.")})
    @action(detail=True, methods=["post"])
    def check(self, request, pk=None):
        """Run a health check on the node now (blank: every single-node check). The runs
        start within seconds; follow them under /health-checks/?node={id}."""
        runs = health_check_run_now(actor=request.user, node=self.get_object(),
                                    check_name=self.validated_input()["check"] or None)
        return Response(HealthCheckRunSerializer(runs, many=True).data,
                        status=status.HTTP_202_ACCEPTED)

    @metrics_schema
    @action(detail=True, methods=["get"])
    def metrics(self, request, pk=None):
        """The node's GPU and OS metrics over time (DCGM exporter and node exporter names),
        from Prometheus where one is configured, else from the history OGAI keeps."""
        return node_metrics_response(request, self.get_object())
