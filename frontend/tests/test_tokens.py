from django.urls import reverse

from infra_os.models import ApiToken, AuditEvent
from infra_os.services.tokens import api_token_authenticate, api_token_create


def test_create_token_shows_the_secret_once(signed_in, world):
    client = signed_in(world.alpha_member)
    response = client.post(reverse("frontend:token-create"),
                           {"name": "laptop", "expires_in_days": "30"})
    assert response.status_code == 302
    assert response.url == reverse("frontend:tokens")

    page = client.get(response.url)
    secret = page.context["new_token"]["secret"]
    assert 'id="new-token-secret"' in page.content.decode()
    assert secret in page.content.decode()
    token = ApiToken.objects.get(user=world.alpha_member, name="laptop")
    assert api_token_authenticate(secret) == token
    assert 29 <= (token.expires_at - token.created_at).days <= 30
    assert "no-store" in page["Cache-Control"]

    again = client.get(reverse("frontend:tokens"))
    assert secret not in again.content.decode()
    assert again.context["new_token"] is None


def test_htmx_refresh_does_not_spend_the_secret(signed_in, world):
    client = signed_in(world.alpha_member)
    client.post(reverse("frontend:token-create"), {"name": "laptop", "expires_in_days": ""})
    client.get(reverse("frontend:tokens"), HTTP_HX_REQUEST="true")
    page = client.get(reverse("frontend:tokens"))
    assert page.context["new_token"]["name"] == "laptop"
    assert ApiToken.objects.get(name="laptop").expires_at is None


def test_create_token_validates_the_expiry(signed_in, world):
    client = signed_in(world.alpha_member)
    response = client.post(reverse("frontend:token-create"),
                           {"name": "laptop", "expires_in_days": "400"})
    assert response.status_code == 200
    assert response.context["form"].errors["expires_in_days"]
    assert not ApiToken.objects.exists()


def test_revoke_token(signed_in, world):
    issued = api_token_create(actor=world.alpha_member, name="old", expires_at=None)
    client = signed_in(world.alpha_member)
    assert b"Revoke" in client.get(reverse("frontend:tokens")).content
    response = client.post(reverse("frontend:token-revoke", args=[issued.token.pk]))
    assert response.status_code == 302
    issued.token.refresh_from_db()
    assert issued.token.state == "revoked"
    assert api_token_authenticate(issued.secret) is None
    page = client.get(reverse("frontend:tokens")).content.decode()
    assert "Token old revoked" in page
    assert "Revoked" in page
    assert AuditEvent.objects.filter(action="api_token.revoke").exists()


def test_cannot_revoke_someone_elses_token(signed_in, world):
    issued = api_token_create(actor=world.alpha_admin, name="theirs", expires_at=None)
    response = signed_in(world.alpha_member).post(
        reverse("frontend:token-revoke", args=[issued.token.pk])
    )
    assert response.status_code == 404
    issued.token.refresh_from_db()
    assert issued.token.revoked_at is None


def test_a_viewer_creates_their_own_read_only_token(signed_in, world):
    client = signed_in(world.alpha_viewer)
    response = client.post(reverse("frontend:token-create"), {"name": "dashboards"})
    assert response.status_code == 302
    assert ApiToken.objects.get().user == world.alpha_viewer


def test_revoke_is_post_only(signed_in, world):
    issued = api_token_create(actor=world.alpha_member, name="old", expires_at=None)
    client = signed_in(world.alpha_member)
    assert client.get(reverse("frontend:token-revoke", args=[issued.token.pk])).status_code == 405
