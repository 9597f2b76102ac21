"""Server leases over the API: members of a tenant read its leases; platform admins lease
servers and end leases."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action

from infra_os import selectors
from infra_os.api.serializers import CallerTenantField
from infra_os.api.viewsets import ScopedViewSet
from infra_os.choices import LeaseState
from infra_os.filtersets import LeaseFilterSet
from infra_os.models import Lease, Server
from infra_os.services.leases import lease_create, lease_end


class LeaseSerializer(serializers.ModelSerializer):
    server = serializers.SlugRelatedField(slug_field="name", read_only=True)
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    state = serializers.ChoiceField(choices=LeaseState.choices, read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                              allow_null=True)

    class Meta:
        model = Lease
        fields = [
            "id", "server", "tenant", "state", "starts_at", "ends_at", "ended_at", "gpu_model",
            "gpus", "note", "created_by", "created_at", "updated_at",
        ]


class LeaseCreateSerializer(serializers.Serializer):
    server = serializers.SlugRelatedField(slug_field="name", queryset=Server.objects.all(),
                                          help_text="The server's name.")
    tenant = CallerTenantField(help_text="The tenant's name.")
    starts_at = serializers.DateTimeField(
        required=False, default=None, allow_null=True,
        help_text="When the lease starts (ISO 8601 with a time zone); empty: now.",
    )
    ends_at = serializers.DateTimeField(help_text="When it ends (ISO 8601 with a time zone).")
    note = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")

    def validate(self, attrs):
        attrs["starts_at"] = attrs["starts_at"] or timezone.now()
        return attrs


class LeaseViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Servers rented whole to a tenant, from a start to an end. Their GPUs count against the
    tenant's GPU quota while they are in force."""

    selector = selectors.lease_list
    output_serializer_class = LeaseSerializer
    input_serializer_classes = {"create": LeaseCreateSerializer}
    filterset_class = LeaseFilterSet
    platform_admin_actions = ("create", "end")

    @extend_schema(request=LeaseCreateSerializer, responses={201: LeaseSerializer})
    def create(self, request):
        lease = lease_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(lease), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=LeaseSerializer)
    @action(detail=True, methods=["post"])
    def end(self, request, pk=None):
        """Cancel a lease that has not started, or end one in force now (its usage is
        recorded)."""
        lease = lease_end(actor=request.user, lease=self.get_object())
        return self.respond(self.reload(lease))
