"""Bare-metal servers, racks and provisioning: the operator's API (platform admins only), plus
the two doors a server being installed uses: its boot config by MAC, and its callback."""

from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from infra_os import selectors
from infra_os.api.viewsets import ScopedViewSet
from infra_os.choices import BootMethod, PowerAction, RunState
from infra_os.filtersets import ProvisioningBatchFilterSet, ServerFilterSet
from infra_os.models import (
    InventorySnapshot,
    ProvisioningBatch,
    ProvisioningProfile,
    ProvisioningRun,
    ProvisioningStep,
    Rack,
    Server,
)
from infra_os.server_files import parse_server_file
from infra_os.services.provisioning import (
    batch_cancel,
    batch_create,
    batch_retry_failed,
    boot_config,
    from_provisioning_network,
    profile_create,
    profile_delete,
    profile_update,
    run_callback,
)
from infra_os.services.servers import (
    bmc_update,
    rack_create,
    rack_delete,
    server_delete,
    server_import,
    server_power_request,
    server_refresh_request,
    server_register,
    server_retire,
    server_update,
)
from ogai.api.parsers import JSONParser
from ogai.request_context import client_ip

# Serializers


class BmcSerializer(serializers.Serializer):
    """How the BMC is reached; the password is never returned."""

    driver = serializers.CharField()
    address = serializers.CharField()
    system_id = serializers.CharField()
    verify_tls = serializers.BooleanField()
    username = serializers.CharField()


class ServerSerializer(serializers.ModelSerializer):
    rack = serializers.SlugRelatedField(slug_field="name", read_only=True)
    bmc = BmcSerializer(read_only=True)
    provisioning_state = serializers.ChoiceField(choices=RunState.choices, read_only=True,
                                                 allow_null=True)
    provisioning_batch_id = serializers.IntegerField(read_only=True, allow_null=True)
    leased_to = serializers.CharField(read_only=True, allow_null=True,
                                      help_text="The tenant of its live lease")

    class Meta:
        model = Server
        fields = [
            "id", "name", "rack", "description", "state", "allocation", "allocated_to",
            "expected_gpu_model", "expected_gpu_count", "gpu_model", "gpu_count",
            "power_state", "health", "mismatches", "console_url", "boot_mac", "last_seen_at",
            "bmc_error", "bmc", "provisioning_state", "provisioning_batch_id", "leased_to",
            "created_at",
            "updated_at",
        ]


class ServerCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    rack = serializers.CharField(max_length=63, required=False, allow_blank=True)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    bmc_address = serializers.CharField(max_length=255)
    bmc_username = serializers.CharField(max_length=128)
    bmc_password = serializers.CharField(max_length=256, write_only=True,
                                         style={"input_type": "password"})
    bmc_driver = serializers.CharField(max_length=32, required=False, default="redfish")
    system_id = serializers.CharField(max_length=255, required=False, allow_blank=True)
    verify_tls = serializers.BooleanField(required=False, default=True)
    expected_gpu_model = serializers.CharField(max_length=64, required=False, allow_blank=True)
    expected_gpu_count = serializers.IntegerField(min_value=0, max_value=64, required=False,
                                                  default=0)
    boot_mac = serializers.CharField(max_length=17, required=False, allow_blank=True)


class ServerUpdateSerializer(serializers.Serializer):
    rack = serializers.CharField(max_length=63, required=False, allow_blank=True)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    expected_gpu_model = serializers.CharField(max_length=64, required=False, allow_blank=True)
    expected_gpu_count = serializers.IntegerField(min_value=0, max_value=64, required=False)


class BmcUpdateSerializer(serializers.Serializer):
    address = serializers.CharField(max_length=255, required=False)
    username = serializers.CharField(max_length=128, required=False)
    password = serializers.CharField(max_length=256, required=False, write_only=True)
    system_id = serializers.CharField(max_length=255, required=False, allow_blank=True)
    verify_tls = serializers.BooleanField(required=False)


class ServerImportSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="CSV with a header row, or a JSON list of objects; "
                                 "columns as for one server")


class PowerSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=PowerAction.choices)


class BulkPowerSerializer(PowerSerializer):
    servers = serializers.ListField(child=serializers.CharField(max_length=63), min_length=1,
                                    max_length=2000)


