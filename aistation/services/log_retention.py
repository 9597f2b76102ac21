"""How long the log store keeps lines: each tenant's `log_retention_days`, whole UTC days.

Day d of a tenant is removed once d is more than its retention before today (a line is kept
at least that many full days). The platform's own lines, and lines of tenants since deleted,
keep OGAI_LOGS_PLATFORM_RETENTION_DAYS. Partitions every tenant is done with are dropped.
The same hourly task then runs the store's upkeep (`LogStore.maintain`).
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, timedelta

from django.conf import settings

from aistation.logstore.base import Expired
from aistation.logstore.config import get_store
from infra_os.models import Tenant

logger = logging.getLogger(__name__)


def retention_cutoffs(today: date) -> tuple[dict[int | None, date], date]:
    platform = today - timedelta(days=settings.OGAI_LOGS_PLATFORM_RETENTION_DAYS)
    cutoffs: dict[int | None, date] = {
        pk: today - timedelta(days=days)
        for pk, days in Tenant.objects.values_list("pk", "log_retention_days")}
    cutoffs[None] = platform
    return cutoffs, platform


def logs_expire(*, today: date | None = None) -> Expired:
    today = today or datetime.now(UTC).date()
    cutoffs, default = retention_cutoffs(today)
    expired = get_store().expire(cutoffs, default)
    if expired.days:
        logger.info("log retention removed %s lines: %s tenant-days, %s whole days dropped",
                    expired.lines, len(expired.days), len(expired.partitions))
    return expired


def logs_maintain() -> None:
    """The store's upkeep that keeps searches fast (PostgreSQL: its GIN pending lists merged,
    much-changed days analyzed)."""
    get_store().maintain()
