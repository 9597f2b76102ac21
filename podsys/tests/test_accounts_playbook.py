"""The accounts playbook: valid, and a check-mode run on this machine that says what it would
create while changing nothing."""

import grp
import json
import os
import pwd
import secrets
import subprocess
import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from podsys.services.accounts import (
    accounts_secret_vars,
    accounts_vars,
    cluster_group_create,
    cluster_ldap_set,
    cluster_user_create,
    cluster_user_remove,
)
from tests.factories import ClusterFactory

PLAYBOOKS = Path(__file__).resolve().parents[1] / "playbooks"
ACCOUNTS = PLAYBOOKS / "accounts.yml"
VENV_BIN = str(Path(sys.executable).parent)


def _env() -> dict:
    return {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}


def test_the_accounts_playbook_passes_the_syntax_check():
    result = subprocess.run(
        [f"{VENV_BIN}/ansible-playbook", "--syntax-check", "-i", "localhost,", str(ACCOUNTS)],
        capture_output=True, text=True, env=_env(), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_task_works_inside_the_accounts_homes():
    """A home belongs to its user: a task run there as root follows a symlink the user planted
    (~/.ssh -> /etc) and would chown or delete what it points at. Only the user module, which
    creates the home, names it."""
    tasks = [task for path in sorted((PLAYBOOKS / "roles" / "accounts" / "tasks").glob("*.yml"))
             for task in yaml.safe_load(path.read_text())]
    assert len(tasks) > 10
    for task in tasks:
        module = next(key for key in task if key.startswith("ansible.builtin."))
        if module != "ansible.builtin.user":
            assert "accounts_home_base" not in json.dumps(task), task["name"]


def _free_id(lookup) -> int:
    while True:
        candidate = 40000 + secrets.randbelow(20000)
        try:
            lookup(candidate)
        except KeyError:
            return candidate


@pytest.mark.slow
def test_a_check_mode_run_reports_what_it_would_create_and_changes_nothing(
        world, settings, tmp_path):
    settings.OGAI_CLUSTER_UID_START = _free_id(pwd.getpwuid)
    settings.OGAI_CLUSTER_GID_START = _free_id(grp.getgrgid)
    suffix = secrets.token_hex(3)
    username, groupname, gone = f"ogt{suffix}", f"ogtg{suffix}", f"ogtx{suffix}"
    key = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    cluster = ClusterFactory(name="here")
    group = cluster_group_create(actor=world.operator, cluster=cluster, name=groupname)
    cluster_user_create(actor=world.operator, cluster=cluster, username=username,
                        groups=[group], ssh_public_keys=f"{key} test")
    cluster_user_remove(actor=world.operator, account=cluster_user_create(
        actor=world.operator, cluster=cluster, username=gone))
    cluster = cluster_ldap_set(actor=world.operator, cluster=cluster, uri="ldaps://ldap.example",
                               base_dn="dc=example,dc=org", bind_dn="cn=reader,dc=example,dc=org",
                               bind_password="pa:ss{{word}}")
    extravars = {**accounts_vars(cluster=cluster), **accounts_secret_vars(cluster=cluster)}
    # The sssd path installs packages, which a machine without its package lists cannot even
    # simulate: the accounts are checked for real, the sssd.conf template is rendered apart.
    extravars["accounts_ldap"]["enabled"] = False
    out = tmp_path / "out"
    out.mkdir()
    wrapper = tmp_path / "wrapper.yml"
    wrapper.write_text(f"""---
- name: Accounts
  ansible.builtin.import_playbook: {ACCOUNTS}
- name: Render the sssd configuration
  hosts: all
  gather_facts: false
  tasks:
    - name: Render sssd.conf
      ansible.builtin.template:
        src: {PLAYBOOKS}/roles/accounts/templates/sssd.conf.j2
        dest: {out}/sssd.conf
        mode: "0600"
      check_mode: false
""")
    (tmp_path / "run").mkdir()
    events: list[dict] = []
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path / "run"), playbook=str(wrapper),
        inventory={"all": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            # No sudo: a check-mode run only reads, which any user may.
            "ansible_become": False, "ansible_remote_tmp": str(tmp_path / "remote")}}}},
        extravars=extravars, cmdline="--check", quiet=True,
        envvars={"PATH": _env()["PATH"], "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")},
        event_handler=lambda event: events.append(event) or True)
    failed = [e["event_data"].get("res") for e in events if e["event"] == "runner_on_failed"]
    assert runner.status == "successful", failed

    changed = {e["event_data"]["task"]: e["event_data"]["res"].get("changed")
               for e in events if e["event"] == "runner_on_ok"}
    for task in ("Create or update the cluster groups", "Create or update the cluster accounts",
                 "Create the folder of the accounts' SSH keys", "Write the accounts' SSH keys",
                 "Let sshd read the accounts' SSH keys from the root-owned folder"):
        assert changed[task] is True, task
    # The keys go to a root-owned file per account, never into the account's home.
    written = set()
    for event in events:
        if event["event"] in ("runner_on_ok", "runner_item_on_ok"):
            args = (event["event_data"]["res"].get("invocation") or {}).get("module_args") or {}
            written.update(args.get(key) for key in ("dest", "path") if args.get(key))
    assert f"/etc/ssh/ogai_authorized_keys/{username}" in written
    assert f"/etc/ssh/ogai_authorized_keys/{gone}" in written  # its keys deleted
    assert not [path for path in written if path and path.startswith("/home/")]
    # The removed account does not exist here: nothing to delete.
    assert changed["Delete the removed accounts"] is False
    assert runner.stats["failures"] == {}

    # Nothing on this machine changed.
    for name in (username, gone):
        with pytest.raises(KeyError):
            pwd.getpwnam(name)
    with pytest.raises(KeyError):
        grp.getgrnam(groupname)
    assert not Path(f"/home/{username}").exists()
    assert not Path(f"/etc/ssh/ogai_authorized_keys/{username}").exists()

    rendered = (out / "sssd.conf").read_text()
    assert "ldap_uri = ldaps://ldap.example" in rendered
    assert "ldap_default_bind_dn = cn=reader,dc=example,dc=org" in rendered
    assert "ldap_default_authtok = pa:ss{{word}}" in rendered  # as typed, never templated
    assert "ldap_id_use_start_tls = false" in rendered
