from django.urls import path
from rest_framework.routers import SimpleRouter

from infra_os.api import views

router = SimpleRouter(trailing_slash=True)
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("memberships", views.MembershipViewSet, basename="membership")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("api-tokens", views.ApiTokenViewSet, basename="api-token")
router.register("audit-events", views.AuditEventViewSet, basename="audit-event")

app_name = "infra_os-api"
urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("auth/login/", views.LoginView.as_view(), name="login"),
    path("auth/logout/", views.LogoutView.as_view(), name="logout"),
    *router.urls,
]
