from django.contrib.auth import views as auth_views
from django.urls import path

from frontend.views import audit, dashboard, layers, members, quotas, switcher, tenants, tokens

app_name = "frontend"
urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(
        template_name="frontend/login.html", redirect_authenticated_user=True,
    ), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("switch-tenant/", switcher.switch_tenant, name="switch-tenant"),
    path("tenants/", tenants.tenants, name="tenants"),
    path("tenants/new/", tenants.tenant_create_view, name="tenant-create"),
    path("tenants/<slug:name>/edit/", tenants.tenant_edit, name="tenant-edit"),
    path("members/", members.members, name="members"),
    path("members/add/", members.member_add, name="member-add"),
    path("members/<int:pk>/role/", members.member_role, name="member-role"),
    path("members/<int:pk>/remove/", members.member_remove, name="member-remove"),
    path("quotas/", quotas.quotas, name="quotas"),
    path("quotas/edit/", quotas.quota_edit, name="quota-edit"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("tokens/new/", tokens.token_create, name="token-create"),
    path("tokens/<int:pk>/revoke/", tokens.token_revoke, name="token-revoke"),
    path("audit/", audit.audit, name="audit"),
    path("clusters/", layers.layer_view("clusters"), name="clusters"),
    path("jobs/", layers.layer_view("jobs"), name="jobs"),
    path("toolchain/", layers.layer_view("toolchain"), name="toolchain"),
    path("models/", layers.layer_view("models"), name="models"),
]
