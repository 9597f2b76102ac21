"""Pricing plans, their rates, reservations, and monthly invoices.

A tenant is billed on `tenant.pricing_plan`, else on the plan marked `is_default`; with neither,
its invoice has no lines and says so (`invoice_note`). Months are calendar months in
`OGAI_BILLING_TIME_ZONE`; the arithmetic is in `infra_os.services.rating` (pure, exact).

Who may do what: platform admins manage plans, rates and reservations, assign plans and close
invoices; a tenant admin may (re-)rate their own tenant's draft; everyone in a tenant reads its
invoices and usage. A closed invoice never changes: rating it again returns it untouched.
"""

import re
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from infra_os.access import require_platform_admin, require_role
from infra_os.choices import ADMIN_ROLES, InvoiceState, LeaseState, RatedResource
from infra_os.models import (
    Invoice,
    InvoiceLine,
    Lease,
    PricingPlan,
    PricingRate,
    Reservation,
    Tenant,
    UsageRecord,
)
from infra_os.services.audit import audit_record
from infra_os.services.rating import (
    BillingPeriod,
    PlanPrices,
    invoice_total,
    month_period,
    rate_month,
)
from ogai.models import assign_changes

PLAN_FIELDS = ("name", "description", "currency", "is_default")
# An invoice of a tenant without any plan still needs a currency.
NO_PLAN_CURRENCY = "USD"
MONTH_PATTERN = re.compile(r"^(\d{4})-(\d{2})$")


def billing_time_zone() -> str:
    return settings.OGAI_BILLING_TIME_ZONE


def parse_month(text: str, *, field: str = "month") -> date:
    """"YYYY-MM" as the first day of that month; anything else is a ValidationError on `field`."""
    found = MONTH_PATTERN.match(text.strip()) if isinstance(text, str) else None
    if found is None or not 1 <= int(found[2]) <= 12 or not 1970 <= int(found[1]) <= 9000:
        raise ValidationError({field: f"Give a month as YYYY-MM, e.g. 2026-10 (got {text!r})."})
    return date(int(found[1]), int(found[2]), 1)


def current_month(now: datetime | None = None) -> date:
    """The month that is running now in the billing time zone."""
    now = now or timezone.now()
    return timezone.localtime(now, timezone=ZoneInfo(billing_time_zone())).date().replace(day=1)


def plan_of(tenant: Tenant) -> PricingPlan | None:
    """The plan a tenant is billed on: its own, else the default one, else None."""
    if tenant.pricing_plan_id is not None:
        return PricingPlan.objects.get(pk=tenant.pricing_plan_id)
    return PricingPlan.objects.filter(is_default=True).first()


def plan_prices(plan: PricingPlan | None) -> PlanPrices | None:
    if plan is None:
        return None
    rates = {(rate.resource, rate.match): rate.unit_price for rate in plan.rates.all()}
    return PlanPrices(name=plan.name, currency=plan.currency, rates=rates)


def invoice_note(invoice: Invoice) -> str:
    """What a reader must know beside the lines, or ""."""
    if not invoice.plan_name:
        return (f"No pricing plan applied: {invoice.tenant.name} has none and no plan is the "
                "default, so its usage was not rated. Assign a plan and rate the month again.")
    return ""


def _usage_of_month(tenant: Tenant, period: BillingPeriod) -> list[UsageRecord]:
    """The month's usage records, and the leases still running (their record is written when
    they end): each is billed for its time in the month so far, so a closed month keeps what
    a long lease used in it; the record written later bills only the months still open."""
    timed = Q(kind__in=(UsageRecord.Kind.JOB, UsageRecord.Kind.LEASE),
              started_at__lt=period.end, ended_at__gt=period.start)
    tokens = Q(kind=UsageRecord.Kind.TOKENS, ended_at__gte=period.start, ended_at__lt=period.end)
    records = list(UsageRecord.objects.filter(timed | tokens, tenant=tenant).order_by("pk"))
    until = min(timezone.now(), period.end)
    recorded = {record.source for record in records if record.kind == UsageRecord.Kind.LEASE}
    for lease in Lease.objects.filter(tenant=tenant, state=LeaseState.ACTIVE,
                                      starts_at__lt=until).order_by("pk"):
        if f"lease {lease.pk}" not in recorded:
            records.append(UsageRecord(
                tenant=tenant, kind=UsageRecord.Kind.LEASE, source=f"lease {lease.pk}",
                gpus=lease.gpus, gpu_model=lease.gpu_model, started_at=lease.starts_at,
                ended_at=until))
    return records


