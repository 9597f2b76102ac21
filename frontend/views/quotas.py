from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import redirect, render

from aistation.logstore.base import StoreDown
from aistation.selectors_logs import tenant_log_bytes
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


def _log_usage(quota) -> tuple[int | None, float | None]:
    """What the tenant's lines in the log store take (None: the store cannot say now), and
    that as a percentage of its storage quota (None without a quota to compare with)."""
    if quota is None:
        return None, None
    try:
        used = tenant_log_bytes(quota.tenant_id)
    except StoreDown:
        return None, None
    if not quota.storage_gib:
        return used, None
    return used, 100 * used / (quota.storage_gib * 2**30)


@login_required
def quotas(request):
    queryset = _current_quotas(request)
    quota = queryset.first()
    log_bytes, log_percent = _log_usage(quota)
    return list_response(
        request,
        template="frontend/quotas/list.html",
        table_class=QuotaTable,
        queryset=queryset,
        filterset_class=QuotaFilterSet,
        hidden_filters=("tenant",),
        context={"quota": quota,
                 "gpu_limits": gpu_limits_text(quota.gpu_model_limits) if quota else "",
                 "log_bytes": log_bytes, "log_percent": log_percent},
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
