"""Personal API tokens: `ogai_<prefix>_<secret>`, looked up by prefix, compared by SHA-256."""

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from infra_os.models import ApiToken
from infra_os.services.audit import audit_record

TOKEN_SCHEME = "ogai"
MAX_LIFETIME = timedelta(days=366)
# Write last_used_at at most this often, so a busy client does not write on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def api_token_create(*, actor, name: str, expires_at: datetime | None) -> IssuedToken:
    # Any signed-in user may hold tokens: a token acts with its owner's roles, so a viewer's
    # token reads and changes nothing.
    now = timezone.now()
    if not name.strip():
        raise ValidationError({"name": "Give the token a name."})
    if expires_at is not None and expires_at <= now:
        raise ValidationError({"expires_at": "The expiry must be in the future."})
    if expires_at is not None and expires_at > now + MAX_LIFETIME:
        raise ValidationError({"expires_at": "A token lives at most 366 days."})
    prefix = secrets.token_hex(6)
    secret = f"{TOKEN_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        user=actor, name=name.strip(), prefix=prefix, key_hash=_hash(secret),
        expires_at=expires_at,
    )
    audit_record(actor=actor, action="api_token.create", obj=token,
                 changes={"name": token.name, "expires_at": expires_at.isoformat()
                          if expires_at else None})
    return IssuedToken(token=token, secret=secret)


@transaction.atomic
def api_token_revoke(*, actor, token: ApiToken) -> ApiToken:
    # Anyone may revoke their own credentials, whatever their role.
    if token.user_id != actor.pk and not actor.is_staff:
        raise PermissionDenied("You can revoke only your own tokens.")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action="api_token.revoke", obj=token,
                     changes={"name": token.name, "owner": token.user.get_username()})
    return token


def api_token_authenticate(secret: str) -> ApiToken | None:
    """The active token matching `secret`, or None. Marks it used."""
    parts = secret.split("_")
    if len(parts) < 3 or parts[0] != TOKEN_SCHEME:
        return None
    token = ApiToken.objects.select_related("user").filter(prefix=parts[1]).first()
    if token is None or not hmac.compare_digest(token.key_hash, _hash(secret)):
        return None
    if not token.is_active or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
