import pytest
from django.urls import path
from rest_framework.views import APIView

from ogai.api.errors import envelope


class Explodes(APIView):
    permission_classes: list = []

    def get(self, request):
        raise RuntimeError("boom")


urlpatterns = [path("api/v1/explodes/", Explodes.as_view())]


def test_an_unknown_api_url_answers_with_the_envelope(api, world):
    response = api.as_user(world.alpha_member).get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json() == envelope("not_found", "Nothing at /api/v1/no-such-thing/.")


def test_an_unauthenticated_request_answers_401_with_the_envelope(api, db):
    response = api.get("/api/v1/infra-os/tenants/")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.urls("ogai.tests.test_api_errors")
def test_a_crash_answers_500_with_the_envelope_and_no_traceback(api, db, caplog):
    response = api.get("/api/v1/explodes/")
    assert response.status_code == 500
    body = response.json()
    assert body["code"] == "server_error"
    assert "boom" not in body["message"]
    assert "boom" in caplog.text


def test_pagination_caps_the_limit(api, world):
    response = api.as_user(world.operator).get("/api/v1/infra-os/memberships/?limit=100000")
    assert response.status_code == 200
    assert response.json()["count"] == 8
