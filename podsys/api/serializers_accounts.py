"""Cluster accounts in the API. Keys are shown as given (they are public) with their
fingerprints; the LDAP bind password is write-only and never comes back."""

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from podsys.models import Cluster, ClusterGroup, ClusterUser, DeploymentRun
from podsys.ssh_keys import fingerprints

_CLUSTER_HELP = "The cluster's name."


def _cluster_field(**kwargs) -> serializers.SlugRelatedField:
    return serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all(),
                                        help_text=_CLUSTER_HELP, **kwargs)


class ClusterGroupSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    member_count = serializers.IntegerField(read_only=True,
                                            help_text="Active accounts in the group.")

    class Meta:
        model = ClusterGroup
        fields = ["id", "cluster", "name", "gid", "is_active", "member_count", "created_at",
                  "updated_at"]
        read_only_fields = fields


class ClusterGroupCreateSerializer(serializers.Serializer):
    cluster = _cluster_field()
    name = serializers.CharField(max_length=32)
    gid = serializers.IntegerField(required=False, allow_null=True, default=None,
                                   help_text="Empty: the next free one.")


class ClusterUserSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    primary_group = serializers.SlugRelatedField(
        slug_field="name", read_only=True,
        help_text="Null: the system group `users` (GID 100 on every node).")
    groups = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    user = serializers.SlugRelatedField(slug_field="username", read_only=True)
    ssh_key_fingerprints = serializers.SerializerMethodField()

    class Meta:
        model = ClusterUser
        fields = ["id", "cluster", "username", "uid", "full_name", "primary_group", "groups",
                  "shell", "ssh_public_keys", "ssh_key_fingerprints", "user", "is_active",
                  "pushed_at", "created_at", "updated_at"]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_ssh_key_fingerprints(self, account: ClusterUser) -> list[str]:
        return fingerprints(account.ssh_public_keys)


class _ClusterUserFieldsSerializer(serializers.Serializer):
    full_name = serializers.CharField(max_length=200, allow_blank=True, default="")
    groups = serializers.ListField(child=serializers.CharField(max_length=32), default=list,
                                   max_length=200, help_text="Supplementary groups, by name.")
    primary_group = serializers.CharField(
        max_length=32, allow_null=True, allow_blank=True, default=None,
        help_text="A group of the cluster, by name; empty: the system group `users`.")
    ssh_public_keys = serializers.CharField(
        allow_blank=True, default="", max_length=65536, trim_whitespace=False,
        help_text="OpenSSH public keys, one a line: the account's whole authorized_keys.")
    shell = serializers.CharField(max_length=100, default="/bin/bash")
    user = serializers.SlugRelatedField(
        slug_field="username", queryset=get_user_model().objects.all(), allow_null=True,
        default=None, help_text="The platform user this account belongs to, if any.")


class ClusterUserCreateSerializer(_ClusterUserFieldsSerializer):
    cluster = _cluster_field()
    username = serializers.CharField(max_length=32)
    uid = serializers.IntegerField(required=False, allow_null=True, default=None,
                                   help_text="Empty: the next free one. The same on every node.")


class ClusterUserUpdateSerializer(_ClusterUserFieldsSerializer):
    """Every field optional; the username and UID are fixed."""


class AccountsPushSerializer(serializers.Serializer):
    cluster = _cluster_field()
    hosts = serializers.ListField(
        child=serializers.CharField(max_length=253), required=False, allow_null=True,
        default=None, max_length=10000,
        help_text="Node names; empty: every node of the cluster that is not lost.")
    check_mode = serializers.BooleanField(default=False,
                                          help_text="Report what would change; change nothing.")


class AccountsPushRunSerializer(serializers.ModelSerializer):
    """The deployment run that carries the push (follow it under deployment-runs)."""

    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = DeploymentRun
        fields = ["id", "cluster", "state", "hosts", "check_mode", "created_at"]
        read_only_fields = fields


class ClusterLdapSerializer(serializers.Serializer):
    cluster = _cluster_field()
    uri = serializers.CharField(
        max_length=1000, allow_blank=True,
        help_text="ldaps://host[:port] (several: comma-separated); empty: local accounts again.")
    base_dn = serializers.CharField(max_length=500, allow_blank=True, default="")
    bind_dn = serializers.CharField(max_length=500, allow_blank=True, default="")
    bind_password = serializers.CharField(
        max_length=500, allow_blank=True, default="", write_only=True, trim_whitespace=False,
        style={"input_type": "password"},
        help_text="Stored encrypted, never shown. Empty: keep the stored one (same bind DN).")


class ClusterLdapStateSerializer(serializers.Serializer):
    cluster = serializers.CharField()
    enabled = serializers.BooleanField()
    uri = serializers.CharField()
    base_dn = serializers.CharField()
    bind_dn = serializers.CharField()
    has_bind_password = serializers.BooleanField()
