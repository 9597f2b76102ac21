"""Each tenant's log retention: whole days past it go, nothing else does."""

from datetime import UTC, date, datetime, timedelta

from aistation.logstore.base import LogLine, LogQuery, Scope
from aistation.services.log_retention import logs_expire
from infra_os.services.tenancy import tenant_update


def _lines(tenant_id, days, source="job"):
    return [LogLine(ts=datetime(2026, 12, day, hour, tzinfo=UTC), message=f"d{day} h{hour}",
                    tenant_id=tenant_id, source=source, job_id=1 if tenant_id else None)
            for day in days for hour in (0, 12, 23)]


def test_retention_follows_each_tenants_setting(world, log_store, settings, api):
    settings.OGAI_LOGS_PLATFORM_RETENTION_DAYS = 1
    tenant_update(actor=world.operator, tenant=world.alpha, log_retention_days=2)
    days = range(1, 7)  # Dec 1..6; today is Dec 6
    log_store.append(_lines(world.alpha.pk, days) + _lines(world.beta.pk, days)
                     + _lines(None, days, source="web"))
    expired = logs_expire(today=date(2026, 12, 6))

    def left(tenant_id):
        scope = Scope(tenant_ids=frozenset({tenant_id}) if tenant_id else frozenset(),
                      platform=tenant_id is None)
        found = log_store.search(LogQuery(scope=scope, limit=1000))
        return sorted({int(h.message.split()[0][1:]) for h in found})

    assert left(world.alpha.pk) == [4, 5, 6]  # 2 days before today, and today
    assert left(world.beta.pk) == [1, 2, 3, 4, 5, 6]  # the default 30 days
    assert left(None) == [5, 6]
    assert len(expired.days) == 3 + 4 and expired.lines == 3 * 7
    # A later pass finds nothing more to remove.
    assert logs_expire(today=date(2026, 12, 6)).lines == 0


def test_only_platform_admins_set_the_retention(world, api):
    client = api.as_user(world.alpha_admin)
    url = f"/api/v1/infra-os/tenants/{world.alpha.name}/"
    refused = client.patch(url, {"log_retention_days": 365}, format="json")
    assert refused.status_code == 403
    world.alpha.refresh_from_db()
    assert world.alpha.log_retention_days == 30
    operator = api.as_user(world.operator)
    bad = operator.patch(url, {"log_retention_days": 0}, format="json")
    assert bad.status_code == 400 and "log_retention_days" in bad.json()["fields"]
    done = operator.patch(url, {"log_retention_days": 7}, format="json")
    assert done.status_code == 200 and done.json()["log_retention_days"] == 7
    world.alpha.refresh_from_db()
    assert world.alpha.log_retention_days == 7
    assert timedelta(days=world.beta.log_retention_days) == timedelta(days=30)


def test_the_hourly_task_expires_then_keeps_the_store_fast(world, log_store, monkeypatch):
    from aistation import tasks

    calls = []
    monkeypatch.setattr(log_store, "maintain", lambda: calls.append("maintain"))
    log_store.append([LogLine(ts=datetime.now(UTC) - timedelta(days=90), message="old",
                              tenant_id=world.alpha.pk, job_id=1)])
    assert tasks.logs_expire() == 1
    assert calls == ["maintain"]
