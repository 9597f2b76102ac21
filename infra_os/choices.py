from django.db import models


class Role(models.TextChoices):
    ADMIN = "admin", "Tenant admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


# Roles allowed to change a tenant's resources; a viewer only reads.
WRITE_ROLES = frozenset({Role.ADMIN, Role.MEMBER})
ADMIN_ROLES = frozenset({Role.ADMIN})
