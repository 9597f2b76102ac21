"""Reads of billing: invoices, plans, reservations and usage by day, always scoped to the
caller."""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal

from django.db.models import Count, Exists, Prefetch, Q, QuerySet

from infra_os.access import is_platform_admin, member_tenant_ids, scope_to_user
from infra_os.models import (
    Invoice,
    InvoiceLine,
    PricingPlan,
    PricingRate,
    Reservation,
    Tenant,
    UsageRecord,
)
from infra_os.services.billing import billing_time_zone
from infra_os.services.rating import (
    MICROSECONDS_PER_HOUR,
    local_midnight,
    overlap_us,
    quantised,
)

# The longest span the usage page and API sum up at once.
MAX_USAGE_DAYS = 366


def invoice_list(*, user) -> QuerySet[Invoice]:
    return scope_to_user(
        Invoice.objects.select_related("tenant", "closed_by").annotate(
            line_count=Count("lines")),
        user,
    )


def invoice_detail(*, user, pk: int) -> Invoice:
    """One invoice the user sees, with its lines (Invoice.DoesNotExist otherwise)."""
    lines = Prefetch("lines", queryset=InvoiceLine.objects.order_by("position"))
    return invoice_list(user=user).prefetch_related(lines).get(pk=pk)


def pricing_plan_list(*, user) -> QuerySet[PricingPlan]:
    """Platform admins see every plan; others the plans their tenants are billed on (their own
    plan, or the default one)."""
    queryset = PricingPlan.objects.prefetch_related(
        Prefetch("rates", queryset=PricingRate.objects.order_by("resource", "match"))
    )
    if is_platform_admin(user):
        return queryset
    if not user.is_authenticated:
        return queryset.none()
    mine = Tenant.objects.filter(pk__in=member_tenant_ids(user))
    return queryset.filter(
        Q(pk__in=mine.filter(pricing_plan__isnull=False).values("pricing_plan_id"))
        | Q(Exists(mine.filter(pricing_plan__isnull=True)), is_default=True)
    )


def plan_tenants(*, user) -> dict[int | None, list[str]]:
    """Names of the tenants on each plan (None: on the default). Platform admins only."""
    if not is_platform_admin(user):
        return {}
    on_plan: dict[int | None, list[str]] = defaultdict(list)
    for name, plan_id in Tenant.objects.order_by("name").values_list("name", "pricing_plan_id"):
        on_plan[plan_id].append(name)
    return dict(on_plan)


def reservation_list(*, user) -> QuerySet[Reservation]:
    return scope_to_user(Reservation.objects.select_related("tenant"), user)


# Usage by day ---------------------------------------------------------------------------------

GPU_HOURS = "gpu_hours"
SERVER_HOURS = "server_hours"
TOKENS = "tokens"
USAGE_RESOURCES = {
    GPU_HOURS: ("GPU-hours (jobs)", "GPU-hours"),
    SERVER_HOURS: ("Server-hours (leases)", "server-hours"),
    TOKENS: ("Tokens (gateway)", "tokens"),
}
USAGE_RESOURCE_CHOICES = [(name, label) for name, (label, _) in USAGE_RESOURCES.items()]


@dataclass
class UsageSeries:
    """One resource's use per day, split by key (GPU model, or model name for tokens)."""

    resource: str
    label: str
    unit: str
    by_day: dict[date, dict[str, Decimal]] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        return sorted({key for values in self.by_day.values() for key in values})

    def day_total(self, day: date) -> Decimal:
        return sum(self.by_day.get(day, {}).values(), Decimal(0))

    @property
    def total(self) -> Decimal:
        return sum((self.day_total(day) for day in self.by_day), Decimal(0))

    def key_totals(self) -> dict[str, Decimal]:
        totals: dict[str, Decimal] = defaultdict(Decimal)
        for values in self.by_day.values():
            for key, value in values.items():
                totals[key] += value
        return dict(sorted(totals.items()))


@dataclass
class UsageSummary:
    tenant: Tenant
    time_zone: str
    start: date
    end: date  # exclusive
    series: list[UsageSeries]

    @property
    def days(self) -> list[date]:
        return [self.start + timedelta(days=n) for n in range((self.end - self.start).days)]

    def rows(self) -> list[dict]:
        """One row a day: {"date", "gpu_hours", "server_hours", "tokens"}."""
        return [{"date": day, **{series.resource: series.day_total(day)
                                 for series in self.series}} for day in self.days]

    def totals(self) -> dict[str, Decimal]:
        return {series.resource: series.total for series in self.series}


def usage_by_day(*, user, tenant: Tenant, start: date, end: date) -> UsageSummary:
    """The tenant's use per day of [start, end) in the billing time zone: GPU-hours of jobs,
    server-hours of leases and tokens through the gateway. A record is split at the day
    boundaries (a 3-day job counts on 3 days); tokens count on the day they ended. Records of a
    tenant the user does not see count for nothing."""
    time_zone = billing_time_zone()
    midnights = [local_midnight(start + timedelta(days=n), time_zone)
                 for n in range((end - start).days + 1)]
    begin, finish = midnights[0], midnights[-1]
    records = scope_to_user(UsageRecord.objects.filter(tenant=tenant), user).filter(
        Q(kind__in=(UsageRecord.Kind.JOB, UsageRecord.Kind.LEASE), started_at__lt=finish,
          ended_at__gt=begin)
        | Q(kind=UsageRecord.Kind.TOKENS, ended_at__gte=begin, ended_at__lt=finish)
    ).only("kind", "gpus", "gpu_model", "model_name", "started_at", "ended_at",
           "prompt_tokens", "completion_tokens")
    micro: dict[str, dict[date, dict[str, int]]] = {
        name: defaultdict(lambda: defaultdict(int)) for name in USAGE_RESOURCES
    }
    for record in records:
        if record.kind == UsageRecord.Kind.TOKENS:
            index = _day_index(midnights, record.ended_at)
            count = record.prompt_tokens + record.completion_tokens
            if count:
                micro[TOKENS][start + timedelta(days=index)][record.model_name] += count
            continue
        factor = record.gpus if record.kind == UsageRecord.Kind.JOB else 1
        resource = GPU_HOURS if record.kind == UsageRecord.Kind.JOB else SERVER_HOURS
        if not factor:
            continue
        first = _day_index(midnights, max(record.started_at, begin))
        last = _day_index(midnights, min(record.ended_at, finish))
        for index in range(first, min(last, len(midnights) - 2) + 1):
            used = overlap_us(record.started_at, record.ended_at, midnights[index],
                              midnights[index + 1])
            if used:
                micro[resource][start + timedelta(days=index)][record.gpu_model] += factor * used
    series = []
    for name, (label, unit) in USAGE_RESOURCES.items():
        by_day: dict[date, dict[str, Decimal]] = {}
        for day, values in micro[name].items():
            by_day[day] = {
                key: Decimal(value) if name == TOKENS
                else quantised(Decimal(value) / MICROSECONDS_PER_HOUR)
                for key, value in sorted(values.items())
            }
        series.append(UsageSeries(resource=name, label=label, unit=unit,
                                  by_day=dict(sorted(by_day.items()))))
    return UsageSummary(tenant=tenant, time_zone=time_zone, start=start, end=end, series=series)


def _day_index(midnights, instant) -> int:
    """Which day of the span an instant falls on (the last midnight at or before it)."""
    low, high = 0, len(midnights) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if midnights[middle] <= instant:
            low = middle
        else:
            high = middle - 1
    return low
