"""Cluster accounts: users and groups pushed to a cluster's nodes, and the LDAP directory they
may use instead. Operators only: everyone else sees none and may change nothing."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from infra_os.api.viewsets import ScopedViewSet
from podsys import selectors
from podsys.api import serializers_accounts as s
from podsys.filtersets_accounts import ClusterGroupFilterSet, ClusterUserFilterSet
from podsys.services.accounts import (
    cluster_accounts_push,
    cluster_group_create,
    cluster_group_remove,
    cluster_ldap,
    cluster_ldap_set,
    cluster_user_create,
    cluster_user_remove,
    cluster_user_update,
)


class ClusterUserViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Accounts on a cluster's nodes, the same UID everywhere. A removed account stays listed
    (inactive) and is deleted from the nodes, keys first, at the next push."""

    selector = selectors.cluster_account_list
    output_serializer_class = s.ClusterUserSerializer
    input_serializer_classes = {"create": s.ClusterUserCreateSerializer,
                                "partial_update": s.ClusterUserUpdateSerializer,
                                "push": s.AccountsPushSerializer,
                                "ldap": s.ClusterLdapSerializer}
    filterset_class = ClusterUserFilterSet
    tenant_field = None
    platform_admin_actions = ("create", "partial_update", "remove", "push", "ldap")

    @extend_schema(request=s.ClusterUserCreateSerializer, responses={201: s.ClusterUserSerializer})
    def create(self, request):
        account = cluster_user_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(account), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ClusterUserUpdateSerializer, responses=s.ClusterUserSerializer)
    def partial_update(self, request, pk=None):
        account = cluster_user_update(actor=request.user, account=self.get_object(),
                                      **self.validated_input(partial=True))
        return self.respond(self.reload(account))

    @extend_schema(request=None, responses=s.ClusterUserSerializer)
    @action(detail=True, methods=["post"])
    def remove(self, request, pk=None):
        """Remove the account: its keys and then the account itself are deleted from every
        node at the next push."""
        account = cluster_user_remove(actor=request.user, account=self.get_object())
        return self.respond(self.reload(account))

    @extend_schema(request=s.AccountsPushSerializer,
                   responses={202: OpenApiResponse(s.AccountsPushRunSerializer,
                                                   description="The run carrying the push.")})
    @action(detail=False, methods=["post"])
    def push(self, request):
        """Push the cluster's groups and accounts (and its LDAP client settings) to its nodes
        with the accounts playbook. Follow the run under /deployment-runs/{id}/."""
        run = cluster_accounts_push(actor=request.user, **self.validated_input())
        return Response(s.AccountsPushRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=s.ClusterLdapSerializer, responses=s.ClusterLdapStateSerializer)
    @action(detail=False, methods=["post"])
    def ldap(self, request):
        """Point the cluster's nodes at an LDAP directory (sssd), or with an empty uri back at
        local accounts. Takes effect at the next push."""
        cluster = cluster_ldap_set(actor=request.user, **self.validated_input())
        settings = cluster_ldap(cluster)
        state = {"cluster": cluster.name, "enabled": bool(settings), "uri": "", "base_dn": "",
                 "bind_dn": "", "has_bind_password": False, **settings}
        return Response(s.ClusterLdapStateSerializer(state).data)


class ClusterGroupViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Groups on a cluster's nodes, the same GID everywhere."""

    selector = selectors.cluster_group_list
    output_serializer_class = s.ClusterGroupSerializer
    input_serializer_classes = {"create": s.ClusterGroupCreateSerializer}
    filterset_class = ClusterGroupFilterSet
    tenant_field = None
    platform_admin_actions = ("create", "remove")

    @extend_schema(request=s.ClusterGroupCreateSerializer,
                   responses={201: s.ClusterGroupSerializer})
    def create(self, request):
        group = cluster_group_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(group), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.ClusterGroupSerializer)
    @action(detail=True, methods=["post"])
    def remove(self, request, pk=None):
        """Remove the group: it leaves every account and is deleted from the nodes at the
        next push."""
        group = cluster_group_remove(actor=request.user, group=self.get_object())
        return self.respond(self.reload(group))
