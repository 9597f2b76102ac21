"""Who is calling: an API token (`Authorization: Bearer ogai_...`) or, for the console's
playground, the Django session cookie (with Django's CSRF rules for unsafe methods).

What a credential resolves to (its user, token and tenants) is cached in this process for
`CACHE_S` seconds, so the hot path makes no database query: a token revoked (or a session
ended, a membership removed) may still pass for up to that long in each web process. A token's
expiry is honoured exactly (the entry never outlives it)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from importlib import import_module
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from mmodel.gateway.db import run_db
from mmodel.gateway.errors import GatewayError, invalid_api_key

CACHE_S = 5.0
# An unknown credential is remembered for less long (it may be a token just created).
NEGATIVE_CACHE_S = 1.0
MAX_ENTRIES = 50_000


@dataclass(frozen=True, slots=True)
class Caller:
    user_id: int
    token_id: int | None  # None: signed in through the session
    tenant_ids: frozenset[int]
    # Per-caller rate limits count under this key: the token, or the user for sessions.
    limit_key: str
    # The tenants whose models the caller may call (a role of MODEL_CALL_ROLES there); in the
    # others of `tenant_ids` it only sees them.
    call_tenant_ids: frozenset[int] = frozenset()


@dataclass
class _SessionHolder:
    """Just enough of a request for `django.contrib.auth.get_user`."""

    session: Any


class _Cache:
    def __init__(self) -> None:
        self.entries: dict[str, tuple[float, Caller | None]] = {}
        self.pending: dict[str, asyncio.Future] = {}

    async def get(self, key: str, load) -> Caller | None:
        now = time.monotonic()
        entry = self.entries.get(key)
        if entry is not None and entry[0] > now:
            return entry[1]
        # Concurrent first requests with one credential share one look-up.
        future = self.pending.get(key)
        loop = asyncio.get_running_loop()
        if future is None or future.get_loop() is not loop:
            future = loop.create_future()
            self.pending[key] = future
            try:
                caller, ttl = await run_db(load, key)
            except BaseException as exc:
                self.pending.pop(key, None)
                future.set_exception(exc)
                future.exception()  # retrieved: waiters (if any) re-raise it
                raise
            if len(self.entries) >= MAX_ENTRIES:
                self.entries = {k: v for k, v in self.entries.items() if v[0] > now}
                if len(self.entries) >= MAX_ENTRIES:
                    self.entries.clear()
            self.entries[key] = (time.monotonic() + ttl, caller)
            self.pending.pop(key, None)
            future.set_result(caller)
            return caller
        return await asyncio.shield(future)

    def clear(self) -> None:
        self.entries.clear()


_tokens = _Cache()
_sessions = _Cache()


def forget_credentials() -> None:
    """Drop every cached credential (tests; an operator's emergency revoke needs a restart or
    `CACHE_S` seconds otherwise)."""
    _tokens.clear()
    _sessions.clear()


def _tenant_ids(user_id: int) -> tuple[frozenset[int], frozenset[int]]:
    """The user's tenants, and those of them where their role may call models."""
    from infra_os.choices import MODEL_CALL_ROLES
    from infra_os.models import Membership

    rows = list(Membership.objects.filter(user_id=user_id, tenant__is_active=True)
                .values_list("tenant_id", "role"))
    return (frozenset(tenant for tenant, _ in rows),
            frozenset(tenant for tenant, role in rows if role in MODEL_CALL_ROLES))


def _load_token(secret: str) -> tuple[Caller | None, float]:
    from django.utils import timezone

    from infra_os.services.tokens import api_token_authenticate

    token = api_token_authenticate(secret)
    if token is None:
        return None, NEGATIVE_CACHE_S
    ttl = CACHE_S
    if token.expires_at is not None:
        ttl = min(ttl, (token.expires_at - timezone.now()).total_seconds())
    seen, callable_ = _tenant_ids(token.user_id)
    caller = Caller(user_id=token.user_id, token_id=token.pk, tenant_ids=seen,
                    limit_key=f"t{token.pk}", call_tenant_ids=callable_)
    return caller, max(ttl, 0.0)


