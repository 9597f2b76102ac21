"""`/health-checks/`: the runs of node health checks, with their verdicts, on the nodes you
see; `/health-check-types/`: the checks the platform runs. Operators start checks with
`POST /nodes/{id}/check/`."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from infra_os.api.viewsets import ScopedViewSet
from podsys import selectors
from podsys.api.serializers_health import HealthCheckRunSerializer, HealthCheckTypeSerializer
from podsys.filtersets_health import HealthCheckRunFilterSet
from podsys.health.registry import health_checks


class HealthCheckRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Health check runs, newest first: pending (a summary says why one waits), running,
    passed, failed, or error (it could not be carried out, which says nothing of the node)."""

    selector = selectors.health_check_run_list
    output_serializer_class = HealthCheckRunSerializer
    filterset_class = HealthCheckRunFilterSet
    tenant_field = "node__cluster__tenant"


class HealthCheckTypesView(APIView):
    """The health checks configured (OGAI_HEALTH_CHECKS), in the order they are listed."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses=HealthCheckTypeSerializer(many=True))
    def get(self, request):
        checks = [{"name": check.name, "label": check.label, "severity": check.severity,
                   "interval_s": check.interval_s, "timeout_s": check.timeout_s,
                   "exclusive": check.exclusive, "multi_node": check.multi_node}
                  for check in health_checks().values()]
        return Response(HealthCheckTypeSerializer(checks, many=True).data)
