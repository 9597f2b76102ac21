from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from infra_os.models import ApiToken, AuditEvent
from infra_os.services.tokens import api_token_create, api_token_revoke

ME = "/api/v1/infra-os/me/"
TOKENS = "/api/v1/infra-os/api-tokens/"


def _bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_a_created_token_authenticates_and_is_shown_once(api, world):
    response = api.as_user(world.alpha_member).post(TOKENS, {"name": "laptop"}, format="json")
    assert response.status_code == 201
    secret = response.json()["token"]
    assert secret.startswith("ogai_")

    me = _bearer(secret).get(ME)
    assert me.status_code == 200
    assert me.json()["username"] == "alpha-member"
    token = ApiToken.objects.get(pk=response.json()["id"])
    assert token.last_used_at is not None
    detail = api.get(f"{TOKENS}{token.pk}/").json()
    assert "token" not in detail
    assert secret not in str(api.get(TOKENS).json())


def test_tokens_are_not_stored_in_clear(world):
    issued = api_token_create(actor=world.alpha_member, name="ci", expires_at=None)
    row = ApiToken.objects.filter(pk=issued.token.pk).values().get()
    secret_part = issued.secret.split("_", 2)[2]
    for value in row.values():
        assert secret_part not in str(value)


def test_a_revoked_token_is_refused(world):
    issued = api_token_create(actor=world.alpha_member, name="ci", expires_at=None)
    assert _bearer(issued.secret).get(ME).status_code == 200
    api_token_revoke(actor=world.alpha_member, token=issued.token)
    response = _bearer(issued.secret).get(ME)
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"


def test_an_expired_token_is_refused(world):
    issued = api_token_create(
        actor=world.alpha_member, name="short", expires_at=timezone.now() + timedelta(hours=1)
    )
    ApiToken.objects.filter(pk=issued.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert _bearer(issued.secret).get(ME).status_code == 401


def test_a_wrong_secret_with_a_real_prefix_is_refused(world):
    issued = api_token_create(actor=world.alpha_member, name="ci", expires_at=None)
    forged = issued.secret[:-4] + "AAAA"
    assert _bearer(forged).get(ME).status_code == 401
    assert _bearer("ogai_nonsense").get(ME).status_code == 401


def test_creation_and_revocation_are_audited_with_the_actor(api, world):
    client = api.as_user(world.alpha_member)
    created = client.post(TOKENS, {"name": "audited"}, format="json").json()
    revoked = client.post(f"{TOKENS}{created['id']}/revoke/")
    assert revoked.status_code == 200
    assert revoked.json()["state"] == "revoked"
    events = AuditEvent.objects.filter(
        object_id=str(created["id"]), object_type="infra_os.apitoken"
    )
    assert sorted(events.values_list("action", "actor_name")) == [
        ("api_token.create", "alpha-member"),
        ("api_token.revoke", "alpha-member"),
    ]
    assert all(event.source_ip == "127.0.0.1" for event in events)


def test_a_viewers_token_reads_but_changes_nothing(api, world):
    client = api.as_user(world.alpha_viewer)
    created = client.post(TOKENS, {"name": "dashboards"}, format="json")
    assert created.status_code == 201
    viewer = _bearer(created.json()["token"])
    assert viewer.get("/api/v1/infra-os/memberships/").status_code == 200
    refused = viewer.post("/api/v1/infra-os/memberships/",
                          {"tenant": "alpha", "username": "beta-member"}, format="json")
    assert refused.status_code == 403
    assert client.post(f"{TOKENS}{created.json()['id']}/revoke/").status_code == 200


def test_token_expiry_is_bounded(api, world):
    client = api.as_user(world.alpha_member)
    response = client.post(TOKENS, {"name": "forever", "expires_in_days": 5000}, format="json")
    assert response.status_code == 400
    assert "expires_in_days" in response.json()["fields"]
    never = client.post(TOKENS, {"name": "never", "expires_in_days": None}, format="json")
    assert never.status_code == 201
    assert never.json()["expires_at"] is None
