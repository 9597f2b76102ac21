"""Health checks in the API: the runs, and the kinds of check the platform runs."""

from rest_framework import serializers

from podsys.choices import CheckSeverity
from podsys.models import HealthCheckRun


class HealthCheckRunSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    cluster = serializers.CharField(source="node.cluster.name", read_only=True)

    class Meta:
        model = HealthCheckRun
        fields = ["id", "node", "node_name", "cluster", "check_name", "severity", "trigger",
                  "state", "workload_id", "created_at", "started_at", "finished_at", "summary",
                  "details"]
        read_only_fields = fields


class HealthCheckTypeSerializer(serializers.Serializer):
    name = serializers.CharField()
    label = serializers.CharField()
    severity = serializers.ChoiceField(choices=CheckSeverity.choices,
                                       help_text="fatal: a confirmed failure cordons the node.")
    interval_s = serializers.FloatField(help_text="Seconds between scheduled runs on a node.")
    timeout_s = serializers.FloatField(help_text="A run past this is stopped, as an error.")
    exclusive = serializers.BooleanField(
        help_text="Needs the node's GPUs to itself: waits while work holds any.")
    multi_node = serializers.BooleanField(help_text="Runs over several nodes at once.")


class NodeCheckSerializer(serializers.Serializer):
    check = serializers.CharField(
        max_length=64, required=False, allow_blank=True, default="",
        help_text="The check to run (see /health-check-types/); blank: every single-node check.")
