"""Pricing plans, rating usage into monthly invoices, CSV and PDF, and the usage summary.

The figures are worked out by hand in the comments: an invoice is right when a person with a
calculator agrees with it to the cent."""

import csv
import io
import itertools
from datetime import date
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone
from pypdf import PdfReader

from infra_os.choices import InvoiceState, RatedResource
from infra_os.invoice_export import invoice_csv, invoice_pdf
from infra_os.models import AuditEvent, Invoice, PricingPlan, Reservation, UsageRecord
from infra_os.selectors_billing import usage_by_day
from infra_os.services.billing import (
    current_month,
    invoice_close,
    invoice_rate,
    parse_month,
    plan_prices,
    pricing_plan_create,
    pricing_plan_delete,
    pricing_plan_update,
    pricing_rate_delete,
    pricing_rate_set,
    reservation_create,
    tenant_set_pricing_plan,
)
from infra_os.services.rating import amount_of, month_period, rate_month
from tests.factories import at, job_usage

OCTOBER = date(2026, 10, 1)
INVOICES = "/api/v1/infra-os/invoices/"
PLANS = "/api/v1/infra-os/pricing-plans/"
RESERVATIONS = "/api/v1/infra-os/reservations/"
USAGE = "/api/v1/infra-os/usage/"
_sources = itertools.count(1)




def lease(tenant, model, start, end, gpus=8):
    return UsageRecord.objects.create(
        tenant=tenant, kind=UsageRecord.Kind.LEASE, source=f"lease {next(_sources)}",
        gpus=gpus, gpu_model=model, started_at=at(start), ended_at=at(end))


def tokens(tenant, model_name, prompt, completion, when):
    return UsageRecord.objects.create(
        tenant=tenant, kind=UsageRecord.Kind.TOKENS, source=f"chat {next(_sources)}",
        model_name=model_name, prompt_tokens=prompt, completion_tokens=completion,
        started_at=at(when), ended_at=at(when))


def lines_of(invoice):
    return [(line.resource, line.match, line.description, str(line.quantity),
             str(line.unit_price), str(line.amount))
            for line in invoice.lines.order_by("position")]


@pytest.fixture
def plan(world):
    """Plan `standard`, the default: H100 GPU-hours 2.50 and any other GPU 0.10, H100
    server-hours 20, llama tokens 0.60 a million (no catch-all for tokens), a reserved H100
    GPU-month 1000."""
    operator = world.operator
    standard = pricing_plan_create(actor=operator, name="standard", is_default=True)
    for resource, match, price in [
        (RatedResource.GPU_HOUR, "H100", "2.50"),
        (RatedResource.GPU_HOUR, "", "0.10"),
        (RatedResource.SERVER_HOUR, "H100", "20"),
        (RatedResource.MILLION_TOKENS, "llama", "0.60"),
        (RatedResource.RESERVED_GPU_MONTH, "H100", "1000"),
    ]:
        pricing_rate_set(actor=operator, plan=standard, resource=resource, match=match,
                         unit_price=Decimal(price))
    return standard


@pytest.fixture
def october(world, plan):
    """Alpha's October 2026 (UTC), and some of beta's that must not show."""
    alpha = world.alpha
    job_usage(alpha, 4, "H100", "2026-10-02T00:00", "2026-10-02T10:00")  # 40 GPU-h, reserved
    job_usage(alpha, 2, "H100", "2026-10-20T00:00", "2026-10-20T03:00")  # 6 GPU-h, outside it
    # 2 GPUs from 23:22:30 on Sept 30: 37.5 min in October = 1.25 GPU-h.
    job_usage(alpha, 2, "A100", "2026-09-30T23:22:30", "2026-10-01T00:37:30")
    job_usage(alpha, 1, "V100", "2026-10-31T23:00", "2026-11-01T02:00")  # 1 GPU-h in October
    lease(alpha, "H100", "2026-10-10T00:00", "2026-10-12T12:00")  # 60 server-hours
    tokens(alpha, "llama", 300_000, 200_000, "2026-10-15T12:00")  # 0.5 M
    tokens(alpha, "other-model", 600_000, 400_000, "2026-10-16T12:00")  # 1 M, no rate
    tokens(alpha, "llama", 1_000_000, 0, "2026-11-01T00:00")  # November's
    job_usage(world.beta, 8, "H100", "2026-10-05T00:00", "2026-10-06T00:00")
    reservation_create(actor=world.operator, tenant=alpha, gpu_model="H100", gpus=1,
                       starts_on=date(2026, 10, 2), ends_on=date(2026, 10, 2))
    return world


