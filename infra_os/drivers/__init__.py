"""BMC drivers, looked up by name (`Bmc.driver`) in `settings.OGAI_BMC_DRIVERS`."""

from __future__ import annotations

from infra_os.drivers.base import BmcAccess, BmcDriver, BmcError, BmcErrorKind

__all__ = ["BmcAccess", "BmcDriver", "BmcError", "BmcErrorKind", "get_bmc_driver"]


def get_bmc_driver(name: str, access: BmcAccess) -> BmcDriver:
    from django.conf import settings
    from django.utils.module_loading import import_string

    known: dict[str, str] = settings.OGAI_BMC_DRIVERS
    if name not in known:
        raise BmcError(f"unknown BMC driver {name!r}; known: {', '.join(sorted(known))}",
                       kind=BmcErrorKind.REFUSED)
    cls = import_string(known[name])
    return cls(access, timeout_s=settings.OGAI_BMC_TIMEOUT_S, retries=settings.OGAI_BMC_RETRIES)
