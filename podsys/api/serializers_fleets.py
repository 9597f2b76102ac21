"""Output of the fleets API: a fleet with its clusters and pools as `fleet_summary` counts them,
and its pools' scale events. Read-only: fleets and pools are made by platform admins through
`podsys.services.fleets`."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from podsys.models import Fleet, ScaleEvent


class FleetClusterSerializer(serializers.Serializer):
    name = serializers.CharField(read_only=True)
    driver = serializers.CharField(read_only=True)
    nodes = serializers.IntegerField(read_only=True)
    gpus = serializers.IntegerField(read_only=True)
    gpus_held = serializers.IntegerField(read_only=True, help_text="GPUs jobs hold now.")
    lost = serializers.BooleanField(
        read_only=True, help_text="Its driver has not answered for OGAI_CLUSTER_LOST_S: waiting "
        "jobs are moved off it.")


class FleetPoolSerializer(serializers.Serializer):
    name = serializers.CharField(read_only=True)
    cluster = serializers.CharField(read_only=True, help_text="The cluster its nodes join.")
    node_type = serializers.CharField(read_only=True)
    max_nodes = serializers.IntegerField(read_only=True)
    booting = serializers.IntegerField(read_only=True, help_text="Nodes bought, not ready yet.")
    idle = serializers.IntegerField(read_only=True,
                                    help_text="Ready nodes with no work and no claim.")
    busy = serializers.IntegerField(read_only=True, help_text="Ready nodes with GPUs held or "
                                    "claimed by a job waiting for them.")
    spend_this_month = serializers.DecimalField(
        max_digits=12, decimal_places=2, read_only=True,
        help_text="What its nodes cost so far this calendar month.")
    max_spend_per_month = serializers.DecimalField(
        max_digits=12, decimal_places=2, read_only=True, help_text="0: no limit.")


class FleetSerializer(serializers.ModelSerializer):
    """The summaries come in the context (`summaries`: fleet id -> `FleetSummary`), worked out
    once for the page, so the clusters and pools of a page cost a fixed number of queries."""

    clusters = serializers.SerializerMethodField()
    pools = serializers.SerializerMethodField()

    class Meta:
        model = Fleet
        fields = ["id", "name", "display_name", "clusters", "pools", "created_at"]

    def _summary(self, fleet: Fleet):
        return self.context["summaries"][fleet.pk]

    @extend_schema_field(FleetClusterSerializer(many=True))
    def get_clusters(self, fleet: Fleet) -> list:
        return FleetClusterSerializer(self._summary(fleet).clusters, many=True).data

    @extend_schema_field(FleetPoolSerializer(many=True))
    def get_pools(self, fleet: Fleet) -> list:
        return FleetPoolSerializer(self._summary(fleet).pools, many=True).data


class ScaleEventSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    # Null for a decision about no one tenant's work, or once the tenant is deleted.
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)

    class Meta:
        model = ScaleEvent
        fields = ["id", "pool", "kind", "tenant", "nodes", "reason", "created_at"]
