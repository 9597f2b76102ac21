"""Reading settings from the environment (12-factor): one helper per type, one error wording."""

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use true or false.")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number.") from None


def env_float_or_none(name: str) -> float | None:
    """A number, or None when unset (the code's own default applies)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from None


def env_floats_or_none(name: str) -> tuple[float, ...] | None:
    """Comma-separated numbers, or None when unset."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return tuple(float(item) for item in raw.split(",") if item.strip())
    except ValueError:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a comma-separated list of numbers.") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def persistent_secret_key(data_dir: Path) -> str:
    """A key generated on first run and kept in the data directory, readable by its owner only."""
    path = data_dir / "secret_key"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key


def private_path(path: Path, *, folder: bool) -> Path:
    """Make `path` (a folder, else a file) if missing, readable by its owner only (0700 / 0600),
    and tighten it to that when this process owns it: the data directory holds the database,
    the secret key and every tenant's files."""
    mode = 0o700 if folder else 0o600
    if folder:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
    elif not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, mode))
    try:
        if path.stat().st_uid == os.geteuid() and path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)
    except OSError:
        pass  # someone else's (a volume's root): its owner decides
    return path
