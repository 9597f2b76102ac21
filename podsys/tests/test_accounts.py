"""Cluster accounts: UIDs/GIDs, names, SSH keys, removal and LDAP, through the services."""

import base64
import json
import struct

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.core.exceptions import PermissionDenied, ValidationError

from infra_os.models import AuditEvent
from podsys.choices import DeploymentKind, DeploymentState, NodeHealth
from podsys.models import Cluster, ClusterUser, DeploymentRun
from podsys.services import accounts as svc
from podsys.services.accounts import (
    accounts_secret_vars,
    accounts_vars,
    cluster_accounts_mark_pushed,
    cluster_group_create,
    cluster_group_remove,
    cluster_ldap,
    cluster_ldap_set,
    cluster_user_create,
    cluster_user_remove,
    cluster_user_update,
)
from podsys.ssh_keys import parse_public_key
from tests.factories import ClusterFactory, NodeFactory


def openssh_public(private, comment="alice@laptop") -> str:
    raw = private.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                            serialization.PublicFormat.OpenSSH).decode()
    return f"{raw} {comment}"


@pytest.fixture(scope="module")
def keys():
    ed = ed25519.Ed25519PrivateKey.generate()
    return {
        "ed25519": openssh_public(ed),
        "ed25519_private": ed.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.OpenSSH,
                                            serialization.NoEncryption()).decode(),
        "rsa": openssh_public(rsa.generate_private_key(public_exponent=65537, key_size=2048),
                              "bob@desk"),
        # A weak key on purpose: the service must refuse it.
        "rsa_1024": openssh_public(rsa.generate_private_key(
            public_exponent=65537, key_size=1024)),  # noqa: S505
        "ecdsa": openssh_public(ec.generate_private_key(ec.SECP256R1()), "carol"),
    }


@pytest.fixture
def cluster(db, settings):
    settings.OGAI_CLUSTER_UID_START = 20000
    settings.OGAI_CLUSTER_GID_START = 30000
    return ClusterFactory(name="gpu")


def _field_error(excinfo, field) -> str:
    return " ".join(excinfo.value.message_dict[field])


# Groups and UIDs/GIDs ------------------------------------------------------------------------


def test_ids_count_up_from_the_configured_start_and_a_given_one_is_kept(world, cluster):
    first = cluster_group_create(actor=world.operator, cluster=cluster, name="research")
    second = cluster_group_create(actor=world.operator, cluster=cluster, name="ops")
    chosen = cluster_group_create(actor=world.operator, cluster=cluster, name="infra", gid=4242)
    assert (first.gid, second.gid, chosen.gid) == (30000, 30001, 4242)

    alice = cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    bob = cluster_user_create(actor=world.operator, cluster=cluster, username="bob", uid=5001)
    carol = cluster_user_create(actor=world.operator, cluster=cluster, username="carol")
    assert (alice.uid, bob.uid, carol.uid) == (20000, 5001, 20001)
    # Another cluster counts on its own.
    other = ClusterFactory(name="other")
    assert cluster_user_create(actor=world.operator, cluster=other, username="alice").uid == 20000


@pytest.mark.parametrize(("name", "message"), [
    ("root", "system name"),
    ("video", "system name"),
    ("systemd-oom", "system name"),
    ("Alice", "POSIX name"),
    ("9lives", "POSIX name"),
    ("a" * 33, "POSIX name"),
])
def test_system_and_malformed_names_are_refused(world, cluster, name, message):
    with pytest.raises(ValidationError) as excinfo:
        cluster_user_create(actor=world.operator, cluster=cluster, username=name)
    assert message in _field_error(excinfo, "username")
    with pytest.raises(ValidationError) as excinfo:
        cluster_group_create(actor=world.operator, cluster=cluster, name=name)
    assert message in _field_error(excinfo, "name")
    assert not ClusterUser.objects.exists()


