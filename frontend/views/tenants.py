from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render

from frontend.access import console_access
from frontend.forms import TenantCreateForm, TenantUpdateForm, add_service_errors
from frontend.lists import list_response
from frontend.tables import TenantTable
from infra_os.choices import Role
from infra_os.filtersets import TenantFilterSet
from infra_os.selectors import tenant_list
from infra_os.services.tenancy import tenant_create, tenant_update


@login_required
def tenants(request):
    """Every tenant the user sees (not only the current one): this is where they are compared."""
    return list_response(
        request,
        template="frontend/tenants/list.html",
        table_class=TenantTable,
        queryset=tenant_list(user=request.user),
        filterset_class=TenantFilterSet,
        filter_labels={"is_active": "Active"},
    )


@login_required
def tenant_create_view(request):
    if not console_access(request).platform_admin:
        raise PermissionDenied("Only a platform admin can create tenants.")
    form = TenantCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            tenant = tenant_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(
                request, f"Tenant {tenant.name} created. Switch to it to add its members."
            )
            return redirect("frontend:tenants")
    return render(request, "frontend/tenants/form.html", {
        "form": form, "heading": "New tenant", "submit_label": "Create tenant",
    })


@login_required
def tenant_edit(request, name: str):
    tenant = get_object_or_404(tenant_list(user=request.user), name=name)
    access = console_access(request)
    if not (access.platform_admin or tenant.my_role == Role.ADMIN):
        raise PermissionDenied("Only a tenant admin can edit the tenant.")
    initial = {"display_name": tenant.display_name, "description": tenant.description,
               "is_active": tenant.is_active, "log_retention_days": tenant.log_retention_days}
    form = TenantUpdateForm(request.POST or None, initial=initial,
                            platform_admin=access.platform_admin)
    if request.method == "POST" and form.is_valid():
        try:
            tenant_update(actor=request.user, tenant=tenant, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Tenant {tenant.name} saved.")
            return redirect("frontend:tenants")
    return render(request, "frontend/tenants/form.html", {
        "form": form, "tenant": tenant, "heading": f"Edit tenant {tenant.name}",
        "submit_label": "Save tenant",
    })
