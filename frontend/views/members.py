from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from frontend.access import console_access, current_tenant
from frontend.forms import InvitationForm, MemberAddForm, MemberRoleForm, add_service_errors
from frontend.lists import list_response
from frontend.tables import MembershipTable
from infra_os.choices import InvitationState, Role
from infra_os.filtersets import MembershipFilterSet
from infra_os.selectors import invitation_list, membership_list
from infra_os.services.invitations import invitation_create, invitation_revoke
from infra_os.services.tenancy import (
    DIRECT_ADD_REFUSED,
    membership_create,
    membership_delete,
    membership_update,
)


def _current_memberships(request):
    tenant = current_tenant(request)
    queryset = membership_list(user=request.user)
    return queryset.filter(tenant_id=tenant.pk) if tenant else queryset.none()


def _pending_invitations(request):
    """The current tenant's invitations waiting for an answer (its admins see them)."""
    tenant = current_tenant(request)
    invitations = invitation_list(user=request.user)
    if not tenant or not console_access(request).can_admin:
        return invitations.none()
    return invitations.filter(tenant_id=tenant.pk, state=InvitationState.PENDING)


@login_required
def members(request):
    can_admin = console_access(request).can_admin
    return list_response(
        request,
        template="frontend/members/list.html",
        table_class=MembershipTable,
        queryset=_current_memberships(request),
        filterset_class=MembershipFilterSet,
        hidden_filters=("tenant",),
        table_kwargs={"exclude": () if can_admin else ("actions",)},
        context={"role_choices": Role.choices, "invitations": _pending_invitations(request)},
    )


@login_required
def member_invite(request):
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:members")
    form = InvitationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            invitation = invitation_create(actor=request.user, tenant=tenant,
                                           **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(
                request, f"{invitation.username} is invited to {tenant.name} as "
                f"{invitation.get_role_display().lower()}; they join when they accept "
                f"(until {invitation.expires_at:%Y-%m-%d})."
            )
            return redirect("frontend:members")
    elif not console_access(request).can_admin:
        raise PermissionDenied("Only a tenant admin can invite members.")
    return render(request, "frontend/members/invite.html", {"form": form})


@login_required
@require_POST
def invitation_revoke_view(request, pk: int):
    invitation = get_object_or_404(_pending_invitations(request), pk=pk)
    try:
        invitation_revoke(actor=request.user, invitation=invitation)
    except ValidationError as exc:
        messages.error(request, _messages_of(exc))
    else:
        messages.success(request, f"The invitation of {invitation.username} is revoked.")
    return redirect("frontend:members")


@login_required
def member_add(request):
    """Adding an account directly: platform admins only; tenant admins invite."""
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:members")
    access = console_access(request)
    if request.method != "POST" and access.can_admin and not access.platform_admin:
        messages.info(request, DIRECT_ADD_REFUSED)
        return redirect("frontend:member-invite")
    form = MemberAddForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            membership = membership_create(actor=request.user, tenant=tenant, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(
                request, f"{membership.user.get_username()} added to {tenant.name} as "
                f"{membership.get_role_display().lower()}."
            )
            return redirect("frontend:members")
    elif not access.platform_admin:
        raise PermissionDenied(DIRECT_ADD_REFUSED if access.can_admin
                               else "Only a tenant admin can add members.")
    return render(request, "frontend/members/add.html", {"form": form})


def _messages_of(exc: ValidationError) -> str:
    return " ".join(exc.messages)


@login_required
@require_POST
def member_role(request, pk: int):
    membership = get_object_or_404(_current_memberships(request), pk=pk)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the roles.")
        return redirect("frontend:members")
    try:
        membership_update(actor=request.user, membership=membership,
                          role=form.cleaned_data["role"])
    except ValidationError as exc:
        messages.error(request, _messages_of(exc))
    else:
        messages.success(
            request, f"{membership.user.get_username()} is now "
            f"{Role(form.cleaned_data['role']).label.lower()}."
        )
    return redirect("frontend:members")


@login_required
@require_POST
def member_remove(request, pk: int):
    membership = get_object_or_404(_current_memberships(request), pk=pk)
    username = membership.user.get_username()
    try:
        membership_delete(actor=request.user, membership=membership)
    except ValidationError as exc:
        messages.error(request, _messages_of(exc))
    else:
        messages.success(request, f"{username} removed from {membership.tenant.name}.")
    return redirect("frontend:members")