def test_ids_below_1000_taken_or_reserved_are_refused(world, cluster):
    cluster_user_create(actor=world.operator, cluster=cluster, username="alice", uid=7000)
    cluster_group_create(actor=world.operator, cluster=cluster, name="research", gid=7000)
    for uid, message in [(999, "below 1000"), (0, "below 1000"), (65534, "reserved"),
                         (7000, "taken")]:
        with pytest.raises(ValidationError) as excinfo:
            cluster_user_create(actor=world.operator, cluster=cluster, username="bob", uid=uid)
        assert message in _field_error(excinfo, "uid")
    with pytest.raises(ValidationError) as excinfo:
        cluster_group_create(actor=world.operator, cluster=cluster, name="ops", gid=7000)
    assert "GID 7000 is taken" in _field_error(excinfo, "gid")


def test_names_are_unique_per_cluster_with_a_clear_error(world, cluster):
    cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    cluster_group_create(actor=world.operator, cluster=cluster, name="research")
    with pytest.raises(ValidationError) as excinfo:
        cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    assert "already has an account alice" in _field_error(excinfo, "username")
    with pytest.raises(ValidationError) as excinfo:
        cluster_group_create(actor=world.operator, cluster=cluster, name="research")
    assert "already has a group research" in _field_error(excinfo, "name")


def test_a_uid_taken_in_a_race_is_a_validation_error_not_an_integrity_error(
        world, cluster, monkeypatch):
    cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    # Another request allocated the same number between the check and the insert.
    monkeypatch.setattr(svc, "_next_uid", lambda cluster: 20000)
    with pytest.raises(ValidationError) as excinfo:
        cluster_user_create(actor=world.operator, cluster=cluster, username="bob")
    assert "UID 20000" in _field_error(excinfo, "username")
    assert list(ClusterUser.objects.values_list("username", flat=True)) == ["alice"]


def test_groups_must_belong_to_the_same_cluster(world, cluster):
    theirs = cluster_group_create(actor=world.operator, cluster=ClusterFactory(name="other"),
                                  name="research")
    with pytest.raises(ValidationError) as excinfo:
        cluster_user_create(actor=world.operator, cluster=cluster, username="alice",
                            groups=[theirs])
    assert "not a group of cluster gpu" in _field_error(excinfo, "groups")
    with pytest.raises(ValidationError) as excinfo:
        cluster_user_create(actor=world.operator, cluster=cluster, username="alice",
                            primary_group="research")
    assert "not a group of cluster gpu" in _field_error(excinfo, "primary_group")


def test_only_platform_admins_manage_accounts(world, cluster):
    for person in (world.alpha_admin, world.alpha_member):
        with pytest.raises(PermissionDenied):
            cluster_user_create(actor=person, cluster=cluster, username="alice")
        with pytest.raises(PermissionDenied):
            cluster_group_create(actor=person, cluster=cluster, name="research")
        with pytest.raises(PermissionDenied):
            cluster_ldap_set(actor=person, cluster=cluster, uri="ldaps://ldap.example",
                             base_dn="dc=example,dc=org")
    assert not ClusterUser.objects.exists()


# SSH keys ------------------------------------------------------------------------------------


def test_public_keys_of_every_accepted_type_are_kept_one_a_line(world, cluster, keys):
    sk_blob = b"".join(struct.pack(">I", len(part)) + part for part in
                       (b"sk-ssh-ed25519@openssh.com", bytes(range(32)), b"ssh:"))
    sk_key = f"sk-ssh-ed25519@openssh.com {base64.b64encode(sk_blob).decode()} yubikey"
    text = "\n".join(["# laptop", keys["ed25519"], "", f"  {keys['rsa']}  ", keys["ecdsa"],
                      sk_key, keys["ed25519"]])
    account = cluster_user_create(actor=world.operator, cluster=cluster, username="alice",
                                  ssh_public_keys=text)
    lines = account.ssh_public_keys.splitlines()
    # Comments and blanks dropped, the repeated key kept once, the order kept.
    assert lines == [keys["ed25519"], keys["rsa"], keys["ecdsa"], sk_key]
    assert account.ssh_public_keys.endswith("\n")