# Rating ---------------------------------------------------------------------------------------

OCTOBER_LINES = [
    # 1 GPU for 1 of 31 days: 0.032258 x 1000 = 32.258 -> 32.26
    ("reserved_gpu_month", "H100", "Reserved 1 x H100, 2026-10-02 to 2026-10-02 (1/31 days)",
     "0.032258", "1000.000000", "32.26"),
    # The reservation covers 1 GPU x 24 h of the 40 GPU-h used on Oct 2.
    ("gpu_hour", "H100", "GPU-hours, H100 - covered by reservation", "24.000000", "0.000000",
     "0.00"),
    # (40 - 24) + 6 = 22 GPU-h x 2.50
    ("gpu_hour", "H100", "GPU-hours, H100", "22.000000", "2.500000", "55.00"),
    # 1.25 + 1 = 2.25 GPU-h x 0.10 = 0.225 -> 0.23 (half up, not half even)
    ("gpu_hour", "", "GPU-hours, any other GPU model: A100, V100", "2.250000", "0.100000",
     "0.23"),
    ("server_hour", "H100", "Server-hours (leases), H100", "60.000000", "20.000000", "1200.00"),
    ("million_tokens", "llama", "Million tokens, llama", "0.500000", "0.600000", "0.30"),
    ("million_tokens", "other-model", "Million tokens, other-model - no rate in plan standard",
     "1.000000", "0.000000", "0.00"),
]


def test_a_month_rated_by_hand(october):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    assert lines_of(invoice) == OCTOBER_LINES
    # 32.26 + 55.00 + 0.23 + 1200.00 + 0.30
    assert invoice.total == Decimal("1287.79")
    assert str(invoice.total) == "1287.79"
    assert (invoice.plan_name, invoice.currency, invoice.state) == ("standard", "USD", "draft")
    assert (invoice.period_start, invoice.period_end) == (at("2026-10-01T00:00"),
                                                         at("2026-11-01T00:00"))
    assert invoice.time_zone == "UTC"
    event = AuditEvent.objects.get(action="invoice.rate")
    assert event.tenant == october.alpha
    assert event.changes["total"] == {"from": None, "to": "1287.79"}


def test_half_cents_round_up_per_line():
    assert amount_of(Decimal("2.25"), Decimal("0.1")) == Decimal("0.23")
    assert amount_of(Decimal("0.5"), Decimal("0.01")) == Decimal("0.01")
    assert amount_of(Decimal("0.000001"), Decimal("5000")) == Decimal("0.01")
    assert amount_of(Decimal("0.000001"), Decimal("4999.999999")) == Decimal("0.00")


def test_usage_without_any_applicable_rate_is_listed_at_price_zero(world):
    bare = pricing_plan_create(actor=world.operator, name="bare", is_default=True)
    pricing_rate_set(actor=world.operator, plan=bare, resource=RatedResource.GPU_HOUR,
                     match="H100", unit_price=Decimal("3"))
    job_usage(world.alpha, 1, "A100", "2026-10-03T00:00", "2026-10-03T02:00")
    lease(world.alpha, "", "2026-10-03T00:00", "2026-10-03T01:00")
    invoice = invoice_rate(actor=world.operator, tenant=world.alpha, month=OCTOBER)
    assert lines_of(invoice) == [
        ("gpu_hour", "A100", "GPU-hours, A100 - no rate in plan bare", "2.000000", "0.000000",
         "0.00"),
        ("server_hour", "", "Server-hours (leases), unspecified - no rate in plan bare",
         "1.000000", "0.000000", "0.00"),
    ]
    assert invoice.total == Decimal("0.00")


def test_a_month_with_no_usage_is_an_empty_invoice(world, plan):
    invoice = invoice_rate(actor=world.operator, tenant=world.beta, month=date(2026, 8, 1))
    assert invoice.lines.count() == 0
    assert str(invoice.total) == "0.00"
    assert invoice_csv(invoice).splitlines() == [
        "line,resource,match,description,quantity,unit,unit_price,amount,currency",
        ",total,,Total beta 2026-08,,,,0.00,USD",
    ]


