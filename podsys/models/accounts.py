"""POSIX accounts on a cluster's nodes, pushed by the accounts playbook with the same UID and
GID on every node."""

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from ogai.models import TimeStampedModel
from podsys.models.clusters import Cluster

posix_name_validator = RegexValidator(
    r"^[a-z_][a-z0-9_-]{0,31}$",
    "Use a POSIX name: a lowercase letter or _, then up to 31 lowercase letters, digits, _ or -.",
)


class ClusterGroup(TimeStampedModel):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="account_groups")
    name = models.CharField(max_length=32, validators=[posix_name_validator])
    gid = models.PositiveIntegerField()
    # False: removed here and removed from the nodes at the next push.
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="cluster_group_unique_name"),
            models.UniqueConstraint(fields=["cluster", "gid"], name="cluster_group_unique_gid"),
        ]

    def __str__(self) -> str:
        return self.name


class ClusterUser(TimeStampedModel):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="account_users")
    username = models.CharField(max_length=32, validators=[posix_name_validator])
    uid = models.PositiveIntegerField()
    # The platform user this account belongs to, when it is one.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.SET_NULL, related_name="cluster_accounts")
    full_name = models.CharField(max_length=200, blank=True)
    primary_group = models.ForeignKey(ClusterGroup, null=True, blank=True,
                                      on_delete=models.PROTECT, related_name="primary_users")
    groups = models.ManyToManyField(ClusterGroup, blank=True, related_name="users")
    shell = models.CharField(max_length=100, default="/bin/bash")
    # OpenSSH public keys, one per line: the whole authorized_keys the playbook writes.
    ssh_public_keys = models.TextField(blank=True)
    # False: removed; the next push deletes the account and its keys from every node.
    is_active = models.BooleanField(default=True)
    pushed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cluster", "username"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "username"],
                                    name="cluster_user_unique_name"),
            models.UniqueConstraint(fields=["cluster", "uid"], name="cluster_user_unique_uid"),
        ]

    def __str__(self) -> str:
        return self.username
