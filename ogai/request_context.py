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


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def client_ip(request) -> str | None:
    """The address of whoever sent the request: the one rule for the audit log, the sign-in
    throttle, /metrics and provisioning callbacks.

    X-Forwarded-For is believed only when OGAI_USE_X_FORWARDED_FOR is on and the connection
    comes from one of OGAI_TRUSTED_PROXIES. It is then read from its right end, the part the
    proxies appended, skipping the trusted proxies' own addresses: the first other address is
    the client. Whatever a client wrote into the header itself lies to the left and is never
    reached, so a spoofed header changes nothing.
    """
    remote = request.META.get("REMOTE_ADDR") or None
    trusted = settings.OGAI_TRUSTED_PROXIES
    if not settings.OGAI_USE_X_FORWARDED_FOR or not in_networks(remote, trusted):
        return remote
    client = remote
    for hop in reversed(request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")):
        hop = hop.strip()
        if not _is_ip(hop):
            break  # garbage: keep the last address a trusted hop vouched for
        client = hop
        if not in_networks(hop, trusted):
            break
    return client


class RequestContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = source_ip.set(client_ip(request))
        try:
            return self.get_response(request)
        finally:
            source_ip.reset(token)
