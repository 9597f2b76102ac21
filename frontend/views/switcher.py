from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from frontend.access import SESSION_KEY
from frontend.responses import safe_next
from infra_os.selectors import tenants_for_switcher


@login_required
@require_POST
def switch_tenant(request):
    name = request.POST.get("tenant", "")
    tenant = tenants_for_switcher(user=request.user).filter(name=name).first()
    if tenant is None:
        # A tenant the user does not see is answered as if it did not exist.
        raise Http404("No such tenant.")
    request.session[SESSION_KEY] = tenant.name
    messages.success(request, f"Now showing tenant {tenant}.")
    return redirect(safe_next(request) or "frontend:dashboard")
