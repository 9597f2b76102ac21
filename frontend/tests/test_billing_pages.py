"""The console's usage, invoices and pricing pages."""

from datetime import date
from decimal import Decimal

import pytest
from django.urls import reverse

from infra_os.choices import InvoiceState, RatedResource
from infra_os.models import Invoice, PricingPlan, Reservation
from infra_os.services.billing import (
    invoice_rate,
    pricing_plan_create,
    pricing_rate_set,
    reservation_create,
)
from tests.factories import TenantFactory, job_usage

OCTOBER = date(2026, 10, 1)




@pytest.fixture
def billed(world):
    """Alpha used H100s and an A100 over three days of October 2026, on plan `standard`
    (H100 at 2.50 a GPU-hour); its October invoice is rated."""
    plan = pricing_plan_create(actor=world.operator, name="standard", is_default=True)
    pricing_rate_set(actor=world.operator, plan=plan, resource=RatedResource.GPU_HOUR,
                     match="H100", unit_price=Decimal("2.50"))
    job_usage(world.alpha, 2, "H100", "2026-10-01T12:00", "2026-10-03T12:00")  # 96 GPU-h
    job_usage(world.alpha, 1, "A100", "2026-10-02T00:00", "2026-10-02T01:00")  # no rate
    world.plan = plan
    world.invoice = invoice_rate(actor=world.operator, tenant=world.alpha, month=OCTOBER)
    return world


def test_usage_page_draws_charts_by_day(signed_in, billed):
    response = signed_in(billed.alpha_viewer).get(reverse("frontend:usage"),
                                                  {"month": "2026-10"})
    assert response.status_code == 200
    content = response.content.decode()
    assert content.count('<svg class="chart"') == 3
    assert 'data-chart="gpu_hours"' in content
    # A 3-day job is a bar on each of its days, named in the bar's tooltip.
    for day in ("2026-10-01", "2026-10-02", "2026-10-03"):
        assert f"<title>{day} · H100:" in content
    assert "<title>2026-10-02 · H100: 48.000000 GPU-hours</title>" in content
    assert "<title>2026-10-02 · A100: 1.000000 GPU-hours</title>" in content
    totals = content.split("data-totals")[1]
    assert "96.000000" in totals and "97.000000" in totals
    assert "<script" not in content.split("<main")[1]


def test_usage_page_says_when_a_month_is_wrong(signed_in, billed):
    response = signed_in(billed.alpha_member).get(reverse("frontend:usage"),
                                                  {"month": "2026-13"})
    assert response.status_code == 200
    assert "Give a month as YYYY-MM" in response.content.decode()


def test_usage_page_without_usage_still_draws_empty_charts(signed_in, world):
    response = signed_in(world.beta_member).get(reverse("frontend:usage"),
                                                {"month": "2026-10"})
    assert response.status_code == 200
    assert "No use in this period" in response.content.decode()


def test_invoice_list_and_detail(signed_in, billed):
    client = signed_in(billed.alpha_member)
    content = client.get(reverse("frontend:invoices")).content.decode()
    assert 'data-invoice="2026-10"' in content
    assert "240.00 USD" in content  # 96 GPU-h x 2.50
    assert "Rate month" not in content  # members read only
    response = client.get(reverse("frontend:invoice", args=[billed.invoice.pk]))
    assert response.status_code == 200
    content = response.content.decode()
    assert "GPU-hours, H100" in content
    assert "GPU-hours, A100 - no rate in plan standard" in content
    assert "240.00 USD" in content.split("data-total")[1]
    assert "Download CSV" in content and "Download PDF" in content
    assert "Rate again" not in content and ">Close<" not in content


