"""OpenSSH public keys as an account's authorized_keys holds them: parsed and checked line by
line, so a pasted private key, a truncated body or a key OpenSSH would refuse is caught here
rather than on a node at login time."""

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

# The key types OpenSSH accepts in authorized_keys today (DSA is gone since OpenSSH 9.8).
KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
RSA_MIN_BITS = 2048
MAX_KEYS = 100
_PRIVATE_MARKERS = ("PRIVATE KEY", "PuTTY-User-Key-File", "SSH2 ENCRYPTED PRIVATE KEY")
# Ansible renders extra vars as templates: text that would be rendered never reaches a node.
TEMPLATE_MARKERS = ("{{", "{%", "{#")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


class PublicKeyError(ValueError):
    """A line that is not an acceptable public key; the message names the line."""


@dataclass(frozen=True)
class PublicKey:
    key_type: str
    body: str
    comment: str
    fingerprint: str  # as `ssh-keygen -l` prints it: SHA256:<base64, unpadded>

    @property
    def line(self) -> str:
        return f"{self.key_type} {self.body} {self.comment}".rstrip()


def _read_string(blob: bytes, offset: int) -> tuple[bytes, int]:
    if offset + 4 > len(blob):
        raise ValueError("truncated")
    (length,) = struct.unpack(">I", blob[offset:offset + 4])
    end = offset + 4 + length
    if end > len(blob):
        raise ValueError("truncated")
    return blob[offset + 4:end], end


def _check_blob(key_type: str, blob: bytes) -> None:
    """The decoded body must name the same key type and hold what that type needs."""
    inner_type, offset = _read_string(blob, 0)
    if inner_type.decode(errors="replace") != key_type:
        raise ValueError(f"the body is a {inner_type.decode(errors='replace')!r} key, "
                         f"not {key_type}")
    if key_type == "ssh-rsa":
        _exponent, offset = _read_string(blob, offset)
        modulus, offset = _read_string(blob, offset)
        bits = int.from_bytes(modulus, "big").bit_length()
        if bits < RSA_MIN_BITS:
            raise ValueError(f"an RSA key of {bits} bits is too weak; use at least "
                             f"{RSA_MIN_BITS} bits, or better an ed25519 key")
    elif key_type in ("ssh-ed25519", "sk-ssh-ed25519@openssh.com"):
        public, offset = _read_string(blob, offset)
        if len(public) != 32:
            raise ValueError("the ed25519 key is not 32 bytes long")
    else:  # ECDSA, plain or security-key: the curve name, then the point
        curve, offset = _read_string(blob, offset)
        if not key_type.split("@")[0].endswith(curve.decode(errors="replace")):
            raise ValueError(f"the curve {curve.decode(errors='replace')!r} does not match "
                             f"{key_type}")
        _point, offset = _read_string(blob, offset)
    if key_type.startswith("sk-"):
        _application, offset = _read_string(blob, offset)
    if offset != len(blob):
        raise ValueError("the body has bytes left over after the key")


def parse_public_key(line: str) -> PublicKey:
    """One key line: `type base64-body [comment]`."""
    parts = line.split(None, 2)
    key_type = parts[0]
    if key_type not in KEY_TYPES:
        if len(parts) > 1 and parts[1] in KEY_TYPES:
            raise PublicKeyError(f"starts with options ({key_type[:40]}); give the key alone, "
                            "without options")
        if key_type in ("ssh-dss", "ssh-dsa"):
            raise PublicKeyError("DSA keys are no longer accepted by OpenSSH; use an ed25519 key")
        if key_type.endswith("-cert-v01@openssh.com"):
            raise PublicKeyError("is a certificate; give the public key itself")
        raise PublicKeyError(f"{key_type[:40]!r} is not a public key type; use one of "
                        f"{', '.join(KEY_TYPES)}")
    if len(parts) < 2:
        raise PublicKeyError(f"has the key type {key_type} but no key after it")
    body = parts[1]
    comment = parts[2].strip() if len(parts) > 2 else ""
    if not _BASE64.match(body) or len(body) % 4:
        raise PublicKeyError(f"the {key_type} key's body is not base64 (cut short, or wrapped?)")
    try:
        blob = base64.b64decode(body, validate=True)
        _check_blob(key_type, blob)
    except (binascii.Error, ValueError, struct.error) as exc:
        detail = "it is cut short" if str(exc) == "truncated" else str(exc)
        raise PublicKeyError(f"the {key_type} key's body does not decode: {detail}") from None
    if any(marker in comment for marker in TEMPLATE_MARKERS):
        raise PublicKeyError("the comment may not contain '{{', '{%' or '{#'")
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return PublicKey(key_type, body, comment, f"SHA256:{digest}")


def parse_authorized_keys(text: str) -> list[PublicKey]:
    """Every key of `text`, one a line; blank lines and `#` comments are dropped, a key given
    twice is kept once. Raises PublicKeyError naming the first bad line."""
    if any(marker in text for marker in _PRIVATE_MARKERS):
        raise PublicKeyError("this is a private key; give the .pub")
    keys: list[PublicKey] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            key = parse_public_key(line)
        except PublicKeyError as exc:
            raise PublicKeyError(f"line {number}: {exc}") from None
        if key.fingerprint not in seen:
            seen.add(key.fingerprint)
            keys.append(key)
    if len(keys) > MAX_KEYS:
        raise PublicKeyError(f"{len(keys)} keys is more than the {MAX_KEYS} an account may have")
    return keys


def authorized_keys_text(keys: list[PublicKey]) -> str:
    """The normalised authorized_keys: one key a line, ending with a newline (empty: none)."""
    return "".join(f"{key.line}\n" for key in keys)


def fingerprints(text: str) -> list[str]:
    """The fingerprints of stored (already checked) keys; a line that no longer parses is
    left out rather than failing a page."""
    found = []
    for line in text.splitlines():
        try:
            found.append(parse_public_key(line.strip()).fingerprint)
        except (PublicKeyError, IndexError):
            continue
    return found
