"""Cluster user accounts: POSIX users and groups with the same UID/GID on every node, pushed by
the accounts playbook, or the cluster pointed at an LDAP directory (sssd).

Removal marks a row inactive; the next push deletes the user (and the SSH keys OGAI wrote for
it) or the group from the nodes. Rows are kept, so a removed name created again comes back with
its old UID/GID and no number is ever handed to someone else (files on the nodes may still carry
it).
"""

import base64
import re
from collections.abc import Iterable

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from infra_os.access import require_platform_admin
from infra_os.services.audit import audit_record
from ogai.crypto import decrypt, encrypt
from podsys.choices import DeploymentKind, DeploymentState, NodeHealth
from podsys.models import Cluster, ClusterGroup, ClusterUser, DeploymentRun
from podsys.models.accounts import posix_name_validator
from podsys.ssh_keys import (
    TEMPLATE_MARKERS,
    PublicKeyError,
    authorized_keys_text,
    parse_authorized_keys,
)

# Names every Linux distribution (or the node software OGAI installs) already uses: an account
# of that name would take over a system user or group on the nodes.
RESERVED_NAMES = frozenset({
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp",
    "proxy", "www-data", "backup", "list", "irc", "gnats", "nobody", "nogroup", "adm", "tty",
    "disk", "kmem", "dialout", "fax", "voice", "cdrom", "floppy", "tape", "sudo", "audio",
    "dip", "operator", "src", "shadow", "utmp", "video", "sasl", "plugdev", "staff", "users",
    "wheel", "admin", "input", "kvm", "render", "sgx", "netdev", "lxd", "docker", "messagebus",
    "syslog", "sshd", "systemd-journal", "systemd-network", "systemd-resolve",
    "systemd-timesync", "systemd-coredump", "polkitd", "_apt", "tss", "uuidd", "tcpdump",
    "landscape", "pollinate", "fwupd-refresh", "usbmux", "dnsmasq", "chrony", "ntp", "halt",
    "shutdown", "ftp", "dbus", "postfix", "rpc", "rpcuser", "nfsnobody", "sssd", "munge",
    "slurm", "nvidia-persistenced", "dcgm", "ubuntu", "ec2-user", "centos", "rocky",
})
MIN_ID = 1000
# 65534 is nobody/nogroup and 65535 is (uid_t)-1 on 16-bit tools; the top is what every
# database stores in an integer column.
FORBIDDEN_IDS = frozenset({65534, 65535})
MAX_ID = 2**31 - 1
_SHELL = re.compile(r"^/[A-Za-z0-9._/+-]{1,99}$")
_LDAP_URI = re.compile(r"^ldaps?://(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?/?$")
# The primary group of an account given none: `users` has GID 100 on Debian, Ubuntu and RHEL,
# so it is the same on every node without OGAI managing it.
DEFAULT_PRIMARY_GROUP = "users"
# Fields an update may change: the name and number are what the nodes know the account by.
USER_UPDATABLE = frozenset({"full_name", "groups", "primary_group", "ssh_public_keys", "shell",
                            "user"})


# Checks ------------------------------------------------------------------------------------


def _check_name(name: str, field: str) -> None:
    try:
        posix_name_validator(name)
    except ValidationError as exc:
        raise ValidationError({field: exc.messages}) from None
    if name in RESERVED_NAMES or name.startswith("systemd-"):
        raise ValidationError({field: f"{name!r} is a system name on the nodes; choose "
                               "another."})


def _check_id(value: int, field: str) -> None:
    what = "UID" if field == "uid" else "GID"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError({field: f"Give the {what} as a whole number."})
    if value < MIN_ID:
        raise ValidationError({field: f"{what}s below {MIN_ID} belong to the system; give "
                               f"{MIN_ID} or more."})
    if value in FORBIDDEN_IDS or value > MAX_ID:
        raise ValidationError({field: f"{what} {value} is reserved; choose another."})


def _check_text(value: str, field: str, *, max_length: int) -> None:
    if len(value) > max_length:
        raise ValidationError({field: f"At most {max_length} characters."})
    if any(marker in value for marker in TEMPLATE_MARKERS):
        raise ValidationError({field: "May not contain '{{', '{%' or '{#'."})