def test_a_platform_admin_rates_and_closes_with_confirmation(signed_in, billed):
    client = signed_in(billed.operator, billed.alpha)
    url = reverse("frontend:invoice", args=[billed.invoice.pk])
    content = client.get(url).content.decode()
    assert "Rate again" in content
    assert 'data-confirm="Close the invoice of alpha for 2026-10?' in content
    job_usage(billed.alpha, 1, "H100", "2026-10-20T00:00", "2026-10-20T04:00")  # +10.00
    response = client.post(reverse("frontend:invoice-rerate", args=[billed.invoice.pk]),
                           follow=True)
    assert "Rated again: 250.00 USD." in response.content.decode()
    response = client.post(reverse("frontend:invoice-close", args=[billed.invoice.pk]),
                           follow=True)
    assert "It will not change again." in response.content.decode()
    billed.invoice.refresh_from_db()
    assert billed.invoice.state == InvoiceState.CLOSED
    content = client.get(url).content.decode()
    assert "Rate again" not in content and "data-confirm" not in content.split("<main")[1]


def test_a_tenant_admin_rates_a_month_from_the_list(signed_in, billed):
    client = signed_in(billed.alpha_admin)
    assert "Rate month" in client.get(reverse("frontend:invoices")).content.decode()
    response = client.post(reverse("frontend:invoice-rate"), {"month": "2026-09"})
    invoice = Invoice.objects.get(tenant=billed.alpha, month=date(2026, 9, 1))
    assert response.url == reverse("frontend:invoice", args=[invoice.pk])
    response = client.post(reverse("frontend:invoice-rate"), {"month": "2099-01"}, follow=True)
    assert "has not begun" in response.content.decode()


def test_members_cannot_close_or_rate(signed_in, billed):
    client = signed_in(billed.alpha_member)
    response = client.post(reverse("frontend:invoice-close", args=[billed.invoice.pk]))
    assert response.status_code == 403
    response = client.post(reverse("frontend:invoice-rerate", args=[billed.invoice.pk]))
    assert response.status_code == 403
    billed.invoice.refresh_from_db()
    assert billed.invoice.state == InvoiceState.DRAFT


def test_another_tenants_invoice_is_not_found(signed_in, billed):
    client = signed_in(billed.beta_admin)
    for name in ("invoice", "invoice-csv", "invoice-pdf"):
        assert client.get(reverse(f"frontend:{name}", args=[billed.invoice.pk])
                          ).status_code == 404
    assert 'data-invoice="2026-10"' not in client.get(reverse("frontend:invoices")
                                                      ).content.decode()


def test_downloads(signed_in, billed):
    client = signed_in(billed.alpha_viewer)
    response = client.get(reverse("frontend:invoice-csv", args=[billed.invoice.pk]))
    assert response["Content-Disposition"] == \
        'attachment; filename="ogai-invoice-alpha-2026-10.csv"'
    assert response.content.decode().splitlines()[-1] == \
        ",total,,Total alpha 2026-10,,,,240.00,USD"
    response = client.get(reverse("frontend:invoice-pdf", args=[billed.invoice.pk]))
    assert response["Content-Type"] == "application/pdf"
    assert response.content.startswith(b"%PDF-")


def test_pricing_for_a_tenant_shows_its_own_plan(signed_in, billed):
    other = pricing_plan_create(actor=billed.operator, name="secret-deal")
    assert other.pk
    content = signed_in(billed.alpha_member).get(reverse("frontend:pricing")).content.decode()
    assert "Plan standard" in content and "2.500000" in content
    assert "secret-deal" not in content
    assert "New plan" not in content
    for name in ("pricing-plan-create", "reservation-create"):
        assert signed_in(billed.alpha_member).get(reverse(f"frontend:{name}")
                                                  ).status_code == 403


