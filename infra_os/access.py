"""The rule of isolation, written once.

Every selector scopes its queryset with `scope_to_user`; every service that changes a tenant's
resources calls `require_role` (or `require_platform_admin`). Platform admins (Django staff) see
and change everything; other users see their tenants' rows only, and a viewer changes nothing.
"""

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as DjangoUser
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404

from infra_os.choices import WRITE_ROLES, Role
from infra_os.models import Membership, Tenant

User = DjangoUser | AnonymousUser
_ROLES_MEMO = "_ogai_roles"


def is_platform_admin(user: User) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def member_tenant_ids(user: User) -> QuerySet:
    """A subquery of the tenants the user belongs to (with any role)."""
    if not user.is_authenticated:
        return Membership.objects.none().values("tenant_id")
    return Membership.objects.filter(user=user, tenant__is_active=True).values("tenant_id")


def scope_to_user(queryset: QuerySet, user: User, *, tenant_field: str = "tenant") -> QuerySet:
    """Rows of `queryset` the user may see. `tenant_field` is the path from the row to its tenant
    ("pk" when the rows are tenants)."""
    if not user.is_authenticated:
        return queryset.none()
    if is_platform_admin(user):
        return queryset
    lookup = "pk__in" if tenant_field == "pk" else f"{tenant_field}__in"
    return queryset.filter(**{lookup: member_tenant_ids(user)})


def role_in(user: User, tenant: Tenant | int) -> Role | None:
    """The user's role in the tenant. Remembered on the user object, as Django remembers
    permissions, so one request asks the database once per tenant however often it checks."""
    if not user.is_authenticated:
        return None
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    roles = user.__dict__.setdefault(_ROLES_MEMO, {})
    if tenant_id not in roles:
        found = Membership.objects.filter(user=user, tenant_id=tenant_id).values_list("role")
        roles[tenant_id] = Role(found[0][0]) if found else None
    return roles[tenant_id]


def forget_roles(user: User) -> None:
    """Drop the remembered roles (after memberships change)."""
    user.__dict__.pop(_ROLES_MEMO, None)


def can_write_somewhere(user: User) -> bool:
    if is_platform_admin(user):
        return True
    if not user.is_authenticated:
        return False
    return Membership.objects.filter(
        user=user, role__in=WRITE_ROLES, tenant__is_active=True
    ).exists()


def require_role(user: User, tenant: Tenant, roles: frozenset[Role] = WRITE_ROLES) -> None:
    if is_platform_admin(user):
        return
    role = role_in(user, tenant)
    if role is None:
        # Not a member: behave as if the tenant did not exist.
        raise Http404("No such tenant.")
    if role not in roles:
        wanted = " or ".join(sorted(Role(r).label.lower() for r in roles))
        raise PermissionDenied(
            f"Your role in {tenant.name} is {role.label.lower()}; this needs {wanted}."
        )


def require_platform_admin(user: User) -> None:
    if not is_platform_admin(user):
        raise PermissionDenied("Only a platform admin can do this.")