def _checked_full_name(full_name: str) -> str:
    full_name = full_name.strip()
    _check_text(full_name, "full_name", max_length=200)
    # It becomes the GECOS field of /etc/passwd: a colon or line break would split the entry.
    if any(char in full_name for char in ":\n\r\0"):
        raise ValidationError({"full_name": "May not contain ':' or line breaks."})
    return full_name


def _checked_shell(shell: str) -> str:
    if not isinstance(shell, str) or not _SHELL.fullmatch(shell):
        raise ValidationError({"shell": "Give the shell as an absolute path, e.g. /bin/bash."})
    return shell


def _checked_keys(text: str) -> tuple[str, list[str]]:
    """The normalised authorized_keys and the keys' fingerprints (what the audit records)."""
    try:
        keys = parse_authorized_keys(text or "")
    except PublicKeyError as exc:
        raise ValidationError({"ssh_public_keys": str(exc)}) from None
    return authorized_keys_text(keys), [key.fingerprint for key in keys]


def _checked_groups(cluster: Cluster, groups: Iterable[ClusterGroup | int | str],
                    field: str = "groups") -> list[ClusterGroup]:
    """Active groups of this cluster, given as rows, ids or names."""
    found: list[ClusterGroup] = []
    for item in groups:
        if isinstance(item, ClusterGroup):
            group = ClusterGroup.objects.filter(pk=item.pk).first()
        elif isinstance(item, int) and not isinstance(item, bool):
            group = ClusterGroup.objects.filter(pk=item).first()
        else:
            group = ClusterGroup.objects.filter(cluster=cluster, name=str(item)).first()
        label = getattr(item, "name", item)
        if group is None or group.cluster_id != cluster.pk:
            raise ValidationError({field: f"Group {label} is not a group of cluster "
                                   f"{cluster.name}."})
        if not group.is_active:
            raise ValidationError({field: f"Group {group.name} was removed; create it again "
                                   "first."})
        if group not in found:
            found.append(group)
    return found


def _checked_primary_group(cluster: Cluster, group) -> ClusterGroup | None:
    if group is None or group == "":
        return None
    return _checked_groups(cluster, [group], field="primary_group")[0]


def _lock_cluster(cluster: Cluster) -> Cluster:
    """Serialises UID/GID allocation on one cluster."""
    return Cluster.objects.select_for_update().get(pk=cluster.pk)


def _above(top: int | None, start: int) -> int:
    """One past the highest number in use from `start` on (numbers of removed rows count:
    files on the nodes may still carry them), skipping the reserved ones."""
    candidate = max(start, MIN_ID) if top is None or top < start else top + 1
    while candidate in FORBIDDEN_IDS:
        candidate += 1
    return candidate


def _next_uid(cluster: Cluster) -> int:
    top = ClusterUser.objects.filter(cluster=cluster).aggregate(top=Max("uid"))["top"]
    return _above(top, settings.OGAI_CLUSTER_UID_START)


def _next_gid(cluster: Cluster) -> int:
    top = ClusterGroup.objects.filter(cluster=cluster).aggregate(top=Max("gid"))["top"]
    return _above(top, settings.OGAI_CLUSTER_GID_START)


def _save_unique(instance, *, messages: dict[str, str]) -> None:
    """Save, turning a unique-constraint race into the same 400 the checks give."""
    try:
        with transaction.atomic():
            instance.save()
    except IntegrityError:
        raise ValidationError(messages) from None


# Groups ------------------------------------------------------------------------------------