def _load_session(session_key: str) -> tuple[Caller | None, float]:
    from django.contrib.auth import get_user

    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(_SessionHolder(session=store))  # type: ignore[arg-type]
    if not user.is_authenticated:
        return None, NEGATIVE_CACHE_S
    seen, callable_ = _tenant_ids(user.pk)
    return Caller(user_id=user.pk, token_id=None, tenant_ids=seen, limit_key=f"u{user.pk}",
                  call_tenant_ids=callable_), CACHE_S


def cookies_of(header: str) -> dict[str, str]:
    cookies: dict[str, str] = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name and name not in cookies:
            cookies[name] = value
    return cookies


def _csrf_header_name() -> bytes:
    name = settings.CSRF_HEADER_NAME  # "HTTP_X_CSRFTOKEN"
    return name.removeprefix("HTTP_").lower().replace("_", "-").encode("latin-1")


def _origin_allowed(origin: str, host: str) -> bool:
    """This very host, or one of `CSRF_TRUSTED_ORIGINS` (wildcards as Django reads them)."""
    if not origin or origin == "null":
        return False
    if host and urlsplit(origin).netloc.lower() == host.lower():
        return True
    for trusted in getattr(settings, "CSRF_TRUSTED_ORIGINS", []):
        if trusted == origin:
            return True
        scheme, _, pattern = trusted.partition("://")
        if (pattern.startswith("*.") and origin.startswith(f"{scheme}://")
                and origin.split("://", 1)[1].lower().endswith(pattern[1:].lower())):
            return True
    return False


def _csrf_matches(sent: str, cookie: str) -> bool:
    from django.middleware.csrf import (
        CSRF_TOKEN_LENGTH,
        InvalidTokenFormat,
        _check_token_format,
        _does_token_match,
        _unmask_cipher_token,
    )

    try:
        _check_token_format(cookie)
        _check_token_format(sent)
    except InvalidTokenFormat:
        return False
    secret = _unmask_cipher_token(cookie) if len(cookie) == CSRF_TOKEN_LENGTH else cookie
    return _does_token_match(sent, secret)


def check_csrf(headers: dict[bytes, str], cookies: dict[str, str]) -> None:
    """An unsafe request made with the session: same-origin `Origin` and the CSRF token header
    matching the CSRF cookie, as Django's middleware would ask of a form post."""
    if not _origin_allowed(headers.get(b"origin", ""), headers.get(b"host", "")):
        raise GatewayError(403, "CSRF check failed: cross-origin or missing Origin header.",
                           code="csrf_failed")
    sent = headers.get(_csrf_header_name(), "")
    cookie = cookies.get(settings.CSRF_COOKIE_NAME, "")
    if not sent or not cookie or not _csrf_matches(sent, cookie):
        raise GatewayError(403, "CSRF check failed: send the X-CSRFToken header with the value "
                           "of the csrftoken cookie.", code="csrf_failed")


async def authenticate(headers: dict[bytes, str], *, unsafe: bool) -> Caller:
    """The caller of a request whose interesting headers are `headers`; or GatewayError."""
    authorization = headers.get(b"authorization")
    if authorization is not None:
        scheme, _, secret = authorization.partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise invalid_api_key()
        caller = await _tokens.get(secret, _load_token)
        if caller is None:
            raise invalid_api_key()
        return caller
    cookie_header = headers.get(b"cookie")
    if cookie_header:
        cookies = cookies_of(cookie_header)
        session_key = cookies.get(settings.SESSION_COOKIE_NAME)
        if session_key:
            caller = await _sessions.get(session_key, _load_session)
            if caller is not None:
                if unsafe:
                    check_csrf(headers, cookies)
                return caller
    raise invalid_api_key("You didn't provide an API key: send `Authorization: Bearer "
                          "<API token>` (create one in the console under API tokens).")


def interesting_headers() -> frozenset[bytes]:
    return frozenset({b"authorization", b"cookie", b"origin", b"host", _csrf_header_name()})
