"""What every visitor meets around the pages: the site's icon, API docs that load nothing from
outside the site, and an address opened with the wrong method."""

import re

import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse

# Namespaces of markup (SVG, XHTML) are names, not addresses anything is fetched from.
NAMESPACES = ("http://www.w3.org/",)


def _outside_urls(html: str) -> list[str]:
    urls = re.findall(r"""(?:https?:)?//[^\s"'<>)]+""", html)
    return [url for url in urls if not url.startswith(NAMESPACES)
            and not re.match(r"(?:https?:)?//testserver(?:/|$)", url)]


@pytest.mark.django_db
def test_the_favicon_answers_and_every_page_names_it(client, world):
    response = client.get("/favicon.ico", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain and response.redirect_chain[0][1] == 302
    assert response.redirect_chain[0][0].endswith(".svg")
    assert finders.find("frontend/favicon.svg")
    login = client.get(reverse("frontend:login")).content.decode()
    assert re.search(r'<link rel="icon" href="[^"]*favicon[^"]*\.svg"', login)
    client.force_login(world.alpha_member)
    dashboard = client.get(reverse("frontend:dashboard")).content.decode()
    assert re.search(r'<link rel="icon" href="[^"]*favicon[^"]*\.svg"', dashboard)


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["api-redoc", "api-docs"])
def test_the_api_docs_load_nothing_from_outside_the_site(client, name):
    response = client.get(reverse(name))
    assert response.status_code == 200
    html = response.content.decode()
    assert "<script src=" in html
    assert _outside_urls(html) == []
    assert "fonts.googleapis.com" not in html


def test_the_outside_url_check_sees_what_drf_spectacular_ships():
    # The check above would have caught the page drf-spectacular renders for ReDoc.
    stock = '<link rel="preconnect" href="https://fonts.gstatic.com" crossorigin>'
    assert _outside_urls(stock) == ["https://fonts.gstatic.com"]
    assert _outside_urls('<script src="//cdn.example.org/x.js">') == ["//cdn.example.org/x.js"]
    assert _outside_urls('<a href="http://testserver/api/">') == []


@pytest.mark.django_db
def test_opening_a_form_only_address_says_what_to_do(signed_in, world):
    client = signed_in(world.alpha_member)
    url = reverse("frontend:cluster-sync", args=["farm"])
    response = client.get(url, HTTP_REFERER="http://testserver/clusters/farm/")
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    page = response.content.decode()
    assert "Not a page to open" in page
    assert "This address takes a form submission, not a visit" in page
    assert 'href="http://testserver/clusters/farm/"' in page  # back where the form was
    assert 'class="sidebar"' not in page and "<form" not in page
    # A referrer from another site is no way back.
    elsewhere = client.get(url, HTTP_REFERER="https://evil.example/").content.decode()
    assert "evil.example" not in elsewhere and "Back to the dashboard" in elsewhere


@pytest.mark.django_db
def test_the_api_keeps_its_envelope_for_a_wrong_method(api, world):
    response = api.as_user(world.alpha_member).get("/api/v1/mmodel/evaluation-runs/1/cancel/")
    assert response.status_code == 405
    body = response.json()
    assert set(body) == {"code", "message", "fields"}
    assert "GET" in body["message"]