def test_a_tenant_without_any_plan_gets_an_empty_invoice_that_says_why(world):
    job_usage(world.alpha, 1, "H100", "2026-10-03T00:00", "2026-10-03T02:00")
    invoice = invoice_rate(actor=world.operator, tenant=world.alpha, month=OCTOBER)
    assert invoice.lines.count() == 0
    assert invoice.total == Decimal("0.00")
    assert invoice.plan_name == ""
    body = api_client_for(world.alpha_member).get(f"{INVOICES}{invoice.pk}/").json()
    assert "No pricing plan applied" in body["note"]


def test_the_tenants_own_plan_wins_over_the_default(world, plan):
    premium = pricing_plan_create(actor=world.operator, name="premium")
    pricing_rate_set(actor=world.operator, plan=premium, resource=RatedResource.GPU_HOUR,
                     unit_price=Decimal("9"))
    tenant_set_pricing_plan(actor=world.operator, tenant=world.alpha, plan=premium)
    job_usage(world.alpha, 1, "H100", "2026-10-03T00:00", "2026-10-03T02:00")
    invoice = invoice_rate(actor=world.operator, tenant=world.alpha, month=OCTOBER)
    assert (invoice.plan_name, invoice.total) == ("premium", Decimal("18.00"))


def test_rating_a_draft_again_follows_new_usage(october):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    job_usage(october.alpha, 1, "H100", "2026-10-25T00:00", "2026-10-25T04:00")  # +4 x 2.50
    again = invoice_rate(actor=october.alpha_admin, tenant=october.alpha, month=OCTOBER)
    assert again.pk == invoice.pk
    assert again.total == Decimal("1297.79")
    assert ("gpu_hour", "H100", "GPU-hours, H100", "26.000000", "2.500000", "65.00") in \
        lines_of(again)
    assert again.lines.count() == len(OCTOBER_LINES)
    assert Invoice.objects.filter(tenant=october.alpha).count() == 1


def test_a_closed_invoice_never_changes(october):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    closed = invoice_close(actor=october.operator, invoice=invoice)
    assert (closed.state, closed.closed_by) == (InvoiceState.CLOSED, october.operator)
    frozen_lines, frozen_csv = lines_of(closed), invoice_csv(closed)
    frozen_row = Invoice.objects.filter(pk=closed.pk).values().get()

    # New usage, new prices, a new default plan: none of it reaches the closed month.
    job_usage(october.alpha, 8, "H100", "2026-10-20T00:00", "2026-10-21T00:00")
    pricing_rate_set(actor=october.operator, plan=october_plan(), resource="gpu_hour",
                     match="H100", unit_price=Decimal("99"))
    pricing_plan_create(actor=october.operator, name="dearer", is_default=True)
    again = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)

    assert again.pk == closed.pk
    assert lines_of(again) == frozen_lines
    assert invoice_csv(again) == frozen_csv
    assert Invoice.objects.filter(pk=closed.pk).values().get() == frozen_row
    # Rating a closed invoice changed nothing, so it wrote no audit event either.
    assert AuditEvent.objects.filter(action="invoice.rate").count() == 1
    assert AuditEvent.objects.filter(action="invoice.close").count() == 1
    with pytest.raises(ValidationError, match="already closed"):
        invoice_close(actor=october.operator, invoice=again)


def october_plan():
    return PricingPlan.objects.get(name="standard")


def test_closing_rates_the_draft_a_last_time(october):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    job_usage(october.alpha, 1, "H100", "2026-10-25T00:00", "2026-10-25T04:00")
    closed = invoice_close(actor=october.operator, invoice=invoice)
    assert closed.total == Decimal("1297.79")


def test_a_month_not_over_cannot_be_closed(world, plan):
    invoice = invoice_rate(actor=world.operator, tenant=world.alpha, month=current_month())
    with pytest.raises(ValidationError, match="not over yet"):
        invoice_close(actor=world.operator, invoice=invoice)
    invoice.refresh_from_db()
    assert invoice.state == InvoiceState.DRAFT


def test_a_month_that_has_not_begun_is_not_rated(world, plan):
    with pytest.raises(ValidationError, match="has not begun"):
        invoice_rate(actor=world.operator, tenant=world.alpha, month=date(2099, 1, 1))
    assert not Invoice.objects.exists()


