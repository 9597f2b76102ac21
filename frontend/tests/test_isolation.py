"""A console page shows the current tenant's rows only, whoever asks."""

from django.urls import reverse

from infra_os.services.tokens import api_token_create
from tests.factories import AuditEventFactory


def test_members_page_shows_only_the_current_tenant(signed_in, world):
    content = signed_in(world.alpha_admin).get(reverse("frontend:members")).content.decode()
    assert "alpha-viewer" in content
    assert "beta-member" not in content
    assert "beta-admin" not in content


def test_audit_log_shows_only_the_current_tenant(signed_in, world):
    AuditEventFactory(tenant=world.alpha, object_repr="alpha-secret-plan")
    AuditEventFactory(tenant=world.beta, object_repr="beta-secret-plan")
    content = signed_in(world.alpha_member).get(reverse("frontend:audit")).content.decode()
    assert "alpha-secret-plan" in content
    assert "beta-secret-plan" not in content


def test_a_tenant_filter_in_the_query_cannot_reach_another_tenant(signed_in, world):
    AuditEventFactory(tenant=world.beta, object_repr="beta-secret-plan")
    client = signed_in(world.alpha_member)
    content = client.get(reverse("frontend:audit"), {"tenant": "beta"}).content.decode()
    assert "beta-secret-plan" not in content


def test_tokens_page_shows_only_my_tokens(signed_in, world):
    api_token_create(actor=world.alpha_admin, name="admins-token", expires_at=None)
    api_token_create(actor=world.alpha_member, name="members-token", expires_at=None)
    content = signed_in(world.alpha_member).get(reverse("frontend:tokens")).content.decode()
    assert "members-token" in content
    assert "admins-token" not in content


def test_platform_admins_see_their_own_tokens_only(signed_in, world):
    api_token_create(actor=world.alpha_admin, name="admins-token", expires_at=None)
    content = signed_in(world.operator, world.alpha).get(reverse("frontend:tokens")).content
    assert b"admins-token" not in content


def test_platform_admin_sees_the_tenant_the_switcher_chose(signed_in, world):
    AuditEventFactory(tenant=world.alpha, object_repr="alpha-secret-plan")
    AuditEventFactory(tenant=world.beta, object_repr="beta-secret-plan")
    content = signed_in(world.operator, world.beta).get(reverse("frontend:audit")).content
    assert b"beta-secret-plan" in content
    assert b"alpha-secret-plan" not in content


def test_quota_page_shows_the_current_tenants_quota(signed_in, world):
    world.beta.quota.gpus = 77
    world.beta.quota.save()
    response = signed_in(world.alpha_member).get(reverse("frontend:quotas"))
    assert response.context["quota"].tenant == world.alpha
    assert list(response.context["table"].data) == [world.alpha.quota]


def test_tenants_page_lists_the_tenants_the_user_sees(signed_in, world):
    response = signed_in(world.both).get(reverse("frontend:tenants"))
    assert {row.name for row in response.context["table"].data} == {"alpha", "beta"}
    response = signed_in(world.alpha_member).get(reverse("frontend:tenants"))
    assert {row.name for row in response.context["table"].data} == {"alpha"}


def test_members_of_another_tenant_cannot_be_changed(signed_in, world):
    beta_membership = world.beta_member.memberships.get()
    client = signed_in(world.alpha_admin)
    response = client.post(reverse("frontend:member-remove", args=[beta_membership.pk]))
    assert response.status_code == 404
    assert world.beta_member.memberships.exists()
