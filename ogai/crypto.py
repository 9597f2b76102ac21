"""Secrets at rest (cluster credentials): Fernet (AES-128-CBC with HMAC-SHA256) from the
`cryptography` package. The key is OGAI_ENCRYPTION_KEY when set (a Fernet key: rotate by setting
the new key first in the list, comma-separated, old ones after), else derived from SECRET_KEY."""

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class DecryptionError(Exception):
    """A secret cannot be read with the configured keys (the key changed?)."""


def _fernet() -> MultiFernet:
    keys = [k.strip() for k in settings.OGAI_ENCRYPTION_KEY.split(",") if k.strip()]
    if not keys:
        digest = hashlib.sha256(f"ogai-secrets:{settings.SECRET_KEY}".encode()).digest()
        keys = [base64.urlsafe_b64encode(digest).decode()]
    return MultiFernet([Fernet(key) for key in keys])


def encrypt(text: str) -> str:
    return _fernet().encrypt(text.encode()).decode() if text else ""


def decrypt(token: str) -> str:
    if not token:
        return ""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise DecryptionError(
            "a stored secret cannot be decrypted with OGAI_ENCRYPTION_KEY (or SECRET_KEY); "
            "set the key it was written with, or register the credentials again") from None
