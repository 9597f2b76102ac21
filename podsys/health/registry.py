"""The health checks this platform runs, by name, from OGAI_HEALTH_CHECKS ({name: dotted path
to a `HealthCheck` class}), loaded like the cluster drivers."""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from podsys.health.checks import HealthCheck

# A check's name becomes part of a node label (`ogai.io/health-<name>`) and a label value.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,46}[a-z0-9])?$")

_cache: tuple[tuple, dict[str, HealthCheck]] | None = None


def _load(configured: dict[str, str]) -> dict[str, HealthCheck]:
    checks: dict[str, HealthCheck] = {}
    for name, path in configured.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ImproperlyConfigured(
                f"OGAI_HEALTH_CHECKS: {name!r} is not a valid check name (lower-case letters, "
                "digits and '-', at most 48 characters)")
        try:
            cls = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"OGAI_HEALTH_CHECKS[{name!r}]: cannot import {path!r}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, HealthCheck)):
            raise ImproperlyConfigured(
                f"OGAI_HEALTH_CHECKS[{name!r}]: {path!r} is not a HealthCheck class")
        checks[name] = cls(name)
    return checks


def health_checks() -> dict[str, HealthCheck]:
    """{name: check}, in the order of the setting; loaded again when the setting changes."""
    global _cache
    configured = dict(settings.OGAI_HEALTH_CHECKS)
    key = tuple(configured.items())
    if _cache is None or _cache[0] != key:
        _cache = (key, _load(configured))
    return _cache[1]
