"""Server leases: a provisioned server rented whole to one tenant from a start to an end (the
bare-metal service). A lease's GPUs count against the tenant's GPU quota while it is in force,
for other leases and for jobs alike."""

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from infra_os.access import require_platform_admin
from infra_os.choices import (
    ACTIVE_RUN_STATES,
    LIVE_LEASE_STATES,
    LeaseState,
    ServerAllocation,
    ServerState,
)
from infra_os.models import Lease, Quota, Server, Tenant, UsageRecord
from infra_os.services.audit import audit_record
from infra_os.services.usage import usage_record_create

# A start this far in the past is taken as "now" (a form filled in a minute ago); further back
# is refused: a lease cannot bill time that has gone by.
START_GRACE = timedelta(minutes=1)
MAX_LEASE = timedelta(days=3 * 365 + 1)


class SweepResult(NamedTuple):
    activated: int
    ended: int


def utc_text(moment: datetime) -> str:
    """How leases name a moment in messages, e.g. 2026-12-01 10:00 UTC."""
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def _peak(intervals: Iterable[tuple[datetime, datetime, int]], start: datetime,
          end: datetime) -> tuple[int, datetime]:
    """The most GPUs held at once within [start, end), and the moment that peak begins. Each
    interval is half-open, so one ending at 10:00 and another starting at 10:00 never add up."""
    events: list[tuple[datetime, int, int]] = []
    for begins, ends, gpus in intervals:
        begins, ends = max(begins, start), min(ends, end)
        if begins < ends and gpus:
            events.append((begins, 1, gpus))
            events.append((ends, 0, -gpus))  # 0 sorts ends before starts at the same moment
    events.sort()
    held, peak, peak_at = 0, 0, start
    for moment, _kind, change in events:
        held += change
        if held > peak:
            peak, peak_at = held, moment
    return peak, peak_at


def _check_times(starts_at: datetime, ends_at: datetime, now: datetime) -> datetime:
    """The lease's start (a start in the last minute becomes now); refuses times that cannot be
    a lease."""
    for field, moment in (("starts_at", starts_at), ("ends_at", ends_at)):
        if timezone.is_naive(moment):
            raise ValidationError({field: "Give the time with its time zone (e.g. ...Z for UTC)."})
    if starts_at < now - START_GRACE:
        raise ValidationError({"starts_at": f"The start {utc_text(starts_at)} is in the past; "
                               "a lease starts now or later."})
    starts_at = max(starts_at, now)
    if ends_at <= starts_at:
        raise ValidationError({"ends_at": f"The end {utc_text(ends_at)} must come after the start "
                               f"{utc_text(starts_at)}."})
    if ends_at - starts_at > MAX_LEASE:
        raise ValidationError({"ends_at": f"A lease lasts at most {MAX_LEASE.days} days; this "
                               f"one would last {(ends_at - starts_at).days}."})
    return starts_at


def _check_server(server: Server) -> None:
    if server.provisioning_runs.filter(state__in=ACTIVE_RUN_STATES).exists():
        raise ValidationError({"server": f"{server.name} is in a provisioning batch; wait for "
                               "it to finish (or cancel it) before leasing the server."})
    if server.allocation == ServerAllocation.CLUSTER:
        raise ValidationError({"server": f"{server.name} is a node of cluster "
                               f"{server.allocated_to or '(unnamed)'}; take it out of the "
                               "cluster before leasing it."})
    if server.state != ServerState.PROVISIONED:
        raise ValidationError({"server": f"{server.name} is {server.get_state_display().lower()}"
                               "; only a provisioned server can be leased."})


def _check_overlap(server: Server, starts_at: datetime, ends_at: datetime) -> None:
    clash = (Lease.objects.filter(server=server, state__in=LIVE_LEASE_STATES,
                                  starts_at__lt=ends_at, ends_at__gt=starts_at)
             .select_related("tenant").order_by("starts_at").first())
    if clash is not None:
        raise ValidationError(
            f"{server.name} is already leased to {clash.tenant.name} from "
            f"{utc_text(clash.starts_at)} to {utc_text(clash.ends_at)} (lease {clash.pk}); "
            "leases of one server cannot overlap."
        )


def _check_quota(tenant: Tenant, gpus: int, gpu_model: str, starts_at: datetime,
                 ends_at: datetime) -> None:
    """The tenant's leased GPUs, at their peak within the new lease's window, plus the new
    lease's, must fit its GPU quota and its limit for the model. The quota row is locked, so
    two leases of one tenant are checked one after the other."""
    if not gpus:
        return
    quota = Quota.objects.select_for_update().filter(tenant=tenant).first()
    if quota is None:
        raise ValidationError({"tenant": f"{tenant.name} has no quota; set one first."})
    live = list(Lease.objects.filter(tenant=tenant, state__in=LIVE_LEASE_STATES,
                                     starts_at__lt=ends_at, ends_at__gt=starts_at)
                .values_list("starts_at", "ends_at", "gpus", "gpu_model"))
    held, at = _peak(((s, e, g) for s, e, g, _m in live), starts_at, ends_at)
    if held + gpus > quota.gpus:
        raise ValidationError(
            f"{tenant.name} would lease {held + gpus} GPUs at once from {utc_text(at)}; its quota "
            f"is {quota.gpus}."
        )
    limit = quota.gpu_model_limits.get(gpu_model) if gpu_model else None
    if limit is not None:
        held, at = _peak(((s, e, g) for s, e, g, m in live if m == gpu_model), starts_at, ends_at)
        if held + gpus > limit:
            raise ValidationError(
                f"{tenant.name} would lease {held + gpus} {gpu_model} GPUs at once from "
                f"{utc_text(at)}; its {gpu_model} limit is {limit}."
            )


