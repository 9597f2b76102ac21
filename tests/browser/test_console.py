"""The console in a real browser: sign in, switch tenant, create and revoke an API token."""

import re

import pytest
from playwright.sync_api import Page, expect

from infra_os.models import ApiToken
from infra_os.services.tokens import api_token_authenticate

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def sign_in(page: Page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{base_url}/")


def test_sign_in_switch_tenant_and_manage_a_token(page: Page, live_server, world, password):
    # `both` is a member of alpha and a viewer of beta.
    sign_in(page, live_server.url, "both", password)
    expect(page.locator("#tenant-switcher")).to_have_value("alpha")
    expect(page.get_by_role("heading", level=1)).to_have_text("Alpha")

    page.get_by_role("link", name="Members").first.click()
    expect(page.get_by_role("cell", name="alpha-admin", exact=True)).to_be_visible()
    page.locator("#tenant-switcher").select_option("beta")
    expect(page.get_by_text("Now showing tenant Beta.")).to_be_visible()
    expect(page).to_have_url(f"{live_server.url}/members/")
    expect(page.get_by_role("cell", name="beta-admin", exact=True)).to_be_visible()
    expect(page.get_by_role("cell", name="alpha-admin", exact=True)).to_have_count(0)

    page.get_by_role("link", name="API tokens").first.click()
    page.get_by_label("Name", exact=True).first.fill("browser token")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#new-token-secret")
    expect(secret).to_be_visible()
    expect(page.get_by_text("it is shown only once")).to_be_visible()
    token = ApiToken.objects.get(user=world.both, name="browser token")
    assert api_token_authenticate(secret.inner_text().strip()) == token

    row = page.locator("tr", has_text="browser token")
    expect(row.get_by_text("Active")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke").click()
    expect(page.get_by_text("Token browser token revoked")).to_be_visible()
    expect(page.locator("tr", has_text="browser token").get_by_text("Revoked")).to_be_visible()
    expect(page.locator("#new-token-secret")).to_have_count(0)
    token.refresh_from_db()
    assert token.state == "revoked"


def test_dismissing_the_confirmation_keeps_the_token(page: Page, live_server, world, password):
    sign_in(page, live_server.url, "alpha-member", password)
    page.goto(f"{live_server.url}/tokens/")
    page.get_by_label("Name", exact=True).first.fill("kept")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#new-token-secret")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.locator("tr", has_text="kept").get_by_role("button", name="Revoke").click()
    expect(page.locator("tr", has_text="kept").get_by_text("Active")).to_be_visible()
    assert ApiToken.objects.get(name="kept").state == "active"


def test_filter_refreshes_the_table_in_place(page: Page, live_server, world, password):
    sign_in(page, live_server.url, "alpha-admin", password)
    page.goto(f"{live_server.url}/members/")
    page.evaluate("window.__sameDocument = true")
    page.get_by_label("Search").fill("viewer")
    expect(page).to_have_url(re.compile(r"/members/\?q=viewer"))
    expect(page.get_by_role("cell", name="alpha-viewer", exact=True)).to_be_visible()
    expect(page.get_by_role("cell", name="alpha-member", exact=True)).to_have_count(0)
    # htmx swapped the table: the page itself was not reloaded.
    assert page.evaluate("window.__sameDocument") is True