def _reservations_of_month(tenant: Tenant, period: BillingPeriod):
    return Reservation.objects.filter(
        Q(ends_on__isnull=True) | Q(ends_on__gte=period.month),
        tenant=tenant, starts_on__lte=period.last_day,
    ).order_by("pk")


def _rate_into(invoice: Invoice, *, tenant: Tenant, period: BillingPeriod) -> Invoice:
    """Rate the month into the (unsaved or draft) invoice, replacing its lines."""
    plan = plan_of(tenant)
    prices = plan_prices(plan)
    drafts = rate_month(_usage_of_month(tenant, period), _reservations_of_month(tenant, period),
                        prices, period)
    invoice.time_zone = period.time_zone
    invoice.period_start = period.start
    invoice.period_end = period.end
    invoice.plan_name = plan.name if plan else ""
    invoice.currency = plan.currency if plan else NO_PLAN_CURRENCY
    invoice.total = invoice_total(drafts)
    invoice.rated_at = timezone.now()
    invoice.save()
    invoice.lines.all().delete()
    InvoiceLine.objects.bulk_create(
        InvoiceLine(invoice=invoice, position=position, resource=draft.resource,
                    match=draft.match, description=draft.description, quantity=draft.quantity,
                    unit=draft.unit, unit_price=draft.unit_price, amount=draft.amount)
        for position, draft in enumerate(drafts, start=1)
    )
    return invoice


@transaction.atomic
def invoice_rate(*, actor, tenant: Tenant, month: date) -> Invoice:
    """Create the tenant's draft invoice for `month`, or rate its draft again from the usage
    now recorded (its lines are replaced). A closed invoice is returned untouched."""
    require_role(actor, tenant, ADMIN_ROLES)
    period = month_period(month, billing_time_zone())
    if period.start > timezone.now():
        raise ValidationError({"month": f"{period.month:%Y-%m} has not begun in "
                               f"{period.time_zone}: there is nothing to bill yet."})
    # Locking the tenant serialises two first ratings of the same month.
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    invoice = Invoice.objects.select_for_update().filter(tenant=tenant,
                                                         month=period.month).first()
    if invoice is not None and invoice.state == InvoiceState.CLOSED:
        return invoice
    created = invoice is None
    if invoice is None:
        invoice = Invoice(tenant=tenant, month=period.month)
    previous_total = None if created else str(invoice.total)
    _rate_into(invoice, tenant=tenant, period=period)
    audit_record(actor=actor, action="invoice.rate", obj=invoice, tenant=tenant, changes={
        "month": f"{period.month:%Y-%m}", "plan": invoice.plan_name,
        "total": {"from": previous_total, "to": str(invoice.total)},
        "lines": invoice.lines.count(),
    })
    return invoice


@transaction.atomic
def invoice_close(*, actor, invoice: Invoice) -> Invoice:
    """Rate the draft a last time and freeze it. Only once its month is over."""
    require_platform_admin(actor)
    invoice = Invoice.objects.select_for_update().select_related("tenant").get(pk=invoice.pk)
    label = f"{invoice.tenant.name} {invoice.month:%Y-%m}"
    if invoice.state == InvoiceState.CLOSED:
        raise ValidationError({"state": f"Invoice {label} is already closed."})
    period = month_period(invoice.month, billing_time_zone())
    if timezone.now() < period.end:
        raise ValidationError({"month": f"{invoice.month:%Y-%m} is not over yet in "
                               f"{period.time_zone}: close its invoice after "
                               f"{period.end:%Y-%m-%d %H:%M} UTC."})
    _rate_into(invoice, tenant=invoice.tenant, period=period)
    invoice.state = InvoiceState.CLOSED
    invoice.closed_at = timezone.now()
    invoice.closed_by = actor
    invoice.save(update_fields=["state", "closed_at", "closed_by"])
    audit_record(actor=actor, action="invoice.close", obj=invoice, tenant=invoice.tenant,
                 changes={"month": f"{invoice.month:%Y-%m}", "total": str(invoice.total),
                          "plan": invoice.plan_name})
    return invoice