class AcceptedSerializer(serializers.Serializer):
    accepted = serializers.IntegerField(help_text="Servers the action was asked of")


class InventorySerializer(serializers.ModelSerializer):
    class Meta:
        model = InventorySnapshot
        fields = ["id", "taken_at", "power_state", "health", "data", "missing", "mismatches"]


class RackSerializer(serializers.ModelSerializer):
    server_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Rack
        fields = ["id", "name", "location", "server_count", "created_at"]
        read_only_fields = ["id", "created_at"]


class RackCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    location = serializers.CharField(max_length=200, required=False, allow_blank=True)


class ProfileSerializer(serializers.ModelSerializer):
    class Meta:
        model = ProvisioningProfile
        fields = ["id", "name", "description", "boot_method", "user_data", "created_at",
                  "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]


class ProfileUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    boot_method = serializers.ChoiceField(choices=BootMethod.choices, required=False)
    user_data = serializers.CharField(required=False, allow_blank=True)


class StepSerializer(serializers.ModelSerializer):
    class Meta:
        model = ProvisioningStep
        fields = ["at", "attempt", "name", "outcome", "message"]


class RunSerializer(serializers.ModelSerializer):
    server = serializers.SlugRelatedField(slug_field="name", read_only=True)
    steps = StepSerializer(many=True, read_only=True)

    class Meta:
        model = ProvisioningRun
        fields = ["id", "server", "state", "attempt", "error", "started_at", "finished_at",
                  "deadline_at", "ogai_seconds", "bmc_seconds", "steps"]


class BatchSerializer(serializers.ModelSerializer):
    profile = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    counts = serializers.SerializerMethodField()

    class Meta:
        model = ProvisioningBatch
        fields = ["id", "name", "profile", "image_url", "boot_method", "concurrency",
                  "max_attempts", "power_timeout_s", "callback_timeout_s", "state", "counts",
                  "summary", "created_by", "created_at", "finished_at"]

    def get_counts(self, batch) -> dict[str, int]:
        return {state: getattr(batch, f"runs_{state}", 0) for state in RunState.values}


class BatchDetailSerializer(BatchSerializer):
    runs = RunSerializer(many=True, read_only=True)

    class Meta(BatchSerializer.Meta):
        fields = [*BatchSerializer.Meta.fields, "runs"]


class BatchCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    profile = serializers.SlugRelatedField(slug_field="name",
                                           queryset=ProvisioningProfile.objects.all())
    servers = serializers.ListField(child=serializers.CharField(max_length=63), min_length=1,
                                    max_length=2000)
    image_url = serializers.URLField(max_length=500)
    boot_method = serializers.ChoiceField(choices=BootMethod.choices, required=False,
                                          help_text="Empty: the profile's")
    concurrency = serializers.IntegerField(min_value=1, max_value=1000, default=20)
    max_attempts = serializers.IntegerField(min_value=1, max_value=10, default=3)
    power_timeout_s = serializers.IntegerField(min_value=1, max_value=3600, default=300)
    callback_timeout_s = serializers.IntegerField(min_value=1, max_value=86400, default=3600)


class CallbackSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=200, required=False, allow_blank=True)
    ip = serializers.CharField(max_length=64, required=False, allow_blank=True)
    os = serializers.CharField(max_length=200, required=False, allow_blank=True)
    kernel = serializers.CharField(max_length=200, required=False, allow_blank=True)


class CallbackAnswerSerializer(serializers.Serializer):
    server = serializers.CharField()
    state = serializers.CharField()


class BootConfigSerializer(serializers.Serializer):
    server = serializers.CharField()
    image_url = serializers.CharField()
    boot_method = serializers.CharField()
    user_data = serializers.CharField()
    callback_url = serializers.CharField()
    token = serializers.CharField()


def servers_named(names: list[str]) -> list[Server]:
    """The servers of these names, or a 400 naming the unknown ones."""
    found = {server.name: server for server in Server.objects.filter(name__in=names)}
    unknown = sorted(set(names) - set(found))
    if unknown:
        raise ValidationError({"servers": f"No such server: {', '.join(unknown)}."})
    return [found[name] for name in dict.fromkeys(names)]


# Views

