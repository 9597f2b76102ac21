"""Every console page: who may open it, and what a page and its htmx partial contain."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from infra_os.models import ApiToken, AuditEvent, Invitation
from tests.factories import AuditEventFactory, MembershipFactory, TenantFactory

HTMX = {"HTTP_HX_REQUEST": "true"}
PAGES = ["dashboard", "tenants", "members", "invitations", "quotas", "tokens", "audit",
         "clusters", "jobs", "datasets", "pipeline-runs", "training-runs", "models"]
LIST_PAGES = ["tenants", "members", "quotas", "tokens", "audit"]
ADMIN_PAGES = ["member-add", "member-invite", "tenant-create", "quota-edit"]


@pytest.mark.parametrize("name", PAGES + ADMIN_PAGES + ["switch-tenant"])
def test_anonymous_users_are_sent_to_login(client, db, name):
    url = reverse(f"frontend:{name}")
    response = client.get(url)
    assert response.status_code == 302
    assert response.url == f"{reverse('frontend:login')}?next={url}"


@pytest.mark.parametrize("name", PAGES)
def test_every_page_renders_for_a_member(signed_in, world, name):
    response = signed_in(world.alpha_member).get(reverse(f"frontend:{name}"))
    assert response.status_code == 200
    content = response.content.decode()
    assert 'class="sidebar"' in content
    assert "alpha-member" in content  # the user menu


@pytest.mark.parametrize("name", PAGES + ADMIN_PAGES)
def test_every_page_renders_for_a_platform_admin(signed_in, world, name):
    response = signed_in(world.operator, world.beta).get(reverse(f"frontend:{name}"))
    assert response.status_code == 200


@pytest.mark.parametrize("name", ["member-add", "member-invite", "tenant-create", "quota-edit"])
def test_write_forms_are_refused_to_a_viewer(signed_in, world, name):
    response = signed_in(world.alpha_viewer).get(reverse(f"frontend:{name}"))
    assert response.status_code == 403
    assert b"Not allowed" in response.content


@pytest.mark.parametrize("name", LIST_PAGES)
def test_htmx_request_gets_only_the_table_area(signed_in, world, name):
    client = signed_in(world.alpha_admin)
    response = client.get(reverse(f"frontend:{name}"), **HTMX)
    assert response.status_code == 200
    content = response.content.decode()
    assert content.lstrip().startswith('<div id="table-area"')
    assert "<html" not in content
    assert 'class="sidebar"' not in content
    assert "HX-Request" in response["Vary"]


def test_history_restore_gets_the_whole_page(signed_in, world):
    client = signed_in(world.alpha_admin)
    response = client.get(reverse("frontend:members"), HTTP_HX_HISTORY_RESTORE_REQUEST="true",
                          **HTMX)
    assert b"<html" in response.content


def test_list_page_has_htmx_filter_and_boosted_table(signed_in, world):
    content = signed_in(world.alpha_admin).get(reverse("frontend:audit")).content.decode()
    assert 'hx-get="/audit/"' in content
    assert 'hx-push-url="true"' in content
    assert 'hx-boost="true"' in content
    assert 'hx-select="#table-area"' in content
    assert "django_htmx/htmx-2.min.js" in content
    # The tenant filter is the switcher's job.
    assert 'name="tenant"' not in content.split('class="filter-bar"')[1].split("</form>")[0]


def test_filters_narrow_the_table(signed_in, world):
    AuditEventFactory(tenant=world.alpha, action="quota.update", object_repr="quota-row")
    AuditEventFactory(tenant=world.alpha, action="tenant.update", object_repr="tenant-row")
    client = signed_in(world.alpha_member)
    response = client.get(reverse("frontend:audit"), {"action": "quota"}, **HTMX)
    assert b"quota-row" in response.content
    assert b"tenant-row" not in response.content


def test_pages_paginate_by_25(signed_in, world):
    AuditEventFactory.create_batch(30, tenant=world.alpha, object_repr="paged-row")
    client = signed_in(world.alpha_member)
    first = client.get(reverse("frontend:audit")).content.decode()
    second = client.get(reverse("frontend:audit"), {"page": 2}).content.decode()
    assert first.count("paged-row") == 25
    assert second.count("paged-row") == 5
    assert "1\u201325 of 30" in first  # an en dash


def test_dashboard_shows_the_current_tenants_numbers(signed_in, world):
    world.alpha.quota.gpus = 6
    world.alpha.quota.save()
    AuditEventFactory(tenant=world.alpha, action="alpha.thing")
    AuditEventFactory(tenant=world.beta, action="beta.thing")
    response = signed_in(world.alpha_member).get(reverse("frontend:dashboard"))
    counts = response.context["counts"]
    assert counts["members"] == 4  # admin, member, viewer and `both`
    assert counts["quota_gpus"] == 6
    assert b"alpha.thing" in response.content
    assert b"beta.thing" not in response.content


def test_dashboard_of_a_user_without_tenant(signed_in, world, django_user_model):
    loner = django_user_model.objects.create_user(username="loner", password="x-Pass-12345")
    response = signed_in(loner).get(reverse("frontend:dashboard"))
    assert response.status_code == 200
    assert b"You belong to no tenant yet" in response.content


def test_navigation_has_one_section_per_layer(signed_in, world):
    response = signed_in(world.alpha_member).get(reverse("frontend:dashboard"))
    sections = [(section.label, section.layer) for section in response.context["nav_sections"]]
    assert sections == [("Computing centre", "L0"), ("Clusters", "L1"), ("Jobs", "L2"),
                        ("Toolchain", "L3"), ("Models", "L4")]
    assert b"/api/docs/" in response.content
    assert b"/api/redoc/" in response.content
    operator = signed_in(world.operator, world.alpha).get(reverse("frontend:dashboard"))
    assert ("Bare metal", "L0") in [(section.label, section.layer)
                                    for section in operator.context["nav_sections"]]


def test_django_admin_link_only_for_platform_admins(signed_in, world, client):
    assert b"/admin/" not in signed_in(world.alpha_admin).get("/").content
    client.logout()
    assert b"/admin/" in signed_in(world.operator, world.alpha).get("/").content


def test_viewers_see_no_write_controls(signed_in, world):
    client = signed_in(world.alpha_viewer)
    members = client.get(reverse("frontend:members")).content
    assert b"Add member" not in members
    assert b"Invite member" not in members
    assert b"Remove" not in members
    # Tokens are personal: a viewer may hold read-only ones.
    assert b"Create token" in client.get(reverse("frontend:tokens")).content


def test_login_page_signs_in(client, world, password):
    assert client.get(reverse("frontend:login")).status_code == 200
    response = client.post(reverse("frontend:login"),
                           {"username": "alpha-member", "password": password})
    assert response.status_code == 302
    assert response.url == reverse("frontend:dashboard")


def test_logout_is_a_post(signed_in, world):
    client = signed_in(world.alpha_member)
    assert client.get(reverse("frontend:logout")).status_code == 405
    response = client.post(reverse("frontend:logout"))
    assert response.url == reverse("frontend:login")


def test_unknown_page_uses_the_console_404(client, db):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert b"Not found" in response.content


def test_error_page_renders_with_only_status_and_title():
    from django.template.loader import render_to_string

    html = render_to_string("frontend/error.html", {"status": 500, "title": "Server error"})
    assert "Server error" in html
    assert "500" in html


# Query counts: each list page's queries do not grow with its rows.

@pytest.fixture
def crowded(world):
    for number in range(30):
        MembershipFactory(tenant=world.alpha, user__username=f"crowd-{number}")
    # Pending invitations: the members page lists alpha's, the dashboard alpha-admin's own.
    until = timezone.now() + timedelta(days=7)
    others = [TenantFactory(name=f"other-{n}") for n in range(5)]
    Invitation.objects.bulk_create(
        [Invitation(tenant=world.alpha, username=f"guest-{n}", expires_at=until)
         for n in range(30)]
        + [Invitation(tenant=other, username="alpha-admin", expires_at=until) for other in others]
    )
    AuditEventFactory.create_batch(30, tenant=world.alpha)
    ApiToken.objects.bulk_create(
        ApiToken(user=world.alpha_admin, name=f"t{n}", prefix=f"p{n:04d}", key_hash="x")
        for n in range(30)
    )
    assert AuditEvent.objects.count() == 30
    return world


@pytest.mark.parametrize(("name", "most"), [
    ("dashboard", 12), ("tenants", 7), ("members", 8), ("quotas", 8), ("tokens", 8), ("audit", 7),
])
def test_list_pages_pin_their_query_counts(signed_in, crowded, django_assert_max_num_queries,
                                           name, most):
    client = signed_in(crowded.alpha_admin)
    with django_assert_max_num_queries(most):
        response = client.get(reverse(f"frontend:{name}"))
    assert response.status_code == 200