# Plans and rates ------------------------------------------------------------------------------


def _json_safe(changes: dict[str, Any]) -> dict[str, Any]:
    def safe(value):
        if isinstance(value, dict):
            return {key: safe(inner) for key, inner in value.items()}
        return str(value) if isinstance(value, Decimal | date) else value

    return safe(changes)


def _take_default(actor, plan: PricingPlan) -> None:
    """Make `plan` the only default: the previous default stops being one."""
    for previous in PricingPlan.objects.select_for_update().filter(is_default=True).exclude(
            pk=plan.pk):
        previous.is_default = False
        previous.save(update_fields=["is_default", "updated_at"])
        audit_record(actor=actor, action="pricing_plan.update", obj=previous,
                     changes={"is_default": {"from": True, "to": False}})


@transaction.atomic
def pricing_plan_create(*, actor, name: str, description: str = "", currency: str = "USD",
                        is_default: bool = False) -> PricingPlan:
    require_platform_admin(actor)
    plan = PricingPlan(name=name.strip(), description=description, currency=currency.upper(),
                       is_default=is_default)
    if is_default:
        # Before validating: the constraint allows one default. On an error below the whole
        # transaction, this included, is rolled back.
        _take_default(actor, plan)
    plan.full_clean()
    plan.save()
    audit_record(actor=actor, action="pricing_plan.create", obj=plan,
                 changes={"name": plan.name, "currency": plan.currency,
                          "is_default": is_default})
    return plan


@transaction.atomic
def pricing_plan_update(*, actor, plan: PricingPlan, **fields) -> PricingPlan:
    """Change a plan's fields. Making it the default takes that from the previous default.
    Invoices keep the plan's name as it was when they were rated."""
    require_platform_admin(actor)
    plan = PricingPlan.objects.select_for_update().get(pk=plan.pk)
    if "name" in fields:
        fields["name"] = fields["name"].strip()
    if "currency" in fields:
        fields["currency"] = fields["currency"].upper()
    changes = assign_changes(plan, fields, allowed=PLAN_FIELDS)
    if changes:
        if plan.is_default:
            _take_default(actor, plan)
        plan.full_clean()
        plan.save()
        audit_record(actor=actor, action="pricing_plan.update", obj=plan, changes=changes)
    return plan


@transaction.atomic
def pricing_plan_delete(*, actor, plan: PricingPlan) -> None:
    """Delete a plan no tenant is billed on (neither assigned nor through the default)."""
    require_platform_admin(actor)
    plan = PricingPlan.objects.select_for_update().get(pk=plan.pk)
    assigned = sorted(plan.tenants.values_list("name", flat=True))
    if assigned:
        shown = ", ".join(assigned[:5]) + (f" and {len(assigned) - 5} more"
                                           if len(assigned) > 5 else "")
        raise ValidationError({"plan": f"Plan {plan.name} is in use by {shown}: move them to "
                               "another plan first."})
    if plan.is_default:
        relying = Tenant.objects.filter(pricing_plan__isnull=True).count()
        if relying:
            raise ValidationError({"plan": f"Plan {plan.name} is the default plan of {relying} "
                                   f"tenant{'s' if relying != 1 else ''}: make another plan "
                                   "the default first."})
    audit_record(actor=actor, action="pricing_plan.delete", obj=plan,
                 changes={"name": plan.name})
    plan.delete()