def test_who_may_rate_and_close(october):
    with pytest.raises(PermissionDenied):
        invoice_rate(actor=october.alpha_member, tenant=october.alpha, month=OCTOBER)
    invoice = invoice_rate(actor=october.alpha_admin, tenant=october.alpha, month=OCTOBER)
    with pytest.raises(PermissionDenied):
        invoice_close(actor=october.alpha_admin, invoice=invoice)


def test_months_are_calendar_months_in_the_billing_time_zone(world, plan, settings):
    settings.OGAI_BILLING_TIME_ZONE = "Asia/Shanghai"
    # 23:30 UTC on September 30 is 07:30 on October 1 in Shanghai (UTC+8).
    job_usage(world.alpha, 1, "H100", "2026-09-30T22:30", "2026-09-30T23:30")
    september = invoice_rate(actor=world.operator, tenant=world.alpha, month=date(2026, 9, 1))
    october = invoice_rate(actor=world.operator, tenant=world.alpha, month=OCTOBER)
    assert september.lines.count() == 0
    assert lines_of(october) == [("gpu_hour", "H100", "GPU-hours, H100", "1.000000",
                                  "2.500000", "2.50")]
    assert october.time_zone == "Asia/Shanghai"
    assert (october.period_start, october.period_end) == (at("2026-09-30T16:00"),
                                                         at("2026-10-31T16:00"))


def test_a_month_with_a_daylight_saving_change_has_its_real_hours(world, plan, settings):
    settings.OGAI_BILLING_TIME_ZONE = "Europe/Berlin"
    # Berlin's clocks go back on 2026-10-25: October there lasts 31 x 24 + 1 = 745 hours.
    job_usage(world.alpha, 1, "H100", "2026-09-20T00:00", "2026-11-10T00:00")
    job_usage(world.alpha, 1, "B200", "2026-09-20T00:00", "2026-11-10T00:00")
    reservation_create(actor=world.operator, tenant=world.alpha, gpu_model="H100", gpus=1,
                       starts_on=date(2026, 9, 1))
    invoice = invoice_rate(actor=world.operator, tenant=world.alpha, month=OCTOBER)
    assert lines_of(invoice) == [
        ("reserved_gpu_month", "H100", "Reserved 1 x H100, 2026-10-01 to 2026-10-31 "
         "(31/31 days)", "1.000000", "1000.000000", "1000.00"),
        ("gpu_hour", "H100", "GPU-hours, H100 - covered by reservation", "745.000000",
         "0.000000", "0.00"),
        ("gpu_hour", "", "GPU-hours, any other GPU model: B200", "745.000000", "0.100000",
         "74.50"),
    ]


def test_rating_is_a_pure_function_of_its_inputs(october):
    records = list(UsageRecord.objects.filter(tenant=october.alpha))
    reservations = list(Reservation.objects.filter(tenant=october.alpha))
    prices = plan_prices(october_plan())
    period = month_period(OCTOBER, "UTC")
    first = rate_month(records, reservations, prices, period)
    for shift in range(1, len(records)):
        reordered = records[shift:] + records[:shift]
        assert rate_month(reordered, reservations, prices, period) == first
        assert rate_month(reordered[::-1], reservations[::-1], prices, period) == first
    assert rate_month(records, reservations, None, period) == []


def test_rating_needs_no_database():
    record = SimpleNamespace(kind="job", gpus=3, gpu_model="L4", model_name="",
                             prompt_tokens=0, completion_tokens=0,
                             started_at=at("2026-10-01T00:00"),
                             ended_at=at("2026-10-01T00:00:01"))
    prices = SimpleNamespace(name="p", currency="EUR",
                             rates={("gpu_hour", ""): Decimal("1000")})
    [line] = rate_month([record], [], prices, month_period(OCTOBER, "UTC"))
    # 3 GPU-seconds = 0.000833... GPU-h -> 0.000833; x 1000 = 0.833 -> 0.83
    assert (line.quantity, line.amount) == (Decimal("0.000833"), Decimal("0.83"))


def test_parse_month():
    assert parse_month("2026-10") == OCTOBER
    for bad in ("2026-13", "2026-00", "2026-1", "October", "", "0000-01"):
        with pytest.raises(ValidationError):
            parse_month(bad)