@pytest.mark.parametrize(("case", "message"), [
    ("private", "this is a private key; give the .pub"),
    ("truncated", "line 2: the ssh-ed25519 key's body"),
    ("rsa_1024", "too weak"),
    ("dsa", "DSA keys are no longer accepted"),
    ("mismatch", "is a 'ssh-ed25519' key, not ssh-rsa"),
    ("options", "give the key alone"),
    ("garbage", "is not a public key type"),
    ("template", "'{{'"),
])
def test_bad_keys_are_refused_naming_the_problem(world, cluster, keys, case, message):
    ed_body = keys["ed25519"].split()[1]
    text = {
        "private": keys["ed25519_private"],
        "truncated": f"{keys['rsa']}\nssh-ed25519 {ed_body[:-8]} cut",
        "rsa_1024": keys["rsa_1024"],
        "dsa": "ssh-dss AAAAB3NzaC1kc3MAAACBAP alice",
        "mismatch": f"ssh-rsa {ed_body} alice",
        "options": f'from="10.0.0.0/8" {keys["ed25519"]}',
        "garbage": "hello world",
        "template": f"{keys['ed25519'].rsplit(' ', 1)[0]} {{{{ lookup('pipe', 'id') }}}}",
    }[case]
    with pytest.raises(ValidationError) as excinfo:
        cluster_user_create(actor=world.operator, cluster=cluster, username="alice",
                            ssh_public_keys=text)
    assert message in _field_error(excinfo, "ssh_public_keys")
    assert not ClusterUser.objects.exists()


def test_the_audit_records_key_fingerprints_never_the_keys(world, cluster, keys):
    account = cluster_user_create(actor=world.operator, cluster=cluster, username="alice",
                                  ssh_public_keys=keys["ed25519"])
    cluster_user_update(actor=world.operator, account=account,
                        ssh_public_keys=f"{keys['ed25519']}\n{keys['rsa']}")
    events = AuditEvent.objects.filter(object_type="podsys.clusteruser").order_by("pk")
    assert [e.action for e in events] == ["cluster_user.create", "cluster_user.update"]
    recorded = json.dumps([e.changes for e in events])
    for key in (keys["ed25519"], keys["rsa"]):
        assert key.split()[1] not in recorded
    assert parse_public_key(keys["rsa"]).fingerprint in events[1].changes["ssh_keys"]
    assert events[1].changes["ssh_keys"][0].startswith("SHA256:")


# Updates, removal, reactivation ----------------------------------------------------------------


def test_update_changes_keys_groups_and_shell_but_never_the_name_or_uid(world, cluster, keys):
    research = cluster_group_create(actor=world.operator, cluster=cluster, name="research")
    account = cluster_user_create(actor=world.operator, cluster=cluster, username="alice",
                                  ssh_public_keys=keys["ed25519"])
    account = cluster_user_update(  # noqa: S604 - a login shell, not a subprocess
        actor=world.operator, account=account, groups=["research"], primary_group=research,
        shell="/bin/zsh", ssh_public_keys=keys["rsa"], full_name="Alice Liddell")
    account.refresh_from_db()
    assert [g.name for g in account.groups.all()] == ["research"]
    assert (account.primary_group, account.shell, account.full_name) == \
        (research, "/bin/zsh", "Alice Liddell")
    assert account.ssh_public_keys == f"{keys['rsa']}\n"
    for field, value in (("uid", 31337), ("username", "alicia")):
        with pytest.raises(ValidationError) as excinfo:
            cluster_user_update(actor=world.operator, account=account, **{field: value})
        assert "cannot change" in _field_error(excinfo, field)
    with pytest.raises(ValidationError) as excinfo:
        cluster_user_update(actor=world.operator, account=account, full_name="Alice: admin")
    assert "':'" in _field_error(excinfo, "full_name")
    for shell in ("bash", "/bin/bash\n/bin/sh"):
        with pytest.raises(ValidationError) as excinfo:
            cluster_user_update(actor=world.operator, account=account, shell=shell)
        assert "absolute path" in _field_error(excinfo, "shell")