def test_a_platform_admin_manages_plans_rates_and_reservations(signed_in, billed):
    client = signed_in(billed.operator, billed.alpha)
    content = client.get(reverse("frontend:pricing")).content.decode()
    assert 'data-plan="standard"' in content and "Default" in content
    assert 'data-tenant="beta"' in content

    response = client.post(reverse("frontend:pricing-plan-create"),
                           {"name": "gold", "currency": "dollars"})
    assert response.status_code == 200
    assert "Use a three-letter code, e.g. USD." in response.content.decode()
    response = client.post(reverse("frontend:pricing-plan-create"),
                           {"name": "standard", "currency": "USD"})
    assert "A plan with this name already exists." in response.content.decode()
    response = client.post(reverse("frontend:pricing-plan-create"),
                           {"name": "gold", "currency": "eur"})
    gold = PricingPlan.objects.get(name="gold")
    assert response.url == reverse("frontend:pricing-plan", args=[gold.pk])
    assert gold.currency == "EUR"

    url = reverse("frontend:pricing-rate-set", args=[gold.pk])
    response = client.post(url, {"resource": "gpu_hour", "match": "H100", "unit_price": "-1"})
    assert response.status_code == 400
    assert "greater than or equal to 0" in response.content.decode()
    client.post(url, {"resource": "gpu_hour", "match": "H100", "unit_price": "3.5"})
    rate = gold.rates.get()
    assert rate.unit_price == Decimal("3.5")
    assert "3.500000" in client.get(reverse("frontend:pricing-plan", args=[gold.pk])
                                    ).content.decode()

    client.post(reverse("frontend:tenant-plan", args=["alpha"]), {"plan": "gold"})
    billed.alpha.refresh_from_db()
    assert billed.alpha.pricing_plan == gold
    response = client.post(reverse("frontend:pricing-plan-delete", args=[gold.pk]), follow=True)
    assert "in use by alpha" in response.content.decode()

    response = client.post(reverse("frontend:reservation-create"), {
        "tenant": "alpha", "gpu_model": "H100", "gpus": 2, "starts_on": "2026-10-05",
        "ends_on": "2026-10-01"})
    assert "The last day cannot be before the first." in response.content.decode()
    client.post(reverse("frontend:reservation-create"), {
        "tenant": "alpha", "gpu_model": "H100", "gpus": 2, "starts_on": "2026-10-01"})
    reservation = Reservation.objects.get()
    assert "Delete the reservation of 2 x H100 for alpha?" in client.get(
        reverse("frontend:pricing")).content.decode()
    client.post(reverse("frontend:reservation-delete", args=[reservation.pk]))
    assert not Reservation.objects.exists()
    client.post(reverse("frontend:pricing-rate-delete", args=[gold.pk, rate.pk]))
    assert not gold.rates.exists()


def test_pages_are_in_the_navigation(signed_in, billed):
    content = signed_in(billed.alpha_member).get(reverse("frontend:dashboard")).content.decode()
    for name in ("usage", "invoices", "pricing"):
        assert f'href="{reverse(f"frontend:{name}")}"' in content


@pytest.mark.parametrize(("name", "most"), [
    ("usage", 6), ("invoices", 7), ("pricing", 9),
])
def test_billing_pages_pin_their_query_counts(signed_in, billed, django_assert_max_num_queries,
                                              name, most):
    for month in range(1, 10):
        invoice_rate(actor=billed.operator, tenant=billed.alpha, month=date(2026, month, 1))
    for gpus in range(1, 6):
        reservation_create(actor=billed.operator, tenant=billed.alpha, gpu_model="H100",
                           gpus=gpus, starts_on=OCTOBER)
    for index in range(5):
        job_usage(billed.alpha, 1, f"GPU{index}", "2026-10-04T00:00", "2026-10-06T00:00")
    client = signed_in(billed.alpha_admin)
    with django_assert_max_num_queries(most):
        response = client.get(reverse(f"frontend:{name}"), {"month": "2026-10"})
    assert response.status_code == 200


def test_invoice_and_admin_pricing_pages_pin_their_query_counts(signed_in, billed,
                                                                django_assert_max_num_queries):
    for index in range(5):
        plan = pricing_plan_create(actor=billed.operator, name=f"plan-{index}")
        pricing_rate_set(actor=billed.operator, plan=plan, resource="gpu_hour",
                         unit_price=Decimal(index))
        TenantFactory(name=f"extra-{index}", pricing_plan=plan)
        reservation_create(actor=billed.operator, tenant=billed.beta, gpu_model="H100",
                           gpus=index + 1, starts_on=OCTOBER)
    client = signed_in(billed.operator, billed.alpha)
    with django_assert_max_num_queries(7):
        assert client.get(reverse("frontend:invoice", args=[billed.invoice.pk])
                          ).status_code == 200
    with django_assert_max_num_queries(10):
        assert client.get(reverse("frontend:pricing")).status_code == 200
