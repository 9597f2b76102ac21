from datetime import datetime

from django.db import transaction

from infra_os.models import Tenant, UsageRecord


@transaction.atomic
def usage_record_create(
    *,
    tenant: Tenant,
    kind: str,
    source: str,
    gpus: int,
    cpu_cores: float,
    gpu_model: str,
    started_at: datetime,
    ended_at: datetime,
) -> UsageRecord:
    """Record what ended once; a second call for the same source returns the first record, so
    a reconcile that sees an end twice does not bill it twice."""
    seconds = max(0.0, (ended_at - started_at).total_seconds())
    record, _ = UsageRecord.objects.get_or_create(
        kind=kind,
        source=source,
        defaults={
            "tenant": tenant, "gpus": gpus, "cpu_cores": cpu_cores, "gpu_model": gpu_model,
            "started_at": started_at, "ended_at": max(ended_at, started_at),
            "gpu_seconds": gpus * seconds, "cpu_seconds": cpu_cores * seconds,
        },
    )
    return record
