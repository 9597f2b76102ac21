from django.urls import path
from rest_framework.routers import SimpleRouter

from infra_os.api import views
from infra_os.api.billing import (
    InvoiceViewSet,
    PricingPlanViewSet,
    ReservationViewSet,
    UsageView,
)
from infra_os.api.leases import LeaseViewSet
from infra_os.api.servers import (
    BootConfigView,
    ProvisioningBatchViewSet,
    ProvisioningCallbackView,
    ProvisioningProfileViewSet,
    RackViewSet,
    ServerViewSet,
)

router = SimpleRouter(trailing_slash=True)
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("memberships", views.MembershipViewSet, basename="membership")
router.register("invitations", views.InvitationViewSet, basename="invitation")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("api-tokens", views.ApiTokenViewSet, basename="api-token")
router.register("audit-events", views.AuditEventViewSet, basename="audit-event")
router.register("leases", LeaseViewSet, basename="lease")
router.register("servers", ServerViewSet, basename="server")
router.register("racks", RackViewSet, basename="rack")
router.register("provisioning-profiles", ProvisioningProfileViewSet,
                basename="provisioning-profile")
router.register("provisioning-batches", ProvisioningBatchViewSet, basename="provisioning-batch")
router.register("pricing-plans", PricingPlanViewSet, basename="pricing-plan")
router.register("reservations", ReservationViewSet, basename="reservation")
router.register("invoices", InvoiceViewSet, basename="invoice")

app_name = "infra_os-api"
urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("auth/login/", views.LoginView.as_view(), name="login"),
    path("auth/logout/", views.LogoutView.as_view(), name="logout"),
    path("provisioning/callback/", ProvisioningCallbackView.as_view(),
         name="provisioning-callback"),
    path("provisioning/boot-config/", BootConfigView.as_view(), name="provisioning-boot-config"),
    # Before the router's: "rate" and "assign" would otherwise read as an object's id.
    path("usage/", UsageView.as_view(), name="usage"),
    *router.urls,
]
