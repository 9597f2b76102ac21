"""Cluster drivers, looked up by name like Django's cache backends.

`get_driver` keeps one instance per (cluster, driver, options) in the process, so every caller
in a process talks to the same cluster state (the fake cluster's, above all).
"""

from __future__ import annotations

import json
import sys
import threading

from podsys.drivers.base import ClusterDriver, DriverError

__all__ = ["ClusterDriver", "DriverError", "driver_class", "get_driver", "reset_drivers"]

_drivers: dict[tuple[str, str, str], ClusterDriver] = {}
_lock = threading.Lock()


def _driver_path(driver: str) -> str:
    # Imported here, not at module level: `python -m podsys.drivers.local_supervisor` imports
    # this package in every replica and must stay light.
    from django.conf import settings

    known: dict[str, str] = getattr(settings, "OGAI_CLUSTER_DRIVERS", {})
    if driver in known:
        return known[driver]
    if "." in driver:
        return driver
    names = ", ".join(sorted(known)) or "none"
    raise DriverError(f"unknown cluster driver {driver!r}; known drivers: {names}")


def _driver_class(path: str) -> type[ClusterDriver]:
    from django.utils.module_loading import import_string

    try:
        cls = import_string(path)
    except ImportError as exc:
        raise DriverError(f"cannot import cluster driver {path!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, ClusterDriver)):
        raise DriverError(f"{path!r} is not a ClusterDriver")
    return cls


def driver_class(driver: str) -> type[ClusterDriver]:
    """The class of the driver named `driver` (a name or a dotted path), for what it says of
    every cluster it drives (`assigns_ports`, `unsupported`)."""
    return _driver_class(_driver_path(driver))


def get_driver(*, cluster: str, driver: str, options: dict | None = None) -> ClusterDriver:
    """The process-wide driver instance of `cluster`; `driver` is a name from
    settings.OGAI_CLUSTER_DRIVERS or a dotted path."""
    path = _driver_path(driver)
    key = (cluster, path, json.dumps(options or {}, sort_keys=True, default=str))
    with _lock:
        instance = _drivers.get(key)
        if instance is None:
            instance = _driver_class(path)(cluster=cluster, options=dict(options or {}))
            _drivers[key] = instance
        return instance


def reset_drivers() -> None:
    """Forget every cached instance and stop every cluster watch of this process (for tests:
    no watch thread outlives its test, nor its fake API server)."""
    with _lock:
        _drivers.clear()
    watches = sys.modules.get("podsys.drivers.kube_watch")  # loaded only where used
    if watches is not None:
        watches.stop_all()
