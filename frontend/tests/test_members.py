from django.contrib.auth import get_user_model
from django.urls import reverse

from infra_os.choices import InvitationState, Role
from infra_os.models import Invitation, Membership
from infra_os.services.invitations import invitation_create


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


def test_platform_admin_adds_an_existing_user(signed_in, world):
    client = signed_in(world.operator, world.alpha)
    response = client.post(reverse("frontend:member-add"),
                           {"username": "beta-member", "role": Role.VIEWER})
    assert response.status_code == 302
    membership = Membership.objects.get(tenant=world.alpha, user=world.beta_member)
    assert membership.role == Role.VIEWER
    assert b"beta-member added to alpha" in client.get(response.url).content


def test_platform_admin_creates_an_account(signed_in, world):
    client = signed_in(world.operator, world.alpha)
    response = client.post(reverse("frontend:member-add"), {
        "username": "newcomer", "role": Role.MEMBER, "email": "new@example.org",
        "password": "A-long-Passphrase-9",
    })
    assert response.status_code == 302
    user = get_user_model().objects.get(username="newcomer")
    assert user.check_password("A-long-Passphrase-9")
    assert Membership.objects.filter(tenant=world.alpha, user=user).exists()


def test_unknown_user_without_password_is_a_form_error(signed_in, world):
    response = signed_in(world.operator, world.alpha).post(
        reverse("frontend:member-add"), {"username": "ghost", "role": Role.MEMBER}
    )
    assert response.status_code == 200
    assert "give a password" in response.context["form"].errors["username"][0]


def test_weak_password_is_a_form_error(signed_in, world):
    response = signed_in(world.operator, world.alpha).post(
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


# -- invitations -------------------------------------------------------------------------------


def test_a_tenant_admin_cannot_add_directly_whatever_the_name(signed_in, world):
    client = signed_in(world.beta_admin)
    # The direct-add page sends a tenant admin to the invitation form.
    page = client.get(reverse("frontend:member-add"))
    assert page.status_code == 302
    assert page.url == reverse("frontend:member-invite")
    answers = set()
    for username in ("alpha-member", "no-such-person"):
        response = client.post(reverse("frontend:member-add"),
                               {"username": username, "role": Role.ADMIN})
        answers.add((response.status_code, response.content))
    assert len(answers) == 1
    status, content = answers.pop()
    assert status == 403
    assert b"invitation" in content
    assert not Membership.objects.filter(tenant=world.beta, user=world.alpha_member).exists()


def test_a_tenant_admin_invites_and_the_invited_user_accepts(signed_in, world, client):
    admin = signed_in(world.beta_admin)
    response = admin.post(reverse("frontend:member-invite"),
                          {"username": "alpha-member", "role": Role.VIEWER})
    assert response.status_code == 302
    members_page = admin.get(response.url).content.decode()
    assert "alpha-member is invited to beta as viewer" in members_page
    assert "Invitations waiting for an answer" in members_page
    assert not Membership.objects.filter(tenant=world.beta, user=world.alpha_member).exists()
    invitation = Invitation.objects.get(tenant=world.beta, username="alpha-member")

    client.logout()
    invitee = signed_in(world.alpha_member)
    dashboard = invitee.get(reverse("frontend:dashboard")).content.decode()
    assert "Invitations waiting for you" in dashboard
    assert reverse("frontend:invitation-accept", args=[invitation.pk]) in dashboard
    accepted = invitee.post(reverse("frontend:invitation-accept", args=[invitation.pk]))
    assert accepted.status_code == 302
    assert Membership.objects.get(tenant=world.beta, user=world.alpha_member).role == \
        Role.VIEWER
    # The console now shows the tenant just joined.
    assert b"You joined beta as viewer" in invitee.get(accepted.url).content
    assert invitee.get(reverse("frontend:dashboard")).context["current_tenant"] == world.beta


def test_inviting_names_no_account_apart(signed_in, world):
    client = signed_in(world.beta_admin)
    for username in ("alpha-member", "no-such-person"):
        response = client.post(reverse("frontend:member-invite"),
                               {"username": username, "role": Role.MEMBER}, follow=True)
        assert f"{username} is invited to beta as member".encode() in response.content


def test_someone_elses_invitation_cannot_be_answered(signed_in, world):
    invitation = invitation_create(actor=world.beta_admin, tenant=world.beta,
                                   username="alpha-member")
    client = signed_in(world.alpha_admin)
    for name in ("frontend:invitation-accept", "frontend:invitation-decline"):
        assert client.post(reverse(name, args=[invitation.pk])).status_code == 404
    invitation.refresh_from_db()
    assert invitation.state == InvitationState.PENDING
    assert b"No invitations are waiting" in client.get(reverse("frontend:invitations")).content


def test_declining_and_revoking_in_the_console(signed_in, world, client):
    declined = invitation_create(actor=world.beta_admin, tenant=world.beta,
                                 username="alpha-member")
    invitee = signed_in(world.alpha_member)
    response = invitee.post(reverse("frontend:invitation-decline", args=[declined.pk]),
                            follow=True)
    assert b"You declined the invitation to beta" in response.content
    declined.refresh_from_db()
    assert declined.state == InvitationState.DECLINED

    client.logout()
    revoked = invitation_create(actor=world.beta_admin, tenant=world.beta,
                                username="alpha-member")
    # A member of beta cannot revoke it; its admin can.
    assert signed_in(world.beta_member).post(
        reverse("frontend:invitation-revoke", args=[revoked.pk])).status_code == 404
    client.logout()
    response = signed_in(world.beta_admin).post(
        reverse("frontend:invitation-revoke", args=[revoked.pk]), follow=True)
    assert b"The invitation of alpha-member is revoked" in response.content
    revoked.refresh_from_db()
    assert revoked.state == InvitationState.REVOKED


def test_viewers_and_members_cannot_invite(signed_in, world, client):
    for user in (world.beta_viewer, world.beta_member):
        response = signed_in(user).post(reverse("frontend:member-invite"),
                                        {"username": "alpha-member", "role": Role.ADMIN})
        assert response.status_code == 403
        client.logout()
    assert not Invitation.objects.exists()
