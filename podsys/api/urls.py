from django.urls import path
from rest_framework.routers import SimpleRouter

from podsys.api import accounts, fleets, health, stack, views

router = SimpleRouter(trailing_slash=True)
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("cluster-users", accounts.ClusterUserViewSet, basename="cluster-user")
router.register("cluster-groups", accounts.ClusterGroupViewSet, basename="cluster-group")
router.register("health-checks", health.HealthCheckRunViewSet, basename="health-check")
router.register("stack-profiles", stack.StackProfileViewSet, basename="stack-profile")
router.register("deployment-runs", stack.DeploymentRunViewSet, basename="deployment-run")
router.register("fleets", fleets.FleetViewSet, basename="fleet")

app_name = "podsys-api"
urlpatterns = [
    path("health-check-types/", health.HealthCheckTypesView.as_view(),
         name="health-check-types"),
    *router.urls,
]
