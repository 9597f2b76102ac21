from django.contrib.auth.decorators import login_required
from django.db.models import Count, F, Q, Sum
from django.shortcuts import render

from aistation.choices import ACTIVE_STATES, JobState
from aistation.selectors import job_list
from frontend.access import current_tenant
from infra_os.selectors import (
    audit_event_list,
    pending_invitations,
    tenant_counts,
    tenant_list,
)

RECENT_EVENTS = 8


@login_required
def dashboard(request):
    tenant = current_tenant(request)
    counts = tenant_counts(user=request.user, tenant=tenant) if tenant else None
    events = (
        audit_event_list(user=request.user).filter(tenant_id=tenant.pk)[:RECENT_EVENTS]
        if tenant else []
    )
    jobs = job_list(user=request.user).filter(tenant_id=tenant.pk).aggregate(
        running=Count("pk", filter=Q(state__in=ACTIVE_STATES)),
        queued=Count("pk", filter=Q(state=JobState.QUEUED)),
        gpus=Sum(F("gpus_per_replica") * F("replicas"), filter=Q(state__in=ACTIVE_STATES),
                 default=0),
    ) if tenant else None
    return render(request, "frontend/dashboard.html", {
        "counts": counts,
        "jobs": jobs,
        "visible_tenants": tenant_list(user=request.user).count(),
        "events": events,
        "invitations": pending_invitations(user=request.user),
    })
