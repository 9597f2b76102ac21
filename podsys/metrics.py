"""PODsys's figures on OGAI's /metrics: nodes of each cluster by state."""

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily, Metric

from podsys.choices import NodeHealth
from podsys.models import Node

NODE_STATES = ("in_service", "cordoned", "not_ready", "lost")


class NodesCollector:
    def collect(self) -> Iterator[Metric]:
        rows = (Node.objects.filter(cluster__is_active=True).order_by()
                .values_list("cluster__name", "health", "schedulable").annotate(n=Count("pk")))
        counts: dict[str, dict[str, int]] = {}
        for cluster, health, schedulable, count in rows:
            state = ("lost" if health == NodeHealth.LOST
                     else "not_ready" if health == NodeHealth.NOT_READY
                     else "in_service" if schedulable else "cordoned")
            by_state = counts.setdefault(cluster, dict.fromkeys(NODE_STATES, 0))
            by_state[state] += count
        family = GaugeMetricFamily("ogai_nodes", "Nodes of each active cluster: in service, "
                                   "cordoned (by an operator or a health check), not ready, "
                                   "lost.", labels=["cluster", "state"])
        for cluster in sorted(counts):
            for state, count in counts[cluster].items():
                family.add_metric([cluster, state], count)
        yield family
