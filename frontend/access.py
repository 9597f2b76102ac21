"""What the signed-in user may do in the current tenant, worked out once per request.

Templates use it only to hide controls the services would refuse; the services still decide.
"""

from dataclasses import dataclass

from infra_os.access import is_platform_admin, role_in
from infra_os.choices import ADMIN_ROLES, WRITE_ROLES, Role
from infra_os.models import Tenant
from infra_os.selectors import tenants_for_switcher

# The session key holding the name of the tenant picked in the switcher.
SESSION_KEY = "ogai_tenant"
_UNSET = object()


@dataclass(frozen=True)
class ConsoleAccess:
    platform_admin: bool
    role: Role | None

    @property
    def can_write(self) -> bool:
        return self.platform_admin or self.role in WRITE_ROLES

    @property
    def can_admin(self) -> bool:
        return self.platform_admin or self.role in ADMIN_ROLES

    @property
    def role_label(self) -> str:
        if self.platform_admin:
            return "Platform admin"
        return self.role.label if self.role is not None else ""


def current_tenant(request) -> Tenant | None:
    """The tenant the console shows: the one picked in the switcher if the user still sees it,
    else the first the user belongs to (None for a user without tenants). Worked out once per
    request."""
    cached = getattr(request, "_ogai_tenant", _UNSET)
    if cached is not _UNSET:
        return cached
    tenant = None
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        visible = tenants_for_switcher(user=user)
        chosen = request.session.get(SESSION_KEY)
        tenant = visible.filter(name=chosen).first() if chosen else None
        if tenant is None:
            tenant = visible.filter(memberships__user=user).first() or visible.first()
    request._ogai_tenant = tenant
    return tenant


def console_access(request) -> ConsoleAccess:
    cached = getattr(request, "_console_access", None)
    if cached is None:
        tenant = current_tenant(request)
        cached = ConsoleAccess(
            platform_admin=is_platform_admin(request.user),
            role=role_in(request.user, tenant) if tenant else None,
        )
        request._console_access = cached
    return cached
