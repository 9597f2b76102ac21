"""Input serializers validate what a client sends; output serializers say what it gets back."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from infra_os.choices import InvitationState, Role
from infra_os.models import ApiToken, AuditEvent, Invitation, Membership, Quota, Tenant
from infra_os.models.tenancy import slug_validator
from infra_os.selectors import tenant_list


@extend_schema_field(OpenApiTypes.STR)
class CallerTenantField(serializers.SlugRelatedField):
    """A tenant named by its slug, chosen among the tenants the caller sees: any other name is
    simply unknown, so no one learns which tenants exist."""

    def __init__(self, **kwargs):
        super().__init__(slug_field="name", **kwargs)

    def get_queryset(self):
        return self.get_queryset_for(self.context["request"].user)

    @staticmethod
    def get_queryset_for(user):
        return tenant_list(user=user)


class UserBriefSerializer(serializers.ModelSerializer):
    class Meta:
        model = get_user_model()
        fields = ["id", "username", "email", "first_name", "last_name"]


# A GPU quota of 0 means no GPUs of its own (jobs may still borrow idle ones); CPU and memory
# quotas of 0 mean no limit, as tenants are made with 0 there.
CPU_QUOTA_HELP = "CPU cores its jobs may hold at once, on all clusters; 0: no CPU limit."
MEMORY_QUOTA_HELP = "GiB of memory its jobs may hold at once, on all clusters; 0: no memory limit."
RDMA_QUOTA_HELP = ("RDMA devices its jobs may hold at once (network.rdma times replicas), on all "
                   "clusters; 0: no RDMA limit.")
QUOTA_HELP = {"cpu_cores": {"help_text": CPU_QUOTA_HELP},
              "memory_gib": {"help_text": MEMORY_QUOTA_HELP},
              "rdma_devices": {"help_text": RDMA_QUOTA_HELP}}


class QuotaBriefSerializer(serializers.ModelSerializer):
    class Meta:
        model = Quota
        fields = ["gpus", "cpu_cores", "memory_gib", "storage_gib", "rdma_devices",
                  "gpu_model_limits"]
        extra_kwargs = QUOTA_HELP


LOG_RETENTION_HELP = ("Days the log store keeps the tenant's jobs' output (whole UTC days, "
                      "default 30); counted against its storage quota.")


class TenantSerializer(serializers.ModelSerializer):
    member_count = serializers.IntegerField(read_only=True)
    my_role = serializers.ChoiceField(choices=Role.choices, read_only=True, allow_null=True)
    quota = QuotaBriefSerializer(read_only=True)

    class Meta:
        model = Tenant
        fields = [
            "id", "name", "display_name", "description", "is_active", "log_retention_days",
            "member_count", "my_role", "quota", "created_at", "updated_at",
        ]


class TenantCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63, validators=[slug_validator])
    display_name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    description = serializers.CharField(required=False, allow_blank=True)
    gpus = serializers.IntegerField(min_value=0, default=0)
    cpu_cores = serializers.IntegerField(min_value=0, default=0, help_text=CPU_QUOTA_HELP)
    memory_gib = serializers.IntegerField(min_value=0, default=0, help_text=MEMORY_QUOTA_HELP)
    storage_gib = serializers.IntegerField(min_value=0, default=0)
    log_retention_days = serializers.IntegerField(
        min_value=1, max_value=3650, required=False, help_text=LOG_RETENTION_HELP)


class TenantUpdateSerializer(serializers.Serializer):
    display_name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    description = serializers.CharField(required=False, allow_blank=True)
    is_active = serializers.BooleanField(required=False)
    log_retention_days = serializers.IntegerField(
        min_value=1, max_value=3650, required=False,
        help_text=f"{LOG_RETENTION_HELP} Platform admins only.")


class MembershipSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    user = UserBriefSerializer(read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "tenant", "user", "role", "created_at", "updated_at"]


class MembershipCreateSerializer(serializers.Serializer):
    tenant = CallerTenantField()
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)
    email = serializers.EmailField(required=False, allow_blank=True, default="")
    password = serializers.CharField(
        required=False, allow_blank=True, default="", write_only=True,
        style={"input_type": "password"},
        help_text="Only to create a new account for a username that does not exist yet. "
        "Adding members directly is for platform admins; tenant admins send invitations.",
    )


class MembershipUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class InvitationSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    invited_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                              allow_null=True)
    state = serializers.ChoiceField(choices=InvitationState.choices, source="status",
                                    read_only=True)

    class Meta:
        model = Invitation
        fields = ["id", "tenant", "username", "role", "state", "invited_by", "created_at",
                  "expires_at", "responded_at"]


class InvitationCreateSerializer(serializers.Serializer):
    tenant = CallerTenantField()
    username = serializers.CharField(
        max_length=150,
        help_text="The account to invite. The answer is the same whether or not it exists.")
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class QuotaSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Quota
        fields = [
            "id", "tenant", "gpus", "cpu_cores", "memory_gib", "storage_gib", "rdma_devices",
            "gpu_model_limits", "updated_at",
        ]
        extra_kwargs = QUOTA_HELP


class QuotaUpdateSerializer(serializers.Serializer):
    gpus = serializers.IntegerField(min_value=0, required=False)
    cpu_cores = serializers.IntegerField(min_value=0, required=False, help_text=CPU_QUOTA_HELP)
    memory_gib = serializers.IntegerField(min_value=0, required=False,
                                          help_text=MEMORY_QUOTA_HELP)
    storage_gib = serializers.IntegerField(min_value=0, required=False)
    rdma_devices = serializers.IntegerField(min_value=0, required=False,
                                            help_text=RDMA_QUOTA_HELP)
    gpu_model_limits = serializers.DictField(
        child=serializers.IntegerField(min_value=0), required=False,
        help_text='GPUs allowed per GPU model, e.g. {"H100": 8}; each at most `gpus`.',
    )


class ApiTokenSerializer(serializers.ModelSerializer):
    user = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state = serializers.ChoiceField(
        choices=[("active", "active"), ("expired", "expired"), ("revoked", "revoked")],
        read_only=True,
    )

    class Meta:
        model = ApiToken
        fields = [
            "id", "name", "prefix", "user", "state", "created_at", "expires_at", "last_used_at",
            "revoked_at",
        ]


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(
        read_only=True, help_text="The secret. It is shown this once and never again."
    )

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    expires_in_days = serializers.IntegerField(
        min_value=1, max_value=366, required=False, allow_null=True, default=90,
        help_text="Days until the token expires (1 to 366); null for no expiry.",
    )

    def validate(self, attrs):
        days = attrs.pop("expires_in_days")
        attrs["expires_at"] = timezone.now() + timedelta(days=days) if days else None
        return attrs


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", read_only=True)
    tenant = serializers.CharField(source="tenant_name", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id", "created_at", "actor", "tenant", "action", "object_type", "object_id",
            "object_repr", "changes", "source_ip",
        ]


class MembershipBriefSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Membership
        fields = ["tenant", "role"]


class MeSerializer(serializers.ModelSerializer):
    is_platform_admin = serializers.BooleanField(source="is_staff", read_only=True)
    memberships = MembershipBriefSerializer(many=True, read_only=True)

    class Meta:
        model = get_user_model()
        fields = [
            "id", "username", "email", "first_name", "last_name", "is_platform_admin",
            "memberships",
        ]


class LoginSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(style={"input_type": "password"}, write_only=True)
