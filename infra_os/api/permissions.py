"""The one DRF permission of tenant-owned resources. Views declare who may write:

- `write_roles`: tenant roles allowed to change an object (default: tenant admin and member);
- `platform_admin_actions`: actions only platform admins may take;
- `tenant_field`: the path from an object to its tenant ("pk" for tenants, None for rows that
  belong to a user rather than a tenant).

Reads need no more than authentication, because every queryset is already scoped: an object of
another tenant is not found (404) before any permission is asked.
"""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from infra_os.access import can_write_somewhere, is_platform_admin, role_in
from infra_os.choices import WRITE_ROLES


def _tenant_id_of(obj, path: str) -> int:
    if path == "pk":
        return obj.pk
    for part in path.split("__")[:-1]:
        obj = getattr(obj, part)
    return getattr(obj, f"{path.split('__')[-1]}_id")


class TenantRolePermission(BasePermission):
    message = "Your role does not allow this change."

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if request.method in SAFE_METHODS:
            return True
        if is_platform_admin(user):
            return True
        action = getattr(view, "action", None)
        if action in getattr(view, "platform_admin_actions", ()) and not view.detail:
            self.message = "Only a platform admin can do this."
            return False
        if getattr(view, "action", None) in getattr(view, "viewer_actions", ()):
            return True
        if not can_write_somewhere(user):
            self.message = "Viewers can read but not change anything."
            return False
        return True

    def has_object_permission(self, request, view, obj) -> bool:
        if request.method in SAFE_METHODS or is_platform_admin(request.user):
            return True
        if getattr(view, "action", None) in getattr(view, "platform_admin_actions", ()):
            # Checked only now, after the object was found: another tenant's object is a 404.
            self.message = "Only a platform admin can do this."
            return False
        path = getattr(view, "tenant_field", "tenant")
        if path is None:
            return True
        role = role_in(request.user, _tenant_id_of(obj, path))
        allowed = getattr(view, "write_roles", WRITE_ROLES)
        if role not in allowed:
            self.message = "Your role in this tenant does not allow this change."
            return False
        return True