def test_a_removed_username_comes_back_with_its_uid(world, cluster):
    alice = cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    cluster_user_create(actor=world.operator, cluster=cluster, username="bob")
    removed = cluster_user_remove(actor=world.operator, account=alice)
    assert removed.is_active is False
    with pytest.raises(ValidationError):
        cluster_user_update(  # noqa: S604 - a login shell, not a subprocess
            actor=world.operator, account=removed, shell="/bin/sh")
    # Its number is never handed to anyone else.
    assert cluster_user_create(actor=world.operator, cluster=cluster,
                               username="carol").uid == 20002
    with pytest.raises(ValidationError) as excinfo:
        cluster_user_create(actor=world.operator, cluster=cluster, username="alice", uid=25000)
    assert "comes back with that UID" in _field_error(excinfo, "uid")
    back = cluster_user_create(actor=world.operator, cluster=cluster, username="alice")
    assert (back.pk, back.uid, back.is_active) == (alice.pk, 20000, True)
    assert AuditEvent.objects.filter(action="cluster_user.reactivate").count() == 1


def test_a_group_cannot_go_while_it_is_someones_primary_group(world, cluster):
    research = cluster_group_create(actor=world.operator, cluster=cluster, name="research")
    ops = cluster_group_create(actor=world.operator, cluster=cluster, name="ops")
    alice = cluster_user_create(actor=world.operator, cluster=cluster, username="alice",
                                primary_group=research, groups=[ops])
    with pytest.raises(ValidationError) as excinfo:
        cluster_group_remove(actor=world.operator, group=research)
    assert "primary group of alice" in _field_error(excinfo, "group")
    cluster_group_remove(actor=world.operator, group=ops)
    assert list(alice.groups.all()) == []
    with pytest.raises(ValidationError) as excinfo:
        cluster_user_update(actor=world.operator, account=alice, groups=["ops"])
    assert "was removed" in _field_error(excinfo, "groups")
    assert cluster_group_create(actor=world.operator, cluster=cluster, name="ops").gid == ops.gid


# What the playbook gets ------------------------------------------------------------------------


def test_accounts_vars_carry_present_and_removed_accounts(world, cluster, keys):
    research = cluster_group_create(actor=world.operator, cluster=cluster, name="research")
    old = cluster_group_create(actor=world.operator, cluster=cluster, name="old")
    cluster_user_create(  # noqa: S604 - a login shell, not a subprocess
        actor=world.operator, cluster=cluster, username="alice", full_name="Alice",
        groups=[research, old], shell="/bin/zsh", ssh_public_keys=keys["ed25519"])
    bob = cluster_user_create(actor=world.operator, cluster=cluster, username="bob",
                              primary_group=research)
    cluster_user_remove(actor=world.operator, account=bob)
    cluster_group_remove(actor=world.operator, group=old)

    found = accounts_vars(cluster=cluster)
    assert found["accounts_groups"] == [
        {"name": "research", "gid": 30000, "state": "present"},
        {"name": "old", "gid": 30001, "state": "absent"},
    ]
    assert found["accounts_users"] == [
        {"name": "alice", "uid": 20000, "state": "present", "group": "users",
         "groups": ["research"], "comment": "Alice", "shell": "/bin/zsh",
         "ssh_keys": f"{keys['ed25519']}\n"},
        {"name": "bob", "uid": 20001, "state": "absent"},
    ]
    assert found["accounts_ldap"] == {"enabled": False, "uri": "", "base_dn": "", "bind_dn": ""}
    assert accounts_secret_vars(cluster=cluster) == {}


# LDAP ------------------------------------------------------------------------------------------


