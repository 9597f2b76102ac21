"""What the console views share about answering: page or partial, and where to go back to."""

from django.utils.http import url_has_allowed_host_and_scheme


def wants_partial(request) -> bool:
    """An htmx request for the table area; a history restore needs the whole page."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request


def safe_next(request, fallback: str = "") -> str:
    """The `next` the form sent (POST, else GET) when it stays on this site, else `fallback`."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    allowed = url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure())
    return target if target and allowed else fallback
