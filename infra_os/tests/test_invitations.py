"""Membership invitations, tried as an attacker: a tenant admin cannot pull another tenant's
member (or any account) into their tenant, cannot tell which names are accounts, and only the
invited person can accept."""

from datetime import datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from infra_os.choices import InvitationState, Role
from infra_os.models import AuditEvent, Invitation, Membership
from tests.factories import UserFactory

MEMBERSHIPS = "/api/v1/infra-os/memberships/"
INVITATIONS = "/api/v1/infra-os/invitations/"


@pytest.fixture
def loner(db):
    """An account that belongs to no tenant."""
    return UserFactory(username="loner")


def _invite(api, admin, username, *, tenant="beta", role="member"):
    return api.as_user(admin).post(INVITATIONS, {"tenant": tenant, "username": username,
                                                 "role": role}, format="json")


def test_a_tenant_admin_cannot_add_an_account_directly_and_cannot_tell_which_exist(
        api, world, loner):
    client = api.as_user(world.beta_admin)
    answers = []
    for username in ("alpha-member", "loner", "no-such-person"):
        for extra in ({}, {"password": "A-long-passphrase-9"}):
            response = client.post(MEMBERSHIPS, {"tenant": "beta", "username": username,
                                                 "role": "admin", **extra}, format="json")
            answers.append((response.status_code, response.content))
    assert len(set(answers)) == 1, answers
    status, body = answers[0]
    assert status == 403
    assert b"invitation" in body
    assert not Membership.objects.filter(tenant=world.beta,
                                         user__in=[world.alpha_member, loner]).exists()
    assert not get_user_model().objects.filter(username="no-such-person").exists()


def test_an_invitation_answers_the_same_whatever_the_name(api, world, loner):
    shapes = []
    for username in ("alpha-member", "loner", "no-such-person"):
        response = _invite(api, world.beta_admin, username, role="viewer")
        assert response.status_code == 201, response.content
        body = response.json()
        assert body["username"] == username
        shapes.append({key: value for key, value in body.items()
                       if key not in {"id", "username", "created_at", "expires_at"}})
    assert shapes[0] == shapes[1] == shapes[2] == {
        "tenant": "beta", "role": "viewer", "state": "pending", "invited_by": "beta-admin",
        "responded_at": None,
    }
    # An invitation is only an offer: nobody joined.
    assert not Membership.objects.filter(tenant=world.beta,
                                         user__in=[world.alpha_member, loner]).exists()


def test_the_invited_user_sees_the_invitation_and_accepting_makes_the_membership(api, world):
    invited = _invite(api, world.beta_admin, "alpha-member", role="viewer").json()
    client = api.as_user(world.alpha_member)
    listed = client.get(INVITATIONS).json()["results"]
    assert [(row["tenant"], row["state"]) for row in listed] == [("beta", "pending")]
    assert not Membership.objects.filter(tenant=world.beta, user=world.alpha_member).exists()

    accepted = client.post(f"{INVITATIONS}{invited['id']}/accept/")
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["tenant"] == "beta"
    assert accepted.json()["role"] == Role.VIEWER
    membership = Membership.objects.get(tenant=world.beta, user=world.alpha_member)
    assert membership.role == Role.VIEWER
    me = client.get("/api/v1/infra-os/me/").json()
    assert ("beta", "viewer") in [(m["tenant"], m["role"]) for m in me["memberships"]]
    assert client.get(f"{INVITATIONS}{invited['id']}/").json()["state"] == "accepted"
    actions = set(AuditEvent.objects.filter(tenant=world.beta).values_list("action", flat=True))
    assert {"invitation.create", "invitation.accept", "membership.create"} <= actions
    assert AuditEvent.objects.get(action="invitation.accept").actor == world.alpha_member


def test_nobody_else_can_accept_or_decline_an_invitation(api, world):
    invitation_id = _invite(api, world.beta_admin, "alpha-member").json()["id"]
    # The inviting admin sees it, another tenant's admin, a platform admin and the invitee's
    # own colleagues do not get to answer it.
    for intruder in (world.beta_admin, world.alpha_admin, world.beta_member, world.operator,
                     world.both):
        client = api.as_user(intruder)
        for action in ("accept", "decline"):
            response = client.post(f"{INVITATIONS}{invitation_id}/{action}/")
            assert response.status_code == 404, (intruder, action, response.content)
            assert response.json()["code"] == "not_found"
    invitation = Invitation.objects.get(pk=invitation_id)
    assert invitation.state == InvitationState.PENDING
    assert not Membership.objects.filter(tenant=world.beta, user=world.alpha_member).exists()


