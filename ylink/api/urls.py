from django.urls import path
from rest_framework.routers import SimpleRouter

from ylink.api import views

router = SimpleRouter(trailing_slash=True)
router.register("datasets", views.DatasetViewSet, basename="dataset")
router.register("dataset-versions", views.DatasetVersionViewSet, basename="dataset-version")
router.register("pipeline-runs", views.PipelineRunViewSet, basename="pipeline-run")
router.register("training-runs", views.TrainingRunViewSet, basename="training-run")

app_name = "ylink-api"
urlpatterns = [
    path("pipeline-steps/", views.PipelineStepsView.as_view(), name="pipeline-steps"),
    path("runner/events/", views.RunnerEventsView.as_view(), name="runner-events"),
    *router.urls,
]
