from infra_os.choices import Role
from infra_os.models import AuditEvent, Membership, Tenant

TENANTS = "/api/v1/infra-os/tenants/"
MEMBERSHIPS = "/api/v1/infra-os/memberships/"
QUOTAS = "/api/v1/infra-os/quotas/"


def test_a_platform_admin_creates_a_tenant_with_its_quota(api, world):
    response = api.as_user(world.operator).post(
        TENANTS, {"name": "gamma", "display_name": "Gamma", "gpus": 16, "cpu_cores": 128},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["quota"]["gpus"] == 16
    assert body["member_count"] == 0
    event = AuditEvent.objects.get(action="tenant.create", tenant__name="gamma")
    assert event.actor == world.operator


def test_only_platform_admins_create_tenants_or_change_quotas(api, world):
    client = api.as_user(world.alpha_admin)
    assert client.post(TENANTS, {"name": "mine"}, format="json").status_code == 403
    quota = world.alpha.quota
    assert client.patch(f"{QUOTAS}{quota.pk}/", {"gpus": 999}, format="json").status_code == 403
    quota.refresh_from_db()
    assert quota.gpus == 8
    assert not Tenant.objects.filter(name="mine").exists()


def test_a_tenant_admin_edits_their_tenant_but_a_member_cannot(api, world):
    url = f"{TENANTS}alpha/"
    assert api.as_user(world.alpha_member).patch(url, {"display_name": "X"},
                                                 format="json").status_code == 403
    response = api.as_user(world.alpha_admin).patch(url, {"display_name": "Alpha Lab"},
                                                    format="json")
    assert response.status_code == 200
    assert response.json()["display_name"] == "Alpha Lab"
    assert response.json()["my_role"] == Role.ADMIN


def test_a_platform_admin_adds_and_creates_members(api, world):
    client = api.as_user(world.operator)
    existing = client.post(MEMBERSHIPS, {"tenant": "alpha", "username": "beta-member",
                                         "role": "viewer"}, format="json")
    assert existing.status_code == 201, existing.content
    created = client.post(MEMBERSHIPS, {"tenant": "alpha", "username": "newcomer",
                                        "password": "A-long-passphrase-9"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["user"]["username"] == "newcomer"
    missing = client.post(MEMBERSHIPS, {"tenant": "alpha", "username": "ghost"}, format="json")
    assert missing.status_code == 400
    assert "username" in missing.json()["fields"]
    weak = client.post(MEMBERSHIPS, {"tenant": "alpha", "username": "weak",
                                     "password": "123"}, format="json")
    assert weak.status_code == 400
    assert "password" in weak.json()["fields"]


def test_a_member_cannot_manage_members(api, world):
    response = api.as_user(world.alpha_member).post(
        MEMBERSHIPS, {"tenant": "alpha", "username": "beta-member"}, format="json"
    )
    assert response.status_code == 403
    assert not Membership.objects.filter(tenant=world.alpha, user=world.beta_member).exists()


def test_the_last_tenant_admin_cannot_be_removed_or_demoted(api, world):
    admin = Membership.objects.get(tenant=world.alpha, user=world.alpha_admin)
    client = api.as_user(world.alpha_admin)
    demoted = client.patch(f"{MEMBERSHIPS}{admin.pk}/", {"role": "member"}, format="json")
    assert demoted.status_code == 400
    assert "role" in demoted.json()["fields"]
    assert client.delete(f"{MEMBERSHIPS}{admin.pk}/").status_code == 400
    admin.refresh_from_db()
    assert admin.role == Role.ADMIN


def test_the_current_user_lists_their_memberships(api, world):
    body = api.as_user(world.both).get("/api/v1/infra-os/me/").json()
    assert body["username"] == "both"
    assert body["is_platform_admin"] is False
    assert sorted((m["tenant"], m["role"]) for m in body["memberships"]) == [
        ("alpha", "member"), ("beta", "viewer"),
    ]


def test_session_login_through_the_api(client, world, password):
    url = "/api/v1/infra-os/auth/login/"
    wrong = client.post(url, {"username": "alpha-member", "password": "nope"},
                        content_type="application/json")
    assert wrong.status_code == 401
    assert wrong.json()["code"] == "authentication_failed"
    right = client.post(url, {"username": "alpha-member", "password": password},
                        content_type="application/json")
    assert right.status_code == 200
    assert client.get("/api/v1/infra-os/me/").json()["username"] == "alpha-member"


def test_list_endpoints_pin_their_query_counts(api, world, django_assert_max_num_queries):
    for index in range(10):
        created = api.as_user(world.operator).post(
            MEMBERSHIPS, {"tenant": "alpha", "username": f"extra{index}",
                          "password": "A-long-passphrase-9"}, format="json")
        assert created.status_code == 201
        invited = api.as_user(world.alpha_admin).post(
            "/api/v1/infra-os/invitations/", {"tenant": "alpha", "username": f"guest{index}"},
            format="json")
        assert invited.status_code == 201
    client = api.as_user(world.alpha_admin)
    for url in (TENANTS, MEMBERSHIPS, QUOTAS, "/api/v1/infra-os/api-tokens/",
                "/api/v1/infra-os/audit-events/", "/api/v1/infra-os/invitations/"):
        with django_assert_max_num_queries(6):
            assert client.get(url).status_code == 200
