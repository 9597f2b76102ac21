"""Bad input answers 400 with the error envelope naming the field, and changes nothing."""

import pytest
from django.test import override_settings

from infra_os.models import AuditEvent, Membership, Quota, Tenant

TENANTS = "/api/v1/infra-os/tenants/"
QUOTAS = "/api/v1/infra-os/quotas/"
MEMBERSHIPS = "/api/v1/infra-os/memberships/"


def _snapshot():
    return (
        list(Tenant.objects.values().order_by("pk")),
        list(Quota.objects.values().order_by("pk")),
        list(Membership.objects.values().order_by("pk")),
        AuditEvent.objects.count(),
    )


@pytest.fixture
def unchanged(world):
    before = _snapshot()
    yield
    assert _snapshot() == before


def _assert_envelope(response, field=None):
    assert response.status_code == 400, response.content
    body = response.json()
    assert set(body) == {"code", "message", "fields"}
    assert body["message"]
    if field:
        assert field in body["fields"], body
    return body


@pytest.mark.parametrize("field", ["gpus", "cpu_cores", "memory_gib", "storage_gib"])
def test_a_quota_below_zero(api, world, unchanged, field):
    quota = world.alpha.quota
    response = api.as_user(world.operator).patch(f"{QUOTAS}{quota.pk}/", {field: -1},
                                                 format="json")
    body = _assert_envelope(response, field)
    assert body["code"] == "invalid"


def test_a_gpu_model_limit_above_the_gpu_quota(api, world, unchanged):
    quota = world.alpha.quota
    response = api.as_user(world.operator).patch(
        f"{QUOTAS}{quota.pk}/", {"gpu_model_limits": {"H100": quota.gpus + 1}}, format="json"
    )
    _assert_envelope(response, "gpu_model_limits")


def test_a_tenant_name_that_collides(api, world, unchanged):
    response = api.as_user(world.operator).post(TENANTS, {"name": "alpha"}, format="json")
    body = _assert_envelope(response, "name")
    assert "already exists" in body["fields"]["name"][0]


def test_a_tenant_name_that_is_not_a_slug(api, world, unchanged):
    response = api.as_user(world.operator).post(TENANTS, {"name": "Not A Slug!"}, format="json")
    _assert_envelope(response, "name")


def test_malformed_json(api, world, unchanged):
    response = api.as_user(world.alpha_admin).post(
        MEMBERSHIPS, '{"tenant": "alpha", "username": ', content_type="application/json"
    )
    body = _assert_envelope(response)
    assert body["code"] == "parse_error"


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_an_oversized_body(api, world, unchanged):
    payload = {"tenant": "alpha", "username": "x" * 2000}
    response = api.as_user(world.alpha_admin).post(MEMBERSHIPS, payload, format="json")
    body = _assert_envelope(response)
    assert body["code"] == "request_too_large"
    assert "1000 bytes" in body["message"]


def test_an_unknown_or_foreign_tenant_is_just_unknown(api, world, unchanged):
    client = api.as_user(world.alpha_admin)
    for name in ("beta", "no-such-tenant"):
        response = client.post(MEMBERSHIPS, {"tenant": name, "username": "alpha-member"},
                               format="json")
        _assert_envelope(response, "tenant")