@transaction.atomic
def pricing_rate_set(*, actor, plan: PricingPlan, resource: str, unit_price: Decimal,
                     match: str = "") -> PricingRate:
    """Set the plan's price of `resource` for `match` (a GPU model or model name; "" for any
    other), creating the rate or changing its price."""
    require_platform_admin(actor)
    match = match.strip()
    if resource not in RatedResource.values:
        raise ValidationError({"resource": f"Unknown resource {resource!r}; use one of "
                               f"{', '.join(RatedResource.values)}."})
    rate = PricingRate.objects.select_for_update().filter(plan=plan, resource=resource,
                                                          match=match).first()
    previous = rate.unit_price if rate else None
    if rate is None:
        rate = PricingRate(plan=plan, resource=resource, match=match)
    rate.unit_price = unit_price
    rate.full_clean()
    rate.save()
    audit_record(actor=actor, action="pricing_rate.set", obj=rate, changes=_json_safe({
        "plan": plan.name, "resource": resource, "match": match,
        "unit_price": {"from": previous, "to": rate.unit_price},
    }))
    return rate


@transaction.atomic
def pricing_rate_delete(*, actor, rate: PricingRate) -> None:
    require_platform_admin(actor)
    audit_record(actor=actor, action="pricing_rate.delete", obj=rate, changes=_json_safe({
        "plan": rate.plan.name, "resource": rate.resource, "match": rate.match,
        "unit_price": rate.unit_price,
    }))
    rate.delete()


@transaction.atomic
def tenant_set_pricing_plan(*, actor, tenant: Tenant, plan: PricingPlan | None) -> Tenant:
    """Bill the tenant on `plan` (None: on the default plan) from its next rating on."""
    require_platform_admin(actor)
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    previous = tenant.pricing_plan.name if tenant.pricing_plan is not None else None
    if tenant.pricing_plan_id != (plan.pk if plan else None):
        tenant.pricing_plan = plan
        tenant.save(update_fields=["pricing_plan", "updated_at"])
        audit_record(actor=actor, action="tenant.pricing_plan", obj=tenant, tenant=tenant,
                     changes={"pricing_plan": {"from": previous,
                                               "to": plan.name if plan else None}})
    return tenant


# Reservations ---------------------------------------------------------------------------------


@transaction.atomic
def reservation_create(*, actor, tenant: Tenant, gpu_model: str, gpus: int, starts_on: date,
                       ends_on: date | None = None) -> Reservation:
    """Reserve `gpus` GPUs of `gpu_model` for the tenant from `starts_on` to `ends_on`
    (inclusive; None: until deleted), billed per month at the plan's reserved price."""
    require_platform_admin(actor)
    gpu_model = gpu_model.strip()
    if not gpu_model:
        raise ValidationError({"gpu_model": "Name the GPU model reserved, e.g. H100."})
    if ends_on is not None and ends_on < starts_on:
        raise ValidationError({"ends_on": "The last day cannot be before the first."})
    reservation = Reservation(tenant=tenant, gpu_model=gpu_model, gpus=gpus,
                              starts_on=starts_on, ends_on=ends_on)
    reservation.full_clean()
    reservation.save()
    audit_record(actor=actor, action="reservation.create", obj=reservation, tenant=tenant,
                 changes=_json_safe({"gpu_model": gpu_model, "gpus": gpus,
                                     "starts_on": starts_on, "ends_on": ends_on}))
    return reservation


@transaction.atomic
def reservation_delete(*, actor, reservation: Reservation) -> None:
    """Delete a reservation. Closed invoices keep the lines it gave them."""
    require_platform_admin(actor)
    audit_record(actor=actor, action="reservation.delete", obj=reservation,
                 tenant=reservation.tenant, changes=_json_safe({
                     "gpu_model": reservation.gpu_model, "gpus": reservation.gpus,
                     "starts_on": reservation.starts_on, "ends_on": reservation.ends_on,
                 }))
    reservation.delete()