@transaction.atomic
def cluster_group_create(*, actor, cluster: Cluster, name: str,
                         gid: int | None = None) -> ClusterGroup:
    """A group on every node of the cluster, with this GID (or the next free one from
    OGAI_CLUSTER_GID_START). A removed group's name comes back with its old GID."""
    require_platform_admin(actor)
    name = (name or "").strip()
    _check_name(name, "name")
    cluster = _lock_cluster(cluster)
    if gid is not None:
        _check_id(gid, "gid")
    group = ClusterGroup.objects.filter(cluster=cluster, name=name).first()
    if group is not None:
        if group.is_active:
            raise ValidationError({"name": f"Cluster {cluster.name} already has a group "
                                   f"{name}."})
        if gid is not None and gid != group.gid:
            raise ValidationError({"gid": f"Group {name} was removed with GID {group.gid}; it "
                                   "comes back with that GID."})
        group.is_active = True
        group.save(update_fields=["is_active", "updated_at"])
        action = "cluster_group.reactivate"
    else:
        if gid is None:
            gid = _next_gid(cluster)
        elif ClusterGroup.objects.filter(cluster=cluster, gid=gid).exists():
            raise ValidationError({"gid": f"GID {gid} is taken on cluster {cluster.name}."})
        group = ClusterGroup(cluster=cluster, name=name, gid=gid)
        _save_unique(group, messages={"name": f"Cluster {cluster.name} already has a group "
                                      f"{name} or GID {gid}."})
        action = "cluster_group.create"
    audit_record(actor=actor, action=action, obj=group, tenant=cluster.tenant,
                 changes={"cluster": cluster.name, "name": group.name, "gid": group.gid})
    return group


@transaction.atomic
def cluster_group_remove(*, actor, group: ClusterGroup) -> ClusterGroup:
    """Mark the group removed: it leaves every account and is deleted from the nodes at the
    next push. Refused while an active account has it as its primary group."""
    require_platform_admin(actor)
    group = ClusterGroup.objects.select_for_update().select_related("cluster").get(pk=group.pk)
    if not group.is_active:
        raise ValidationError({"group": f"Group {group.name} is already removed."})
    primary_of = list(group.primary_users.filter(is_active=True)
                      .values_list("username", flat=True)[:6])
    if primary_of:
        shown = ", ".join(primary_of[:5]) + (", …" if len(primary_of) > 5 else "")
        raise ValidationError({"group": f"Group {group.name} is the primary group of {shown}; "
                               "give them another primary group or remove them first."})
    members = group.users.count()
    group.users.clear()
    group.is_active = False
    group.save(update_fields=["is_active", "updated_at"])
    audit_record(actor=actor, action="cluster_group.remove", obj=group,
                 tenant=group.cluster.tenant,
                 changes={"cluster": group.cluster.name, "name": group.name, "gid": group.gid,
                          "members_removed": members})
    return group


# Users -------------------------------------------------------------------------------------


@transaction.atomic
def cluster_user_create(
    *,
    actor,
    cluster: Cluster,
    username: str,
    uid: int | None = None,
    full_name: str = "",
    groups: Iterable[ClusterGroup | int | str] = (),
    primary_group: ClusterGroup | int | str | None = None,
    ssh_public_keys: str = "",
    shell: str = "/bin/bash",
    user=None,
) -> ClusterUser:
    """An account on every node of the cluster, with this UID (or the next free one from
    OGAI_CLUSTER_UID_START), its groups and its SSH public keys (written root-owned on the nodes).
    Without a primary group it gets the system group `users` (GID 100 everywhere). A removed
    username comes back with its old UID."""
    require_platform_admin(actor)
    username = (username or "").strip()
    _check_name(username, "username")
    cluster = _lock_cluster(cluster)
    if uid is not None:
        _check_id(uid, "uid")
    full_name = _checked_full_name(full_name or "")
    shell = _checked_shell(shell)
    keys, fingerprints = _checked_keys(ssh_public_keys)
    group_rows = _checked_groups(cluster, groups)
    primary = _checked_primary_group(cluster, primary_group)
    _check_platform_user(user)

    account = ClusterUser.objects.filter(cluster=cluster, username=username).first()
    if account is not None:
        if account.is_active:
            raise ValidationError({"username": f"Cluster {cluster.name} already has an "
                                   f"account {username}."})
        if uid is not None and uid != account.uid:
            raise ValidationError({"uid": f"Account {username} was removed with UID "
                                   f"{account.uid}; it comes back with that UID."})
        action = "cluster_user.reactivate"
    else:
        if uid is None:
            uid = _next_uid(cluster)
        elif ClusterUser.objects.filter(cluster=cluster, uid=uid).exists():
            raise ValidationError({"uid": f"UID {uid} is taken on cluster {cluster.name}."})
        account = ClusterUser(cluster=cluster, username=username, uid=uid)
        action = "cluster_user.create"
    account.full_name = full_name
    account.shell = shell
    account.ssh_public_keys = keys
    account.primary_group = primary
    account.user = user
    account.is_active = True
    account.pushed_at = None
    _save_unique(account, messages={"username": f"Cluster {cluster.name} already has an "
                                    f"account {username} or UID {account.uid}."})
    account.groups.set(group_rows)
    audit_record(actor=actor, action=action, obj=account, tenant=cluster.tenant,
                 changes={"cluster": cluster.name, "username": username, "uid": account.uid,
                          "groups": [g.name for g in group_rows],
                          "primary_group": primary.name if primary else DEFAULT_PRIMARY_GROUP,
                          "ssh_keys": fingerprints})
    return account


