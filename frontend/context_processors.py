from django.utils.functional import SimpleLazyObject

from frontend.access import console_access, current_tenant
from frontend.navigation import navigation
from infra_os.selectors import tenants_for_switcher


def console(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    # Lazy, so a partial that shows none of the chrome costs no queries for it.
    return {
        "nav_sections": SimpleLazyObject(lambda: navigation(request)),
        "switcher_tenants": tenants_for_switcher(user=user),
        "current_tenant": current_tenant(request),
        "access": SimpleLazyObject(lambda: console_access(request)),
    }
