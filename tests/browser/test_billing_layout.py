"""The billing pages in a real browser, each long enough to scroll: no table cell or button is
cut off by its card (a table pulled outside a card that hides its overflow loses its first
letters, its last rows and its Delete buttons). Each page's screenshot is kept in the test's
tmp dir."""

from datetime import date
from decimal import Decimal

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from infra_os.choices import RatedResource
from infra_os.services.billing import (
    invoice_rate,
    pricing_plan_create,
    pricing_rate_set,
    reservation_create,
)
from tests.factories import TenantFactory, job_usage

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

GPU_MODELS = [f"GPU-{number:02d}" for number in range(1, 25)]
OCTOBER = date(2026, 10, 1)

# Every cell and button of a card's tables, and every button in the card, whose box is not
# inside the card's box (half a pixel spared for rounding).
OUTSIDE_THEIR_CARD = """() => {
  const outside = [];
  for (const card of document.querySelectorAll("main .card")) {
    if (!card.querySelector("table")) continue;
    const box = card.getBoundingClientRect();
    for (const item of card.querySelectorAll("td, th, button")) {
      const r = item.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5
          || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) {
        outside.push(`${item.tagName} "${item.textContent.trim().slice(0, 30)}" at `
          + `${Math.round(r.left)},${Math.round(r.top)}-${Math.round(r.right)},`
          + `${Math.round(r.bottom)} outside ${Math.round(box.left)},${Math.round(box.top)}-`
          + `${Math.round(box.right)},${Math.round(box.bottom)}`);
      }
    }
  }
  return outside;
}"""


@pytest.fixture
def billing(world):
    """A default plan with a rate per GPU model, more plans and tenants, reservations, and a
    month of alpha's usage on every GPU model, rated into an invoice of as many lines."""
    plan = pricing_plan_create(actor=world.operator, name="standard", is_default=True)
    for number, model in enumerate(GPU_MODELS, start=1):
        pricing_rate_set(actor=world.operator, plan=plan, resource=RatedResource.GPU_HOUR,
                         match=model, unit_price=Decimal(number) / 4)
        job_usage(world.alpha, 1 + number % 4, model, "2026-10-02T00:00", "2026-10-02T06:00")
    for number in range(8):
        other = pricing_plan_create(actor=world.operator, name=f"plan-{number}",
                                    description="For the tenants of one contract")
        pricing_rate_set(actor=world.operator, plan=other, resource=RatedResource.GPU_HOUR,
                         match="", unit_price=Decimal("1.5"))
    for number in range(8):
        TenantFactory(name=f"team-{number}")
    for model in GPU_MODELS[:12]:
        reservation_create(actor=world.operator, tenant=world.alpha, gpu_model=model, gpus=2,
                           starts_on=OCTOBER)
    world.plan = plan
    world.invoice = invoice_rate(actor=world.operator, tenant=world.alpha, month=OCTOBER)
    return world


def _sign_in(page: Page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{base_url}/")


def _check_page(page: Page, url: str, shot, expected_text: str) -> None:
    page.goto(url)
    expect(page.get_by_text(expected_text).first).to_be_visible()
    scroll_height = page.evaluate("document.documentElement.scrollHeight")
    assert scroll_height > page.viewport_size["height"], f"{url} does not scroll"
    page.screenshot(path=shot, full_page=True)
    assert page.evaluate(OUTSIDE_THEIR_CARD) == [], url


def test_billing_tables_lie_inside_their_cards(page: Page, live_server, billing, password,
                                               tmp_path):
    page.set_viewport_size({"width": 1280, "height": 720})
    base = live_server.url
    _sign_in(page, base, "alpha-admin", password)
    _check_page(page, f"{base}{reverse('frontend:usage')}?month=2026-10",
                tmp_path / "usage.png", "Totals by resource")
    _check_page(page, f"{base}{reverse('frontend:invoice', args=[billing.invoice.pk])}",
                tmp_path / "invoice.png", "GPU-hours, GPU-24")
    page.context.clear_cookies()
    _sign_in(page, base, "operator", password)
    _check_page(page, f"{base}{reverse('frontend:pricing')}", tmp_path / "pricing.png",
                "Tenants' plans")
    _check_page(page, f"{base}{reverse('frontend:pricing-plan', args=[billing.plan.pk])}",
                tmp_path / "plan.png", "Set a rate")
    # The last rate's Delete button is there to press, not cut off.
    last = page.locator('tr[data-rate="gpu_hour:GPU-24"]')
    expect(last.get_by_role("button", name="Delete")).to_be_visible()
    for name in ("usage", "invoice", "pricing", "plan"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