def _check_platform_user(user) -> None:
    if user is not None and not isinstance(user, get_user_model()):
        raise ValidationError({"user": "Give the platform user this account belongs to."})


@transaction.atomic
def cluster_user_update(*, actor, account: ClusterUser, **fields) -> ClusterUser:
    """Change an account's name, shell, groups, keys or platform user. Its username and UID are
    fixed: the nodes know it by them."""
    require_platform_admin(actor)
    account = ClusterUser.objects.select_for_update().select_related("cluster").get(
        pk=account.pk)
    cluster = account.cluster
    for fixed in ("username", "uid", "cluster"):
        if fixed in fields and fields[fixed] != getattr(account, fixed):
            raise ValidationError({fixed: f"An account's {fixed} cannot change; remove it and "
                                   "create another."})
        fields.pop(fixed, None)
    unknown = sorted(set(fields) - USER_UPDATABLE)
    if unknown:
        raise ValidationError({unknown[0]: "This field cannot be changed here."})
    if not account.is_active:
        raise ValidationError({"username": f"Account {account.username} was removed; create "
                               "it again to bring it back."})
    changes: dict = {}
    if "full_name" in fields:
        account.full_name = _checked_full_name(fields["full_name"] or "")
        changes["full_name"] = account.full_name
    if "shell" in fields:
        account.shell = _checked_shell(fields["shell"])
        changes["shell"] = account.shell
    if "ssh_public_keys" in fields:
        account.ssh_public_keys, changes["ssh_keys"] = _checked_keys(fields["ssh_public_keys"])
    if "primary_group" in fields:
        account.primary_group = _checked_primary_group(cluster, fields["primary_group"])
        changes["primary_group"] = (account.primary_group.name if account.primary_group
                                    else DEFAULT_PRIMARY_GROUP)
    if "user" in fields:
        _check_platform_user(fields["user"])
        account.user = fields["user"]
        changes["user"] = account.user.get_username() if account.user else ""
    group_rows = None
    if "groups" in fields:
        group_rows = _checked_groups(cluster, fields["groups"] or ())
        changes["groups"] = [g.name for g in group_rows]
    account.pushed_at = None
    account.save()
    if group_rows is not None:
        account.groups.set(group_rows)
    audit_record(actor=actor, action="cluster_user.update", obj=account, tenant=cluster.tenant,
                 changes={"cluster": cluster.name, **changes})
    return account


@transaction.atomic
def cluster_user_remove(*, actor, account: ClusterUser) -> ClusterUser:
    """Mark the account removed: the next push deletes it and the SSH keys OGAI wrote for it
    from every node, which ends its access."""
    require_platform_admin(actor)
    account = ClusterUser.objects.select_for_update().select_related("cluster").get(
        pk=account.pk)
    if not account.is_active:
        raise ValidationError({"account": f"Account {account.username} is already removed."})
    account.is_active = False
    account.pushed_at = None
    account.save(update_fields=["is_active", "pushed_at", "updated_at"])
    audit_record(actor=actor, action="cluster_user.remove", obj=account,
                 tenant=account.cluster.tenant,
                 changes={"cluster": account.cluster.name, "username": account.username,
                          "uid": account.uid})
    return account


# LDAP --------------------------------------------------------------------------------------


def cluster_ldap(cluster: Cluster) -> dict:
    """The cluster's LDAP settings without the password (empty: local accounts only)."""
    ldap = (cluster.options or {}).get("ldap") or {}
    if not ldap.get("uri"):
        return {}
    return {"uri": ldap["uri"], "base_dn": ldap.get("base_dn", ""),
            "bind_dn": ldap.get("bind_dn", ""),
            "has_bind_password": bool(ldap.get("bind_password_encrypted"))}


