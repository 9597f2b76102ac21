"""Your invitations to join tenants: accept or decline them."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from frontend.access import SESSION_KEY
from infra_os.selectors import invitation_inbox, pending_invitations
from infra_os.services.invitations import invitation_accept, invitation_decline


@login_required
def invitations(request):
    return render(request, "frontend/invitations/list.html",
                  {"invitations": pending_invitations(user=request.user)})


def _mine(request, pk: int):
    # Only the addressee finds it: anyone else's invitation is a 404.
    return get_object_or_404(invitation_inbox(user=request.user), pk=pk)


@login_required
@require_POST
def invitation_accept_view(request, pk: int):
    invitation = _mine(request, pk)
    try:
        membership = invitation_accept(actor=request.user, invitation=invitation)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("frontend:invitations")
    # Show the tenant just joined.
    request.session[SESSION_KEY] = membership.tenant.name
    messages.success(request, f"You joined {membership.tenant.name} as "
                              f"{membership.get_role_display().lower()}.")
    return redirect("frontend:dashboard")


@login_required
@require_POST
def invitation_decline_view(request, pk: int):
    invitation = _mine(request, pk)
    try:
        invitation_decline(actor=request.user, invitation=invitation)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"You declined the invitation to {invitation.tenant.name}.")
    return redirect("frontend:invitations")
