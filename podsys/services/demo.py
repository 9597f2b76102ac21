from django.db import transaction

from podsys.models import Cluster
from podsys.services.clusters import cluster_sync_nodes

LOCAL_CLUSTER = "local"


@transaction.atomic
def demo_seed(*, stdout) -> None:
    """Register this machine as the `local` cluster (GPUs found through NVML, else none)."""
    cluster, created = Cluster.objects.get_or_create(
        name=LOCAL_CLUSTER,
        defaults={"driver": "local", "display_name": "This machine"},
    )
    nodes = cluster_sync_nodes(cluster=cluster)
    if created:
        gpus = sum(node.gpus for node in nodes)
        cpus = sum(node.cpu_cores for node in nodes)
        stdout.write(f"  cluster         local        {gpus} GPUs, {cpus:g} CPU cores\n")
