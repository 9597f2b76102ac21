from django.contrib.auth import get_user_model
from django.urls import reverse

from infra_os.choices import Role
from infra_os.models import Membership


def test_viewer_cannot_add_a_member(signed_in, world):
    client = signed_in(world.alpha_viewer)
    response = client.post(reverse("frontend:member-add"),
                           {"username": "beta-member", "role": Role.MEMBER})
    assert response.status_code == 403
    assert b"viewer" in response.content
    assert not Membership.objects.filter(tenant=world.alpha, user=world.beta_member).exists()


def test_member_cannot_add_a_member(signed_in, world):
    response = signed_in(world.alpha_member).post(
        reverse("frontend:member-add"), {"username": "beta-member", "role": Role.MEMBER}
    )
    assert response.status_code == 403


def test_tenant_admin_adds_an_existing_user(signed_in, world):
    client = signed_in(world.alpha_admin)
    response = client.post(reverse("frontend:member-add"),
                           {"username": "beta-member", "role": Role.VIEWER})
    assert response.status_code == 302
    membership = Membership.objects.get(tenant=world.alpha, user=world.beta_member)
    assert membership.role == Role.VIEWER
    assert b"beta-member added to alpha" in client.get(response.url).content


def test_tenant_admin_creates_an_account(signed_in, world):
    client = signed_in(world.alpha_admin)
    response = client.post(reverse("frontend:member-add"), {
        "username": "newcomer", "role": Role.MEMBER, "email": "new@example.org",
        "password": "A-long-Passphrase-9",
    })
    assert response.status_code == 302
    user = get_user_model().objects.get(username="newcomer")
    assert user.check_password("A-long-Passphrase-9")
    assert Membership.objects.filter(tenant=world.alpha, user=user).exists()


def test_unknown_user_without_password_is_a_form_error(signed_in, world):
    response = signed_in(world.alpha_admin).post(
        reverse("frontend:member-add"), {"username": "ghost", "role": Role.MEMBER}
    )
    assert response.status_code == 200
    assert "give a password" in response.context["form"].errors["username"][0]


def test_weak_password_is_a_form_error(signed_in, world):
    response = signed_in(world.alpha_admin).post(
        reverse("frontend:member-add"), {"username": "ghost", "role": Role.MEMBER,
                                         "password": "123"}
    )
    assert response.status_code == 200
    assert response.context["form"].errors["password"]


def test_change_role(signed_in, world):
    membership = world.alpha_member.memberships.get(tenant=world.alpha)
    response = signed_in(world.alpha_admin).post(
        reverse("frontend:member-role", args=[membership.pk]), {"role": Role.VIEWER}
    )
    assert response.status_code == 302
    membership.refresh_from_db()
    assert membership.role == Role.VIEWER


def test_last_admin_cannot_step_down(signed_in, world):
    membership = world.alpha_admin.memberships.get(tenant=world.alpha)
    client = signed_in(world.alpha_admin)
    response = client.post(reverse("frontend:member-role", args=[membership.pk]),
                           {"role": Role.MEMBER}, follow=True)
    assert b"at least one tenant admin" in response.content
    membership.refresh_from_db()
    assert membership.role == Role.ADMIN


def test_remove_member(signed_in, world):
    membership = world.alpha_viewer.memberships.get(tenant=world.alpha)
    response = signed_in(world.alpha_admin).post(
        reverse("frontend:member-remove", args=[membership.pk])
    )
    assert response.status_code == 302
    assert not Membership.objects.filter(pk=membership.pk).exists()


def test_viewer_cannot_remove_or_change(signed_in, world):
    membership = world.alpha_member.memberships.get(tenant=world.alpha)
    client = signed_in(world.alpha_viewer)
    assert client.post(reverse("frontend:member-remove", args=[membership.pk])).status_code == 403
    response = client.post(reverse("frontend:member-role", args=[membership.pk]),
                           {"role": Role.ADMIN})
    assert response.status_code == 403
    membership.refresh_from_db()
    assert membership.role == Role.MEMBER