@transaction.atomic
def lease_create(
    *,
    actor,
    server: Server,
    tenant: Tenant,
    starts_at: datetime,
    ends_at: datetime,
    note: str = "",
) -> Lease:
    """Lease a free provisioned server to a tenant. A lease that starts now is active at once;
    a later one is scheduled and `lease_sweep` activates it. Safe under concurrent requests:
    the server's row is locked before the overlap check, the tenant's quota row before the
    quota check."""
    require_platform_admin(actor)
    now = timezone.now()
    starts_at = _check_times(starts_at, ends_at, now)
    if not tenant.is_active:
        raise ValidationError({"tenant": f"{tenant.name} is inactive; activate it first."})
    if len(note) > 200:
        raise ValidationError({"note": "At most 200 characters."})
    server = Server.objects.select_for_update().get(pk=server.pk)
    _check_server(server)
    _check_overlap(server, starts_at, ends_at)
    gpus, gpu_model = server.billed_gpu_count, server.billed_gpu_model
    _check_quota(tenant, gpus, gpu_model, starts_at, ends_at)
    lease = Lease(server=server, tenant=tenant, starts_at=starts_at, ends_at=ends_at,
                  state=LeaseState.ACTIVE if starts_at <= now else LeaseState.SCHEDULED,
                  gpus=gpus, gpu_model=gpu_model, note=note, created_by=actor)
    lease.full_clean()
    lease.save()
    audit_record(actor=actor, action="lease.create", obj=lease, tenant=tenant, changes={
        "server": server.name, "tenant": tenant.name, "state": lease.state,
        "starts_at": starts_at.isoformat(), "ends_at": ends_at.isoformat(), "gpus": gpus,
        "gpu_model": gpu_model,
    })
    return lease


def _finish(lease: Lease, *, actor, ended_at: datetime) -> UsageRecord:
    """End a lease that was in force at `ended_at`, and record what the tenant used."""
    previous = lease.state
    lease.state, lease.ended_at = LeaseState.ENDED, ended_at
    lease.save(update_fields=["state", "ended_at", "updated_at"])
    record = usage_record_create(
        tenant=lease.tenant, kind=UsageRecord.Kind.LEASE, source=f"lease {lease.pk}",
        gpus=lease.gpus, gpu_model=lease.gpu_model, cpu_cores=0, started_at=lease.starts_at,
        ended_at=ended_at,
    )
    audit_record(actor=actor, action="lease.end", obj=lease, tenant=lease.tenant, changes={
        "state": {"from": previous, "to": LeaseState.ENDED}, "ended_at": ended_at.isoformat(),
        "gpu_hours": round(record.gpu_seconds / 3600, 3),
    })
    return record


@transaction.atomic
def lease_end(*, actor, lease: Lease) -> Lease:
    """Cancel a lease that has not started (no usage), or end one in force now (its usage is
    recorded up to now). An ended or cancelled lease is refused."""
    require_platform_admin(actor)
    lease = (Lease.objects.select_for_update(of=("self",)).select_related("tenant", "server")
             .get(pk=lease.pk))
    now = timezone.now()
    if lease.state not in LIVE_LEASE_STATES:
        raise ValidationError(f"Lease {lease.pk} is already {lease.get_state_display().lower()}.")
    if lease.starts_at > now:
        lease.state = LeaseState.CANCELLED
        lease.save(update_fields=["state", "updated_at"])
        audit_record(actor=actor, action="lease.cancel", obj=lease, tenant=lease.tenant,
                     changes={"state": {"from": LeaseState.SCHEDULED,
                                        "to": LeaseState.CANCELLED}})
        return lease
    # In force (even if the sweep has not marked it active yet), or past its end and not yet
    # swept: it ended at the earlier of now and its planned end.
    _finish(lease, actor=actor, ended_at=min(now, lease.ends_at))
    return lease


@transaction.atomic
def lease_sweep(*, now: datetime | None = None) -> SweepResult:
    """Activate scheduled leases whose start has come and end active ones whose end has passed,
    each once (rows are locked, and a lease already taken by a concurrent sweep is skipped).
    A lease ends at its planned end, not when the sweep notices, so the tenant pays for the
    time it had the server. Called by a periodic task; no actor."""
    now = now or timezone.now()
    due = Q(state=LeaseState.SCHEDULED, starts_at__lte=now) | Q(state=LeaseState.ACTIVE,
                                                                 ends_at__lte=now)
    leases = list(Lease.objects.select_for_update(skip_locked=True, of=("self",))
                  .select_related("tenant", "server").filter(due).order_by("pk"))
    activated = ended = 0
    for lease in leases:
        if lease.state == LeaseState.SCHEDULED:
            lease.state = LeaseState.ACTIVE
            lease.save(update_fields=["state", "updated_at"])
            audit_record(actor=None, action="lease.activate", obj=lease, tenant=lease.tenant,
                         changes={"state": {"from": LeaseState.SCHEDULED,
                                            "to": LeaseState.ACTIVE}})
            activated += 1
        if lease.ends_at <= now:
            _finish(lease, actor=None, ended_at=lease.ends_at)
            ended += 1
    return SweepResult(activated=activated, ended=ended)