def test_ldap_settings_keep_the_bind_password_encrypted_and_out_of_sight(world, cluster):
    cluster = cluster_ldap_set(actor=world.operator, cluster=cluster,
                               uri="ldaps://ldap1.example, ldaps://ldap2.example:636",
                               base_dn="dc=example,dc=org",
                               bind_dn="cn=reader,dc=example,dc=org", bind_password="s3cr{{t}}")
    stored = Cluster.objects.get(pk=cluster.pk).options
    assert "s3cr" not in json.dumps(stored)
    assert cluster_ldap(cluster) == {
        "uri": "ldaps://ldap1.example,ldaps://ldap2.example:636",
        "base_dn": "dc=example,dc=org", "bind_dn": "cn=reader,dc=example,dc=org",
        "has_bind_password": True}
    found = accounts_vars(cluster=cluster)
    assert found["accounts_ldap"]["enabled"] is True
    assert "s3cr" not in json.dumps(found)
    secret = accounts_secret_vars(cluster=cluster)["accounts_ldap_bind_password_b64"]
    assert base64.b64decode(secret).decode() == "s3cr{{t}}"
    assert "s3cr" not in json.dumps([e.changes for e in AuditEvent.objects.all()])

    # Changing the base DN without retyping the password keeps it.
    cluster = cluster_ldap_set(actor=world.operator, cluster=cluster,
                               uri="ldaps://ldap1.example", base_dn="ou=people,dc=example,dc=org",
                               bind_dn="cn=reader,dc=example,dc=org")
    assert cluster_ldap(cluster)["has_bind_password"] is True
    # An empty URI: local accounts again.
    cluster = cluster_ldap_set(actor=world.operator, cluster=cluster, uri="", base_dn="")
    assert cluster_ldap(cluster) == {}
    assert "ldap" not in Cluster.objects.get(pk=cluster.pk).options
    assert accounts_vars(cluster=cluster)["accounts_ldap"]["enabled"] is False


@pytest.mark.parametrize(("kwargs", "field", "message"), [
    ({"uri": "http://ldap.example", "base_dn": "dc=x"}, "uri", "not an LDAP URI"),
    ({"uri": "ldaps://ldap.example", "base_dn": ""}, "base_dn", "Give the DN"),
    ({"uri": "ldaps://ldap.example", "base_dn": "example.org"}, "base_dn", "not a DN"),
    ({"uri": "ldaps://ldap.example", "base_dn": "dc=x", "bind_password": "pw"}, "bind_dn",
     "needs the bind DN"),
])
def test_bad_ldap_settings_are_refused(world, cluster, kwargs, field, message):
    with pytest.raises(ValidationError) as excinfo:
        cluster_ldap_set(actor=world.operator, cluster=cluster, **kwargs)
    assert message in _field_error(excinfo, field)
    assert "ldap" not in Cluster.objects.get(pk=cluster.pk).options


# After a push ----------------------------------------------------------------------------------


def test_a_successful_full_push_stamps_the_accounts_it_carried(world, cluster):
    NodeFactory(cluster=cluster, name="n1")
    NodeFactory(cluster=cluster, name="n2")
    NodeFactory(cluster=cluster, name="gone", health=NodeHealth.LOST)
    alice = cluster_user_create(actor=world.operator, cluster=cluster, username="alice")

    def run(hosts, **extra):
        return DeploymentRun.objects.create(
            cluster=cluster, kind=DeploymentKind.ACCOUNTS, playbook="accounts.yml",
            hosts=hosts, extra_vars=accounts_vars(cluster=cluster),
            state=extra.pop("state", DeploymentState.SUCCEEDED), **extra)

    assert cluster_accounts_mark_pushed(run=run(["n1"])) == 0  # n2 still has the old ones
    assert cluster_accounts_mark_pushed(run=run(["n1", "n2"], check_mode=True)) == 0
    assert cluster_accounts_mark_pushed(run=run(["n1", "n2"], state=DeploymentState.FAILED)) == 0
    alice.refresh_from_db()
    assert alice.pushed_at is None
    assert cluster_accounts_mark_pushed(run=run(["n1", "n2"])) == 1
    alice.refresh_from_db()
    assert alice.pushed_at is not None
