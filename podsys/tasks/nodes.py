from celery import shared_task

from podsys.models import Cluster
from podsys.services.clusters import cluster_cleanup, cluster_sync_nodes


@shared_task(name="podsys.sync_nodes", queue="cluster", time_limit=120, soft_time_limit=100)
def sync_nodes(cluster_id: int | None = None) -> int:
    """Refresh the nodes of one cluster, or of every active cluster, and clear what finished
    workloads left behind there (their logs kept)."""
    clusters = Cluster.objects.filter(is_active=True)
    if cluster_id is not None:
        clusters = clusters.filter(pk=cluster_id)
    for cluster in clusters:
        cluster_sync_nodes(cluster=cluster)
        cluster_cleanup(cluster=cluster)
    return len(clusters)
