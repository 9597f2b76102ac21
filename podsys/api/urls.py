from rest_framework.routers import SimpleRouter

from podsys.api import views

router = SimpleRouter(trailing_slash=True)
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("nodes", views.NodeViewSet, basename="node")

app_name = "podsys-api"
urlpatterns = router.urls
