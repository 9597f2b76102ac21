"""Who is asking and from where, for the audit log, without passing the request into services.

The middleware sets it for each web request; Celery tasks and management commands leave it empty.
"""

import ipaddress
from contextvars import ContextVar

from django.conf import settings

source_ip: ContextVar[str | None] = ContextVar("ogai_source_ip", default=None)


def in_networks(address: str | None, networks: list[str]) -> bool:
    """Whether `address` (an IP, as `client_ip` gives it) lies in one of `networks` (CIDRs)."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(net, strict=False) for net in networks)


def client_ip(request) -> str | None:
    if settings.OGAI_USE_X_FORWARDED_FOR:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        if forwarded:
            return forwarded.split(",")[0].strip() or None
    return request.META.get("REMOTE_ADDR") or None


class RequestContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = source_ip.set(client_ip(request))
        try:
            return self.get_response(request)
        finally:
            source_ip.reset(token)