# Plans, rates, reservations -------------------------------------------------------------------


def test_one_default_plan(world, plan):
    other = pricing_plan_create(actor=world.operator, name="other", is_default=True)
    plan.refresh_from_db()
    assert (plan.is_default, other.is_default) == (False, True)
    pricing_plan_update(actor=world.operator, plan=plan, is_default=True)
    other.refresh_from_db()
    assert list(PricingPlan.objects.filter(is_default=True)) == [plan]


def test_a_plan_in_use_cannot_be_deleted(world, plan):
    spare = pricing_plan_create(actor=world.operator, name="spare")
    tenant_set_pricing_plan(actor=world.operator, tenant=world.alpha, plan=spare)
    with pytest.raises(ValidationError, match="in use by alpha"):
        pricing_plan_delete(actor=world.operator, plan=spare)
    with pytest.raises(ValidationError, match="default plan of 1 tenant"):
        pricing_plan_delete(actor=world.operator, plan=plan)  # beta relies on it
    tenant_set_pricing_plan(actor=world.operator, tenant=world.alpha, plan=None)
    pricing_plan_delete(actor=world.operator, plan=spare)
    assert not PricingPlan.objects.filter(name="spare").exists()
    assert AuditEvent.objects.filter(action="pricing_plan.delete").count() == 1


def test_only_platform_admins_manage_pricing(world, plan):
    for actor in (world.alpha_admin, world.alpha_member):
        with pytest.raises(PermissionDenied):
            pricing_plan_create(actor=actor, name="mine")
        with pytest.raises(PermissionDenied):
            pricing_rate_set(actor=actor, plan=plan, resource="gpu_hour",
                             unit_price=Decimal(0))
        with pytest.raises(PermissionDenied):
            reservation_create(actor=actor, tenant=world.alpha, gpu_model="H100", gpus=1,
                               starts_on=OCTOBER)
        with pytest.raises(PermissionDenied):
            tenant_set_pricing_plan(actor=actor, tenant=world.alpha, plan=plan)


def test_rates_are_set_changed_and_deleted_with_audit(world, plan):
    rate = pricing_rate_set(actor=world.operator, plan=plan, resource="gpu_hour", match="H100",
                            unit_price=Decimal("3.25"))
    assert plan.rates.get(resource="gpu_hour", match="H100").unit_price == Decimal("3.25")
    event = AuditEvent.objects.filter(action="pricing_rate.set").first()
    assert event.changes["unit_price"] == {"from": "2.500000", "to": "3.25"}
    with pytest.raises(ValidationError) as error:
        pricing_rate_set(actor=world.operator, plan=plan, resource="gpu_hour",
                         unit_price=Decimal("-1"))
    assert "unit_price" in error.value.message_dict
    with pytest.raises(ValidationError):
        pricing_rate_set(actor=world.operator, plan=plan, resource="banana",
                         unit_price=Decimal("1"))
    pricing_rate_delete(actor=world.operator, rate=rate)
    assert not plan.rates.filter(match="H100", resource="gpu_hour").exists()


def test_bad_plans_and_reservations_are_refused_clearly(world, plan):
    with pytest.raises(ValidationError, match="already exists"):
        pricing_plan_create(actor=world.operator, name="standard")
    with pytest.raises(ValidationError) as error:
        pricing_plan_create(actor=world.operator, name="x", currency="dollars")
    assert "currency" in error.value.message_dict
    with pytest.raises(ValidationError) as error:
        reservation_create(actor=world.operator, tenant=world.alpha, gpu_model="H100", gpus=1,
                           starts_on=date(2026, 10, 5), ends_on=date(2026, 10, 4))
    assert "ends_on" in error.value.message_dict
    with pytest.raises(ValidationError) as error:
        reservation_create(actor=world.operator, tenant=world.alpha, gpu_model=" ", gpus=1,
                           starts_on=OCTOBER)
    assert "gpu_model" in error.value.message_dict


# Exports --------------------------------------------------------------------------------------


