from rest_framework.routers import SimpleRouter

from mmodel.api import deployments, evaluation, registry

router = SimpleRouter(trailing_slash=True)
for module in (registry, evaluation, deployments):
    for prefix, viewset, basename in module.ROUTES:
        router.register(prefix, viewset, basename=basename)

app_name = "mmodel-api"
urlpatterns = [
    *registry.PATHS, *evaluation.PATHS, *deployments.PATHS,
    *router.urls,
]
