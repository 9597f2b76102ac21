from django.urls import reverse

from frontend.access import SESSION_KEY

SWITCH = reverse("frontend:switch-tenant")


def test_switch_to_a_tenant_of_mine(signed_in, world):
    client = signed_in(world.both)
    assert client.get(reverse("frontend:dashboard")).context["current_tenant"] == world.alpha
    response = client.post(SWITCH, {"tenant": "beta", "next": "/members/"})
    assert response.status_code == 302
    assert response.url == "/members/"
    assert client.session[SESSION_KEY] == "beta"
    page = client.get("/members/").content.decode()
    assert "beta-admin" in page
    assert "alpha-admin" not in page


def test_switcher_refuses_a_tenant_i_do_not_belong_to(signed_in, world):
    client = signed_in(world.alpha_admin)
    response = client.post(SWITCH, {"tenant": "beta", "next": "/"})
    assert response.status_code == 404
    assert SESSION_KEY not in client.session
    assert client.get("/").context["current_tenant"] == world.alpha


def test_switcher_ignores_an_offsite_next(signed_in, world):
    client = signed_in(world.both)
    response = client.post(SWITCH, {"tenant": "beta", "next": "https://evil.example/"})
    assert response.url == reverse("frontend:dashboard")


def test_switcher_is_post_only(signed_in, world):
    assert signed_in(world.both).get(SWITCH).status_code == 405


def test_platform_admin_sees_and_switches_to_every_tenant(signed_in, world):
    client = signed_in(world.operator)
    options = client.get("/").context["switcher_tenants"]
    assert {tenant.name for tenant in options} == {"alpha", "beta"}
    client.post(SWITCH, {"tenant": "beta"})
    assert client.get("/").context["current_tenant"] == world.beta


def test_switcher_lists_only_my_tenants(signed_in, world):
    content = signed_in(world.alpha_member).get("/").content.decode()
    assert 'value="alpha"' in content
    assert 'value="beta"' not in content