def test_the_csv_has_a_header_a_row_per_line_and_the_total(october):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    rows = list(csv.reader(io.StringIO(invoice_csv(invoice))))
    assert rows[0] == ["line", "resource", "match", "description", "quantity", "unit",
                       "unit_price", "amount", "currency"]
    assert [(*row[1:5], row[6], row[7]) for row in rows[1:-1]] == OCTOBER_LINES
    assert rows[1] == ["1", "reserved_gpu_month", "H100", OCTOBER_LINES[0][2], "0.032258",
                       "GPU-month", "1000.000000", "32.26", "USD"]
    assert rows[-1] == ["", "total", "", "Total alpha 2026-10", "", "", "", "1287.79", "USD"]
    assert sum(Decimal(row[7]) for row in rows[1:-1]) == Decimal(rows[-1][7])


def test_the_pdf_shows_tenant_month_lines_and_total(october):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    document = invoice_pdf(invoice)
    assert document.startswith(b"%PDF-")
    text = " ".join(page.extract_text() for page in PdfReader(io.BytesIO(document)).pages)
    text = " ".join(text.split())
    for expected in ("alpha", "2026-10", "standard", "Reserved 1 x H100", "GPU-hours, H100",
                     "covered by reservation", "Server-hours (leases), H100", "1200.00",
                     "no rate in plan standard", "Total: 1287.79 USD"):
        assert expected in text, expected
    # The same invoice gives the same file.
    assert invoice_pdf(invoice) == document


# Usage by day ---------------------------------------------------------------------------------


def test_usage_is_split_at_day_boundaries(world, plan):
    job_usage(world.alpha, 2, "H100", "2026-10-01T12:00", "2026-10-03T12:00")
    lease(world.alpha, "H100", "2026-10-02T18:00", "2026-10-03T06:00")
    tokens(world.alpha, "llama", 700, 300, "2026-10-02T09:00")
    job_usage(world.beta, 8, "H100", "2026-10-01T00:00", "2026-10-02T00:00")
    summary = usage_by_day(user=world.alpha_viewer, tenant=world.alpha,
                           start=date(2026, 10, 1), end=date(2026, 10, 5))
    rows = {row["date"].day: row for row in summary.rows()}
    assert [rows[day]["gpu_hours"] for day in (1, 2, 3, 4)] == [
        Decimal(24), Decimal(48), Decimal(24), Decimal(0)]
    assert [rows[day]["server_hours"] for day in (1, 2, 3)] == [0, Decimal(6), Decimal(6)]
    assert rows[2]["tokens"] == 1000
    assert summary.totals() == {"gpu_hours": Decimal(96), "server_hours": Decimal(12),
                                "tokens": Decimal(1000)}


def test_usage_days_follow_the_billing_time_zone(world, plan, settings):
    settings.OGAI_BILLING_TIME_ZONE = "Asia/Shanghai"
    job_usage(world.alpha, 1, "H100", "2026-09-30T22:30", "2026-09-30T23:30")
    summary = usage_by_day(user=world.alpha_member, tenant=world.alpha,
                           start=date(2026, 9, 30), end=date(2026, 10, 2))
    assert [row["gpu_hours"] for row in summary.rows()] == [0, Decimal(1)]


def test_usage_of_a_tenant_one_does_not_belong_to_is_empty(world, plan):
    job_usage(world.alpha, 2, "H100", "2026-10-01T12:00", "2026-10-03T12:00")
    summary = usage_by_day(user=world.beta_admin, tenant=world.alpha,
                           start=date(2026, 10, 1), end=date(2026, 10, 5))
    assert summary.totals()["gpu_hours"] == 0


# API ------------------------------------------------------------------------------------------


def api_client_for(user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user=user)
    return client


def _envelope(response, field, status=400):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"code", "message", "fields"}
    assert field in body["fields"], body
    return body


