from celery import shared_task

from podsys.models import Cluster
from podsys.services.metrics import metrics_collect, metrics_prune


@shared_task(name="podsys.collect_metrics", queue="cluster", acks_late=True,
             reject_on_worker_lost=True, time_limit=120, soft_time_limit=100)
def collect_metrics() -> int:
    """Read the metrics of every node of every active cluster (nothing when Prometheus keeps
    them), then drop the history past OGAI_METRICS_HISTORY_H; returns the snapshots written."""
    written = sum(metrics_collect(cluster=cluster)
                  for cluster in Cluster.objects.filter(is_active=True))
    metrics_prune()
    return written