def _checked_ldap_uri(uri: str) -> str:
    uris = [part for part in re.split(r"[\s,]+", uri.strip()) if part]
    for part in uris:
        if not _LDAP_URI.match(part):
            raise ValidationError({"uri": f"{part[:100]!r} is not an LDAP URI; give "
                                   "ldaps://host[:port] or ldap://host[:port]."})
    return ",".join(uris)


def _checked_dn(value: str, field: str, *, required: bool) -> str:
    value = (value or "").strip()
    if not value:
        if required:
            raise ValidationError({field: "Give the DN, e.g. dc=example,dc=org."})
        return ""
    _check_text(value, field, max_length=500)
    if "=" not in value or any(char in value for char in "\n\r\0"):
        raise ValidationError({field: "This is not a DN; write it like dc=example,dc=org."})
    return value


@transaction.atomic
def cluster_ldap_set(*, actor, cluster: Cluster, uri: str, base_dn: str, bind_dn: str = "",
                     bind_password: str = "") -> Cluster:
    """Point the cluster's nodes at an LDAP directory (sssd), or with an empty `uri` back at
    local accounts. The bind password is stored encrypted and never shown; an empty one keeps
    the stored password while the bind DN stays the same. Takes effect at the next push."""
    require_platform_admin(actor)
    cluster = _lock_cluster(cluster)
    options = dict(cluster.options or {})
    previous = options.get("ldap") or {}
    if not (uri or "").strip():
        options.pop("ldap", None)
        cluster.options = options
        cluster.save(update_fields=["options", "updated_at"])
        audit_record(actor=actor, action="cluster.ldap_clear", obj=cluster,
                     tenant=cluster.tenant, changes={"uri": previous.get("uri", "")})
        return cluster
    uri = _checked_ldap_uri(uri)
    base_dn = _checked_dn(base_dn, "base_dn", required=True)
    bind_dn = _checked_dn(bind_dn, "bind_dn", required=False)
    if len(bind_password) > 500 or any(char in bind_password for char in "\n\r\0"):
        raise ValidationError({"bind_password": "At most 500 characters, on one line."})
    if bind_password and not bind_dn:
        raise ValidationError({"bind_dn": "A bind password needs the bind DN it belongs to."})
    stored = ""
    if bind_dn:
        if bind_password:
            stored = encrypt(bind_password)
        elif previous.get("bind_dn") == bind_dn:
            stored = previous.get("bind_password_encrypted", "")
    options["ldap"] = {"uri": uri, "base_dn": base_dn, "bind_dn": bind_dn,
                       "bind_password_encrypted": stored}
    cluster.options = options
    cluster.save(update_fields=["options", "updated_at"])
    audit_record(actor=actor, action="cluster.ldap_set", obj=cluster, tenant=cluster.tenant,
                 changes={"uri": uri, "base_dn": base_dn, "bind_dn": bind_dn,
                          "bind_password": "changed" if bind_password else
                          ("kept" if stored else "none")})
    return cluster


# Push --------------------------------------------------------------------------------------


def accounts_vars(*, cluster: Cluster) -> dict:
    """The accounts playbook's variables for this cluster: every group and account, present or
    (removed ones) absent, and the LDAP settings. Never a secret: these are stored with the run;
    the bind password comes from `accounts_secret_vars` when the run starts."""
    groups = [{"name": g.name, "gid": g.gid, "state": "present" if g.is_active else "absent"}
              for g in ClusterGroup.objects.filter(cluster=cluster).order_by("gid", "name")]
    users = []
    accounts = (ClusterUser.objects.filter(cluster=cluster).select_related("primary_group")
                .prefetch_related("groups").order_by("uid", "username"))
    for account in accounts:
        if not account.is_active:
            users.append({"name": account.username, "uid": account.uid, "state": "absent"})
            continue
        primary = account.primary_group
        users.append({
            "name": account.username,
            "uid": account.uid,
            "state": "present",
            "group": primary.name if primary and primary.is_active else DEFAULT_PRIMARY_GROUP,
            "groups": sorted(g.name for g in account.groups.all() if g.is_active),
            "comment": account.full_name,
            "shell": account.shell,
            "ssh_keys": account.ssh_public_keys,
        })
    ldap = cluster_ldap(cluster)
    return {
        "accounts_groups": groups,
        "accounts_users": users,
        "accounts_ldap": {"enabled": bool(ldap), "uri": ldap.get("uri", ""),
                          "base_dn": ldap.get("base_dn", ""),
                          "bind_dn": ldap.get("bind_dn", "")},
    }