def test_api_rates_a_month_with_decimals_as_strings(api, october):
    response = api.as_user(october.alpha_admin).post(
        f"{INVOICES}rate/", {"tenant": "alpha", "month": "2026-10"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["tenant"], body["month"], body["total"], body["state"]) == (
        "alpha", "2026-10", "1287.79", "draft")
    assert body["lines"][0] == {
        "position": 1, "resource": "reserved_gpu_month", "match": "H100",
        "description": OCTOBER_LINES[0][2], "quantity": "0.032258", "unit": "GPU-month",
        "unit_price": "1000.000000", "amount": "32.26"}
    assert body["note"] == ""


def test_api_refuses_bad_input_with_the_envelope(api, october):
    client = api.as_user(october.operator)
    body = _envelope(client.post(f"{INVOICES}rate/", {"tenant": "alpha", "month": "2026-13"},
                                 format="json"), "month")
    assert "YYYY-MM" in body["message"]
    _envelope(client.post(f"{INVOICES}rate/", {"tenant": "nope", "month": "2026-10"},
                          format="json"), "tenant")
    _envelope(client.post(f"{INVOICES}rate/", {"tenant": "alpha", "month": "2099-01"},
                          format="json"), "month")
    _envelope(client.get(INVOICES, {"month": "2026-13"}), "month")
    _envelope(client.post(f"{PLANS}{october_plan().pk}/rates/",
                          {"resource": "gpu_hour", "unit_price": "-1"}, format="json"),
              "unit_price")
    _envelope(client.get(USAGE, {"tenant": "alpha", "from": "2026-10-05", "to": "2026-10-01"}),
              "to")
    # A tenant admin of alpha naming beta: beta is just unknown.
    _envelope(api.as_user(october.alpha_admin).post(
        f"{INVOICES}rate/", {"tenant": "beta", "month": "2026-10"}, format="json"), "tenant")
    assert not Invoice.objects.exists()


def test_invoices_are_isolated_between_tenants(api, october):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    beta = api.as_user(october.beta_admin)
    assert beta.get(INVOICES).json()["count"] == 0
    for suffix in ("", "csv/", "pdf/"):
        assert beta.get(f"{INVOICES}{invoice.pk}/{suffix}").status_code == 404
    assert beta.post(f"{INVOICES}{invoice.pk}/close/").status_code == 404
    viewer = api.as_user(october.alpha_viewer)
    assert viewer.get(f"{INVOICES}{invoice.pk}/").json()["total"] == "1287.79"
    assert viewer.get(INVOICES, {"tenant": "alpha", "month": "2026-10", "state": "draft"}
                      ).json()["count"] == 1


def test_only_a_platform_admin_closes_through_the_api(api, october):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    for user in (october.alpha_member, october.alpha_admin, october.alpha_viewer):
        response = api.as_user(user).post(f"{INVOICES}{invoice.pk}/close/")
        assert response.status_code == 403, user
        assert response.json()["code"] == "permission_denied"
    response = api.as_user(october.alpha_member).post(
        f"{INVOICES}rate/", {"tenant": "alpha", "month": "2026-10"}, format="json")
    assert response.status_code == 403
    response = api.as_user(october.operator).post(f"{INVOICES}{invoice.pk}/close/")
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["closed_by"]) == ("closed", "operator")
    invoice.refresh_from_db()
    assert invoice.state == InvoiceState.CLOSED


