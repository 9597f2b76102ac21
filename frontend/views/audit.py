from django.contrib.auth.decorators import login_required
from django.db.models import Q

from frontend.access import current_tenant
from frontend.lists import list_response
from frontend.tables import AuditEventTable
from infra_os.filtersets import AuditEventFilterSet
from infra_os.selectors import audit_event_list


@login_required
def audit(request):
    tenant = current_tenant(request)
    # The tenant's events, and the user's own account events (tokens), which have no tenant.
    own = Q(tenant__isnull=True, actor_id=request.user.pk)
    queryset = audit_event_list(user=request.user).filter(
        Q(tenant_id=tenant.pk) | own if tenant else own
    )
    return list_response(
        request,
        template="frontend/audit/list.html",
        table_class=AuditEventTable,
        queryset=queryset,
        filterset_class=AuditEventFilterSet,
        hidden_filters=("tenant",),
        filter_labels={"action": "Action", "since": "Since", "until": "Until"},
    )
