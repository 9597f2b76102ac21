from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import redirect, render

from frontend.access import console_access, current_tenant
from frontend.forms import QuotaForm, add_service_errors
from frontend.lists import list_response
from frontend.tables import QuotaTable, gpu_limits_text
from infra_os.filtersets import QuotaFilterSet
from infra_os.selectors import quota_list
from infra_os.services.quotas import QUOTA_FIELDS, quota_update


def _current_quotas(request):
    tenant = current_tenant(request)
    queryset = quota_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


@login_required
def quotas(request):
    queryset = _current_quotas(request)
    quota = queryset.first()
    return list_response(
        request,
        template="frontend/quotas/list.html",
        table_class=QuotaTable,
        queryset=queryset,
        filterset_class=QuotaFilterSet,
        hidden_filters=("tenant",),
        context={"quota": quota,
                 "gpu_limits": gpu_limits_text(quota.gpu_model_limits) if quota else ""},
    )


@login_required
def quota_edit(request):
    if not console_access(request).platform_admin:
        raise PermissionDenied("Only a platform admin can change quotas.")
    quota = _current_quotas(request).first()
    if quota is None:
        raise Http404("This tenant has no quota.")
    initial = {field: getattr(quota, field) for field in QUOTA_FIELDS}
    initial["gpu_model_limits"] = QuotaForm.limits_as_text(quota.gpu_model_limits)
    form = QuotaForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            quota_update(actor=request.user, quota=quota, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Quota of {quota.tenant.name} saved.")
            return redirect("frontend:quotas")
    return render(request, "frontend/quotas/edit.html", {"form": form, "quota": quota})
