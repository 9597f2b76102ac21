from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from frontend.access import current_tenant
from infra_os.selectors import audit_event_list, tenant_counts, tenant_list

RECENT_EVENTS = 8


@login_required
def dashboard(request):
    tenant = current_tenant(request)
    counts = tenant_counts(user=request.user, tenant=tenant) if tenant else None
    events = (
        audit_event_list(user=request.user).filter(tenant_id=tenant.pk)[:RECENT_EVENTS]
        if tenant else []
    )
    return render(request, "frontend/dashboard.html", {
        "counts": counts,
        "visible_tenants": tenant_list(user=request.user).count(),
        "events": events,
    })
