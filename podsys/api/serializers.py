from rest_framework import serializers

from infra_os.api.serializers import CallerTenantField
from infra_os.models import Server
from infra_os.models.tenancy import slug_validator
from podsys.models import Cluster, Node


class ClusterSerializer(serializers.ModelSerializer):
    # Null on a cluster shared by every tenant.
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    node_count = serializers.IntegerField(read_only=True)
    gpu_count = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta:
        model = Cluster
        fields = [
            "id",
            "name",
            "display_name",
            "driver",
            "tenant",
            "is_active",
            "node_count",
            "gpu_count",
            "last_synced_at",
            "sync_error",
            "created_at",
        ]


class ClusterCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63, validators=[slug_validator])
    display_name = serializers.CharField(max_length=200, allow_blank=True, default="")
    driver = serializers.CharField(max_length=64)
    options = serializers.DictField(default=dict)
    kubeconfig = serializers.CharField(
        required=False, default="", allow_blank=True, write_only=True, max_length=256_000,
        trim_whitespace=False, style={"base_template": "textarea.html"},
        help_text="Kubernetes only: the kubeconfig OGAI uses (stored encrypted, never shown "
        "again). Or set options {\"in_cluster\": true}.",
    )
    tenant = CallerTenantField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Only this tenant may use it; empty: shared.",
    )


class NodeSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    gpus_allocated = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "id",
            "cluster",
            "name",
            "gpus",
            "gpus_allocated",
            "gpu_model",
            "gpu_memory_mib",
            "cpu_cores",
            "memory_mib",
            "labels",
            "taints",
            "gpus_in_use",
            "gpus_foreign",
            "rdma_devices",
            "rdma_in_use",
            "health",
            "health_reason",
            "schedulable",
            "cordon_source",
            "address",
            "last_seen_at",
        ]

    def get_gpus_allocated(self, node: Node) -> int:
        return self.context.get("allocations", {}).get((node.cluster_id, node.name), 0)


class NodeCordonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, allow_blank=True, default="")


class ConnectionReportSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    message = serializers.CharField()
    details = serializers.DictField()


class EnvironmentSerializer(serializers.Serializer):
    """A named environment jobs may ask for (`environment` on a job)."""

    name = serializers.CharField()
    where = serializers.CharField(help_text="A Python environment's folder (local clusters) or "
                                  "an image (Kubernetes).")
    python = serializers.CharField(help_text="Its Python version; empty when not known.")
    torch = serializers.CharField(help_text="Its torch version; empty when it has none or it "
                                  "is not known.")
    default = serializers.BooleanField(help_text="Jobs that name no environment run in it.")
    problem = serializers.SerializerMethodField(
        help_text="Why it cannot run jobs; empty when it can.")

    def get_problem(self, env) -> str:
        return getattr(env, "problem", "")


class ServerNameSerializer(serializers.Serializer):
    server = serializers.SlugRelatedField(slug_field="name", queryset=Server.objects.all(),
                                          help_text="The bare-metal server's name.")


class ServerAllocationSerializer(serializers.ModelSerializer):
    """What a server is used for after joining or leaving a cluster."""

    class Meta:
        model = Server
        fields = ["id", "name", "allocation", "allocated_to"]
        read_only_fields = fields