def test_api_downloads_are_attachments(api, october):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    client = api.as_user(october.alpha_member)
    response = client.get(f"{INVOICES}{invoice.pk}/csv/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == \
        'attachment; filename="ogai-invoice-alpha-2026-10.csv"'
    assert response.content.decode() == invoice_csv(invoice)
    response = client.get(f"{INVOICES}{invoice.pk}/pdf/", HTTP_ACCEPT="application/pdf")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/pdf"
    assert response["Content-Disposition"] == \
        'attachment; filename="ogai-invoice-alpha-2026-10.pdf"'
    assert response.content.startswith(b"%PDF-")
    response = client.get(f"{INVOICES}999999/csv/", HTTP_ACCEPT="text/csv")
    assert response.status_code == 404


def test_api_manages_plans_rates_reservations_and_assignments(api, world):
    client = api.as_user(world.operator)
    response = client.post(PLANS, {"name": "gold", "currency": "eur", "is_default": True},
                           format="json")
    assert response.status_code == 201, response.content
    plan_id = response.json()["id"]
    assert (response.json()["currency"], response.json()["is_default"]) == ("EUR", True)
    response = client.post(f"{PLANS}{plan_id}/rates/", {"resource": "gpu_hour",
                                                        "match": "H100", "unit_price": "2.5"},
                           format="json")
    assert response.json()["rates"] == [{"id": response.json()["rates"][0]["id"],
                                         "resource": "gpu_hour", "match": "H100",
                                         "unit_price": "2.500000"}]
    response = client.post(RESERVATIONS, {"tenant": "alpha", "gpu_model": "H100", "gpus": 2,
                                          "starts_on": "2026-10-01"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["ends_on"] is None
    response = client.post(f"{PLANS}assign/", {"tenant": "beta", "plan": "gold"},
                           format="json")
    assert response.status_code == 204
    world.beta.refresh_from_db()
    assert world.beta.pricing_plan.name == "gold"
    assert client.delete(f"{PLANS}{plan_id}/").status_code == 400  # beta is on it
    assert client.delete(f"{PLANS}{plan_id}/rates/?resource=gpu_hour&match=A100"
                         ).status_code == 404
    assert client.delete(f"{PLANS}{plan_id}/rates/?resource=gpu_hour&match=H100"
                         ).json()["rates"] == []

    # A tenant's people see the plan they are billed on and their reservations, and change
    # nothing.
    member = api.as_user(world.beta_member)
    assert [plan["name"] for plan in member.get(PLANS).json()["results"]] == ["gold"]
    assert member.post(PLANS, {"name": "mine"}, format="json").status_code == 403
    assert member.post(f"{PLANS}{plan_id}/rates/", {"resource": "gpu_hour", "unit_price": "0"},
                       format="json").status_code == 403
    assert member.get(RESERVATIONS).json()["count"] == 0
    assert api.as_user(world.alpha_viewer).get(RESERVATIONS).json()["count"] == 1
    assert api.as_user(world.alpha_admin).post(
        RESERVATIONS, {"tenant": "alpha", "gpu_model": "H100", "gpus": 1,
                       "starts_on": "2026-10-01"}, format="json").status_code == 403


def test_api_usage_summary(api, world, plan):
    job_usage(world.alpha, 2, "H100", "2026-10-01T12:00", "2026-10-03T12:00")
    tokens(world.alpha, "llama", 700, 300, "2026-10-02T09:00")
    response = api.as_user(world.alpha_viewer).get(
        USAGE, {"tenant": "alpha", "from": "2026-10-01", "to": "2026-10-04"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["start"], body["end"], body["time_zone"]) == ("2026-10-01", "2026-10-04", "UTC")
    assert [day["gpu_hours"] for day in body["days"]] == [
        "24.000000", "48.000000", "24.000000", "0.000000"]
    assert body["days"][1]["tokens"] == "1000"
    resources = {item["resource"]: item for item in body["resources"]}
    assert resources["gpu_hours"]["total"] == "96.000000"
    assert resources["gpu_hours"]["by_key"] == {"H100": "96.000000"}
    assert api.as_user(world.beta_admin).get(USAGE, {"tenant": "alpha"}).status_code == 400


def test_list_endpoints_pin_their_query_counts(api, october, django_assert_max_num_queries):
    for month in range(1, 11):
        invoice_rate(actor=october.operator, tenant=october.alpha, month=date(2026, month, 1))
    for tenant in (october.alpha, october.beta):
        for gpus in (1, 2, 3):
            reservation_create(actor=october.operator, tenant=tenant, gpu_model="A100",
                               gpus=gpus, starts_on=OCTOBER)
    for index in range(5):
        pricing_plan_create(actor=october.operator, name=f"plan-{index}")
    for user in (october.operator, october.alpha_member):
        client = api.as_user(user)
        for url in (INVOICES, PLANS, RESERVATIONS):
            with django_assert_max_num_queries(4):
                assert client.get(url).status_code == 200
    with django_assert_max_num_queries(5):
        assert api.as_user(october.alpha_member).get(
            USAGE, {"tenant": "alpha", "from": "2026-10-01", "to": "2026-10-31"}
        ).status_code == 200


def test_invoice_detail_costs_a_few_queries(api, october, django_assert_max_num_queries):
    invoice = invoice_rate(actor=october.operator, tenant=october.alpha, month=OCTOBER)
    with django_assert_max_num_queries(4):
        assert api.as_user(october.alpha_member).get(f"{INVOICES}{invoice.pk}/"
                                                     ).status_code == 200


def test_current_month_is_in_the_billing_time_zone(settings):
    settings.OGAI_BILLING_TIME_ZONE = "Pacific/Kiritimati"  # UTC+14
    assert current_month(at("2026-10-31T10:00")) == date(2026, 11, 1)
    settings.OGAI_BILLING_TIME_ZONE = "UTC"
    assert current_month(at("2026-10-31T10:00")) == OCTOBER
    assert current_month() == timezone.now().date().replace(day=1)
