from rest_framework.routers import SimpleRouter

from aistation.api import views, views_logs

router = SimpleRouter(trailing_slash=True)
router.register("queues", views.QueueViewSet, basename="queue")
router.register("jobs", views.JobViewSet, basename="job")
router.register("notebooks", views.NotebookViewSet, basename="notebook")
router.register("workdirs", views.WorkdirViewSet, basename="workdir")
router.register("logs", views_logs.LogViewSet, basename="log")

app_name = "aistation-api"
urlpatterns = router.urls