def accounts_secret_vars(*, cluster: Cluster) -> dict:
    """Variables that must never be stored with a run: the LDAP bind password, base64-encoded
    (so no character of it can be read as a template). The deployment runner merges them into
    the extra vars of an accounts run when it starts; the playbook marks every task using it
    `no_log`."""
    token = ((cluster.options or {}).get("ldap") or {}).get("bind_password_encrypted", "")
    if not token:
        return {}
    password = decrypt(token)
    return {"accounts_ldap_bind_password_b64": base64.b64encode(password.encode()).decode()}


@transaction.atomic
def cluster_accounts_push(*, actor, cluster: Cluster, hosts: list[str] | None = None,
                          check_mode: bool = False) -> DeploymentRun:
    """Run the accounts playbook on the cluster's nodes (by default every node not lost):
    groups and accounts created or changed with their UID/GID, removed ones deleted, the LDAP
    client configured when the cluster has one."""
    require_platform_admin(actor)
    cluster = Cluster.objects.get(pk=cluster.pk)  # its LDAP settings as they are now
    if not cluster.is_active:
        raise ValidationError({"cluster": f"Cluster {cluster.name} is inactive."})
    nodes = cluster.nodes.all()
    if hosts is None:
        hosts = list(nodes.exclude(health=NodeHealth.LOST).values_list("name", flat=True))
        if not hosts:
            raise ValidationError({"hosts": f"Cluster {cluster.name} has no reachable nodes "
                                   "to push accounts to."})
    else:
        hosts = list(dict.fromkeys(hosts))
        if not hosts:
            raise ValidationError({"hosts": "Give at least one node, or none to mean all."})
        known = set(nodes.filter(name__in=hosts).values_list("name", flat=True))
        unknown = [host for host in hosts if host not in known]
        if unknown:
            raise ValidationError({"hosts": f"Not nodes of cluster {cluster.name}: "
                                   f"{', '.join(unknown[:10])}."})
    from podsys.services.deployments import deployment_start  # part A; imported late, no cycle

    extra_vars = accounts_vars(cluster=cluster)
    run = deployment_start(actor=actor, cluster=cluster, kind=DeploymentKind.ACCOUNTS,
                           hosts=hosts, check_mode=check_mode, extra_vars=extra_vars)
    audit_record(actor=actor, action="cluster.accounts_push", obj=cluster,
                 tenant=cluster.tenant,
                 changes={"run": run.pk, "hosts": len(hosts), "check_mode": check_mode,
                          "users": sum(1 for u in extra_vars["accounts_users"]
                                       if u["state"] == "present"),
                          "removed_users": sum(1 for u in extra_vars["accounts_users"]
                                               if u["state"] == "absent"),
                          "ldap": extra_vars["accounts_ldap"]["enabled"]})
    return run


@transaction.atomic
def cluster_accounts_mark_pushed(*, run: DeploymentRun) -> int:
    """After an accounts run succeeded (for real, on every node of its cluster that is not
    lost), stamp the accounts it carried unchanged since it started as pushed. Returns how many
    were stamped; the deployment runner calls it when an accounts run ends."""
    if (run.kind != DeploymentKind.ACCOUNTS or run.state != DeploymentState.SUCCEEDED
            or run.check_mode):
        return 0
    live = set(run.cluster.nodes.exclude(health=NodeHealth.LOST).values_list("name", flat=True))
    if not live <= set(run.hosts):
        return 0  # a partial push: some nodes still hold the old accounts
    carried = {u["name"] for u in (run.extra_vars or {}).get("accounts_users", [])}
    return ClusterUser.objects.filter(
        Q(updated_at__lte=run.created_at), cluster=run.cluster, username__in=carried,
    ).update(pushed_at=run.finished_at or timezone.now())