class OperatorViewSet(ScopedViewSet):
    tenant_field = None
    platform_admin_actions = ("create", "update", "partial_update", "destroy", "import_file",
                              "power", "power_many", "refresh", "retire", "bmc", "cancel",
                              "retry_failed")


class ServerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    """Bare-metal servers and their BMCs (platform admins). Registering one reads its
    inventory in the background; power actions answer 202 and happen on the `provision`
    queue."""

    selector = selectors.server_list
    output_serializer_class = ServerSerializer
    input_serializer_classes = {
        "create": ServerCreateSerializer, "partial_update": ServerUpdateSerializer,
        "update": ServerUpdateSerializer, "import_file": ServerImportSerializer,
        "power": PowerSerializer, "power_many": BulkPowerSerializer, "bmc": BmcUpdateSerializer,
    }
    filterset_class = ServerFilterSet
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"

    @extend_schema(request=ServerCreateSerializer, responses={201: ServerSerializer})
    def create(self, request):
        server = server_register(actor=request.user, **self.validated_input())
        return self.respond(self.reload(server), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=ServerUpdateSerializer, responses=ServerSerializer)
    def update(self, request, name=None):
        server = server_update(actor=request.user, server=self.get_object(),
                               **self.validated_input(partial=True))
        return self.respond(self.reload(server))

    @extend_schema(request=ServerUpdateSerializer, responses=ServerSerializer)
    def partial_update(self, request, name=None):
        return self.update(request, name=name)

    @extend_schema(responses={204: None})
    def destroy(self, request, name=None):
        server_delete(actor=request.user, server=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request={"multipart/form-data": ServerImportSerializer},
                   responses={201: ServerSerializer(many=True)})
    @action(detail=False, methods=["post"], url_path="import",
            parser_classes=[MultiPartParser, FormParser])
    def import_file(self, request):
        """Register many servers from a CSV or JSON file: all of them, or none when a row is
        wrong (each wrong row is named)."""
        upload = self.validated_input()["file"]
        rows = parse_server_file(upload.read(), filename=upload.name)
        servers = server_import(actor=request.user, rows=rows)
        queryset = self.get_queryset().filter(pk__in=[server.pk for server in servers])
        return Response(ServerSerializer(queryset, many=True).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=PowerSerializer, responses={202: AcceptedSerializer})
    @action(detail=True, methods=["post"])
    def power(self, request, name=None):
        count = server_power_request(actor=request.user, servers=[self.get_object()],
                                     **self.validated_input())
        return Response({"accepted": count}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=BulkPowerSerializer, responses={202: AcceptedSerializer},
                   operation_id="infra_os_servers_power_many")
    @action(detail=False, methods=["post"], url_path="power")
    def power_many(self, request):
        data = self.validated_input()
        servers = servers_named(data["servers"])
        count = server_power_request(actor=request.user, servers=servers, action=data["action"])
        return Response({"accepted": count}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: AcceptedSerializer})
    @action(detail=True, methods=["post"])
    def refresh(self, request, name=None):
        """Read the inventory again from the BMC (in the background)."""
        server_refresh_request(actor=request.user, server=self.get_object())
        return Response({"accepted": 1}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=InventorySerializer)
    @action(detail=True, methods=["get"])
    def inventory(self, request, name=None):
        """The newest inventory the BMC reported."""
        snapshot = self.get_object().inventories.first()
        if snapshot is None:
            return Response({"code": "not_found", "message": "No inventory yet: the BMC has not "
                             "answered (see bmc_error).", "fields": {}},
                            status=status.HTTP_404_NOT_FOUND)
        return Response(InventorySerializer(snapshot).data)

    @extend_schema(request=None, responses=ServerSerializer)
    @action(detail=True, methods=["post"])
    def retire(self, request, name=None):
        server = server_retire(actor=request.user, server=self.get_object())
        return self.respond(self.reload(server))

    @extend_schema(request=BmcUpdateSerializer, responses=ServerSerializer)
    @action(detail=True, methods=["patch"])
    def bmc(self, request, name=None):
        server = self.get_object()
        bmc_update(actor=request.user, server=server, **self.validated_input(partial=True))
        return self.respond(self.reload(server))


class RackViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    selector = selectors.rack_list
    output_serializer_class = RackSerializer
    input_serializer_classes = {"create": RackCreateSerializer}
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"

    @extend_schema(request=RackCreateSerializer, responses={201: RackSerializer})
    def create(self, request):
        rack = rack_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(rack), http_status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request, name=None):
        rack_delete(actor=request.user, rack=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class ProvisioningProfileViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                                 OperatorViewSet):
    selector = selectors.provisioning_profile_list
    output_serializer_class = ProfileSerializer
    input_serializer_classes = {"create": ProfileSerializer, "update": ProfileUpdateSerializer,
                                "partial_update": ProfileUpdateSerializer}
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"

    @extend_schema(request=ProfileSerializer, responses={201: ProfileSerializer})
    def create(self, request):
        profile = profile_create(actor=request.user, **self.validated_input())
        return self.respond(profile, http_status=status.HTTP_201_CREATED)

    @extend_schema(request=ProfileUpdateSerializer, responses=ProfileSerializer)
    def update(self, request, name=None):
        profile = profile_update(actor=request.user, profile=self.get_object(),
                                 **self.validated_input(partial=True))
        return self.respond(profile)

    @extend_schema(request=ProfileUpdateSerializer, responses=ProfileSerializer)
    def partial_update(self, request, name=None):
        return self.update(request, name=name)

    @extend_schema(responses={204: None})
    def destroy(self, request, name=None):
        profile_delete(actor=request.user, profile=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class ProvisioningBatchViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                               OperatorViewSet):
    """Provisioning batches: every server's state and step history; create one to install an
    image on many servers at once (202: it runs in the background)."""

    selector = selectors.provisioning_batch_list
    output_serializer_class = BatchSerializer
    input_serializer_classes = {"create": BatchCreateSerializer}
    filterset_class = ProvisioningBatchFilterSet

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action != "list":
            queryset = queryset.prefetch_related("runs__server", "runs__steps")
        return queryset

    @extend_schema(responses=BatchDetailSerializer)
    def retrieve(self, request, pk=None):
        return self.respond(self.get_object(), serializer=BatchDetailSerializer)

    @extend_schema(request=BatchCreateSerializer, responses={202: BatchDetailSerializer})
    def create(self, request):
        data = self.validated_input()
        data["servers"] = servers_named(data["servers"])
        batch = batch_create(actor=request.user, **data)
        return self.respond(self.reload(batch), http_status=status.HTTP_202_ACCEPTED,
                            serializer=BatchDetailSerializer)

    @extend_schema(request=None, responses=BatchDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        batch = batch_cancel(actor=request.user, batch=self.get_object())
        return self.respond(self.reload(batch), serializer=BatchDetailSerializer)

    @extend_schema(request=None, responses={202: BatchDetailSerializer})
    @action(detail=True, methods=["post"], url_path="retry-failed")
    def retry_failed(self, request, pk=None):
        """A new batch of this batch's failed servers, same settings."""
        batch = batch_retry_failed(actor=request.user, batch=self.get_object())
        return self.respond(self.reload(batch), http_status=status.HTTP_202_ACCEPTED,
                            serializer=BatchDetailSerializer)


class ProvisioningCallbackView(APIView):
    """A freshly installed server's first-boot agent calls here with its one-time token (no
    other credentials: the token is the proof). It works once."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes = [JSONParser]

    @extend_schema(request=CallbackSerializer, responses=CallbackAnswerSerializer)
    def post(self, request):
        if not from_provisioning_network(client_ip(request)):
            raise PermissionDenied("Callbacks are accepted from the provisioning networks only.")
        serializer = CallbackSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        facts = dict(serializer.validated_data)
        run = run_callback(token=facts.pop("token"), facts=facts)
        return Response({"server": run.server.name, "state": run.state})


class BootConfigView(APIView):
    """What a server booting its installer needs, by the MAC it boots from (served only while
    that server waits for its first boot)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(parameters=[OpenApiParameter("mac", OpenApiTypes.STR, required=True)],
                   responses=BootConfigSerializer)
    def get(self, request):
        if not from_provisioning_network(client_ip(request)):
            raise Http404("Boot configs are served to the provisioning networks only.")
        callback = request.build_absolute_uri(reverse("infra_os-api:provisioning-callback"))
        return Response(boot_config(mac=request.query_params.get("mac", ""),
                                    callback_url=callback))

