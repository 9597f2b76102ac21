"""Invitations: how a tenant admin brings a person into a tenant. The person joins only by
accepting; platform admins may still add an account directly (`membership_create`)."""

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone

from infra_os.access import forget_roles, require_role
from infra_os.choices import ADMIN_ROLES, InvitationState, Role
from infra_os.models import Invitation, Membership, Tenant
from infra_os.services.audit import audit_record


@transaction.atomic
def invitation_create(*, actor, tenant: Tenant, username: str,
                      role: str = Role.MEMBER) -> Invitation:
    """Invite the account `username` to `tenant` with `role`. The answer is the same whether
    the name is an account, free or in another tenant, or no account at all: nothing here
    looks accounts up."""
    require_role(actor, tenant, ADMIN_ROLES)
    username = username.strip()
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError as exc:
        raise ValidationError({"username": exc.messages}) from None
    # The tenant's own members are no secret to its admin.
    if Membership.objects.filter(tenant=tenant, user__username=username).exists():
        raise ValidationError({"username": f"{username} is already a member of {tenant.name}."})
    now = timezone.now()
    waiting = Invitation.objects.select_for_update().filter(
        tenant=tenant, username=username, state=InvitationState.PENDING)
    if waiting.filter(expires_at__gt=now).exists():
        raise ValidationError(
            {"username": f"{username} already has a pending invitation to {tenant.name}."})
    waiting.update(state=InvitationState.EXPIRED, updated_at=now)
    invitation = Invitation(
        tenant=tenant, username=username, role=role, invited_by=actor,
        expires_at=now + timedelta(days=settings.OGAI_INVITATION_DAYS),
    )
    invitation.full_clean(validate_constraints=False)
    try:
        with transaction.atomic():
            invitation.save()
    except IntegrityError:  # another admin invited the same name at the same moment
        raise ValidationError(
            {"username": f"{username} already has a pending invitation to {tenant.name}."}
        ) from None
    audit_record(actor=actor, action="invitation.create", obj=invitation, tenant=tenant,
                 changes={"username": username, "role": role,
                          "expires_at": invitation.expires_at.isoformat()})
    return invitation


def _addressed_to(actor, invitation: Invitation) -> Invitation:
    """The invitation, locked, if it is the actor's own; anyone else is told it does not exist
    (the tenant's admins too: they see it, but only its addressee answers it)."""
    if not (actor.is_authenticated and invitation.username == actor.get_username()):
        raise Http404("No such invitation.")
    return Invitation.objects.select_for_update().select_related("tenant").get(pk=invitation.pk)


def _answered(invitation: Invitation) -> ValidationError:
    state = invitation.get_state_display().lower()
    return ValidationError(f"This invitation was already {state}.")


def _still_open(invitation: Invitation) -> None:
    if invitation.state != InvitationState.PENDING:
        raise _answered(invitation)
    if invitation.is_expired:
        expired = timezone.localtime(invitation.expires_at)
        raise ValidationError(
            f"This invitation expired on {expired:%Y-%m-%d %H:%M %Z}; ask an admin of "
            f"{invitation.tenant.name} to invite you again.")


@transaction.atomic
def invitation_accept(*, actor, invitation: Invitation) -> Membership:
    """Join the tenant with the invited role."""
    invitation = _addressed_to(actor, invitation)
    _still_open(invitation)
    tenant = invitation.tenant
    if Membership.objects.filter(tenant=tenant, user=actor).exists():
        raise ValidationError(f"You are already a member of {tenant.name}.")
    membership = Membership(tenant=tenant, user=actor, role=invitation.role)
    membership.full_clean()
    membership.save()
    invitation.state = InvitationState.ACCEPTED
    invitation.responded_at = timezone.now()
    invitation.save(update_fields=["state", "responded_at", "updated_at"])
    audit_record(actor=actor, action="invitation.accept", obj=invitation, tenant=tenant,
                 changes={"username": invitation.username, "role": invitation.role})
    audit_record(actor=actor, action="membership.create", obj=membership, tenant=tenant,
                 changes={"user": invitation.username, "role": invitation.role,
                          "invitation": invitation.pk})
    forget_roles(actor)
    return membership


@transaction.atomic
def invitation_decline(*, actor, invitation: Invitation) -> Invitation:
    invitation = _addressed_to(actor, invitation)
    if invitation.state != InvitationState.PENDING:
        raise _answered(invitation)
    invitation.state = InvitationState.DECLINED
    invitation.responded_at = timezone.now()
    invitation.save(update_fields=["state", "responded_at", "updated_at"])
    audit_record(actor=actor, action="invitation.decline", obj=invitation,
                 tenant=invitation.tenant,
                 changes={"username": invitation.username, "role": invitation.role})
    return invitation


@transaction.atomic
def invitation_revoke(*, actor, invitation: Invitation) -> Invitation:
    """A tenant admin withdraws a pending invitation."""
    require_role(actor, invitation.tenant, ADMIN_ROLES)
    invitation = Invitation.objects.select_for_update().select_related("tenant") \
        .get(pk=invitation.pk)
    if invitation.state != InvitationState.PENDING:
        raise _answered(invitation)
    invitation.state = InvitationState.REVOKED
    invitation.responded_at = timezone.now()
    invitation.save(update_fields=["state", "responded_at", "updated_at"])
    audit_record(actor=actor, action="invitation.revoke", obj=invitation,
                 tenant=invitation.tenant,
                 changes={"username": invitation.username, "role": invitation.role})
    return invitation
