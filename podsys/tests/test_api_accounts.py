"""Cluster accounts over the API: operators only, errors in the envelope, secrets never shown."""

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from podsys.choices import NodeHealth
from podsys.models import ClusterGroup, ClusterUser
from podsys.services.accounts import cluster_group_create, cluster_user_create
from tests.factories import ClusterFactory, NodeFactory

USERS = "/api/v1/podsys/cluster-users/"
GROUPS = "/api/v1/podsys/cluster-groups/"


@pytest.fixture
def cluster(db, settings):
    settings.OGAI_CLUSTER_UID_START = 20000
    settings.OGAI_CLUSTER_GID_START = 30000
    return ClusterFactory(name="gpu")


@pytest.fixture(scope="module")
def public_key():
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    raw = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{raw.decode()} alice@laptop"


def test_operator_creates_an_account_with_its_groups_and_keys(api, world, cluster, public_key):
    client = api.as_user(world.operator)
    response = client.post(GROUPS, {"cluster": "gpu", "name": "research"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["gid"] == 30000

    response = client.post(USERS, {"cluster": "gpu", "username": "alice", "full_name": "Alice",
                                   "groups": ["research"], "ssh_public_keys": public_key,
                                   "user": world.alpha_member.username}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["uid"] == 20000
    assert body["groups"] == ["research"]
    assert body["primary_group"] is None
    assert body["user"] == world.alpha_member.username
    assert body["ssh_public_keys"] == f"{public_key}\n"
    assert body["ssh_key_fingerprints"][0].startswith("SHA256:")
    assert body["is_active"] is True and body["pushed_at"] is None

    listed = client.get(GROUPS, {"cluster": "gpu"}).json()["results"]
    assert [(g["name"], g["member_count"]) for g in listed] == [("research", 1)]


def test_errors_name_the_field(api, world, cluster):
    client = api.as_user(world.operator)
    cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    for payload, field, text in [
        ({"username": "alice"}, "username", "already has an account alice"),
        ({"username": "root"}, "username", "system name"),
        ({"username": "bob", "uid": 500}, "uid", "below 1000"),
        ({"username": "bob", "ssh_public_keys": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn"},
         "ssh_public_keys", "this is a private key; give the .pub"),
        ({"username": "bob", "groups": ["nosuch"]}, "groups", "not a group of cluster gpu"),
    ]:
        response = client.post(USERS, {"cluster": "gpu", **payload}, format="json")
        assert response.status_code == 400, payload
        error = response.json()
        assert error["code"] == "invalid"
        assert text in " ".join(error["fields"][field]), error
    assert ClusterUser.objects.count() == 1


def test_update_and_remove(api, world, cluster, public_key):
    client = api.as_user(world.operator)
    cluster_group_create(actor=world.operator, cluster=cluster, name="research")
    account = cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    url = f"{USERS}{account.pk}/"
    response = client.patch(url, {"ssh_public_keys": public_key, "primary_group": "research"},
                            format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["primary_group"] == "research"
    assert response.json()["shell"] == "/bin/bash"  # untouched by a partial update
    assert len(response.json()["ssh_key_fingerprints"]) == 1

    response = client.post(f"{url}remove/")
    assert response.status_code == 200
    assert response.json()["is_active"] is False
    response = client.post(f"{url}remove/")
    assert response.status_code == 400
    assert "already removed" in response.json()["message"]
    assert client.get(USERS, {"cluster": "gpu", "is_active": "false"}).json()["count"] == 1


def test_group_removal_over_the_api(api, world, cluster):
    client = api.as_user(world.operator)
    group = cluster_group_create(actor=world.operator, cluster=cluster, name="research")
    cluster_user_create(actor=world.operator, cluster=cluster, username="alice",
                        primary_group=group)
    response = client.post(f"{GROUPS}{group.pk}/remove/")
    assert response.status_code == 400
    assert "primary group of alice" in " ".join(response.json()["fields"]["group"])
    other = cluster_group_create(actor=world.operator, cluster=cluster, name="ops")
    response = client.post(f"{GROUPS}{other.pk}/remove/")
    assert response.status_code == 200
    assert response.json()["is_active"] is False


def test_tenant_users_see_no_accounts_and_change_nothing(api, world, cluster):
    account = cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    group = cluster_group_create(actor=world.operator, cluster=cluster, name="research")
    NodeFactory(cluster=cluster, name="n1")
    for person in (world.alpha_admin, world.alpha_member):
        client = api.as_user(person)
        assert client.get(USERS).json()["count"] == 0
        assert client.get(GROUPS).json()["count"] == 0
        assert client.get(f"{USERS}{account.pk}/").status_code == 404
        for url, payload in [(USERS, {"cluster": "gpu", "username": "mallory"}),
                             (GROUPS, {"cluster": "gpu", "name": "wheel2"}),
                             (f"{USERS}push/", {"cluster": "gpu"}),
                             (f"{USERS}ldap/", {"cluster": "gpu", "uri": ""})]:
            response = client.post(url, payload, format="json")
            assert response.status_code == 403, (url, response.json())
            assert response.json()["code"] == "permission_denied"
        assert client.post(f"{USERS}{account.pk}/remove/").status_code == 404
        assert client.post(f"{GROUPS}{group.pk}/remove/").status_code == 404
    assert ClusterUser.objects.filter(is_active=True).count() == 1
    assert ClusterGroup.objects.filter(is_active=True).count() == 1


def test_ldap_is_set_and_the_password_never_comes_back(api, world, cluster):
    client = api.as_user(world.operator)
    response = client.post(f"{USERS}ldap/", {
        "cluster": "gpu", "uri": "ldaps://ldap.example", "base_dn": "dc=example,dc=org",
        "bind_dn": "cn=reader,dc=example,dc=org", "bind_password": "hunter2"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {"cluster": "gpu", "enabled": True, "uri": "ldaps://ldap.example",
                               "base_dn": "dc=example,dc=org",
                               "bind_dn": "cn=reader,dc=example,dc=org",
                               "has_bind_password": True}
    assert "hunter2" not in client.get("/api/v1/podsys/clusters/gpu/").content.decode()
    response = client.post(f"{USERS}ldap/", {"cluster": "gpu", "uri": "ldap.example",
                                             "base_dn": "dc=x"}, format="json")
    assert response.status_code == 400
    assert "not an LDAP URI" in " ".join(response.json()["fields"]["uri"])
    response = client.post(f"{USERS}ldap/", {"cluster": "gpu", "uri": ""}, format="json")
    assert response.json()["enabled"] is False


def test_push_refuses_nodes_of_another_cluster(api, world, cluster):
    NodeFactory(cluster=cluster, name="n1")
    NodeFactory(cluster=ClusterFactory(name="other"), name="elsewhere")
    response = api.as_user(world.operator).post(
        f"{USERS}push/", {"cluster": "gpu", "hosts": ["n1", "elsewhere"]}, format="json")
    assert response.status_code == 400
    assert "Not nodes of cluster gpu: elsewhere" in " ".join(response.json()["fields"]["hosts"])


def test_push_starts_an_accounts_run_on_every_node_not_lost(api, world, cluster):
    pytest.importorskip("podsys.services.deployments", reason="part A's deployment_start")
    NodeFactory(cluster=cluster, name="n1")
    NodeFactory(cluster=cluster, name="n2")
    NodeFactory(cluster=cluster, name="gone", health=NodeHealth.LOST)
    account = cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    response = api.as_user(world.operator).post(f"{USERS}push/", {"cluster": "gpu"},
                                                format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert sorted(body["hosts"]) == ["n1", "n2"]
    assert body["state"] == "queued"
    from podsys.models import DeploymentRun

    run = DeploymentRun.objects.get(pk=body["id"])
    assert run.kind == "accounts"
    assert run.extra_vars["accounts_users"][0]["uid"] == account.uid


def test_the_account_list_takes_a_fixed_number_of_queries(api, world, cluster,
                                                         django_assert_num_queries):
    groups = [cluster_group_create(actor=world.operator, cluster=cluster, name=f"g{i}")
              for i in range(3)]
    for i in range(6):
        cluster_user_create(actor=world.operator, cluster=cluster, username=f"user{i}",
                            groups=groups, primary_group=groups[0])
    client = api.as_user(world.operator)
    # count, page (with cluster, primary group, platform user), the groups prefetch
    with django_assert_num_queries(3):
        response = client.get(USERS, {"cluster": "gpu"})
    assert response.json()["count"] == 6
    with django_assert_num_queries(2):
        assert client.get(GROUPS).json()["count"] == 3
