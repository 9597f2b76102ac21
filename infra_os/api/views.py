from django.contrib.auth import login, logout
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed, Throttled
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from infra_os import selectors
from infra_os.api import serializers as s
from infra_os.api.viewsets import ScopedViewSet
from infra_os.choices import ADMIN_ROLES
from infra_os.filtersets import (
    ApiTokenFilterSet,
    AuditEventFilterSet,
    InvitationFilterSet,
    MembershipFilterSet,
    QuotaFilterSet,
    TenantFilterSet,
)
from infra_os.services.invitations import (
    invitation_accept,
    invitation_create,
    invitation_decline,
    invitation_revoke,
)
from infra_os.services.quotas import quota_update
from infra_os.services.tenancy import (
    membership_create,
    membership_delete,
    membership_update,
    tenant_create,
    tenant_delete,
    tenant_update,
)
from infra_os.services.tokens import api_token_create, api_token_revoke
from ogai.sign_in import SignInThrottled, throttled_authenticate


class TenantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Tenants the caller belongs to (platform admins: all). Platform admins create and delete
    tenants; tenant admins edit their own."""

    selector = selectors.tenant_list
    output_serializer_class = s.TenantSerializer
    input_serializer_classes = {
        "create": s.TenantCreateSerializer,
        "partial_update": s.TenantUpdateSerializer,
        "update": s.TenantUpdateSerializer,
    }
    filterset_class = TenantFilterSet
    tenant_field = "pk"
    write_roles = ADMIN_ROLES
    platform_admin_actions = ("create", "destroy")
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"

    @extend_schema(request=s.TenantCreateSerializer, responses={201: s.TenantSerializer})
    def create(self, request):
        tenant = tenant_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(tenant), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=s.TenantUpdateSerializer, responses=s.TenantSerializer)
    def update(self, request, name=None):
        tenant = tenant_update(actor=request.user, tenant=self.get_object(),
                               **self.validated_input(partial=True))
        return self.respond(self.reload(tenant))

    @extend_schema(request=s.TenantUpdateSerializer, responses=s.TenantSerializer)
    def partial_update(self, request, name=None):
        return self.update(request, name=name)

    @extend_schema(responses={204: None})
    def destroy(self, request, name=None):
        tenant_delete(actor=request.user, tenant=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class MembershipViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Who belongs to which tenant with which role. Tenant admins manage their tenant's members."""

    selector = selectors.membership_list
    output_serializer_class = s.MembershipSerializer
    input_serializer_classes = {
        "create": s.MembershipCreateSerializer,
        "partial_update": s.MembershipUpdateSerializer,
        "update": s.MembershipUpdateSerializer,
    }
    filterset_class = MembershipFilterSet
    write_roles = ADMIN_ROLES

    @extend_schema(request=s.MembershipCreateSerializer, responses={201: s.MembershipSerializer})
    def create(self, request):
        membership = membership_create(actor=request.user, **self.validated_input())
        return self.respond(membership, http_status=status.HTTP_201_CREATED)

    @extend_schema(request=s.MembershipUpdateSerializer, responses=s.MembershipSerializer)
    def update(self, request, pk=None):
        membership = membership_update(actor=request.user, membership=self.get_object(),
                                       **self.validated_input())
        return self.respond(membership)

    @extend_schema(request=s.MembershipUpdateSerializer, responses=s.MembershipSerializer)
    def partial_update(self, request, pk=None):
        return self.update(request, pk=pk)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        membership_delete(actor=request.user, membership=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Invitations to join a tenant: those addressed to you, and those of the tenants you are a
    tenant admin of. Tenant admins invite a username with a role (the answer is the same
    whether or not the account exists) and revoke; the invited person accepts or declines."""

    selector = selectors.invitation_list
    output_serializer_class = s.InvitationSerializer
    input_serializer_classes = {"create": s.InvitationCreateSerializer}
    filterset_class = InvitationFilterSet
    write_roles = ADMIN_ROLES
    # Answering an invitation is the addressee's, whatever their role elsewhere.
    viewer_actions = ("accept", "decline")

    def get_queryset(self):
        if self.action in self.viewer_actions:
            # Only the addressee finds it: anyone else, the tenant's admins too, gets a 404.
            return selectors.invitation_inbox(user=self.request.user)
        return super().get_queryset()

    @extend_schema(request=s.InvitationCreateSerializer, responses={201: s.InvitationSerializer})
    def create(self, request):
        invitation = invitation_create(actor=request.user, **self.validated_input())
        return self.respond(invitation, http_status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        invitation_revoke(actor=request.user, invitation=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={201: s.MembershipSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def accept(self, request, pk=None):
        membership = invitation_accept(actor=request.user, invitation=self.get_object())
        return self.respond(membership, http_status=status.HTTP_201_CREATED,
                            serializer=s.MembershipSerializer)

    @extend_schema(request=None, responses=s.InvitationSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsAuthenticated])
    def decline(self, request, pk=None):
        invitation = invitation_decline(actor=request.user, invitation=self.get_object())
        return self.respond(invitation)


class QuotaViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Each tenant's quota. Only platform admins change quotas."""

    selector = selectors.quota_list
    output_serializer_class = s.QuotaSerializer
    input_serializer_classes = {
        "partial_update": s.QuotaUpdateSerializer,
        "update": s.QuotaUpdateSerializer,
    }
    filterset_class = QuotaFilterSet
    platform_admin_actions = ("update", "partial_update")

    @extend_schema(request=s.QuotaUpdateSerializer, responses=s.QuotaSerializer)
    def update(self, request, pk=None):
        quota = quota_update(actor=request.user, quota=self.get_object(),
                             **self.validated_input(partial=True))
        return self.respond(quota)

    @extend_schema(request=s.QuotaUpdateSerializer, responses=s.QuotaSerializer)
    def partial_update(self, request, pk=None):
        return self.update(request, pk=pk)


class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Your personal API tokens. The secret is returned once, when the token is created."""

    selector = selectors.api_token_list
    output_serializer_class = s.ApiTokenSerializer
    input_serializer_classes = {"create": s.ApiTokenCreateSerializer}
    filterset_class = ApiTokenFilterSet
    tenant_field = None
    # Tokens are personal: a viewer creates and revokes their own (they stay read-only).
    viewer_actions = ("create", "revoke")

    @extend_schema(request=s.ApiTokenCreateSerializer,
                   responses={201: s.ApiTokenCreatedSerializer})
    def create(self, request):
        issued = api_token_create(actor=request.user, **self.validated_input())
        data = s.ApiTokenCreatedSerializer(issued.token).data
        data["token"] = issued.secret
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.ApiTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        token = api_token_revoke(actor=request.user, token=self.get_object())
        return self.respond(token)


class AuditEventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """What changed, who changed it, when and from where; read only."""

    selector = selectors.audit_event_list
    output_serializer_class = s.AuditEventSerializer
    filterset_class = AuditEventFilterSet


class MeView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses=s.MeSerializer)
    def get(self, request):
        return Response(s.MeSerializer(request.user).data)


class LoginView(APIView):
    """Sign in with a username and password; the answer sets a session cookie. Throttled like
    the console's and the admin's sign-in (`ogai.sign_in`): per client address and, for
    failures, per username."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    def get_authenticate_header(self, request):
        # A wrong password is a 401 (DRF makes it a 403 when a view has no authenticator).
        return 'Bearer realm="api"'

    @extend_schema(request=s.LoginSerializer, responses={
        200: s.MeSerializer,
        429: OpenApiResponse(description="Too many sign-in attempts; Retry-After says when to "
                                         "try again."),
    })
    def post(self, request):
        serializer = s.LoginSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            user = throttled_authenticate(request, **serializer.validated_data)
        except SignInThrottled as exc:
            refused = Throttled(detail=exc.message)
            refused.wait = exc.wait_s
            raise refused from None
        if user is None:
            raise AuthenticationFailed("The username or password is wrong.")
        login(request._request, user)
        return Response(s.MeSerializer(user).data)


class LogoutView(APIView):
    @extend_schema(request=None, responses={204: None})
    def post(self, request):
        logout(request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)
