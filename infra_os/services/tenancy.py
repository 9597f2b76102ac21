"""Tenants and their members."""

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from infra_os.access import (
    forget_roles,
    is_platform_admin,
    require_platform_admin,
    require_role,
)
from infra_os.choices import ADMIN_ROLES, Role
from infra_os.models import Membership, Quota, Tenant
from infra_os.services.audit import audit_record
from ogai.models import assign_changes

TENANT_FIELDS = ("display_name", "description", "is_active", "log_retention_days")
# What only platform admins change: whether the tenant is active, and how long the log store
# keeps its jobs' output (it counts against the storage the centre provides).
OPERATOR_FIELDS = ("is_active", "log_retention_days")
DIRECT_ADD_REFUSED = (
    "Tenant admins add people by invitation: invite them, and they join when they accept. "
    "Only a platform admin adds an account to a tenant directly."
)


def _validated(instance) -> None:
    instance.full_clean()


@transaction.atomic
def tenant_create(
    *,
    actor,
    name: str,
    display_name: str = "",
    description: str = "",
    gpus: int = 0,
    cpu_cores: int = 0,
    memory_gib: int = 0,
    storage_gib: int = 0,
    log_retention_days: int | None = None,
) -> Tenant:
    require_platform_admin(actor)
    tenant = Tenant(name=name, display_name=display_name, description=description)
    if log_retention_days is not None:
        tenant.log_retention_days = log_retention_days
    _validated(tenant)
    tenant.save()
    quota = Quota(
        tenant=tenant, gpus=gpus, cpu_cores=cpu_cores, memory_gib=memory_gib,
        storage_gib=storage_gib,
    )
    _validated(quota)
    quota.save()
    audit_record(
        actor=actor, action="tenant.create", obj=tenant, tenant=tenant,
        changes={"name": name, "gpus": gpus, "cpu_cores": cpu_cores,
                 "log_retention_days": tenant.log_retention_days},
    )
    return tenant


@transaction.atomic
def tenant_update(*, actor, tenant: Tenant, **fields) -> Tenant:
    require_role(actor, tenant, ADMIN_ROLES)
    if any(field in fields for field in OPERATOR_FIELDS):
        require_platform_admin(actor)
    changes = assign_changes(tenant, fields, allowed=TENANT_FIELDS)
    if changes:
        _validated(tenant)
        tenant.save()
        audit_record(actor=actor, action="tenant.update", obj=tenant, tenant=tenant,
                     changes=changes)
    return tenant


@transaction.atomic
def tenant_delete(*, actor, tenant: Tenant) -> None:
    require_platform_admin(actor)
    audit_record(actor=actor, action="tenant.delete", obj=tenant, tenant=None,
                 changes={"name": tenant.name})
    tenant.delete()


def _admin_count(tenant: Tenant) -> int:
    return Membership.objects.filter(tenant=tenant, role=Role.ADMIN).count()


@transaction.atomic
def membership_create(
    *,
    actor,
    tenant: Tenant,
    username: str,
    role: str = Role.MEMBER,
    email: str = "",
    password: str = "",
) -> Membership:
    """Add a user to a tenant directly: platform admins only. A username that does not exist
    yet is created as a new account when a password is given. Tenant admins invite instead
    (`invitation_create`): the person joins by accepting."""
    require_role(actor, tenant, ADMIN_ROLES)
    if not is_platform_admin(actor):
        # Refused before any account is looked up, in words that name no account: a free name,
        # another tenant's member and a name that is no account get the same answer.
        raise PermissionDenied(DIRECT_ADD_REFUSED)
    user_model = get_user_model()
    user = user_model.objects.filter(username=username).first()
    if user is None:
        if not password:
            raise ValidationError(
                {"username": f"No user named {username!r}: give a password to create one."}
            )
        user = user_model(username=username, email=email)
        try:
            user.full_clean(exclude=["password"])
            validate_password(password, user)
        except ValidationError as exc:
            errors = exc.message_dict if hasattr(exc, "error_dict") else {"password": exc.messages}
            raise ValidationError(errors) from None
        user.set_password(password)
        user.save()
        audit_record(actor=actor, action="user.create", obj=user, tenant=tenant)
    elif password:
        raise ValidationError(
            {"password": f"{username} already has an account: leave the password empty."}
        )
    if Membership.objects.filter(tenant=tenant, user=user).exists():
        raise ValidationError({"username": f"{username} is already a member of {tenant.name}."})
    membership = Membership(tenant=tenant, user=user, role=role)
    _validated(membership)
    membership.save()
    audit_record(actor=actor, action="membership.create", obj=membership, tenant=tenant,
                 changes={"user": username, "role": role})
    forget_roles(actor)
    return membership


@transaction.atomic
def membership_update(*, actor, membership: Membership, role: str) -> Membership:
    require_role(actor, membership.tenant, ADMIN_ROLES)
    membership = Membership.objects.select_for_update().get(pk=membership.pk)
    if membership.role == Role.ADMIN and role != Role.ADMIN and _admin_count(
        membership.tenant
    ) == 1:
        raise ValidationError({"role": "A tenant keeps at least one tenant admin."})
    previous = membership.role
    membership.role = role
    _validated(membership)
    membership.save(update_fields=["role", "updated_at"])
    audit_record(actor=actor, action="membership.update", obj=membership,
                 tenant=membership.tenant, changes={"role": {"from": previous, "to": role}})
    forget_roles(actor)
    return membership


@transaction.atomic
def membership_delete(*, actor, membership: Membership) -> None:
    require_role(actor, membership.tenant, ADMIN_ROLES)
    if membership.role == Role.ADMIN and _admin_count(membership.tenant) == 1:
        raise ValidationError({"role": "A tenant keeps at least one tenant admin."})
    audit_record(actor=actor, action="membership.delete", obj=membership,
                 tenant=membership.tenant, changes={"user": membership.user.get_username()})
    membership.delete()
    forget_roles(actor)