def test_an_expired_invitation_cannot_be_accepted(api, world):
    invitation_id = _invite(api, world.beta_admin, "alpha-member").json()["id"]
    Invitation.objects.filter(pk=invitation_id).update(
        expires_at=timezone.now() - timedelta(minutes=1))
    client = api.as_user(world.alpha_member)
    response = client.post(f"{INVITATIONS}{invitation_id}/accept/")
    assert response.status_code == 400
    assert "expired" in response.json()["message"]
    assert not Membership.objects.filter(tenant=world.beta, user=world.alpha_member).exists()
    assert client.get(f"{INVITATIONS}{invitation_id}/").json()["state"] == "expired"
    assert client.get(INVITATIONS, {"state": "pending"}).json()["count"] == 0
    assert client.get(INVITATIONS, {"state": "expired"}).json()["count"] == 1
    # The admin may invite again once it has expired.
    assert _invite(api, world.beta_admin, "alpha-member").status_code == 201


def test_members_and_viewers_cannot_invite(api, world):
    member = _invite(api, world.beta_member, "alpha-member")
    assert member.status_code == 403
    assert "tenant admin" in member.json()["message"]
    assert _invite(api, world.beta_viewer, "alpha-member").status_code == 403
    # Nor invite to a tenant they are not in: it is simply unknown.
    foreign = _invite(api, world.alpha_admin, "alpha-member", tenant="beta")
    assert foreign.status_code == 400
    assert "tenant" in foreign.json()["fields"]
    assert not Invitation.objects.exists()


def test_invitations_are_seen_by_their_addressee_and_the_tenants_admins_only(api, world):
    _invite(api, world.beta_admin, "alpha-member")
    _invite(api, world.alpha_admin, "beta-viewer", tenant="alpha")

    def usernames(user):
        rows = api.as_user(user).get(INVITATIONS).json()["results"]
        return sorted((row["tenant"], row["username"]) for row in rows)

    assert usernames(world.beta_admin) == [("beta", "alpha-member")]
    assert usernames(world.alpha_member) == [("beta", "alpha-member")]
    assert usernames(world.beta_viewer) == [("alpha", "beta-viewer")]
    assert usernames(world.beta_member) == []  # beta's members do not see its invitations
    assert usernames(world.alpha_viewer) == []


def test_declining_and_revoking(api, world):
    declined = _invite(api, world.beta_admin, "alpha-member").json()["id"]
    invitee = api.as_user(world.alpha_member)
    response = invitee.post(f"{INVITATIONS}{declined}/decline/")
    assert response.status_code == 200
    assert response.json()["state"] == "declined"
    assert invitee.post(f"{INVITATIONS}{declined}/accept/").status_code == 400
    assert AuditEvent.objects.filter(action="invitation.decline", actor=world.alpha_member)\
        .exists()

    revoked = _invite(api, world.beta_admin, "alpha-member").json()["id"]
    # The addressee cannot revoke (that is the tenant admin's), only decline.
    assert api.as_user(world.alpha_member).delete(f"{INVITATIONS}{revoked}/").status_code == 403
    assert api.as_user(world.beta_admin).delete(f"{INVITATIONS}{revoked}/").status_code == 204
    assert Invitation.objects.get(pk=revoked).state == InvitationState.REVOKED
    assert AuditEvent.objects.filter(action="invitation.revoke", actor=world.beta_admin).exists()
    assert api.as_user(world.alpha_member).post(f"{INVITATIONS}{revoked}/accept/")\
        .status_code == 400
    assert not Membership.objects.filter(tenant=world.beta, user=world.alpha_member).exists()


def test_inviting_twice_or_inviting_a_member_is_refused(api, world):
    assert _invite(api, world.beta_admin, "alpha-member").status_code == 201
    again = _invite(api, world.beta_admin, "alpha-member")
    assert again.status_code == 400
    assert "pending invitation" in again.json()["fields"]["username"][0]
    member = _invite(api, world.beta_admin, "beta-viewer")
    assert member.status_code == 400
    assert "already a member" in member.json()["fields"]["username"][0]


def test_an_account_made_later_under_the_invited_name_sees_it(api, world):
    invitation_id = _invite(api, world.beta_admin, "newcomer").json()["id"]
    newcomer = UserFactory(username="newcomer")
    response = api.as_user(newcomer).post(f"{INVITATIONS}{invitation_id}/accept/")
    assert response.status_code == 201
    assert Membership.objects.get(tenant=world.beta, user=newcomer).role == Role.MEMBER


def test_the_lifetime_is_a_setting(api, world, settings):
    settings.OGAI_INVITATION_DAYS = 2
    body = _invite(api, world.beta_admin, "alpha-member").json()
    left = datetime.fromisoformat(body["expires_at"]) - timezone.now()
    assert timedelta(days=1) < left <= timedelta(days=2)
