"""Health checks run on nodes, and the metrics history kept where no Prometheus is."""

from django.db import models

from podsys.choices import CheckSeverity, CheckState, CheckTrigger
from podsys.models.clusters import Node


class HealthCheckRun(models.Model):
    """One run of one check on one node: what it measured and the verdict. A check across
    nodes (NCCL all-reduce) has one row per node, sharing its workload."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_checks")
    check_name = models.CharField(max_length=64)
    severity = models.CharField(max_length=16, choices=CheckSeverity.choices)
    trigger = models.CharField(max_length=16, choices=CheckTrigger.choices,
                               default=CheckTrigger.SCHEDULE)
    state = models.CharField(max_length=16, choices=CheckState.choices,
                             default=CheckState.PENDING)
    workload_id = models.CharField(max_length=63, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The verdict in a person's words ("2 GPUs have uncorrectable remapped rows: 3, 5").
    summary = models.TextField(blank=True)
    # What it measured (driver version, GB/s, rows per GPU ...).
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["node", "check_name", "-created_at"],
                                name="health_check_node_latest")]

    def __str__(self) -> str:
        return f"{self.check_name} on {self.node.name}: {self.state}"


class NodeMetricSnapshot(models.Model):
    """One scrape of a node's metrics: {DCGM or node-exporter metric name: {gpu index or "":
    value}}. Kept for `OGAI_METRICS_HISTORY_H` hours, only where no Prometheus is configured."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="metric_snapshots")
    at = models.DateTimeField()
    values = models.JSONField(default=dict)

    class Meta:
        ordering = ["node", "at"]
        indexes = [models.Index(fields=["node", "at"], name="node_metric_node_at")]

    def __str__(self) -> str:
        return f"metrics of {self.node.name} at {self.at:%Y-%m-%d %H:%M:%S}"
